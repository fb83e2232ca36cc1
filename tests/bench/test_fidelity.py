"""bench.fidelity: the figures of a fidelity run, computed by hand from rows (what bench.validate_gpu reports)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from bench.fidelity.metrics import memory, order_checks, repeatability, scores, trusted_orders
from bench.fidelity.report import markdown, model_figures, run_summary
from bench.fidelity.runs import labels


def row(methods, real, sim, **kw):
    """A measured placement's row, as runs.rows writes it (``kind`` random, two logical devices)."""
    return {
        "model": "m",
        "kind": kw.pop("kind", "random"),
        "methods": methods,
        "issue_order": kw.pop("issue_order", "node"),
        "status": "ok",
        "real_step_s": real,
        "sim_step_s": {"eager": sim, "dataflow": sim * 1.5},
        "ops_per_device": kw.pop("ops_per_device", {"cpu:0": 1, "gpu:0": 1}),
        **kw,
    }


def test_scores_by_hand():
    sim, real = np.array([1.0, 2.0, 3.0, 1.0]), np.array([2.0, 1.0, 4.0, 3.0])
    s = scores(sim, real)
    # ranks: sim (1.5, 3, 4, 1.5), real (2, 1, 4, 3): Spearman = Pearson of the ranks
    assert s["spearman"] == pytest.approx(np.corrcoef([1.5, 3, 4, 1.5], [2, 1, 4, 3])[0, 1])
    assert s["mape"] == pytest.approx((0.5 + 1.0 + 0.25 + 2 / 3) / 4)
    # the simulator's best is placement 0 (first of two tied), which really takes 2.0; the real best takes 1.0
    assert (s["sim_best"], s["sim_best_ties"], s["best_ratio"], s["n"]) == (0, 2, 2.0, 4)
    assert s["pass"] == {"spearman": False, "mape": False, "best_ratio": False}
    good = scores(np.array([1.0, 2.0, 3.0]), np.array([1.02, 2.05, 3.1]))  # targets: 0.95, 10%, 1.03
    assert good["best_ratio"] == 1.0 and good["pass"] == {"spearman": True, "mape": True, "best_ratio": True}


def test_repeatability_is_the_median_difference_of_two_builds_and_drift_the_halves_of_the_rounds():
    rows = [
        row(["a"], 100.0, 1.0, repeat={"real_step_s": 102.0}, round_medians_s=[99.0, 101.0, 100.0, 104.0]),
        row(["b"], 50.0, 1.0, repeat={"real_step_s": 45.0}),
        row(["c"], 10.0, 1.0, repeat={"real_step_s": 10.1}),
        row(["d"], 20.0, 1.0),
    ]
    r = repeatability(rows)
    # |100-102|/101 = 1.98%, |50-45|/47.5 = 10.5%, |10-10.1|/10.05 = 1.0%: median 1.98%, worst 10.5%
    assert r["n"] == 3 and r["median"] == pytest.approx(2 / 101) and r["max"] == pytest.approx(5 / 47.5)
    assert r["pass"] is True and [p["placement"] for p in r["pairs"]] == ["a", "b", "c"]
    # drift of a: rounds 99, 101 (median 100) against 100, 104 (median 102): 2/101
    assert r["drift_n"] == 1 and r["drift_median"] == pytest.approx(2 / 101)
    assert repeatability([row(["x"], 1.0, 1.0)])["pass"] is None  # nothing measured twice: no verdict


def test_memory_compares_the_simulated_peak_with_the_allocators_per_gpu():
    rows = [
        row(["a"], 1.0, 1.0, real_peak_bytes={"gpu:0": 1000}, sim_peak_bytes={"cpu:0": 5, "gpu:0": 1080}),
        row(["b"], 1.0, 1.0, real_peak_bytes={"gpu:0": 2000}, sim_peak_bytes={"cpu:0": 5, "gpu:0": 1900}),
        row(["c"], 1.0, 1.0, real_peak_bytes={}, sim_peak_bytes={"cpu:0": 5, "gpu:0": 0}),
    ]  # all on the host: no GPU peak
    m = memory(rows)
    assert m["n"] == 2 and m["max_abs"] == pytest.approx(0.08) and m["median_abs"] == pytest.approx((0.08 + 0.05) / 2)
    assert m["within"] == 2 and m["pass"] is True and m["worst"][0]["placement"] == "a"
    rows[1]["sim_peak_bytes"]["gpu:0"] = 1500  # 25% under
    assert memory(rows)["pass"] is False and memory(rows)["within"] == 1


def test_order_checks_and_the_margin_from_the_tuned_models_applied_to_the_held_out_ones():
    ordered = [
        row(["heft"], 1.143, 0.97, issue_order="schedule", sim_node_step_s=1.0, node_order={"real_step_s": 1.0}),
        row(["m_etf"], 0.80, 0.83, issue_order="devices-first", sim_node_step_s=1.0, node_order={"real_step_s": 1.0}),
        row(["plain"], 1.0, 1.0),
    ]
    checks = order_checks(ordered, "nmt-4")
    assert [(c["placement"], c["ok"]) for c in checks] == [("heft", False), ("m_etf", True)]
    assert checks[0]["sim_ratio"] == pytest.approx(0.97) and checks[0]["real_ratio"] == pytest.approx(1.143)
    held = [{"sim_ratio": 0.9, "real_ratio": 1.05}, {"sim_ratio": 0.7, "real_ratio": 0.75}]
    t = trusted_orders(checks, held, 4)
    # tuned margin: heft over-predicted by 1.143 - 0.97 = 0.173; the held-out order predicted 10% faster is not kept
    assert t["record"]["margin"] == pytest.approx(0.173) and t["record"]["model_version"] == 4
    assert (t["held_out_checks"], t["held_out_kept"], t["held_out_worst_kept"], t["raw_worst"]) == (2, 1, 0.75, 1.05)
    assert t["pass"] is True
    held.append({"sim_ratio": 0.5, "real_ratio": 1.2})  # kept (50% predicted) and slower: the target fails
    assert trusted_orders(checks, held, 4)["pass"] is False


def test_labels_measure_each_ordered_placement_in_node_order_and_a_few_twice():
    logical = types.SimpleNamespace(device_names=["cpu:0", "gpu:0"])
    graph = types.SimpleNamespace(names=["a", "b", "c"])
    cands = [
        {"kind": "learned", "methods": ["rl"], "op_devices": np.array([1, 1, 1]), "order": None},
        {"kind": "baseline", "methods": ["heft"], "op_devices": np.array([0, 1, 1]), "order": np.array([0, 2, 1])},
        {"kind": "single", "methods": ["all on cpu:0"], "op_devices": np.array([0, 0, 0]), "order": None},
        {"kind": "random", "methods": ["random 0"], "op_devices": np.array([1, 0, 1]), "order": None},
    ]
    out = labels(cands, graph, logical, repeats=3)
    what = [(v["cand"], v["what"]) for v in out.values()]
    # the learned placement is all on the GPU: it and the first random one are built twice, last
    assert what == [
        (0, "placement"),
        (1, "placement"),
        (1, "node"),
        (2, "placement"),
        (3, "placement"),
        (0, "repeat"),
        (3, "repeat"),
    ]
    assert out[cands[1]["key"]]["order"].tolist() == [0, 2, 1] and out[cands[1]["key"] + "@node"]["order"] is None
    assert len({c["key"] for c in cands}) == 4


def test_model_figures_and_the_report():
    rows = [
        row(
            ["all on gpu:0"],
            1.0,
            1.05,
            kind="single",
            ops_per_device={"cpu:0": 0, "gpu:0": 2},
            repeat={"real_step_s": 1.01},
        ),
        row(["heft"], 1.5, 1.4, issue_order="schedule", sim_node_step_s=1.5, node_order={"real_step_s": 1.4}),
        row(["random 0"], 3.0, 2.9),
        {**row(["random 1"], 0.0, 2.0), "status": "oom", "real_step_s": None, "message": "out of memory"},
    ]
    m = {**model_figures("gpt2", "held-out", rows), "ops": 2}
    assert m["measured_ok"] == 3 and m["failed"] == ["random 1: oom: out of memory"]
    assert m["executors"]["eager"]["best_ratio"] == 1.0 and m["executors"]["eager"]["sim_best"] == "all on gpu:0"
    assert m["executors"]["eager"]["spearman"] == 1.0 and m["real_best"] == "all on gpu:0"
    assert m["all_on_gpu"] == {"sim_s": 1.05, "real_s": 1.0}
    assert m["repeatability"]["median"] == pytest.approx(0.01 / 1.005)
    summary = run_summary([m], 4)
    assert list(summary["groups"]) == ["held-out"] and summary["orders"]["held_out_checks"] == 1
    text = markdown([m], summary, "header")
    assert text.startswith("header\n") and "| held-out | gpt2 | 2 | 3 |" in text and "`schedule`" in text


# ------------------------------------------------------------------ host contention fitted on the tuned models
def _contention_item(name: str, group: str, real_op: float | None, probe: float = 90.0) -> dict:
    """A fan ``s -> a_k, b_k -> j`` whose ``b`` ops run on the host beside the GPU's: its rows' real steps are the
    simulated ones with ``contention_op = real_op`` (``None``: the probe's)."""
    from bench.fidelity import contention
    from envs import resolve_cluster
    from graphs import OpGraph

    k = 4
    names = ["s", *[f"a{i}" for i in range(k)], *[f"b{i}" for i in range(k)], "j"]
    edges = [("s", f"{x}{i}", 1 << 16) for x in "ab" for i in range(k)] + [
        (f"{x}{i}", "j", 1 << 16) for x in "ab" for i in range(k)
    ]
    g = OpGraph.from_edges(names, edges, flops=[1e6] * len(names), op_types=["aten.mm.default"] * len(names))
    n = g.num_ops
    prof = {
        "format": "placer-profile/1",
        "graph_hash": g.content_hash,
        "ops": list(g.names),
        "links": [],
        "devices": {
            "cpu": {"kind": "cpu", "fwd_s": [1e-3] * n, "bwd_s": [2e-3] * n, "contention": {"op": probe, "issue": 0.0}},
            "cuda:0": {
                "kind": "gpu",
                "fwd_s": [1e-3] * n,
                "bwd_s": [2e-3] * n,
                "issue_fwd_s": [2e-4] * n,
                "issue_bwd_s": [1e-3] * n,
            },
        },
    }
    rng = np.random.default_rng(len(name))
    rows = [
        {
            "methods": [f"random {i}"],
            "devices": rng.integers(0, 2, n).tolist(),
            "order": None,
            "ops_per_device": {"cpu:0": 1, "gpu:0": 1},
        }
        for i in range(8)
    ]
    item = {"name": name, "group": group, "graph": g, "prof": prof, "rows": rows}
    sims, _ = contention.rescored(
        item, contention.PROBE if real_op is None else real_op, resolve_cluster("h200x1"), "gpu:0=cuda:0,cpu:0=cpu"
    )
    item["rows"] = [{**r, "real_step_s": s["sim_step_s"]["eager"]} for r, s in zip(rows, sims)]
    return item


def test_contention_is_fitted_on_the_tuned_models_and_a_tie_keeps_the_probe():
    from bench.fidelity import contention
    from envs import resolve_cluster

    cluster, dmap = resolve_cluster("h200x1"), "gpu:0=cuda:0,cpu:0=cpu"
    tuned = [_contention_item("t1", "tuned", 8.0), _contention_item("t22", "tuned", 8.0)]
    fit = contention.fit(tuned, cluster, dmap)
    assert fit["op"] == 8.0 and fit["mape"] < 1e-9 < fit["probe_mape"]  # the grid value the real steps came from
    assert fit["probe"] == {"t1": {"cpu": 90.0}, "t22": {"cpu": 90.0}} and fit["models"] == ["t1", "t22"]
    assert set(fit["by_op"]) == {"probe", *map(str, contention.GRID)}
    # contention moves these steps at all (else the fit above proves nothing)
    assert len({round(v, 9) for v in fit["by_op"].values()}) > 3
    # real steps as the probe says: the probe stays
    assert contention.fit([_contention_item("t1", "tuned", None)], cluster, dmap)["op"] == "probe"
    # where contention changes nothing (every placement on the host), a tie: the probe stays
    flat = _contention_item("t1", "tuned", 8.0)
    flat["rows"] = [{**r, "devices": [0] * len(r["devices"])} for r in flat["rows"]]
    flat_fit = contention.fit([flat], cluster, dmap)
    assert flat_fit["op"] == "probe" and len(set(flat_fit["by_op"].values())) == 1
    # the probe is kept beside the value used
    prof = contention.with_contention(tuned[0]["prof"], 8.0)
    assert prof["devices"]["cpu"]["contention"] == {"op": 8.0, "issue": 0.0, "op_probe": 90.0}
    assert tuned[0]["prof"]["devices"]["cpu"]["contention"] == {"op": 90.0, "issue": 0.0}  # the input is not changed
    assert contention.fit([], cluster, dmap) is None


def test_the_tuned_models_contention_scores_the_held_out_ones():
    """The fit uses the tuned models only; every model, held out too, is then scored with it (rows, profile,
    figures)."""
    from bench.fidelity import contention
    from envs import resolve_cluster

    cluster, dmap = resolve_cluster("h200x1"), "gpu:0=cuda:0,cpu:0=cpu"
    items = [_contention_item("t1", "tuned", 8.0), _contention_item("h1", "held-out", 8.0)]
    for it in items:
        it["rows"] = [{**r, "sim_step_s": {"eager": 1.0, "dataflow": 1.0}} for r in it["rows"]]  # stale scores
        it["figures"] = model_figures(it["name"], it["group"], it["rows"])
    held_rows = items[1]["rows"]
    fit = contention.refit(items, cluster, dmap)
    assert fit["op"] == 8.0 and fit["models"] == ["t1"]
    assert items[1]["figures"]["executors"]["eager"]["mape"] < 1e-9  # rescored with the fit, not left stale
    assert items[1]["prof"]["devices"]["cpu"]["contention"]["op"] == 8.0 and items[1]["rows"] is not held_rows
    assert contention.refit([items[1]], cluster, dmap) is None  # no tuned model: nothing to fit
