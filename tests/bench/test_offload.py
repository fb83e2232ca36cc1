"""The offload scenario (issue 34): the cap, the rivals' plans, FSDP2's offload, the measured-reward loop (CPU
stand-in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import envs
import graphs
from bench import offload
from bench.measured_rl import Recorder, curves, fine_tune, hand_off, read_curves
from bench.offload import SCENARIOS, Plan
from envs.result import Result
from placer.learn import checkpoint
from placer.learn.config import TrainConfig
from placer.learn.runners import train
from placer.methods.heuristics.costs import MEMORY_HEADROOM
from policies.seq2seq import Seq2SeqPolicy

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _plan(label: str, kind: str, status: str = "ok", t: float = 1.0) -> Plan:
    return Plan(label, kind, object(), {"status": status, "step_time_s": t})  # type: ignore[arg-type]


def test_measure_order_puts_placer_the_gpu_and_accelerate_first_then_the_host_then_fitting_heuristics():
    plans = [
        _plan("heft", "heuristic", t=3.0),
        _plan("m_etf", "heuristic", "oom", 0.1),
        _plan("all on cpu:0", "single", t=9.0),
        _plan("accelerate, a", "accelerate", "oom"),
        _plan("all on gpu:0", "single", "oom"),
        _plan("annealing", "heuristic", t=0.5),
        _plan("placer, trained on the simulator", "placer"),
        Plan("metis", "heuristic", None, {"status": "no plan"}),
    ]
    assert [p.label for p in offload.measure_order(plans)] == [
        "placer, trained on the simulator",
        "all on gpu:0",
        "accelerate, a",
        "all on cpu:0",
        "annealing",
        "heft",
        "m_etf",
        "metis",
    ]


@pytest.mark.slow
def test_the_scenario_does_not_fit_its_cap_with_headroom_but_its_weights_do_and_accelerate_fills_in_module_order():
    s = SCENARIOS["llama-256k"]
    model, inputs = offload.build(s, meta=True)
    g = graphs.capture(model, inputs, name=s.name)
    c = offload.scenario_cluster(s)
    assert 1.4e9 < g.total_param_bytes / 4 < 1.7e9 and g.total_param_bytes < 0.3 * s.gpu_cap_bytes
    gpu, host = offload.single_plans(g, c)[1], offload.single_plans(g, c)[0]
    # the state at the end of the backward (weights, Adam's moments, every gradient) is 95 % of the cap: past the
    # headroom the searches keep (the allocator's reserve and the CUDA context take the rest)
    state = 4 * g.total_param_bytes
    assert MEMORY_HEADROOM * s.gpu_cap_bytes < state < gpu.sim["peak_bytes"]["gpu:0"] < 1.01 * state
    assert host.sim["status"] == "ok"
    at_cap, *lowered = offload.accelerate_plans(g, c, model, fractions=(1.0, 0.2))
    assert (at_cap.placement.indices(g) == 1).all()  # its weights all fit the cap
    idx = lowered[0].placement.indices(g)
    head = [i for i, m in enumerate(g.module_paths) if m.endswith("lm_head")]
    embed = [i for i, m in enumerate(g.module_paths) if "embed_tokens" in m]
    assert (idx[head] == 0).all() and (idx[embed] == 1).all() and lowered[0].sim["status"] == "ok"
    # the plan it misses: the embedding (a gather) on the host, the rest, the head included, on the capped GPU
    emb = np.array([0 if "embed_tokens" in m else 1 for m in g.module_paths])
    fits = envs.SimEnv(g, c).simulate(emb)
    assert fits.status == "ok" and fits.step_time_s < lowered[0].sim["step_time_s"] / 5


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_tied_scenario_reads_one_tensor_in_its_embedding_and_its_head_and_can_home_it():
    from dataclasses import replace

    from envs.sim.homes import homeable

    assert SCENARIOS["llama-1b"].tied and not SCENARIOS["llama-256k"].tied
    s = replace(SCENARIOS["tiny"], tied=True)
    model, inputs = offload.build(s)
    lm = model.model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    g = graphs.capture(model, inputs, name="tiny-tied")
    untied = graphs.capture(*offload.build(SCENARIOS["tiny"]), name="tiny")
    table = s.vocab_size * s.hidden_size * 4
    assert untied.total_param_bytes - g.total_param_bytes == table  # one table, not two
    assert g.meta["tied_params"] == [["model.lm_head.weight", "model.model.embed_tokens.weight"]]
    readers = [i for i, names in enumerate(g.params) if "model.lm_head.weight" in names]
    assert len(readers) == 2 and homeable(g)[readers[0]] == 1  # the embedding and the head, one home


def test_a_fine_tuning_scenario_freezes_its_embedding_and_first_layers_and_can_home_their_weights():
    from dataclasses import replace

    from envs.sim.homes import homeable
    from graphs.ops import frozen_home_bytes, grad_mask

    assert SCENARIOS["llama-3b-ft"].trainable_layers == 4 and SCENARIOS["llama-3b"].trainable_layers == -1
    s = replace(SCENARIOS["tiny"], trainable_layers=1)
    model, inputs = offload.build(s)
    g = graphs.capture(model, inputs, name="tiny-ft")
    frozen = g.meta["frozen_params"]
    assert "model.model.embed_tokens.weight" in frozen and any(n.startswith("model.model.layers.0.") for n in frozen)
    assert not any(n.startswith(("model.model.layers.1.", "model.lm_head", "model.model.norm")) for n in frozen)
    held = frozen_home_bytes(g)
    assert held.sum() == g.buffer_bytes.sum() - sum(  # every frozen weight is homeable; the rotary table is a buffer
        int(b) for b, names in zip(g.buffer_bytes, g.params) if b and not set(names) & set(frozen)
    )
    assert (homeable(g)[held > 0] == 1).all()
    assert not grad_mask(g)[held > 0].any()  # all before the first trainable layer: none runs a backward


def test_curves_follow_the_real_best_and_the_simulators_pick():
    rec = [  # n: real (status, s), simulated (status, s)
        {"real_status": "oom", "real_step_time_s": None, "sim_status": "oom", "sim_step_time_s": None},
        {"real_status": "ok", "real_step_time_s": 2.0, "sim_status": "ok", "sim_step_time_s": 1.0},
        {"real_status": "ok", "real_step_time_s": 1.5, "sim_status": "ok", "sim_step_time_s": 1.2},
        {"real_status": "oom", "real_step_time_s": None, "sim_status": "ok", "sim_step_time_s": 0.5},
        {"real_status": "ok", "real_step_time_s": 1.0, "sim_status": "ok", "sim_step_time_s": 0.9},
    ]
    c = curves(rec)
    assert c["real_best_s"] == [None, 2.0, 1.5, 1.5, 1.0]
    assert c["sim_pick_real_s"] == [
        None,
        2.0,
        2.0,
        None,
        None,
    ]  # the simulator keeps its 1.0 s pick, then the 0.5 s one
    assert c["parted_at"] == 2 and c["fit_disagreements"] == [3]
    assert c["median_real_over_sim"] == pytest.approx(np.median([2.0, 1.25, 1.0 / 0.9]))
    # the simulator's pick ran out of memory for real: they part there, though the real best did not change
    c = curves(rec[1:2] + rec[3:4])
    assert c["parted_at"] == 1 and c["sim_pick_real_s"] == [2.0, None] and c["real_best_s"] == [2.0, 2.0]


def test_the_curves_plot_to_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.measured_rl import plot_curves

    rec = [
        {"real_status": "ok", "real_step_time_s": 2.0, "sim_status": "ok", "sim_step_time_s": 1.0},
        {"real_status": "oom", "real_step_time_s": None, "sim_status": "ok", "sim_step_time_s": 0.5},
    ]
    plot_curves(curves(rec), str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def _two_chains() -> graphs.OpGraph:
    names = [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)]
    edges = [(f"a{i}", f"a{i + 1}", 1 << 20) for i in range(3)] + [(f"b{i}", f"b{i + 1}", 1 << 20) for i in range(3)]
    return graphs.OpGraph.from_edges(
        names, edges, flops=[2e11] * 8, op_types=["aten.mm.default"] * 8, name="two_chains"
    )


class SlowGPU:
    """A stand-in for measurement that disagrees with the simulator: each op on the GPU costs ``penalty_s`` more."""

    def __init__(self, graph, cluster, penalty_s: float) -> None:
        self.sim, self.penalty_s, self.calls = envs.SimEnv(graph, cluster), penalty_s, 0

    def evaluate(self, placements):
        self.calls += len(placements)
        out = []
        for p in placements:
            r = self.sim.simulate(np.asarray(p))
            out.append(
                Result(
                    r.step_time_s + self.penalty_s * int(np.sum(np.asarray(p) == 1)),
                    r.status,
                    source="measured",
                    peak_bytes=r.peak_bytes,
                )
            )
        return out


def _greedy(graph, logdir: str, hidden: int) -> np.ndarray:
    policy = Seq2SeqPolicy(graph, 2, max_groups=0, hidden=hidden)
    policy.load_state_dict(torch.load(os.path.join(logdir, checkpoint.CHECKPOINT_PT), weights_only=True)["policy"])
    return policy.greedy()


@pytest.mark.slow
@pytest.mark.parametrize("learning", [True, False])
def test_measured_rewards_move_the_simulators_policy(tmp_path, monkeypatch, learning):
    """Fine-tuning starts from the simulator's converged policy (all on the GPU) and, exploring around it, follows the
    measured rewards where they disagree (here every op on the GPU is 1 s slower: all on the host is best)."""
    g, c = _two_chains(), envs.resolve_cluster("h200x1")
    cpath = tmp_path / "c.json"
    cpath.write_text(json.dumps(c.to_dict()))
    config = TrainConfig(
        cluster=str(cpath),
        iterations=30,
        samples=8,
        max_groups=0,
        warm_start="none",
        lr=0.02,
        logdir=str(tmp_path / "sim"),
        progress=False,
        heuristics=(),
    )
    train(config, graph=g, cluster=c)
    before = _greedy(g, str(tmp_path / "sim"), config.hidden)
    assert (before == 1).all()  # the simulator's optimum
    measured = SlowGPU(g, c, penalty_s=1.0)
    if not learning:  # the update switched off: the policy cannot follow the rewards
        import placer.learn.algos as algos

        monkeypatch.setattr(
            algos.Reinforce, "update", staticmethod(lambda policy, optimizer, sample, adv, c: (0.0, 0.0))
        )
    r = fine_tune(
        g, c, str(cpath), measured, str(tmp_path / "sim"), str(tmp_path / "ft"), iterations=40, exploration=3.0
    )
    after = _greedy(g, str(tmp_path / "ft"), config.hidden)
    assert checkpoint.load(str(tmp_path / "ft"))[1]["run"]["warm_start"].startswith("the simulator-trained policy")
    assert r.iterations == 40 and measured.calls > 10
    records = read_curves(str(tmp_path / "ft" / "curves.jsonl"))
    assert len(records) == measured.calls  # every placement scored once, and recorded with the simulator's view
    assert all(rec["sim_step_time_s"] <= rec["real_step_time_s"] for rec in records)
    if learning:
        assert (after == 0).all(), (before, after)  # measurement says the host is faster, and the policy followed
        assert r.best_step_time_s == pytest.approx(measured.evaluate([after])[0].step_time_s)
    else:
        assert np.array_equal(after, before)


def test_hand_off_keeps_the_policy_and_its_items_and_starts_a_fresh_record(tmp_path):
    g, c = _two_chains(), envs.resolve_cluster("h200x1")
    config = TrainConfig(
        cluster="h200x1", iterations=3, samples=4, logdir=str(tmp_path / "sim"), progress=False, heuristics=("single",)
    )
    train(config, graph=g, cluster=c)
    saved_tensors, saved = checkpoint.load(str(tmp_path / "sim"))
    assert saved["run"]["iteration"] == 3 and saved["run"]["best_indices"] is not None
    assert hand_off(str(tmp_path / "sim"), str(tmp_path / "ft"))["samples"] == 4
    tensors, state = checkpoint.load(str(tmp_path / "ft"))
    run = state["run"]
    assert run["iteration"] == 0 and run["best_indices"] is None and run["elapsed_s"] == 0.0
    assert run["warm_start_indices"] == saved["run"]["warm_start_indices"]  # the items the policy places
    assert all(torch.equal(tensors["policy"][k], v) for k, v in saved_tensors["policy"].items())
    with pytest.raises(graphs.PlacerError, match="already holds a checkpoint"):
        hand_off(str(tmp_path / "sim"), str(tmp_path / "ft"))


def test_recorder_records_each_placement_once_with_the_simulators_view(tmp_path):
    g, c = _two_chains(), envs.resolve_cluster("h200x1")
    rec = Recorder(SlowGPU(g, c, 0.5), envs.SimEnv(g, c), str(tmp_path / "curves.jsonl"))
    a, b = np.ones(8, dtype=np.int32), np.zeros(8, dtype=np.int32)
    t, failed = rec.step_times(np.stack([a, b, a]))
    assert t[0] == t[2] and not failed.any()
    rec.evaluate([b])
    lines = read_curves(str(tmp_path / "curves.jsonl"))
    assert [x["n"] for x in lines] == [1, 2] and lines[0]["real_step_time_s"] == pytest.approx(
        lines[0]["sim_step_time_s"] + 4.0
    )
    again = Recorder(SlowGPU(g, c, 0.5), envs.SimEnv(g, c), str(tmp_path / "curves.jsonl"))  # a resumed run
    again.evaluate([a, b])
    assert len(read_curves(str(tmp_path / "curves.jsonl"))) == 2


# ------------------------------------------------------------------ FSDP2's offload
@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpointed"])
def test_fsdp2_offload_runs_on_one_process_and_trains_as_the_unwrapped_model(checkpoint):
    """FSDP2 with CPUOffloadPolicy on a world of one (gloo over an in-process store: a cpu mesh), the tiny scenario:
    every block sharded (and checkpointed), and the same losses as plain Adam steps on the same seeded model."""
    from bench.fsdp2 import measure_offload
    from envs.real.timing import train_step

    s = SCENARIOS["tiny"]
    r = measure_offload(offload.builder(s), "cpu", warmup_steps=1, timed_steps=3, checkpoint=checkpoint)
    assert r.status == "ok", r.message
    assert r.extra["sharded_blocks"] == s.num_layers and len(r.extra["step_times_s"]) == 3
    assert r.extra["checkpoint"] is checkpoint
    assert r.extra["protocol"]["steady_malloc"]  # the rival timed as placer's plans are
    model, inputs = offload.build(s)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plain = [float(train_step(model, inputs, opt)) for _ in range(4)]
    assert r.extra["losses"] == pytest.approx(plain[1:], rel=1e-5)
    assert not torch.distributed.is_initialized()  # the world of one is gone


def test_fsdp2_s_checkpointed_blocks_keep_their_inputs_only():
    """With ``checkpoint``, each block is a :class:`bench.fsdp2.Checkpointed` whose forward saves less for the
    backward than the plain sharded block does, and both train."""
    from bench.fsdp2 import Checkpointed, shard_with_offload, world_of_one

    saved = {}
    for on in (False, True):
        model, inputs = offload.build(SCENARIOS["tiny"])
        with world_of_one(torch.device("cpu")):
            shard_with_offload(model, torch.device("cpu"), checkpoint=on)
            wrapped = [m for m in model.modules() if isinstance(m, Checkpointed)]
            assert len(wrapped) == (SCENARIOS["tiny"].num_layers if on else 0)
            total = [0]

            def pack(t, total=total):
                total[0] += t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(*inputs)
            loss.backward()
            saved[on] = total[0]
    assert saved[True] < 0.9 * saved[False], saved  # the tiny model: its head's activations stay


def test_fsdp2_failure_is_a_result():
    from bench.fsdp2 import measure_offload

    def broken():
        raise MemoryError()

    r = measure_offload(broken, "cpu")
    assert r.status == "oom" and np.isinf(r.step_time_s)


# ------------------------------------------------------------------ bench.gpu_offload, on the CPU stand-in
def _subprocess(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m bench.gpu_offload ARGS`` in the checkout's root."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    command = [sys.executable, "-m", "bench.gpu_offload", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.fixture
def run_here(run_entry):
    """``gpu_offload.main(ARGS)`` in this process, without ray: ``(status, stdout, stderr)``."""
    from bench import gpu_offload

    return lambda *args: run_entry(gpu_offload, *args)


@pytest.mark.slow
def test_a_profile_calibrates_the_plans_and_every_simulated_column(tmp_path, without_ray, run_here):
    """The issue's "placer's plan from the calibrated simulator": after the profile stage, the rivals stage plans and
    simulates with the profile; plans made before it are simulated again; a profile of another graph is refused.
    The first stage runs as the GPU machine runs it: ``python -m``, without ray."""
    from envs.real.profiler import apply_profile, calibrate_cluster, load_profile
    from graphs.plan import Placement

    out = tmp_path / "offload"
    quick = ("--tiny", "--out-dir", str(out), "--train-budget", "1", "--deadline", "0.1", "--json")
    before = _subprocess("rivals", *quick, env_extra=without_ray)
    assert before.returncode == 0, before.stderr[-2000:]
    assert json.loads(before.stdout)["simulator"] == "estimates"
    status, _, stderr = run_here("profile", "--tiny", "--out-dir", str(out), "--profile-repeats", "1")
    assert status == 0, stderr[-2000:]
    g = graphs.load(out / "graph.json")
    doc = load_profile(out / "profile.json")
    assert (
        doc["graph_hash"] == g.content_hash and set(doc["devices"]) == {"cpu"} and doc["devices"]["cpu"]["step_s"] > 0
    )
    status, stdout, stderr = run_here("rivals", *quick)
    assert status == 0, stderr[-2000:]
    assert "plans made with the simulator's estimates: simulated again with its profile" in stderr
    report = json.loads(stdout)
    assert report["simulator"] == "profile"  # plans.json keeps what the plans were made with: the estimates
    assert json.loads((out / "plans.json").read_text())["simulator"] == "estimates"
    calibrated = envs.SimEnv(
        apply_profile(g, doc),
        calibrate_cluster(offload.scenario_cluster(SCENARIOS["tiny"]), doc, graph=g, device_map="*=cpu"),
    )
    plans = {p["label"]: p for p in json.loads((out / "plans.json").read_text())["plans"]}
    old = {r["label"]: r for r in json.loads(before.stdout)["rows"]}
    for row in report["rows"]:
        if row["label"] in ("all on cpu:0", "heft"):
            want = calibrated.simulate(Placement.from_dict(plans[row["label"]]["placement"])).step_time_s
            assert row["sim_step_time_s"] == pytest.approx(want) and row["sim_step_time_s"] != pytest.approx(
                old[row["label"]]["sim_step_time_s"]
            )

    doc["graph_hash"] = "0" * 16
    (out / "profile.json").write_text(json.dumps(doc))
    status, _, stderr = run_here("rivals", *quick)
    assert status == 2 and stderr.strip().splitlines()[-1].startswith("gpu_offload: ")
    assert "profile.json: profiled graph 0000000000000000, not this graph" in stderr


def test_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    from bench import gpu_offload

    for args, needle in (
        (["rivals", "--tiny", "--steps", "0", "--out-dir", str(tmp_path)], "--steps"),
        (["rivals", "--scenario", "huge", "--device-map", "*=cpu", "--out-dir", str(tmp_path)], "--scenario"),
        (["rivals", "--device-map", "gpu:0=cuda:7", "--out-dir", str(tmp_path)], "cuda:7"),
        (["report", "--out-dir", str(tmp_path / "none")], "rows.json"),
        (["finetune", "--tiny", "--out-dir", str(tmp_path / "empty")], "rivals stage first"),
        (["adam", "--threads", "x"], "--threads"),
        (["profile", "--tiny", "--profile-repeats", "0", "--out-dir", str(tmp_path)], "--profile-repeats"),
    ):
        assert gpu_offload.main(args) == 2, args
        err = capsys.readouterr().err
        assert err.strip().count("\n") == 0 and needle in err, (args, err)
