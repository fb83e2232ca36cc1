"""bench.sim_throughput runs and reports the figures BENCHMARKS.md quotes."""

from __future__ import annotations

import json

from bench import sim_throughput


def test_sim_throughput_json(capsys):
    argv = ["--ops", "300", "--batch", "4", "--seconds", "0.2", "--json", "--executor", "both"]
    assert sim_throughput.main(argv) == 0
    both = json.loads(capsys.readouterr().out)
    assert sorted(both) == ["dataflow", "eager"]
    for executor, doc in both.items():
        assert doc["executor"] == executor
        assert doc["num_ops"] == 300 and doc["cluster"] == "k80x4"
        assert doc["op_placements_per_s"] > 0 and doc["scalar_simulate_s"] > 0
        assert 0 < doc["lower_bound_s"] <= doc["median_step_time_s"]


def test_the_simulator_of_ranks_is_timed_on_random_placements_and_on_splits(capsys):
    assert (
        sim_throughput.main(
            ["--ranks", "4", "--ops", "40", "--cluster", "k80x2", "--batch", "4", "--seconds", "0.05", "--json"]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["microbatches"] == 4 and doc["num_ops"] >= 40
    for kind in ("random", "splits"):
        assert doc[kind]["placements_per_s"] > 0 and doc[kind]["median_step_time_s"] > 0
