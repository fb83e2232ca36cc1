"""bench.table1: Table 1 rows, speed-ups, the markdown, and one real (tiny) row."""

from __future__ import annotations

import math

import pytest

import envs
from bench.common import parse_list
from bench.table1 import Table1Row, markdown_report, markdown_table, table1_row
from graphs import PlacerError
from graphs.synthetic import random_dag


def row(**kw) -> Table1Row:
    base = dict(
        graph="nmt",
        num_ops=10,
        cluster="k80x4",
        lower_bound_s=0.1,
        single_cpu_s=None,
        single_gpu_s=0.4,
        baselines={"single": 0.05, "expert": 0.3, "scotch": 0.25, "metis": None, "heft": 0.2, "m_etf": 0.22},
        statuses={"metis": "oom", "single_cpu": "oom"},
        rl={"seq2seq": 0.15, "hierarchical": 0.18},
    )
    base.update(kw)
    return Table1Row(**base)


def test_best_heuristics_skip_single_and_failed():
    r = row()
    assert r.best_heuristic() == ("heft", 0.2)  # "single" is a column, not a rival; metis ran out of memory
    assert r.best_other() == ("heft", 0.2)
    assert row(baselines={"expert": 0.1, "heft": 0.2}).best_other() == ("heft", 0.2)
    assert row(baselines={"metis": None}).best_heuristic() is None


def test_speedups_are_step_time_reductions_in_percent():
    r = row()
    assert r.best_rl() == ("seq2seq", 0.15)
    assert math.isclose(r.rl_speedup_pct("expert"), 50.0)
    assert math.isclose(r.rl_speedup_pct(), 25.0)
    slower = row(rl={"seq2seq": 0.25})
    assert math.isclose(slower.rl_speedup_pct(), -25.0)
    assert row(rl={"seq2seq": None}).rl_speedup_pct() is None
    assert row(baselines={"heft": 0.2}).rl_speedup_pct("expert") is None


def test_to_dict_has_the_derived_columns():
    d = row().to_dict()
    assert d["best_heuristic"] == "heft" and d["best_rl"] == "seq2seq"
    assert math.isclose(d["rl_speedup_over_expert_pct"], 50.0)


def test_markdown_cells():
    text = markdown_table([row(), row(baselines={"expert": 0.3, "heft": 0.2}, statuses={})])
    first, second = text.splitlines()[2:4]
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[:10] == [
        "nmt",
        "10",
        "k80x4",
        "OOM",
        "400",
        "250",
        "OOM",
        "300",
        "n/a",
        "**heft 200**",
    ]  # n/a: no ilp row
    assert cells[10:] == ["150", "180", "100", "+50.0%", "+25.0%"]
    assert "| n/a | n/a |" in second  # no scotch/metis row at all (not installed / not run)
    starved = row(rl={"seq2seq": None}, rl_runs={"seq2seq": {"iterations": 0}})
    assert "| none (0 iterations) | not run |" in markdown_table([starved])


def test_report_splits_paper_and_modern_clusters():
    text = markdown_report([row(), row(cluster="h100x8")], budget_s=60, warm_start="none", seed=3)
    assert text.index("paper's machines") < text.index("k80x4") < text.index("Modern machines") < text.index("h100x8")
    assert "60 s of training" in text and "from scratch" in text and "seed 3" in text


def test_parse_list():
    assert parse_list("a, b", what="graphs") == ["a", "b"]
    with pytest.raises(PlacerError, match="--graphs"):
        parse_list("a,,b", what="graphs")
    with pytest.raises(PlacerError, match="unknown zzz"):
        parse_list("seq2seq,zzz", what="policies", known=["seq2seq"])


@pytest.mark.slow
def test_a_real_row_on_a_small_graph():
    g = random_dag(60, seed=5, name="small")
    c = envs.Cluster.preset("k80x2")
    lines = []
    r = table1_row(
        g,
        c,
        rl_budget_s=None,
        rl_iterations=2,
        policies=("seq2seq",),
        progress=lines.append,
        compare_options={"annealing": {"steps": 32}, "random_search": {"n": 32}, "ilp": {"time_limit_s": 2.0}},
    )
    assert r.graph == "small" and r.cluster == "k80x2" and r.num_ops == 60
    assert {"expert", "metis", "heft"} <= set(r.baselines)
    assert r.rl["seq2seq"] is not None and r.rl["seq2seq"] >= r.lower_bound_s * (1 - 1e-9)
    assert r.single_cpu_s > r.single_gpu_s >= r.lower_bound_s  # a K80 beats the host CPU
    assert r.rl_runs["seq2seq"]["iterations"] == 2 and any("RL seq2seq" in line for line in lines)
