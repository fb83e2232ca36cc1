"""The throughput benchmark of the environments: every figure, from a short run on a small graph."""

from __future__ import annotations

import json

from bench import env_throughput


def test_every_figure_is_measured_and_relative_to_the_direct_scorer(capsys):
    argv = ["--graph", "synthetic/chain-40-s0", "--cluster", "k80x2", "--seconds", "0.05", "--batch", "8", "--json"]
    assert env_throughput.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    names = ("direct_batch", "direct_one", "direct_evaluate", "place_all", "place_all_peaks", "sequential")
    for name in names:
        row = report[name]
        assert row["placements_per_s"] > 0
        assert row["op_placements_per_s"] == row["placements_per_s"] * report["num_ops"]
        assert row["ratio"] == row["op_placements_per_s"] / report["direct_batch"]["op_placements_per_s"]
    assert report["direct_batch"]["ratio"] == 1.0
    same = report["place_all_peaks"]["placements_per_s"] / report["direct_evaluate"]["placements_per_s"]
    assert report["place_all_peaks"]["ratio_same"] == same


def test_bad_input_is_one_line_and_exit_status_2(capsys):
    assert env_throughput.main(["--graph", "nope/x", "--seconds", "0.01"]) == 2
    assert env_throughput.main(["--seconds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown dataset 'nope'" in err[0] and "--seconds" in err[1]
