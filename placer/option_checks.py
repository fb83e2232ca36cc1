"""Checks of command-line options made before any work starts: files to read, files to write, numbers.

Every command checks the files it reads with :func:`check_input_file` and the
file it writes with :func:`check_output_file` (or :func:`check_output_dir` for a
run directory) before it captures, places or trains anything, and every numeric
option goes through :func:`check_int` or :func:`check_float`. Each raises
:class:`PlacerError` with one line naming the option and the problem, which the
CLI turns into exit status 2.

>>> check_float(0.5, "--lr", above=0, most=1)
0.5
>>> check_int(0, "--samples", least=1)
Traceback (most recent call last):
...
graphs.errors.PlacerError: --samples 0: must be at least 1
"""

from __future__ import annotations

import os
import tempfile

from graphs.errors import PlacerError
from graphs.schema import check_float, check_int  # noqa: F401 - the option checks, re-exported for placer

#: Seeds reach numpy (non-negative) and torch (< 2**63 as a signed generator seed).
MAX_SEED = 2**63 - 1
#: The longest file name (one path component) in bytes on common file systems.
NAME_MAX = 255


# ------------------------------------------------------------------ numbers
def check_seed(value: object, option: str = "--seed") -> int:
    """A seed every random generator here accepts: an integer in ``[0, 2**63 - 1]``."""
    return check_int(value, option, least=0, most=MAX_SEED)


def parse_group_counts(
    text: str, option: str = "--groups", *, ops: bool = False, modules: bool = False
) -> tuple[int | str, ...]:
    """A comma list of group counts (2..100000); "none" -> (). With ``ops``, 0 (the ops themselves) is allowed too;
    with ``modules``, the word ``modules`` (the graph grouped by module at each depth).

    >>> parse_group_counts("128, 256"), parse_group_counts("none"), parse_group_counts("0,64", ops=True)
    ((128, 256), (), (0, 64))
    >>> parse_group_counts("128,modules", modules=True)
    (128, 'modules')
    """
    if text.strip().lower() == "none":
        return ()
    counts: tuple[int | str, ...]
    try:
        counts = tuple("modules" if modules and item.strip() == "modules" else int(item) for item in text.split(","))
    except ValueError:
        counts = ()
    if not counts or any(n != "modules" and not (2 <= n <= 100_000 or (ops and n == 0)) for n in counts):
        zero = "0 (the ops) or " if ops else ""
        word = " or the word modules" if modules else ""
        raise PlacerError(
            f"{option}: expected 'none' or a comma list of group counts, each {zero}from 2 to 100000{word}, "
            f"got {text!r}"
        )
    return counts


# ------------------------------------------------------------------ input files
def check_input_file(path: str | os.PathLike, option: str = "") -> str:
    """Check that ``path`` is a file this process can read; returns it as a string.

    ``option`` names it in errors (empty for a positional argument: the path alone
    names it). A file that is there but malformed is its reader's to refuse.
    """
    path = os.fspath(path)
    where = f"{option} {path}" if option else path
    if not path:
        raise PlacerError(f"{option or 'input'}: give a file name")
    if os.path.isdir(path):
        raise PlacerError(f"{where}: is a directory, not a file")
    if not os.path.exists(path):
        raise PlacerError(f"{where}: no such file")
    if not os.access(path, os.R_OK):
        raise PlacerError(f"{where}: cannot read (permission denied)")
    return path


# ------------------------------------------------------------------ output paths
def _probe_writable(directory: str) -> str | None:
    """Why no file can be created in ``directory`` (None if one can): creates and removes a probe file."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".placer-probe-", dir=directory)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.remove(probe)
    return None


def _name_too_long(path: str) -> str | None:
    """The first component of ``path`` longer than the file system allows (255 bytes here)."""
    for part in path.split(os.sep):
        if len(os.fsencode(part)) > NAME_MAX:
            return part
    return None


def _check_name(path: str | os.PathLike, option: str, what: str) -> str:
    """``path`` as a string, unless it is empty, holds a NUL byte or has a component too long to create."""
    path = os.fspath(path)
    if not path:
        raise PlacerError(f"{option}: give a {what} name")
    if "\0" in path:
        raise PlacerError(f"{option} {path!r}: a {what} name cannot contain a NUL byte")
    if _name_too_long(path):
        raise PlacerError(f"{option} {path[:60]}...: a {what} name is longer than {NAME_MAX} bytes")
    return path


def check_output_file(path: str | os.PathLike, option: str) -> str:
    """Check that ``path`` can be written as a file; returns it as a string.

    Refuses an empty name, an existing directory, a missing or non-directory
    parent, and a location where no file can be created (read-only, no
    permission). Nothing is left behind.
    """
    path = _check_name(path, option, "file")
    if os.path.isdir(path):
        raise PlacerError(f"{option} {path}: is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise PlacerError(f"{option} {path}: directory {parent} does not exist")
    if not os.path.isdir(parent):
        raise PlacerError(f"{option} {path}: {parent} is not a directory")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise PlacerError(f"{option} {path}: cannot write (permission denied)")
    why = _probe_writable(parent)
    if why:
        raise PlacerError(f"{option} {path}: cannot write in {parent} ({why})")
    return path


def check_output_dir(path: str | os.PathLike, option: str) -> str:
    """Check that ``path`` is, or can be created as, a writable directory; returns it as a string.

    Refuses an empty name, an existing non-directory (at ``path`` or at one of
    its ancestors) and a location where nothing can be created. Creates nothing.
    """
    path = _check_name(path, option, "directory")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        up = os.path.dirname(existing)
        if up == existing:
            break
        existing = up
    if not os.path.isdir(existing):
        where = "is a file" if existing == os.path.abspath(path) else f"{existing} is a file"
        raise PlacerError(f"{option} {path}: {where}, not a directory")
    why = _probe_writable(existing)
    if why:
        raise PlacerError(f"{option} {path}: cannot write in {existing} ({why})")
    return path
