"""Shared by the tests of the benchmarks: an entry point's ``main`` run in this process, as on a lent GPU machine."""

from __future__ import annotations

import gc
import importlib
import sys

import pytest


@pytest.fixture
def run_entry(capsys):
    """``run(module, *ARGS, ray=False)``: ``module.main(ARGS)`` here, ``(exit status, stdout, stderr)``. Without
    ray unless ``ray``, as on the lent GPU machines: ``import ray`` fails, and so does the one module that imports it
    (:mod:`envs.real.measured`), however much of it an earlier test imported."""

    def run(module, *args: str, ray: bool = False) -> tuple[int, str, str]:
        with pytest.MonkeyPatch.context() as mp:
            if not ray:
                mp.setitem(sys.modules, "ray", None)
                mp.setitem(sys.modules, "envs.real.measured", None)
            try:
                status = module.main(list(args))
            except SystemExit as e:  # a usage error (argparse): the status the process would exit with
                status = e.code
        out, err = capsys.readouterr()
        return status, out, err

    return run


def freeze_after_importing(*modules: str) -> None:
    """Import ``modules`` (what an in-process run imports lazily), then set every object alive aside from the garbage
    collector (``gc.freeze``), as long-lived objects are: the measurement protocol still collects before and after
    each placement (``LocalEnv``, :func:`envs.real.timing.no_gc`) and frees what the run makes, but no longer walks
    the whole pytest process each time (0.25-0.5 s a collection)."""
    for name in modules:
        importlib.import_module(name)
    gc.freeze()
