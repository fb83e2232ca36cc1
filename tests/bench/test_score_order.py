"""bench.score_order run tiny: both comparisons per heuristic, planned-order times each way."""

from __future__ import annotations

import json

import pytest

from bench import score_order


@pytest.mark.slow
def test_each_heuristic_is_timed_planned_both_ways(capsys):
    assert score_order.main(["--graphs", "moe-30", "--clusters", "k80x2", "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in cell["rows"]}
    # a rule heuristic places without the simulator: the same placement, so the same planned time both ways
    assert rows["round_robin"]["planned_searched_s"] == pytest.approx(rows["round_robin"]["node_searched_s"])
    # a search simulates as many placements either way; what it finds is its own
    assert rows["random_search"]["simulated_node"] == rows["random_search"]["simulated_planned"] > 1
    best = cell["best_planned_searched"]
    assert best["step_time_s"] == min(r["planned_searched_s"] for r in cell["rows"] if r["planned_searched_s"])
    assert cell["lower_bound_s"] <= best["step_time_s"]
    assert score_order.main(["--graphs", "moe-30", "--clusters", "k80x2"]) == 0
    assert "| random_search |" in capsys.readouterr().out


def test_an_unknown_graph_exits_2_with_one_line(capsys):
    assert score_order.main(["--graphs", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1
