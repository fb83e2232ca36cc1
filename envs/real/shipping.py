"""What the measured env ships to its Ray workers: the module a ``module:callable`` SOURCE names.

A worker on another machine has placer and the libraries it needs installed,
but not the user's own code. So the driver finds the top-level module of
SOURCE as it would import it (the driver's working directory first, then
``sys.path``, which holds ``PYTHONPATH``), without importing it, and ships it
through Ray's runtime environment (``py_modules``): a single ``.py`` file as
itself, a package as its whole directory (``__pycache__``, ``*.pyc`` and
``.git`` left out; Ray also leaves out what ``.gitignore`` lists). Modules
that come from an installed distribution (``site-packages``, the standard
library) and placer's own packages are not shipped: every node has them.

A worker then imports SOURCE from the shipped copy: Ray puts it first on the
worker's ``PYTHONPATH``, and :func:`shipped_root` puts it before the
directories Ray adds for the driver (its working directory), so a stale copy
at the same path on a worker's machine cannot shadow it.

>>> plan = ship_plan("nmt-2")  # a zoo name: nothing to ship
>>> plan is None
True
"""

from __future__ import annotations

import importlib.machinery
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from types import ModuleType

from graphs.errors import PlacerError

#: The most a shipped module may hold: model code, not data (Ray's own hard limit is 512 MiB).
SHIP_LIMIT_BYTES = 100 * 2**20
#: Left out of a shipped package (gitignore patterns, as Ray's ``excludes`` reads them).
EXCLUDES = ("__pycache__", "*.pyc", ".git")
#: Placer's own packages: installed on every node with placer, never shipped.
_OWN = frozenset({"graphs", "envs", "policies", "placer", "bench"})


@dataclass(frozen=True)
class Shipment:
    """The user's module as shipped: its top-level name, its file or package directory, its size."""

    module: str
    path: str
    size_bytes: int

    def runtime_env(self) -> dict:
        """Ray's job-level runtime environment that ships it."""
        return {"py_modules": [self.path], "excludes": list(EXCLUDES)}

    def describe(self) -> str:
        kind = "package" if os.path.isdir(self.path) else "module"
        return f"{kind} {self.module} ({self.path}, {_mib(self.size_bytes)})"


def ship_plan(source: object, search_dir: str | None = None, limit_bytes: int = SHIP_LIMIT_BYTES) -> Shipment | None:
    """The module to ship for ``source`` (None: a zoo name, a callable, an installed or built-in module).

    Raises :class:`PlacerError` (one line naming SOURCE) when the module cannot be
    found or holds more than ``limit_bytes``.
    """
    if not isinstance(source, str) or ":" not in source:
        return None
    top = source.partition(":")[0].split(".")[0]
    if top in _OWN:
        return None
    path = _module_path(top, os.path.abspath(search_dir or os.getcwd()))
    if path is None:
        raise PlacerError(f"{source}: cannot find module {top!r} (not in the current directory or on PYTHONPATH)")
    if not path or _installed(path):
        return None
    size = _size_bytes(path, limit_bytes)
    if size > limit_bytes:
        raise PlacerError(
            f"{source}: {path}, shipped to the Ray workers, holds more than {_mib(limit_bytes)} "
            f"(the limit for model code); move data files out of it"
        )
    return Shipment(top, path, size)


def _module_path(top: str, search_dir: str) -> str | None:
    """The file or package directory ``import top`` gives (``""``: not shippable, e.g. built in; None: not found)."""
    loaded = sys.modules.get(top)
    if isinstance(loaded, ModuleType):
        return _spec_path(loaded.__spec__)
    spec = importlib.machinery.PathFinder.find_spec(top, [search_dir, *sys.path])
    if spec is None:
        return "" if top in sys.builtin_module_names else None
    return _spec_path(spec)


def _spec_path(spec: importlib.machinery.ModuleSpec | None) -> str:
    if spec is None:
        return ""
    locations = list(spec.submodule_search_locations or [])
    if locations:  # a package: its one directory (a namespace package split over several is not shipped)
        return os.path.abspath(locations[0]) if len(locations) == 1 else ""
    origin = spec.origin or ""
    return os.path.abspath(origin) if origin.endswith(".py") and os.path.isfile(origin) else ""


def _installed(path: str) -> bool:
    """True for a path inside site-packages or the standard library."""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    roots.update(site.getsitepackages() + [site.getusersitepackages()])
    real = os.path.realpath(path)
    return any(real == r or real.startswith(os.path.realpath(r) + os.sep) for r in roots)


def _size_bytes(path: str, stop_above: int) -> int:
    """Bytes of the files shipped from ``path`` (the walk stops once past ``stop_above``)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".git")]
        for name in files:
            if not name.endswith(".pyc"):
                total += os.path.getsize(os.path.join(root, name))
        if total > stop_above:
            break
    return total


def shipped_root(module: str) -> str | None:
    """In a worker: the directory on ``PYTHONPATH`` that holds the shipped ``module`` (Ray puts it first).

    None when no entry holds it (the worker was started without the runtime environment).
    """
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (
            os.path.isfile(os.path.join(entry, module + ".py")) or os.path.isdir(os.path.join(entry, module))
        ):
            return entry
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


__all__ = ["EXCLUDES", "SHIP_LIMIT_BYTES", "Shipment", "ship_plan", "shipped_root"]
