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
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np

from graphs.errors import GraphFormatError, PlacerError
from graphs.ir import FORMAT, OpGraph

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
        from graphs.torch_capture import capture_pt2

        return capture_pt2(path)
    # The document is a few big lists of small objects and holds no reference
    # cycles; pausing the cyclic GC while it is parsed and turned into arrays
    # saves ~30% of the load time of a 100,000-op graph.
    with _gc_paused():
        doc = read_json(path, error=GraphFormatError)
        return from_dict(doc, source=path, verify_hash=verify_hash)


def read_json(path: str | os.PathLike, *, error: type[PlacerError] = PlacerError) -> Any:
    """Parse a JSON file (gzip-compressed if the name ends in ``.gz``).

    Every way it can fail (missing, unreadable, truncated, not JSON) raises
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
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise error(f"{path}: cannot read ({e})") from None


def from_dict(doc: Any, *, source: str = "graph", verify_hash: bool = True) -> OpGraph:
    """Build an OpGraph from a parsed placer-graph/1 document."""
    if not isinstance(doc, dict):
        raise GraphFormatError(f"{source}: expected a JSON object at top level")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise GraphFormatError(f"{source}: format is {fmt!r}, expected {FORMAT!r}")
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
    name = str(doc.get("name", ""))
    try:
        profile = {
            str(kind): {str(c): _column([np.nan if x is None else x for x in arr], float, f"profile.{kind}.{c}") for c, arr in cols.items()}
            for kind, cols in (doc.get("profile") or {}).items()
        }
        graph = OpGraph(
            names=[str(x) for x in ops["name"]],
            op_types=[str(x) for x in ops["type"]],
            out_shapes=ops["shapes"],
            out_dtypes=ops["dtypes"],
            out_bytes=_column(ops["out_bytes"], int, "ops.out_bytes"),
            param_bytes=_column(ops["param_bytes"], int, "ops.param_bytes"),
            buffer_bytes=_column(ops["buffer_bytes"], int, "ops.buffer_bytes"),
            flops=_column(ops["flops"], float, "ops.flops"),
            module_paths=[str(x) for x in ops["module"]],
            params=ops["params"],
            edge_src=_column(edges["src"], int, "edges.src"),
            edge_dst=_column(edges["dst"], int, "edges.dst"),
            edge_bytes=_column(edges["bytes"], int, "edges.bytes"),
            profile=profile,
            name=name,
            meta=dict(doc.get("meta") or {}),
        )
    except GraphFormatError as e:
        msg, label = str(e), f"{name or 'graph'}: "
        raise GraphFormatError(f"{source}: {msg[len(label):] if msg.startswith(label) else msg}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise GraphFormatError(f"{source}: a column has the wrong type ({e})") from None
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


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _column(values: list, kind: type, where: str) -> np.ndarray:
    """A 1-d int64/float64 array from a JSON list; rejects strings, bools, nulls and fractional ints."""
    arr = np.asarray(values) if len(values) else np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        raise GraphFormatError(f"{where} must be a list of numbers")
    if kind is int:
        if arr.dtype.kind == "f":
            if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                bad = int(np.argmax(~np.isfinite(arr) | (arr != np.round(arr))))
                raise GraphFormatError(f"{where}[{bad}] is {arr[bad].item()!r}, expected a whole number")
        return arr.astype(np.int64)
    return arr.astype(np.float64)
