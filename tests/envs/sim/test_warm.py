"""python -m envs.sim.warm: every kernel it runs compiles into numba's cache; no arguments."""

from __future__ import annotations

import pytest

from envs.sim import warm


def test_warm_runs_the_kernels_and_says_how_long(capsys):
    assert warm.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("envs.sim.warm: the simulator's kernels are compiled and cached (") and out.endswith(" s)\n")


def test_an_argument_is_one_line_and_status_2_and_help_teaches(capsys):
    with pytest.raises(SystemExit) as stop:
        warm.main(["--fast"])
    assert stop.value.code == 2 and capsys.readouterr().err == "envs.sim.warm: unrecognized arguments: --fast\n"
    with pytest.raises(SystemExit) as stop:
        warm.main(["--help"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m envs.sim.warm")
