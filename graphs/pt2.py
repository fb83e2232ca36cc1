"""Reading a user's ``.pt2`` file without running anything from it.

``torch.export.load`` trusts its archive: it unpickles weights and constants
marked ``use_pickle`` (``torch.load(weights_only=False)``), opaque constants
(``pickle.loads``) and TorchBind objects, falls back to ``weights_only=False``
for example inputs, dlopens AOTInductor libraries, and hands every symbolic
shape expression to ``sympy.sympify`` (which ``eval``s it). Any of these runs
code from the file.

:func:`load_program` reads the file once into memory and inspects that copy
with torch's own zip reader (the one ``torch.export.load`` uses, so the check
and the load see the same bytes) before anything is deserialized. It accepts
only the archive layout ``torch.export.save`` writes for a plain program:

- weights and constants stored as raw tensor bytes (``use_pickle: false``,
  constants named ``tensor_*``), described by the JSON payload configs;
- example inputs that ``torch.load(weights_only=True)`` reads (so torch never
  takes its ``weights_only=False`` fallback);
- symbolic expressions that are plain arithmetic over shape symbols;
- no AOTInductor/ExecuTorch/MTIA payloads, no legacy ``.pt`` pickles, no other
  entries.

Anything else is refused with one line naming the archive and the entry, as a
:class:`GraphFormatError`. Then the very same in-memory bytes go to
``torch.export.load``.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from typing import Any

from graphs.errors import GraphFormatError

# Entry names (relative to the archive's top folder) that torch.export.save writes.
_FIXED = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
_MODEL = re.compile(r"models/([A-Za-z0-9_.\-]+)\.json")
_WEIGHT = re.compile(r"data/weights/weight_\d+")
_CONSTANT = re.compile(r"data/constants/tensor_\d+")
_WEIGHTS_CONFIG = re.compile(r"data/weights/(.+)_weights_config\.json")
_CONSTANTS_CONFIG = re.compile(r"data/constants/(.+)_constants_config\.json")
_SAMPLE_INPUTS = re.compile(r"data/sample_inputs/(.+)\.pt")
_EXTRA = re.compile(r"extra/[^/]+")

# Symbolic shape expressions: what torch's serializer writes (sympy ``srepr`` or
# ``str`` of arithmetic over shape symbols). sympify evaluates these as Python, so
# only these names may appear; no attribute access, subscripts or free strings.
_SYMPY_NAMES = frozenset(
    """Symbol Dummy Integer Rational Float Add Mul Pow Mod Max Min Abs floor ceiling sign
    Eq Ne Lt Le Gt Ge Equality Unequality StrictLessThan StrictGreaterThan LessThan GreaterThan
    And Or Not Xor true false True False BooleanTrue BooleanFalse Piecewise ExprCondPair
    oo zoo nan Infinity NegativeInfinity NaN ComplexInfinity IntInfinity NegativeIntInfinity
    Zero One NegativeOne Half
    FloorDiv ModularIndexing Where PythonMod CleanDiv CeilToInt FloorToInt CeilDiv LShift RShift
    PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator
    TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat Identity OpaqueUnaryFn_sqrt""".split()
)
_EXPR_TOKEN = re.compile(
    r"\s+|(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)|(?P<str>'[A-Za-z0-9_.+\-]*')"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>\*\*|//|==|!=|<=|>=|[-+*/%<>=(),&|~^])"
)
_SHAPE_SYMBOL = re.compile(r"[a-z]+\d+")
_KEYWORD = re.compile(r"[a-z]+")


def load_program(path: str):
    """The ``ExportedProgram`` in the ``.pt2`` file ``path``, after :func:`check_archive`."""
    import torch  # only to load a program: graphs stays light

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GraphFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    check_archive(path, data)
    return torch.export.load(io.BytesIO(data))


def _refuse(path: str, entry: str, why: str) -> None:
    raise GraphFormatError(f"{path}: refusing entry {entry!r}: {why} (placer never unpickles or runs code from a file)")


def _zip_names(path: str, data: bytes) -> tuple[list[str], str]:
    """Python's view of the zip: its names and its one top folder; no duplicate names.

    torch's reader matches names case-insensitively, so neither may two names differ in case only.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise GraphFormatError(f"{path}: not a loadable torch.export program ({e})") from None
    if not names:
        raise GraphFormatError(f"{path}: not a loadable torch.export program (empty zip)")
    prefix = names[0].split("/", 1)[0] + "/"
    folded: set[str] = set()
    for name in names:
        if not name.startswith(prefix) or name == prefix:
            _refuse(path, name, f"outside the archive's folder {prefix!r}")
        if name.lower() in folded:
            _refuse(path, name, "the name appears twice")
        folded.add(name.lower())
    return names, prefix


class _Archive:
    """torch's view of the archive (the reader ``torch.export.load`` uses): its records, read one at a time."""

    def __init__(self, path: str, data: bytes) -> None:
        import torch  # only to read an archive: graphs stays light

        self.path = path
        try:
            self.reader = torch._C.PyTorchFileReader(io.BytesIO(data))
            self.records = sorted(self.reader.get_all_records())
        except Exception as e:
            raise GraphFormatError(f"{path}: not a loadable torch.export program ({_first_line(e)})") from None

    def read(self, entry: str) -> bytes:
        try:
            return self.reader.get_record(entry)
        except Exception as e:
            raise GraphFormatError(f"{self.path}: cannot read entry {entry!r} ({_first_line(e)})") from None

    def read_json(self, entry: str) -> Any:
        try:
            return json.loads(self.read(entry))
        except (ValueError, RecursionError) as e:
            raise GraphFormatError(f"{self.path}: entry {entry!r} is not valid JSON ({_first_line(e)})") from None


def _check_layout(path: str, records: list[str], models: set[str]) -> None:
    """Every record is part of an exported program's layout: nothing pickled, no compiled code."""
    for r in records:
        if r in _FIXED or _MODEL.fullmatch(r) or _WEIGHT.fullmatch(r) or _CONSTANT.fullmatch(r) or _EXTRA.fullmatch(r):
            continue
        m = _WEIGHTS_CONFIG.fullmatch(r) or _CONSTANTS_CONFIG.fullmatch(r) or _SAMPLE_INPUTS.fullmatch(r)
        if m and m.group(1) in models:
            continue
        if r.endswith((".pt", ".pkl", ".pickle")):
            _refuse(path, r, "a pickled file")
        if r.startswith(("data/aotinductor/", "data/executorch/", "data/mtia")):
            _refuse(path, r, "compiled code")
        _refuse(path, r, "not part of an exported program's layout")


def _check_tensors(path: str, archive: _Archive, model: str) -> None:
    """The model's weights and constants are raw tensor bytes that exist, each with its tensor_meta."""
    for config, kind in (
        (f"data/weights/{model}_weights_config.json", "weight"),
        (f"data/constants/{model}_constants_config.json", "constant"),
    ):
        if config not in archive.records:
            raise GraphFormatError(f"{path}: not a loadable torch.export program (no {config})")
        doc = archive.read_json(config)
        entries = doc.get("config") if isinstance(doc, dict) else None
        if not isinstance(entries, dict):
            raise GraphFormatError(f"{path}: entry {config!r} has no 'config' object")
        folder = "data/weights/" if kind == "weight" else "data/constants/"
        pattern = _WEIGHT if kind == "weight" else _CONSTANT
        for fqn, meta in entries.items():
            file = meta.get("path_name") if isinstance(meta, dict) else None
            where = f"{folder}{file}" if isinstance(file, str) else config
            if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
                _refuse(path, where, f"{kind} {fqn!r} is pickled (use_pickle)")
            if not isinstance(file, str) or not pattern.fullmatch(folder + file):
                _refuse(path, where, f"{kind} {fqn!r} is not stored as raw tensor bytes")
            if folder + file not in archive.records:
                raise GraphFormatError(f"{path}: {kind} {fqn!r} names a missing entry {where!r}")
            if not isinstance(meta.get("tensor_meta"), dict):
                raise GraphFormatError(f"{path}: entry {config!r}: {kind} {fqn!r} has no tensor_meta")


def _check_sample_inputs(path: str, archive: _Archive, model: str) -> None:
    """Example inputs, if stored, load as plain tensors (``weights_only``)."""
    import torch  # only to read an archive: graphs stays light

    inputs = f"data/sample_inputs/{model}.pt"
    if inputs in archive.records:
        blob = archive.read(inputs)
        if blob:
            try:  # the same call torch makes first; if it fails torch would unpickle freely
                torch.load(io.BytesIO(blob), weights_only=True)
            except Exception as e:
                _refuse(path, inputs, f"the example inputs are not plain tensors ({type(e).__name__})")


def check_archive(path: str, data: bytes) -> None:
    """Raise :class:`GraphFormatError` unless ``data`` is a plain, pickle-free torch.export archive."""
    names, prefix = _zip_names(path, data)
    archive = _Archive(path, data)
    records = archive.records
    if records != sorted(n[len(prefix) :] for n in names):
        raise GraphFormatError(f"{path}: the zip's directory is inconsistent (torch and Python read different entries)")
    if archive.read("archive_format") != b"pt2":
        raise GraphFormatError(f"{path}: not a loadable torch.export program (archive_format is not 'pt2')")
    models = {m.group(1) for r in records if (m := _MODEL.fullmatch(r))}
    if not models:
        raise GraphFormatError(f"{path}: not a loadable torch.export program (no models/*.json)")
    _check_layout(path, records, models)
    for model in sorted(models):
        _check_tensors(path, archive, model)
        _check_expressions(path, f"models/{model}.json", archive.read_json(f"models/{model}.json"))
        _check_sample_inputs(path, archive, model)


def _check_expressions(path: str, entry: str, doc: Any) -> None:
    """Every ``expr_str`` in the program must be arithmetic over shape symbols."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            expr = node.get("expr_str")
            if expr is not None and not _safe_expression(expr):
                shown = expr if len(expr) <= 80 else expr[:77] + "..."
                raise GraphFormatError(
                    f"{path}: refusing entry {entry!r}: symbolic expression {shown!r} is not plain arithmetic "
                    "(placer never unpickles or runs code from a file)"
                )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _safe_expression(expr: Any) -> bool:
    if not isinstance(expr, str) or len(expr) > 100_000:
        return False
    tokens = []
    pos = 0
    while pos < len(expr):
        m = _EXPR_TOKEN.match(expr, pos)
        if not m:
            return False
        pos = m.end()
        if m.lastgroup:
            tokens.append((m.lastgroup, m.group()))
    for k, (kind, text) in enumerate(tokens):
        if kind != "name" or text in _SYMPY_NAMES or _SHAPE_SYMBOL.fullmatch(text):
            continue
        # A keyword argument (``positive=True``): a lowercase name followed by a single '='.
        if _KEYWORD.fullmatch(text) and k + 1 < len(tokens) and tokens[k + 1] == ("op", "="):
            continue
        return False
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
