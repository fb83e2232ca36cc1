"""What the commands print: strict JSON (every ``--json``), aligned tables, sizes with units.

>>> json_safe({"t": float("inf"), "xs": [1.0, float("nan")], "ok": True})
{'t': None, 'xs': [1.0, None], 'ok': True}
>>> flops(3.2e12), nbytes(1536), gb(2.5e9), rate(4e12, "FLOP/s")
('3.2 TFLOP', '1.5 KiB', '2.50 GB', '4 TFLOP/s')
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(doc: Any) -> Any:
    """``doc`` with every non-finite float (inf, nan) as None and numpy values as plain Python ones.

    JSON has no Infinity or NaN; a document with them is not JSON to a strict
    parser. A value that is not finite is one that does not exist (an OOM step
    has no step time), and the document's ``status`` says why.
    """
    if isinstance(doc, dict):
        return {k: json_safe(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [json_safe(v) for v in doc]
    if isinstance(doc, (bool, int, str)) or doc is None:
        return doc
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if hasattr(doc, "tolist"):  # numpy scalars and arrays
        return json_safe(doc.tolist())
    return doc


def to_json(doc: Any, indent: int | None = 1) -> str:
    """The one JSON encoder of the CLI's outputs: strict JSON (see :func:`json_safe`)."""
    return json.dumps(json_safe(doc), indent=indent, allow_nan=False)


def print_json(doc: Any, indent: int | None = 1) -> None:
    """Print ``doc`` as strict JSON on stdout: every ``--json`` output goes through here."""
    print(to_json(doc, indent=indent))


def table(rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """Rows as aligned columns (``right``: the right-aligned ones), a rule under the first row."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        cells = [v.rjust(w) if c in right else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _scaled(value: float, units: tuple[str, ...], base: float) -> str:
    """``value`` in the largest unit it reaches, three significant digits; from 999.5 up the next unit (three digits
    of 1000-1023 would read ``1.02e+03``).

    >>> nbytes(1020 * 2**20), nbytes(999.4), count(999_600)
    ('0.996 GiB', '999 B', '1 M')
    """
    for unit in units[:-1]:
        if abs(value) < min(base, 999.5):
            return f"{value:.3g} {unit}" if unit else f"{value:.3g}"
        value /= base
    return f"{value:.3g} {units[-1]}"


def flops(value: float) -> str:
    return _scaled(value, ("FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"), 1000.0)


def nbytes(value: float) -> str:
    return _scaled(value, ("B", "KiB", "MiB", "GiB", "TiB"), 1024.0)


def count(value: float) -> str:
    return _scaled(value, ("", "K", "M", "G"), 1000.0)


def gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB"


def rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:g} {prefix}{unit}"
    return f"{value:g} {unit}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1.

    >>> counted(1, "rank"), counted(2, "stage"), counted(1, "microbatch", "microbatches")
    ('1 rank', '2 stages', '1 microbatch')
    """
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def first_few(names: list[str], most: int = 3) -> str:
    """``names`` for one line: the first ``most``, then how many more.

    >>> first_few(["a", "b", "c", "d", "e"])
    'a, b, c and 2 more'
    """
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
