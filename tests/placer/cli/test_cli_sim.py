"""`placer clusters`, `placer place`, `placer simulate`: outputs, files, exit status 2 on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphs
from graphs.plan import Placement
from graphs.synthetic import random_dag
from placer.cli import main


@pytest.fixture
def files(tmp_path):
    g = random_dag(120, seed=4, name="rand")
    gpath = tmp_path / "g.json"
    graphs.save(g, gpath)
    return tmp_path, g, str(gpath)


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_clusters_list_show_and_json_round_trip(capsys, files):
    tmp, g, gpath = files
    rc, out, _ = run(capsys, "clusters")
    assert rc == 0 and all(
        n in out for n in ("k80x2", "k80x4", "v100x4", "h100x8", "h200x1", "a100-40gx4", "a100-80gx8", "l4x4")
    )
    rc, out, _ = run(capsys, "clusters", "v100x4")
    assert rc == 0 and "gpu:3" in out and "45 GB/s" in out
    rc, out, _ = run(capsys, "clusters", "k80x2", "--json")
    cpath = tmp / "c.json"
    cpath.write_text(out)
    rc, out, _ = run(capsys, "place", gpath, "--cluster", str(cpath), "--method", "single", "-o", str(tmp / "p.json"))
    assert rc == 0 and "gpu:0: 120" in out
    rc, out, _ = run(capsys, "simulate", gpath, str(tmp / "p.json"), "--cluster", str(cpath), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["status"] == "ok" and 0 < doc["lower_bound_s"] <= doc["step_time_s"]
    rc, out2, _ = run(capsys, "simulate", gpath, str(tmp / "p.json"), "--cluster", "k80x2", "--json")
    assert json.loads(out2)["step_time_s"] == doc["step_time_s"]
    rc, out, _ = run(capsys, "clusters", "--json")
    assert [c["name"] for c in json.loads(out)] == [
        "k80x2",
        "k80x4",
        "v100x4",
        "h100x8",
        "h200x1",
        "a100-40gx4",
        "a100-80gx8",
        "l4x4",
    ]


def test_place_with_options_and_simulate_with_trace(capsys, files):
    tmp, g, gpath = files
    p = tmp / "p.json"
    rc, _, _ = run(
        capsys, "place", gpath, "--cluster", "k80x4", "--method", "single", "--option", "device=gpu:2", "-o", str(p)
    )
    assert rc == 0 and set(Placement.load(p).assignment.values()) == {"gpu:2"}
    trace = tmp / "t.json"
    rc, out, _ = run(capsys, "simulate", gpath, str(p), "--cluster", "k80x4", "--trace", str(trace))
    assert rc == 0
    for word in ("step time", "lower bound", "status      ok", "gpu:2", "peak memory"):
        assert word in out
    doc = json.loads(trace.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sum(e["name"].startswith("fwd ") for e in spans) == g.num_ops


def test_simulate_reports_oom(capsys, files):
    tmp, g, gpath = files
    doc = json.loads((run(capsys, "clusters", "k80x2", "--json"))[1])
    doc["devices"][1]["memory_bytes"] = 1e6
    cpath = tmp / "small.json"
    cpath.write_text(json.dumps(doc))
    p = tmp / "p.json"
    rc, out, _ = run(capsys, "place", gpath, "--cluster", str(cpath), "--option", "device=gpu:0", "-o", str(p))
    assert rc == 0 and "(out of memory on gpu:0: peak" in out and "ms ignoring memory)" in out  # not "ms simulated"
    rc, out, _ = run(capsys, "simulate", gpath, str(p), "--cluster", str(cpath), "--json")
    res = json.loads(out)
    assert rc == 0 and res["status"] == "oom" and res["step_time_s"] is None
    assert "gpu:0" in res["message"] and res["extra"]["oom_devices"] == ["gpu:0"]
    # without an explicit device, `single` picks one that fits
    rc, out, _ = run(capsys, "place", gpath, "--cluster", str(cpath), "-o", str(p))
    assert rc == 0 and "ms simulated, eager)" in out
    assert set(Placement.load(p).assignment.values()) == {"gpu:1"}


def test_simulate_scores_the_file_s_homes_and_checkpointed_blocks_as_the_simulator_does(capsys, tmp_path):
    # a -> b -> c -> d on gpu:0, module l0 = (a, b) and l1 = (c, d); a's 8 bytes of weights
    import envs

    g = graphs.OpGraph.from_edges(
        list("abcd"), [("a", "b", 1 << 20), ("b", "c", 1 << 20), ("c", "d", 1 << 20)], flops=[1e9] * 4
    )
    g.param_bytes = np.array([1 << 20, 0, 0, 0])
    g.params = [["w"], [], [], []]
    g.module_paths = ["l0", "l0", "l1", "l1"]
    gpath = tmp_path / "g.json"
    graphs.save(g, gpath)
    cluster = envs.Cluster.preset("h200x1")
    p = Placement.from_indices(g, cluster.device_names, [1, 1, 1, 1], homes=[0, -1, -1, -1])
    p.checkpoint = ["l1"]
    p.save(tmp_path / "p.json")
    expected = envs.SimEnv(g, cluster).simulate(p)
    plain = envs.SimEnv(g, cluster).simulate(Placement.from_indices(g, cluster.device_names, [1, 1, 1, 1]))
    assert expected.step_time_s != plain.step_time_s
    rc, out, _ = run(capsys, "simulate", str(gpath), str(tmp_path / "p.json"), "--cluster", "h200x1", "--json")
    assert rc == 0 and json.loads(out)["step_time_s"] == expected.step_time_s
    rc, out, _ = run(capsys, "simulate", str(gpath), str(tmp_path / "p.json"), "--cluster", "h200x1")
    assert "homes       1 parameters live apart" in out and "checkpoint  1 blocks run their forward again" in out
    # placer compare's row of the file: the same plan, whole
    argv = [
        "compare",
        str(gpath),
        "--cluster",
        "h200x1",
        "--methods",
        "single",
        "--placement",
        str(tmp_path / "p.json"),
    ]
    rc, out, _ = run(capsys, *argv, "--json")
    row = next(r for r in json.loads(out)["rows"] if r["kind"] == "placement")
    assert rc == 0 and row["step_time_s"] == expected.step_time_s


def test_bad_inputs_exit_2_with_one_line(capsys, files):
    tmp, g, gpath = files
    p = tmp / "p.json"
    assert run(capsys, "place", gpath, "--cluster", "k80x2", "-o", str(p))[0] == 0

    other = tmp / "other.json"
    graphs.save(random_dag(120, seed=5, name="other"), other)
    unknown_dev = tmp / "unknown.json"
    d = json.loads(p.read_text())
    d["assignment"] = {k: "gpu:7" for k in d["assignment"]}
    d["devices"] = ["cpu:0", "gpu:0", "gpu:7"]
    unknown_dev.write_text(json.dumps(d))
    missing = tmp / "missing.json"
    d = json.loads(p.read_text())
    d["assignment"].pop(g.names[5])
    missing.write_text(json.dumps(d))
    bad_cluster = tmp / "bc.json"
    bad_cluster.write_text(json.dumps({"devices": [{"name": "cpu:0"}]}))

    cases = [
        (["simulate", str(other), str(p), "--cluster", "k80x2"], "made for graph"),
        (["simulate", gpath, str(unknown_dev), "--cluster", "k80x2"], "unknown device 'gpu:7'"),
        (["simulate", gpath, str(missing), "--cluster", "k80x2"], "1 ops have no device"),
        (["simulate", gpath, str(p), "--cluster", str(bad_cluster)], "is missing 'kind'"),
        (["simulate", gpath, str(p), "--cluster", "k80x9"], "not a preset"),
        (["simulate", gpath, str(tmp / "nope.json"), "--cluster", "k80x2"], "no such file"),
        (["place", gpath, "--cluster", "k80x2", "--method", "nope", "-o", str(p)], "unknown placement method 'nope'"),
        (["place", gpath, "--cluster", "k80x2", "--option", "device", "-o", str(p)], "expected KEY=VALUE"),
        (["clusters", "k80x9"], "not a preset"),
    ]
    for argv, expected in cases:
        rc, out, err = run(capsys, *argv)
        assert rc == 2, (argv, out, err)
        assert expected in err and err.count("\n") == 1 and err.startswith("placer: error: "), (argv, err)


def uniform_profile(g: graphs.OpGraph, device: str, kind: str) -> dict:
    """A placer-profile/1 document of ``g`` timing every op on ``device`` at 1 ms forward and 2 ms backward."""
    times = {"kind": kind, "fwd_s": [1e-3] * g.num_ops, "bwd_s": [2e-3] * g.num_ops}
    return {
        "format": "placer-profile/1",
        "graph_hash": g.content_hash,
        "ops": list(g.names),
        "devices": {device: times},
        "links": [],
    }


def test_simulate_with_a_profile_uses_measured_times(capsys, files):
    tmp, g, gpath = files
    p = tmp / "p.json"
    assert run(capsys, "place", gpath, "--cluster", "k80x2", "--option", "device=gpu:0", "-o", str(p))[0] == 0
    prof = uniform_profile(g, "cuda:0", "gpu")
    ppath = tmp / "prof.json"
    ppath.write_text(json.dumps(prof))
    rc, out, _ = run(
        capsys,
        "simulate",
        gpath,
        str(p),
        "--cluster",
        "k80x2",
        "--profile",
        str(ppath),
        "--json",
        "--executor",
        "dataflow",
    )  # eager adds the host's dispatch of the first op
    res = json.loads(out)
    # every op measured at 1 ms forward + 2 ms backward, all on one GPU, plus the optimizer step
    assert rc == 0 and res["extra"]["backward_end_s"] == pytest.approx(g.num_ops * 3e-3)


def two_branches() -> graphs.OpGraph:
    """Two independent chains of heavy ops between a fork and a join: m_etf puts one on each GPU and plans their
    ops interleaved."""
    names = ["x"] + [f"a{k}" for k in range(6)] + [f"b{k}" for k in range(6)] + ["join"]
    edges = [("x", "a0", 4e6), ("x", "b0", 4e6), ("a5", "join", 4e6), ("b5", "join", 4e6)]
    edges += [(f"{c}{k}", f"{c}{k + 1}", 4e6) for c in "ab" for k in range(5)]
    return graphs.OpGraph.from_edges(names, edges, flops=[1e8] + [4e10] * 12 + [1e8])


def test_place_ranks_keeps_the_issue_order_that_runs_faster_across_processes(capsys, tmp_path):
    """m_etf's planned order interleaves the two GPUs' ops: 12 stages across processes, slower there than node
    order's 2; with --ranks the file keeps node order and says what it simulated."""
    from envs.cluster import Cluster
    from envs.sim.ranks import RankSim

    g = two_branches()
    graphs.save(g, tmp_path / "g.json")
    gpath, out = str(tmp_path / "g.json"), str(tmp_path / "p.json")
    rc, text, err = run(capsys, "place", gpath, "--cluster", "k80x2", "--method", "m_etf", "--ranks", "-o", out)
    assert rc == 0, err
    plan = Placement.load(out)
    sim = RankSim(g, Cluster.preset("k80x2"))
    kept = sim.simulate(plan)
    assert plan.meta["ranks_step_time_s"] == pytest.approx(kept.step_time_s, rel=1e-12)
    assert f"across processes: {kept.step_time_s * 1e3:.3f} ms simulated ({kept.extra['stages']} stages" in text
    bound = sim.lower_bound(plan.microbatches)  # what no plan of its M beats there, in the file and said
    assert plan.meta["ranks_lower_bound_s"] == float(bound) <= kept.step_time_s
    assert f"no plan of 1 microbatch on these ranks under {float(bound) * 1e3:.3f} ms ({bound.name})" in text
    busy = ", ".join(f"{d} {kept.busy_s[d] * 1e3:.1f} ms" for d in sorted(set(plan.assignment.values())))
    assert f"ranks busy: {busy} of the {kept.step_time_s * 1e3:.1f} ms step" in text
    # the whole model on its fastest rank alone, as compare's best single device, and the plan against it
    alone = min((sim.simulate(np.full(g.num_ops, d)).step_time_s, d) for d in range(3))
    assert (
        plan.meta["ranks_one_rank_s"] == alone[0] and plan.meta["ranks_one_rank"] == sim.cluster.device_names[alone[1]]
    )
    assert f"one rank alone: {alone[0] * 1e3:.3f} ms ({plan.meta['ranks_one_rank']}, the whole model" in text
    gain = alone[0] / kept.step_time_s
    assert f"this plan is {gain:.2f}x as fast" + ("" if gain >= 1 else " (a pipeline does not pay here)") in text
    rc, _, err = run(capsys, "place", gpath, "--cluster", "k80x2", "--method", "m_etf", "-o", str(tmp_path / "q.json"))
    planned = Placement.load(str(tmp_path / "q.json"))
    assert rc == 0 and "ranks_step_time_s" not in planned.meta and planned.order is not None
    assert plan.order is None and plan.meta["issue_order"] == "node" and kept.extra["stages"] == 2
    assert kept.step_time_s < sim.simulate(planned).step_time_s


def test_place_ranks_says_when_a_looped_plan_was_timed_without_per_op_times(capsys, files):
    """A plan of more stages than ranks, placed with --ranks and no --profile, gets a line on per-op times (the
    roofline alone was 21 % off such plans measured); one stage per rank, or a profile given, none."""
    tmp, g, gpath = files
    looped = ["--method", "flops_balanced", "--option", "stages_per_rank=2", "--option", "schedule=interleaved_1f1b"]
    rc, text, err = run(capsys, "place", gpath, "--cluster", "k80x2", *looped, "--ranks", "-o", str(tmp / "a.json"))
    assert rc == 0, err
    assert "note: 4 stages on 2 ranks, timed by the roofline alone" in text and "--profile ops.json" in text
    rc, text, err = run(
        capsys, "place", gpath, "--cluster", "k80x2", "--method", "flops_balanced", "--ranks", "-o", str(tmp / "b.json")
    )
    assert rc == 0 and "across processes" in text and "roofline alone" not in text
    (tmp / "prof.json").write_text(json.dumps(uniform_profile(g, "cpu", "cpu")))
    argv = ["place", gpath, "--cluster", "k80x2", *looped, "--ranks", "--profile", str(tmp / "prof.json")]
    rc, text, err = run(capsys, *argv, "-o", str(tmp / "c.json"))
    assert rc == 0, err
    assert "across processes" in text and "roofline alone" not in text
