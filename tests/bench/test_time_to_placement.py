"""bench.time_to_placement: the recording scorer, the table, and real (tiny) search curves."""

from __future__ import annotations

import numpy as np
import pytest

import envs
from bench import time_to_placement
from graphs import PlacerError
from graphs.synthetic import random_dag


class FakeEnv:
    """step_times returns the first column of the batch as seconds; negative means OOM."""

    marker = "fake"

    def step_times(self, op_devices, order=None):
        t = np.asarray(op_devices, dtype=float)[:, 0]
        return np.abs(t), t < 0


def test_recording_counts_every_placement_and_keeps_the_best_that_fits():
    rec = time_to_placement.RecordingEnv(FakeEnv())
    rec.step_times(np.array([[5], [3], [-1], [4]]))
    rec.step_times(np.array([[2], [6]]))
    assert rec.evals == 6
    assert rec.best_s == [5.0, 3.0, 2.0] and rec.evals_at == [1, 2, 5]
    assert all(a <= b for a, b in zip(rec.wall_s, rec.wall_s[1:]))
    assert rec.marker == "fake"  # everything else is the wrapped env's
    c = rec.curve("g", "m")
    assert c["end_evals"] == 6 and c["best_s"] == [5.0, 3.0, 2.0] and c["method"] == "m"


def test_deadline_stops_the_search():
    rec = time_to_placement.RecordingEnv(FakeEnv(), deadline_s=0.0)
    with pytest.raises(time_to_placement.SearchBudgetExhausted):
        rec.step_times(np.array([[1]]))
    rec.deadline_s = None
    rec.restart()
    rec.step_times(np.array([[1]]))
    assert rec.evals == 1


def test_evaluate_is_recorded_too():
    g = random_dag(20, seed=0)
    rec = time_to_placement.RecordingEnv(envs.SimEnv(g, envs.Cluster.preset("k80x2")))
    results = rec.evaluate([np.ones(20, dtype=np.int32), np.zeros(20, dtype=np.int32)])
    assert rec.evals == 2 and rec.best == min(r.step_time_s for r in results)


def test_table_reports_when_the_expert_was_beaten():
    curve = {
        "graph": "g",
        "method": "annealing",
        "wall_s": [0.0, 2.0, 5.0],
        "evals": [1, 40, 90],
        "best_s": [0.3, 0.19, 0.15],
        "end_wall_s": 10.0,
        "end_evals": 200,
    }
    res = {
        "graph": "g",
        "cluster": "k80x4",
        "num_ops": 9,
        "lower_bound_s": 0.1,
        "evals_per_s": 20.0,
        "reference": {"expert": 0.2, "m_etf": None},
        "curves": [curve],
    }
    line = time_to_placement.markdown_table([res]).splitlines()[2]
    assert line == "| g | annealing | 200 | 20 | 150.00 | 5.0 / 90 | 2.0 / 40 |"
    assert "m_etf OOM" in time_to_placement.reference_lines([res])


def test_unknown_method_or_bad_budget():
    g = random_dag(20, seed=0)
    c = envs.Cluster.preset("k80x2")
    with pytest.raises(PlacerError, match="unknown"):
        time_to_placement.search_curves(g, c, budget_s=1, methods=["gradient_descent"])
    with pytest.raises(PlacerError, match="positive"):
        time_to_placement.search_curves(g, c, budget_s=0, methods=["annealing"])


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard, not a speed target: each method's 1 s budget must end it
def test_real_curves_are_monotone_and_above_the_bound():
    g = random_dag(80, seed=3, name="g80")
    c = envs.Cluster.preset("k80x4")
    out = time_to_placement.search_curves(g, c, budget_s=1.0, methods=["annealing", "random_search", "rl-seq2seq"])
    assert [cv["method"] for cv in out["curves"]] == ["annealing", "random_search", "rl-seq2seq"]
    for cv in out["curves"]:
        assert cv["best_s"], cv["method"]
        assert all(b < a for a, b in zip(cv["best_s"], cv["best_s"][1:]))
        assert min(cv["best_s"]) >= out["lower_bound_s"] * (1 - 1e-9)
        assert cv["end_evals"] >= cv["evals"][-1] and cv["end_wall_s"] >= cv["wall_s"][-1]
