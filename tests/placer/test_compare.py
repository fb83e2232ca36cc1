"""placer compare: one scorer, every method a row, the bound last, JSON and CLI."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

import envs
import graphs
from graphs import OpGraph, PlacerError
from graphs.plan import Placement
from graphs.synthetic import random_dag
from placer.cli import main
from placer.compare import compare, plot
from placer.methods import registry as baselines

QUICK = {"random_search": {"n": 32}, "annealing": {"steps": 32}, "ilp": {"time_limit_s": 1, "num_workers": 1}}


@pytest.fixture(scope="module")
def graph():
    return random_dag(120, seed=4)


@pytest.fixture(scope="module")
def cluster():
    return envs.Cluster.preset("k80x4")


@pytest.fixture(scope="module")
def report(graph, cluster):
    return compare(graph, cluster, seed=0, options=QUICK)


def test_every_method_is_a_row_and_the_bound_is_last(report):
    methods = [r.method for r in report.rows]
    assert set(baselines.names()) <= set(methods)
    assert methods[-1] == "lower bound" and report.rows[-1].kind == "bound"
    for r in report.rows:
        if r.kind == "bound":
            continue
        assert r.status in ("ok", "oom", "not installed", "needs a model"), (r.method, r.status, r.message)
        if r.status == "ok":
            assert r.step_time_s >= report.lower_bound_s * (1 - 1e-9)
            assert r.place_time_s is not None and r.place_time_s >= 0
            assert r.speedup == pytest.approx(report.best_single_s / r.step_time_s)
            assert set(r.peak_bytes) == set(report.devices)


def test_best_heuristic(report):
    best = report.best()
    assert best is not None and best.step_time_s == min(
        r.step_time_s for r in report.rows if r.kind == "heuristic" and r.status == "ok"
    )


def test_json_shape(report):
    doc = json.loads(json.dumps(report.to_dict()))
    assert {"rows", "lower_bound_s", "best_single_s", "best_heuristic", "graph_hash"} <= set(doc)
    for row in doc["rows"]:
        assert {"method", "step_time_s", "status", "place_time_s", "speedup", "peak_bytes"} <= set(row)


def test_deterministic_for_a_seed(graph, cluster):
    a = compare(graph, cluster, methods=["random_search", "annealing", "metis"], seed=7, options=QUICK)
    b = compare(graph, cluster, methods=["random_search", "annealing", "metis"], seed=7, options=QUICK)
    assert [r.step_time_s for r in a.rows] == [r.step_time_s for r in b.rows]


def test_placement_rows_and_foreign_placement(graph, cluster):
    p = baselines.place("m_topo", graph, cluster)
    rep = compare(graph, cluster, methods=["round_robin"], placements=[("learned", p)])
    row = rep.rows[1]
    assert row.method == "learned" and row.kind == "placement"
    assert row.step_time_s == pytest.approx(envs.simulate(graph, p, cluster).step_time_s)
    other = random_dag(120, seed=5)
    with pytest.raises(PlacerError, match="made for graph"):
        compare(other, cluster, methods=["round_robin"], placements=[("learned", p)])


def test_error_row_does_not_sink_the_table(graph, cluster, monkeypatch):
    def boom(graph, cluster, *, seed=0):
        raise RuntimeError("kaboom\nsecond line")

    baselines.names()
    monkeypatch.setitem(baselines._REGISTRY, "boom", boom)
    rep = compare(graph, cluster, methods=["boom", "round_robin"])
    assert rep.rows[0].status == "error" and rep.rows[0].message == "RuntimeError: kaboom"
    assert rep.rows[1].status == "ok"
    assert "error: RuntimeError: kaboom" in rep.table()


def test_not_installed_row(graph, cluster, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)
    rep = compare(graph, cluster, methods=["metis"])
    assert rep.rows[0].status == "not installed" and rep.rows[0].step_time_s is None


def test_unknown_method(graph, cluster):
    with pytest.raises(PlacerError, match="unknown placement method"):
        compare(graph, cluster, methods=["nope"])


def test_plot(report, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bars.png"
    plot(report, str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlacerError, match="needs matplotlib"):
        plot(report, str(out))


def test_cli_says_on_stderr_which_method_it_runs_and_the_total_time(graph, tmp_path, capsys):
    path = tmp_path / "g.json"
    graphs.save(graph, str(path))
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "round_robin,m_etf", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays the JSON document
    lines = captured.err.strip().splitlines()
    assert lines[:2] == ["placer: compare: 1/2 round_robin", "placer: compare: 2/2 m_etf"]
    assert re.fullmatch(r"placer: compare: 2 methods in \d+\.\d s", lines[2]) and len(lines) == 3
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "m_etf", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_cli_json_table_and_bad_placement(graph, cluster, tmp_path, capsys):
    path = tmp_path / "g.json"
    graphs.save(graph, str(path))
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "round_robin,m_etf", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in doc["rows"]] == ["round_robin", "m_etf", "previous bound", "lower bound"]
    assert (
        doc["lower_bound_s"] >= doc["previous_lower_bound_s"]
        and doc["lower_bound_name"]
        and doc["previous_lower_bound_name"]
    )
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "gpipe"]) == 0
    out = capsys.readouterr().out
    assert "| gpipe | ok |" in out and "| lower bound |" in out
    foreign = tmp_path / "p.json"
    baselines.place("m_topo", random_dag(120, seed=5), cluster).save(foreign)
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "gpipe", "--placement", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert str(foreign) in err and "made for graph" in err and len(err.strip().splitlines()) == 1
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "nope"]) == 2
    capsys.readouterr()
    assert (
        main(["compare", str(path), "--cluster", "k80x4", "--methods", "m_etf", "--score-order", "planned", "--json"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["score_order"] == "planned" and len(doc["rows"][0]["order"]) == graph.num_ops
    assert main(["compare", str(path), "--cluster", "k80x4", "--methods", "m_etf", "--score-order", "planned"]) == 0
    assert "each placement in its planned issue order" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["compare", str(path), "--cluster", "k80x4", "--score-order", "best"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--score-order" in err and len(err.strip().splitlines()) == 1


def test_cli_placement_row(graph, cluster, tmp_path, capsys):
    path = tmp_path / "g.json"
    graphs.save(graph, str(path))
    pfile = tmp_path / "best.json"
    Placement.from_indices(graph, cluster.device_names, np.full(graph.num_ops, 1), method="rl").save(pfile)
    assert (
        main(
            [
                "compare",
                str(path),
                "--cluster",
                "k80x4",
                "--methods",
                "round_robin",
                "--placement",
                str(pfile),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][1]["method"] == str(pfile) and doc["rows"][1]["status"] == "ok"


def test_cli_table_says_one_memory_unit_the_bound_and_when_the_model_is_too_small(tmp_path, capsys):
    # a tiny model: every method at 1.00x, every peak under a GB (the table once said 0.0 GiB for all of them,
    # beside out-of-memory messages in GB), and a "previous bound" row nothing explained
    path = str(tmp_path / "tiny.json")
    graphs.save(
        OpGraph.from_edges(["a", "b"], [("a", "b", 4096)], flops=[1e6, 1e6], param_bytes=[1 << 20, 0], name="tiny"),
        path,
    )
    assert main(["compare", path, "--cluster", "k80x4", "--methods", "single,m_etf"]) == 0
    out = capsys.readouterr().out
    assert "peak MB (cpu:0, gpu:0" in out and "GiB" not in out and "| single | ok |" in out
    single = next(line for line in out.splitlines() if line.startswith("| single"))
    assert single.split("|")[-2].strip() != "0.0/0.0/0.0/0.0/0.0"
    assert "previous bound" not in out and "lower bound: no placement runs a step faster" in out
    assert "this model is too small to gain from splitting it over devices" in out


def test_cli_table_of_a_model_over_a_gb_is_in_gb_like_the_out_of_memory_messages(graph, cluster, capsys):
    # 4x with grads and Adam's two moments (its fused step adds nothing): 4 x 4 GiB = 17.18 GB
    big = OpGraph.from_edges(["w"], [], flops=[1e9], param_bytes=[4 << 30], name="big")
    table = compare(big, cluster, methods=["single"]).table()
    assert "peak GB (" in table and "out of memory on gpu:0: peak 17.18 GB > capacity 12.00 GB" in table
    assert "| 0.0/17.2/0.0/0.0/0.0 |" in table


def test_place_and_compare_help_list_the_heuristics(capsys):
    for command in ("place", "compare"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(name in text for name in baselines.names()), command


def test_a_planned_comparison_searches_and_scores_every_heuristic_in_its_planned_order(
    graph, cluster, step_time_orders
):
    """score_order="planned": the searches score their candidates in the planned order (as placer train's
    samples are) and each row is timed in, and carries, its placement's planned order."""
    asked = step_time_orders
    r = compare(
        graph, cluster, methods=["random_search", "m_etf"], options={"random_search": {"n": 16}}, score_order="planned"
    )
    assert asked and all(o == "planned" for o in asked)  # random_search's draws and every row's scoring
    env = envs.SimEnv(graph, cluster)
    for row in r.rows[:2]:
        idx = row.placement.indices(graph, cluster.device_names)
        np.testing.assert_array_equal(row.placement.order, env.schedule_order(idx))
        assert row.placement.meta["issue_order"] == "schedule"
        assert row.step_time_s == pytest.approx(float(env.step_times(idx[None], order="planned")[0][0]))
    assert r.score_order == "planned" and r.to_dict()["score_order"] == "planned"
    # a pipelined plan: the order of microbatch 0, the step of all of them
    row = compare(graph, cluster, methods=["m_etf"], microbatches=2, score_order="planned").rows[0]
    idx, env2 = row.placement.indices(graph, cluster.device_names), env.with_microbatches(2)
    np.testing.assert_array_equal(row.placement.order, env2.schedule_order(idx))
    assert row.microbatches == 2 and row.step_time_s == pytest.approx(
        float(env2.step_times(idx[None], order="planned")[0][0])
    )
    asked.clear()
    r = compare(graph, cluster, methods=["random_search"], options={"random_search": {"n": 16}})
    assert r.rows[0].placement.order is None and set(asked) == {None} and r.score_order == "node"
    with pytest.raises(PlacerError, match="score order 'best'"):
        compare(graph, cluster, methods=["m_etf"], score_order="best")


def test_each_row_counts_the_placements_its_method_simulated(graph, cluster):
    r = compare(graph, cluster, methods=["random_search", "m_etf", "single"], options={"random_search": {"n": 32}})
    sims = {row.method: row.simulated for row in r.rows}
    gpus = len(cluster.gpu_indices())
    # its 32 draws and its scoring; a rule heuristic's scoring alone; one placement per GPU and the scoring
    assert sims == {"random_search": 33, "m_etf": 1, "single": gpus + 1, "previous bound": 0, "lower bound": 0}
    assert r.to_dict()["rows"][0]["simulated"] == 33
    # searched over two microbatch counts: every plan is counted
    assert compare(graph, cluster, methods=["m_etf"], microbatches=[1, 2]).rows[0].simulated == 2


def test_cli_bound_seconds_adds_the_block_bound(tmp_path, capsys):
    """A fan s -> b0, b1 -> j on two GPUs with 0.5 s copies: the block bound (10.5 s, what the best placement takes)
    beats the path bounds (9 s) only when asked for; a negative or non-finite --bound-seconds exits 2 on one line."""
    from tests.envs.sim.test_blocks import fan

    g, c = fan(2, 0.5)
    gpath, cpath = tmp_path / "fan.json", tmp_path / "two_gpus.json"
    graphs.save(g, str(gpath))
    cpath.write_text(json.dumps(c.to_dict()))
    assert main(["compare", str(gpath), "--cluster", str(cpath), "--methods", "single,m_etf", "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["lower_bound_name"] != "blocks" and fast["lower_bound_s"] == pytest.approx(9.0)
    assert (
        main(
            [
                "compare",
                str(gpath),
                "--cluster",
                str(cpath),
                "--methods",
                "single,m_etf",
                "--bound-seconds",
                "10",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["lower_bound_name"] == "blocks" and doc["lower_bound_s"] == pytest.approx(10.5)
    assert all(r["step_time_s"] >= doc["lower_bound_s"] * (1 - 1e-9) for r in doc["rows"] if r["status"] == "ok")
    for bad in ("-1", "nan"):
        assert main(["compare", str(gpath), "--cluster", str(cpath), "--bound-seconds", bad]) == 2
        err = capsys.readouterr().err
        assert "--bound-seconds" in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def fork():
    """a on cpu:0, b and c on gpu:0: issuing b before a overlaps them (the eager host blocks while a runs)."""
    g = OpGraph.from_edges(["a", "b", "c"], [("a", "c", 4), ("b", "c", 4)], flops=[2e9, 2e10, 1e6], name="fork")
    c = envs.Cluster.preset("k80x2")
    p = Placement.from_indices(g, c.device_names, [0, 1, 1], method="learned")
    p.order = np.array([1, 0, 2])
    return g, c, p


def test_a_given_placement_is_scored_in_its_own_issue_order_in_the_table_and_the_plot(fork, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    g, c, p = fork
    own = envs.simulate(g, p, c).step_time_s
    assert own < envs.simulate(g, p, c, order=np.arange(3)).step_time_s * 0.9  # the order matters here
    report = compare(g, c, methods=["single"], placements=[("learned", p)])
    assert report.rows[1].step_time_s == pytest.approx(own)
    assert report.to_dict()["rows"][1]["step_time_s"] == pytest.approx(own)
    assert report.to_dict()["rows"][1]["order"] == [1, 0, 2]
    drawn = []
    barh = Axes.barh
    monkeypatch.setattr(
        Axes, "barh", lambda self, y, width, **kw: drawn.append(list(width)) or barh(self, y, width, **kw)
    )
    plot(report, str(tmp_path / "bars.png"))
    assert drawn[0][1] == pytest.approx(own * 1e3)


def test_cli_footer_weighs_every_row_and_scores_a_placement_file_in_its_order(fork, tmp_path, capsys):
    """--methods single --placement P: P's row, 1.1x faster than single, keeps the footer from calling the model
    too small (the footer once looked at the heuristics alone), and is timed in the order its file carries."""
    g, c, p = fork
    gpath, ppath = str(tmp_path / "fork.json"), str(tmp_path / "p.json")
    graphs.save(g, gpath)
    p.save(ppath)
    own = envs.simulate(g, p, c).step_time_s
    assert main(["compare", gpath, "--cluster", "k80x2", "--methods", "single", "--placement", ppath]) == 0
    out = capsys.readouterr().out
    assert f"| {ppath} | ok | {own * 1e3:.3f} | 1.10x |" in out
    assert "too small" not in out
    assert main(["compare", gpath, "--cluster", "k80x2", "--methods", "single"]) == 0
    assert "too small to gain from splitting" in capsys.readouterr().out  # the heuristics alone are all 1.00x


def test_a_heuristic_row_is_of_kind_heuristic_and_an_old_report_with_baseline_rows_still_reads(report):
    from placer.compare import CompareReport

    doc = json.loads(json.dumps(report.to_dict()))
    kinds = {r["method"]: r["kind"] for r in doc["rows"]}
    assert kinds["m_etf"] == "heuristic" and kinds["lower bound"] == "bound" and "baseline" not in kinds.values()
    again = CompareReport.from_dict(doc)
    assert again.to_dict() == doc and again.best().method == doc["best_heuristic"]
    old = json.loads(json.dumps(doc).replace('"kind": "heuristic"', '"kind": "baseline"'))  # as earlier releases wrote
    read = CompareReport.from_dict(old)
    assert [r.kind for r in read.rows] == [r.kind for r in report.rows] and read.best().method == doc["best_heuristic"]


def test_the_chart_draws_every_ok_row_but_the_bound(report):
    from placer.compare import bars

    drawn = bars(report)
    ok = [r for r in report.rows if r.kind != "bound" and r.status == "ok"]
    assert [(m, k) for m, _, k in drawn] == [(r.method, r.kind) for r in ok]
    assert [t for _, t, _ in drawn] == pytest.approx([r.step_time_s * 1e3 for r in ok])


# ------------------------------------------------------------ across processes (--ranks)
def _chain(n: int = 12) -> OpGraph:
    names = [f"layers.{k}.mm" for k in range(n)]
    return OpGraph.from_edges(
        names,
        [(a, b, 4_000_000) for a, b in zip(names, names[1:])],
        flops=[2e9 * (1 + k % 3) for k in range(n)],
        module_paths=names,
        param_bytes=[4_000_000] * n,
    )


def test_ranks_scores_every_row_on_the_simulator_of_ranks_and_gives_the_bound_of_ranks():
    from envs.sim.ranks import RankSim

    g, cluster = _chain(), envs.Cluster.preset("k80x2")
    methods = ["single", "round_robin", "equal_layers", "flops_balanced", "stage_search"]
    gpipe = Placement.from_indices(g, cluster.device_names, [1] * 6 + [2] * 6, method="mine", microbatches=2)
    report = compare(g, cluster, methods=methods, placements=[gpipe], microbatches=[1, 2], ranks=True)
    assert [r.method for r in report.rows] == [*methods, "mine", "lower bound"]  # no earlier bound across ranks
    sim, one_process = RankSim(g, cluster), envs.SimEnv(g, cluster)
    # the bound of ranks at the smaller of the two Ms scored (the one-process bound does not hold here)
    assert report.executor == "ranks" and report.lower_bound_s == min(float(sim.lower_bound(M)) for M in (1, 2))
    assert report.rows[-1].kind == "bound" and report.previous_lower_bound_s is None
    differs = 0
    for r in report.rows[:-1]:
        assert r.status == "ok", (r.method, r.message)
        expected = sim.simulate(r.placement)
        assert (
            r.step_time_s == pytest.approx(expected.step_time_s, rel=1e-12)
            and r.microbatches == r.placement.microbatches
        )
        differs += abs(one_process.simulate(r.placement).step_time_s - r.step_time_s) > 1e-6 * r.step_time_s
        assert r.step_time_s >= report.lower_bound_s
    assert differs  # (the one-process simulator scores these plans otherwise: the rows are not its figures)
    by = {r.method: r.step_time_s for r in report.rows}
    assert by["stage_search"] <= min(by["equal_layers"], by["flops_balanced"]) * (1 + 1e-9)  # its start, improved
    # what its search spent on the simulator of ranks is counted (at both M): its start's 3 splits, then its moves
    spent = {r.method: r.simulated for r in report.rows}
    assert spent["stage_search"] > 2 * 3 and spent["equal_layers"] == 0
    doc = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert doc["lower_bound_s"] == report.lower_bound_s and doc["executor"] == "ranks"


def test_compare_cli_ranks_prints_the_scorer_and_the_bound_of_ranks(tmp_path, capsys):
    path = tmp_path / "chain.json"
    graphs.save(_chain(), path)
    args = ["compare", str(path), "--cluster", "k80x2", "--methods", "equal_layers,stage_search", "--ranks"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "scored by the simulator of ranks (one process per device)" in out and "| lower bound" in out
    assert "lower bound: no plan runs a step faster across these ranks, whatever its stages and schedule" in out
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in doc["rows"]] == ["equal_layers", "stage_search", "lower bound"]
    assert doc["executor"] == "ranks"


def test_the_bound_holds_for_a_method_given_its_own_microbatches():
    """A method's own ``microbatches`` option scores its plan at another M than the comparison's: the bound is the
    least over every M a row was scored at (at M = 1 alone it was 0.240 s here, over gpipe's 0.107 s at M = 4)."""
    names = [f"l{i}" for i in range(8)]
    g = OpGraph.from_edges(
        names,
        [(a, b, 4_000_000) for a, b in zip(names, names[1:])],
        flops=[4e10] * 8,
        module_paths=[f"layers.{i}" for i in range(8)],
        param_bytes=[1_000_000] * 8,
    )
    cluster = envs.Cluster.preset("k80x4")
    report = compare(g, cluster, methods=["single", "gpipe"], options={"gpipe": {"microbatches": 4}})
    by = {r.method: r for r in report.rows}
    assert by["single"].microbatches == 1 and by["gpipe"].microbatches == 4
    assert report.lower_bound_s == pytest.approx(float(envs.SimEnv(g, cluster, microbatches=4).lower_bound()))
    assert all(r.step_time_s >= report.lower_bound_s for r in report.rows if r.kind != "bound" and r.status == "ok")
