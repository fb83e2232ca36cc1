"""Reading and writing graphs: placer-graph/1 JSON, and exported ``.pt2`` files.

>>> import tempfile, os
>>> from graphs.ir import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], flops=[1.0, 2.0])
>>> path = os.path.join(tempfile.mkdtemp(), "g.json")
>>> save(g, path)
>>> load(path).content_hash == g.content_hash
True
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import tempfile
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

import numpy as np

from graphs import schema
from graphs.errors import GraphFormatError, PlacerError
from graphs.ir import FORMAT, OpGraph

T = TypeVar("T")

_OP_KEYS = ("name", "type", "shapes", "dtypes", "out_bytes", "param_bytes", "buffer_bytes", "flops", "module", "params")


def save(graph: OpGraph, path: str | os.PathLike) -> None:
    """Write ``graph`` as placer-graph/1 JSON (gzip-compressed if the name ends in ``.gz``)."""
    doc = graph.to_dict()
    doc["hash"] = graph.content_hash
    write_text_atomic(path, json.dumps(doc, separators=(",", ":"), allow_nan=False))


def _read_umask() -> int:
    # Read once at import: os.umask can only be read by setting it, which is not
    # thread-safe, so never do that while writing.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """The one atomic file writer: ``path`` is always either the old file or the whole new one.

    ``write`` gets a binary file and writes the content (gzip-compressed for you if
    the name ends in ``.gz``). The temporary file is created with
    :func:`tempfile.mkstemp` in the target's directory (a fresh unpredictable name,
    ``O_CREAT | O_EXCL``, mode 0600), so a symlink planted at any name is never
    followed and concurrent writers never share one; it is fsynced, renamed over
    ``path`` (which replaces a symlink at ``path`` itself, never its target) and
    the directory is fsynced so the rename survives a crash. On any failure the
    temporary file is removed and ``path`` is untouched. Graphs, placements,
    profiles and checkpoints are all written through here.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)[:100]}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.endswith(".gz"):
                # mtime=0: the same content gives the same bytes.
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
                    write(f)
            else:
                write(raw)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it 0600; give it the mode open() would
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) through :func:`write_atomic`."""
    if not isinstance(text, str):
        raise TypeError(f"write_text_atomic needs a str, got {type(text).__name__}")
    data = text.encode("utf-8")
    write_atomic(path, lambda f: f.write(data))


def _fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(path: str | os.PathLike, *, verify_hash: bool = True) -> OpGraph:
    """Read a graph from a placer-graph/1 JSON file or an exported ``.pt2`` program.

    Raises :class:`GraphFormatError` (a :class:`PlacerError`) with the file name
    and the problem for anything malformed.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise PlacerError(f"{path}: no such file")
    if path.endswith(".pt2"):
        from graphs.torch_capture import capture_pt2  # torch: loaded only for a .pt2 file

        return capture_pt2(path)
    # The document is a few big lists of small objects and holds no reference
    # cycles; pausing the cyclic GC while it is parsed and turned into arrays
    # saves ~30% of the load time of a 100,000-op graph.
    with _gc_paused():
        doc = read_json(path, error=GraphFormatError)
        return from_dict(doc, source=path, verify_hash=verify_hash)


def read_json(path: str | os.PathLike, *, error: type[PlacerError] = PlacerError) -> Any:
    """Parse a JSON file (gzip-compressed if the name ends in ``.gz``).

    Every way it can fail (missing, unreadable, truncated, not JSON, nested too
    deeply for the parser) raises
    ``error`` with one line that names the file; graphs, placements, clusters and
    profiles are all read through here.
    """
    path = os.fspath(path)
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); truncated?") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to read") from None
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise error(f"{path}: cannot read ({e})") from None
    except ValueError as e:  # e.g. an integer literal beyond Python's digit limit
        raise error(f"{path}: not valid JSON ({str(e).splitlines()[0][:200]})") from None


def read_document(path: str | os.PathLike, from_dict: Callable[..., T], *, error: type[PlacerError] = PlacerError) -> T:
    """``from_dict(read_json(path), source=path)``: how every placer file but a graph is loaded."""
    path = os.fspath(path)
    return from_dict(read_json(path, error=error), source=path)


def from_dict(doc: Any, *, source: str = "graph", verify_hash: bool = True) -> OpGraph:
    """Build an OpGraph from a parsed placer-graph/1 document (types checked by :mod:`graphs.schema`)."""
    E = GraphFormatError
    schema.document(doc, source, FORMAT, error=E)
    ops, edges = doc.get("ops"), doc.get("edges")
    if not isinstance(ops, dict) or not isinstance(edges, dict):
        raise GraphFormatError(f"{source}: missing 'ops' or 'edges' table")
    for k in _OP_KEYS:
        if not isinstance(ops.get(k), list):
            raise GraphFormatError(f"{source}: ops.{k} is missing or not a list")
    for k in ("src", "dst", "bytes"):
        if not isinstance(edges.get(k), list):
            raise GraphFormatError(f"{source}: edges.{k} is missing or not a list")
    n = len(ops["name"])
    for k in _OP_KEYS:
        if len(ops[k]) != n:
            raise GraphFormatError(f"{source}: ops.{k} has {len(ops[k])} entries but there are {n} ops")
    name = schema.string(doc.get("name", ""), source, "name", error=E)
    for k in ("name", "type", "module"):
        schema.strings(ops[k], source, f"ops.{k}", error=E)
    params = ops["params"]
    if not all(isinstance(p, list) and set(map(type, p)) <= {str} for p in params):
        k = next(i for i, p in enumerate(params) if not (isinstance(p, list) and set(map(type, p)) <= {str}))
        schema.strings(
            schema.array(params[k], source, f"ops.params[{k}]", error=E), source, f"ops.params[{k}]", error=E
        )
    profile = {}
    for kind, cols in schema.obj(doc.get("profile") or {}, source, "profile", error=E).items():
        profile[kind] = {
            c: schema.column(
                [np.nan if x is None else x for x in schema.array(arr, source, f"profile.{kind}.{c}", error=E)],
                source,
                f"profile.{kind}.{c}",
                whole=False,
                nan_ok=True,
                error=E,
            )
            for c, arr in schema.obj(cols, source, f"profile.{kind}", error=E).items()
        }
    meta = check_meta(doc.get("meta", {}), source)
    if "hash" in doc:
        schema.string(doc["hash"], source, "hash", error=E)
    columns = {
        key: schema.column(ops[col], source, f"ops.{col}", whole=col != "flops", error=E)
        for key, col in (
            ("out_bytes", "out_bytes"),
            ("param_bytes", "param_bytes"),
            ("buffer_bytes", "buffer_bytes"),
            ("flops", "flops"),
        )
    }
    src, dst, nbytes = (
        schema.column(edges[k], source, f"edges.{k}", whole=True, error=E) for k in ("src", "dst", "bytes")
    )
    for col, arr in (("edges.src", src), ("edges.dst", dst)):
        if len(arr) and (arr.min() < 0 or arr.max() >= n):
            k = int(np.argmax((arr < 0) | (arr >= n)))
            raise GraphFormatError(
                f"{source}: {col}[{k}] is {int(arr[k])}: a dangling edge (op indices must be in [0, {n}))"
            )
    try:
        graph = OpGraph(
            names=ops["name"],
            op_types=ops["type"],
            out_shapes=ops["shapes"],
            out_dtypes=ops["dtypes"],
            module_paths=ops["module"],
            params=params,
            edge_src=src,
            edge_dst=dst,
            edge_bytes=nbytes,
            profile=profile,
            name=name,
            meta=meta,
            **columns,
        )
    except GraphFormatError as e:
        msg, label = str(e), f"{name or 'graph'}: "
        raise GraphFormatError(f"{source}: {msg[len(label) :] if msg.startswith(label) else msg}") from None
    if verify_hash and "hash" in doc:
        # Hash what was parsed, in canonical form (graph.to_dict()), so the cached
        # hash is exactly what a re-save writes, whatever number spelling the file used.
        actual = graph.content_hash
        if actual != doc["hash"]:
            raise GraphFormatError(
                f"{source}: content hash mismatch (file says {doc['hash']}, content is {actual}); "
                "the file was edited or damaged"
            )
    return graph


# The meta keys placer itself reads, and the type each must have; any other key is
# free-form (kept and saved, never interpreted).
_META_STRING_LISTS = ("alias_ops", "inplace_ops", "unused_params", "strided_views")


def check_meta(meta: Any, source: str) -> dict:
    """A graph's ``meta``: an object whose keys that placer reads have the right types."""
    E = GraphFormatError
    meta = dict(schema.obj(meta, source, "meta", error=E))
    for key in _META_STRING_LISTS:
        if key in meta:
            schema.strings(meta[key], source, f"meta.{key}", error=E)
    if "decomposed" in meta:
        schema.boolean(meta["decomposed"], source, "meta.decomposed", error=E)
    if "tied_params" in meta:
        for k, group in enumerate(schema.array(meta["tied_params"], source, "meta.tied_params", error=E)):
            schema.strings(group, source, f"meta.tied_params[{k}]", error=E)
    if "buffer_writes" in meta:
        for k, entry in enumerate(schema.array(meta["buffer_writes"], source, "meta.buffer_writes", error=E)):
            schema.strings(entry, source, f"meta.buffer_writes[{k}]", error=E)
            if len(entry) != 3:
                schema.fail(source, f"meta.buffer_writes[{k}]", f"must be [op, buffer, through], got {len(entry)}", E)
    if "buffer_readers" in meta:
        for name, ops in schema.obj(meta["buffer_readers"], source, "meta.buffer_readers", error=E).items():
            schema.strings(ops, source, f"meta.buffer_readers.{name}", error=E)
    if "capture_version" in meta:
        schema.integer(meta["capture_version"], source, "meta.capture_version", error=E)
    if "inputs" in meta:
        for k, item in enumerate(schema.array(meta["inputs"], source, "meta.inputs", error=E)):
            where = f"meta.inputs[{k}]"
            schema.obj(item, source, where, error=E)
            if "name" in item:
                schema.string(item["name"], source, f"{where}.name", error=E)
            if "bytes" in item:
                schema.integer(item["bytes"], source, f"{where}.bytes", minimum=0, error=E)
            if "shape" in item:
                for j, d in enumerate(schema.array(item["shape"], source, f"{where}.shape", error=E)):
                    schema.integer(d, source, f"{where}.shape[{j}]", minimum=0, error=E)
            if "consumers" in item:
                schema.strings(item["consumers"], source, f"{where}.consumers", error=E)
    return meta


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
