"""The one schema layer: strict, typed readers for the fields of placer's JSON files.

Graph, cluster, placement and profile readers all take their fields through
these helpers, so every file follows the same rules:

- a bool is not a number and a number is not a bool (JSON ``true`` is not ``1``);
- a string is not a bool: ``"false"`` is an error, never true;
- a list is not a string, an object is not a list;
- a number must be finite and fit where it goes: an integer beyond int64 (or
  one too large even for a float) is an error naming the field, never a
  wrapped-around or rounded value.

Every failure raises ``error`` (a :class:`PlacerError`, exit status 2 on the CLI)
with one line ``"<source>: <field> must be ..., got ..."``.

>>> number(2, "c.json", "devices[0].flops_per_s")
2.0
>>> boolean("false", "c.json", "links[0].bidirectional")
Traceback (most recent call last):
...
graphs.errors.PlacerError: c.json: links[0].bidirectional must be true or false, got 'false' (a string)
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NoReturn

import numpy as np

from graphs.errors import PlacerError

INT64_MAX = 2**63 - 1

_TYPE_NAMES = {
    bool: "a bool",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def describe(x: Any) -> str:
    """``x`` for an error message: a short repr and its JSON type."""
    text = repr(x)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = _TYPE_NAMES.get(type(x), type(x).__name__)
    return f"{text} ({kind})"


def fail(source: str, field: str, problem: str, error: type[PlacerError] = PlacerError) -> NoReturn:
    raise error(f"{source}: {field} {problem}")


def document(
    doc: Any, source: str, fmt: str, *, error: type[PlacerError] = PlacerError, format_optional: bool = False
) -> dict:
    """The top level of every placer file: a JSON object whose ``format`` is ``fmt``.

    The one header check of graphs, groupings, placements, clusters and profiles
    (``format_optional``: a document without ``format`` is taken as ``fmt``).
    """
    if not isinstance(doc, dict):
        raise error(f"{source}: expected a JSON object at top level")
    found = doc.get("format", fmt) if format_optional else doc.get("format")
    if found != fmt:
        raise error(f"{source}: format is {found!r}, expected {fmt!r}")
    return doc


def obj(x: Any, source: str, field: str, *, error: type[PlacerError] = PlacerError) -> dict:
    if not isinstance(x, dict):
        fail(source, field, f"must be an object, got {describe(x)}", error)
    return x


def array(x: Any, source: str, field: str, *, error: type[PlacerError] = PlacerError) -> list:
    if not isinstance(x, list):
        fail(source, field, f"must be a list, got {describe(x)}", error)
    return x


def string(x: Any, source: str, field: str, *, nonempty: bool = False, error: type[PlacerError] = PlacerError) -> str:
    if not isinstance(x, str):
        fail(source, field, f"must be a string, got {describe(x)}", error)
    if nonempty and not x:
        fail(source, field, "must be a non-empty string", error)
    return x


def boolean(x: Any, source: str, field: str, *, error: type[PlacerError] = PlacerError) -> bool:
    if not isinstance(x, bool):
        fail(source, field, f"must be true or false, got {describe(x)}", error)
    return x


def strings(x: Any, source: str, field: str, *, error: type[PlacerError] = PlacerError) -> list[str]:
    """A list of strings (checked in one pass, so long lists stay fast)."""
    array(x, source, field, error=error)
    if not set(map(type, x)) <= {str}:
        k = next(i for i, v in enumerate(x) if not isinstance(v, str))
        fail(source, f"{field}[{k}]", f"must be a string, got {describe(x[k])}", error)
    return x


def number(
    x: Any,
    source: str,
    field: str,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    finite: bool = True,
    error: type[PlacerError] = PlacerError,
) -> float:
    """A JSON number as a float: not a bool, not a string, representable, in range.

    ``minimum``/``maximum`` are inclusive bounds, ``above`` an exclusive lower one.
    """
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        fail(source, field, f"must be a number, got {describe(x)}", error)
    try:
        v = float(x)
    except OverflowError:
        fail(source, field, f"is too large ({_digits(x)})", error)
    if finite and not math.isfinite(v):
        fail(source, field, f"must be finite, got {v!r}", error)
    if minimum is not None and not v >= minimum:
        fail(source, field, f"must be >= {minimum:g}, got {v!r}", error)
    if above is not None and not v > above:
        fail(source, field, f"must be > {above:g}, got {v!r}", error)
    if maximum is not None and not v <= maximum:
        fail(source, field, f"must be <= {maximum:g}, got {v!r}", error)
    return v


def integer(
    x: Any,
    source: str,
    field: str,
    *,
    minimum: int | None = None,
    maximum: int = INT64_MAX,
    error: type[PlacerError] = PlacerError,
) -> int:
    """A JSON integer (a whole float such as ``4.0`` is accepted) that fits in int64."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        fail(source, field, f"must be an integer, got {describe(x)}", error)
    if isinstance(x, float):
        if not (math.isfinite(x) and x == int(x)):
            fail(source, field, f"is {x!r}, expected a whole number", error)
        if not -(2.0**63) <= x < 2.0**63:
            fail(source, field, f"is too large for a 64-bit integer ({x!r})", error)
        x = int(x)
    if x > maximum:
        fail(source, field, f"is too large ({_digits(x)}; at most {maximum})", error)
    if minimum is not None and x < minimum:
        fail(source, field, f"must be >= {minimum}, got {x}", error)
    if x < -INT64_MAX - 1:
        fail(source, field, f"is too small ({_digits(x)})", error)
    return x


def column(
    values: Any, source: str, field: str, *, whole: bool, nan_ok: bool = False, error: type[PlacerError] = PlacerError
) -> np.ndarray:
    """A 1-d int64 (``whole``) or float64 array from a JSON list of numbers.

    Rejects bools, strings, nulls, nested lists, non-finite values, fractions in a
    whole-number column, and integers that do not fit in int64 (or a float), each
    naming the entry, e.g. ``ops.param_bytes[3]``; ``nan_ok`` lets NaN through
    (a float column where the caller turned JSON ``null`` into NaN). Vectorised: a 100,000-entry
    column takes milliseconds.
    """
    array(values, source, field, error=error)
    if not values:
        return np.zeros(0, dtype=np.int64 if whole else np.float64)
    if not set(map(type, values)) <= {int, float}:
        k = next(i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, (int, float)))
        fail(source, f"{field}[{k}]", f"must be a number, got {describe(values[k])}", error)
    try:
        arr = np.asarray(values)
    except OverflowError:  # an int beyond what any numpy dtype holds, mixed with floats
        arr = np.asarray(values, dtype=object)
    if arr.dtype.kind not in "iuf":  # object (huge ints) or uint64 (ints >= 2**63)
        _check_each(values, source, field, whole=whole, error=error)
    if arr.dtype.kind == "u":
        _check_each(values, source, field, whole=whole, error=error)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) & ~(np.isnan(arr) if nan_ok else False)
        if whole:
            with np.errstate(invalid="ignore"):
                bad |= arr != np.round(arr)
                bad |= np.abs(arr) >= 2.0**63
        if bad.any():
            _check_each(values, source, field, whole=whole, error=error)
    return arr.astype(np.int64 if whole else np.float64)


def _check_each(values: list, source: str, field: str, *, whole: bool, error: type[PlacerError]) -> None:
    for k, v in enumerate(values):
        if isinstance(v, float) and math.isnan(v) and not whole:
            continue
        if whole:
            integer(v, source, f"{field}[{k}]", error=error)
        else:
            number(v, source, f"{field}[{k}]", error=error)
    fail(source, field, "holds numbers that do not fit one column", error)  # pragma: no cover


def _digits(x: Any) -> str:
    if isinstance(x, int):
        try:
            text = str(x)
        except ValueError:  # beyond Python's int-to-str digit limit
            return "an integer of more than 4300 digits"
        return f"an integer of {len(text.lstrip('-'))} digits" if len(text) > 24 else text
    return repr(x)


# ------------------------------------------------------------ option values
# The same rules for values given on a command line or to a Python API
# (placer.option_checks, envs.real.measured's timeouts): one line "<option> <value>: must ...".
def check_int(value: object, option: str, *, least: int | None = None, most: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[least, most]``, else PlacerError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PlacerError(f"{option} {value!r}: must be an integer")
    value = int(value)
    if least is not None and most is not None and not least <= value <= most:
        raise PlacerError(f"{option} {value}: must be between {least} and {most}")
    if least is not None and value < least:
        raise PlacerError(f"{option} {value}: must be at least {least}")
    if most is not None and value > most:
        raise PlacerError(f"{option} {value}: must be at most {most}")
    return value


def check_float(
    value: object,
    option: str,
    *,
    above: float | None = None,
    least: float | None = None,
    below: float | None = None,
    most: float | None = None,
) -> float:
    """``value`` if it is a finite real number (not a bool) within the given bounds, else PlacerError.

    ``above``/``below`` are strict bounds, ``least``/``most`` inclusive ones.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PlacerError(f"{option} {value!r}: must be a number")
    value = float(value)
    bounds = [
        f"> {above:g}" if above is not None else "",
        f">= {least:g}" if least is not None else "",
        f"< {below:g}" if below is not None else "",
        f"<= {most:g}" if most is not None else "",
    ]
    want = " and ".join(b for b in bounds if b)
    ok = math.isfinite(value)
    ok = ok and (above is None or value > above) and (least is None or value >= least)
    ok = ok and (below is None or value < below) and (most is None or value <= most)
    if not ok:
        raise PlacerError(f"{option} {value:g}: must be a finite number" + (f" {want}" if want else ""))
    return value
