"""Fixtures shared by every test package."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once every test module is imported (torch, transformers, Ray, the project): set what is alive aside from the
    garbage collector (``gc.freeze``), as a long-running process's imports are. Every collection after, Python's own
    and the ``gc.collect()`` the measured envs make before and after each placement, walks only what the tests make
    (it walked the whole pytest process, 0.25-0.5 s a collection). What the tests make is still collected."""
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Where a test file ends (its module's fixtures torn down): collect what it left, then set the rest aside as
    :func:`pytest_collection_finish` does. What one file keeps alive for the session (captures, exported programs,
    lru caches) was walked again by every later collection (about 300 full collections a worker, 21-32 s); now each
    walks only what the running file made. Set-aside objects are still freed when nothing refers to them."""
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


#: The ``_system_config`` of every Ray cluster a test starts: Ray nices its workers to 15 by default, and beside a
#: busy test worker they then starve (one measured test took 90 s instead of 10 s beside two busy cores).
RAY_UNNICED = {"worker_niceness": 0}


def fast_first(values, fast: int = 1) -> list:
    """``values`` for ``pytest.mark.parametrize``: the first ``fast`` in the fast tier, the rest marked slow.

    The fast tier (``-m "not slow"``) checks each property on a sample; the whole suite (CI) on every value."""
    values = list(values)
    return values[:fast] + [pytest.param(v, marks=pytest.mark.slow) for v in values[fast:]]


def importable_module(directory: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Path:
    """Write module ``name`` (the text ``source``) into ``directory``, make that the working directory and put it on
    ``sys.path``, forgetting a module of that name an earlier test imported; returns ``directory``.

    What a user does before passing ``name:build`` as a SOURCE.
    """
    (directory / f"{name}.py").write_text(source)
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    sys.modules.pop(name, None)
    return directory


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory):
    """One capture per zoo model per test run, shared by every test file and every xdist worker.

    Points ``PLACER_CACHE_DIR`` at a directory of this run, so tests never read a
    developer's ``~/.cache/placer`` and the real zoo is captured once per run: under
    xdist, the workers' base directories share a parent, and the cache's writes are
    atomic (:func:`graphs.io.save`), so one worker reads what the other captured.
    """
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "placer-cache"
    path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLACER_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def without_ray(tmp_path_factory) -> dict[str, str]:
    """Environment entries for a subprocess that cannot import ``ray``, as on the lent GPU machines (they have none).

    A ``ray`` package first on ``PYTHONPATH`` that raises on import: what the GPU scripts (validate_gpu, gpu_offload,
    gpu_conformance) import must not reach :mod:`envs.real.measured`, lazily or not.
    """
    shim = tmp_path_factory.mktemp("no_ray") / "ray"
    shim.mkdir()
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ray' (blocked by the test)\", name='ray')\n"
    )
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(shim.parent), os.environ.get("PYTHONPATH", "")) if p)}


@pytest.fixture
def step_time_orders(monkeypatch):
    """The ``order`` of every :meth:`envs.SimEnv.step_times` and :meth:`~envs.SimEnv.overflow` call made while
    the test runs, in call order."""
    import envs

    asked: list = []
    for name in ("step_times", "overflow"):
        method = getattr(envs.SimEnv, name)

        def spy(self, op_devices, order=None, method=method):
            asked.append(order)
            return method(self, op_devices, order)

        monkeypatch.setattr(envs.SimEnv, name, spy)
    return asked


#: What the ``test`` extra installs that some tests import (and would otherwise skip without).
TEST_EXTRAS = (
    "transformers",
    "accelerate",
    "ortools",
    "matplotlib",
    "pymetis",
    "pyscotch",
    "hypothesis",
    "ray",
    "psutil",
)


def missing_test_extras(modules=TEST_EXTRAS) -> list[str]:
    """The modules of ``modules`` that do not import, each with its error's first line."""
    import importlib

    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # an extra that is installed but broken counts as missing
            missing.append(f"{name} ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})")
    return missing


def pytest_sessionstart(session):
    """In CI (``CI`` set) a test extra that does not import fails the run instead of skipping its tests silently."""
    import os

    if os.environ.get("CI", "").lower() in ("", "0", "false"):
        return
    missing = missing_test_extras()
    if missing:
        raise pytest.UsageError("CI: test extras that do not import (pip install -e '.[test]'): " + "; ".join(missing))


def file_order(items, root, seconds) -> list:
    """``items`` in the order the files start: those ``seconds`` names (a CI run's, tests/durations.json), the longest
    first; then the other files holding slow tests; then the rest; each file's tests in their own order."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item):
        rel = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        return -seconds.get(rel, 0), item.path not in slow

    return sorted(items, key=key)  # stable: the order within a file stays


def pytest_collection_modifyitems(session, config, items):
    """The longest files start first (:func:`file_order`).

    With two workers and ``--dist loadfile`` a file runs on one worker; a long file that
    starts last keeps one worker busy while the other has nothing left. Starting the
    long files first lets the short ones fill in at the end. xdist keeps this order only
    with ``--no-loadscope-reorder`` (setup.cfg): by default it starts the files with the
    most tests first, and a 50 s file of one test last.
    """
    import json

    durations = Path(__file__).with_name("durations.json")
    seconds = json.loads(durations.read_text())["seconds"] if durations.exists() else {}
    items[:] = file_order(items, config.rootpath, seconds)
