"""python -m envs.sim.warm: every kernel it runs compiles into numba's cache; no arguments."""

from __future__ import annotations

from envs.sim import warm


def test_warm_runs_the_kernels_and_says_how_long(capsys):
    assert warm.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("envs.sim.warm: the simulator's kernels are compiled and cached (") and out.endswith(" s)\n")


def test_an_argument_is_one_line_and_status_2(capsys):
    assert warm.main(["--fast"]) == 2
    err = capsys.readouterr().err
    assert err == "envs.sim.warm: takes no arguments, got --fast\n"
