"""The searches choose the checkpointed layers with the op placement (placer.learn.checkpoint_choice)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import envs
from envs.cluster import Cluster, Device
from envs.machines import PCIE5
from graphs import OpGraph
from graphs.plan import Placement, checkpoint_blocks
from placer.learn.checkpoint_choice import CheckpointScorer, candidate_blocks, kept_blocks, prune_blocks
from placer.learn.offload_plan import plan_with_homes

MB = 1 << 20
CPU, GPU = 0, 1


def activation_problem(memory_bytes: float | None = None) -> tuple[OpGraph, Cluster]:
    """An input op, then 6 layers of two matmuls (``layers.k``) with 64 MB outputs and no weights: the activations
    kept for the backward are what fills the GPU. A layer takes 10 s on the host and 10 ms on the GPU."""
    names, paths = ["inp"], [""]
    for k in range(6):
        names += [f"l{k}a", f"l{k}b"]
        paths += [f"layers.{k}.up", f"layers.{k}.down"]
    g = OpGraph.from_edges(
        names,
        [(a, b, 64 * MB) for a, b in zip(names, names[1:])],
        flops=[1e9] + [5e10] * 12,
        op_types=["aten.mm.default"] * len(names),
        name="activation-toy",
    )
    g.module_paths = paths
    g.out_bytes = np.full(len(names), 64 * MB)
    memory = 1e12 if memory_bytes is None else memory_bytes
    devices = [Device("cpu:0", "cpu", 64e9, 1e10, 1e10, 5e-6), Device("gpu:0", "gpu", memory, 1e13, 1e12, 6e-6)]
    return g, Cluster("toy-activations", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})


def on_gpu(g, cluster, checkpoint=()):
    p = Placement.from_indices(g, cluster.device_names, [GPU] * g.num_ops)
    p.checkpoint = list(checkpoint)
    return p


def test_the_candidates_are_the_largest_repeated_list_of_layers():
    g, _ = activation_problem()
    assert candidate_blocks(g) == [f"layers.{k}" for k in range(6)]
    g.module_paths = ["", *[f"enc.{k}.x" for k in range(6)], *[f"dec.blocks.{k}.y" for k in range(3)], "", "x"]
    g.module_paths[2] = "enc.0.z"  # enc.0 runs two ops, enc.1 one: too small to checkpoint
    assert candidate_blocks(g) == []  # no list with two members of two ops or more
    g.module_paths = ["", *[f"enc.{k // 2}.x" for k in range(12)]]
    assert candidate_blocks(g) == [f"enc.{k}" for k in range(6)]


def test_the_candidates_are_every_outermost_repeated_list_an_encoder_s_and_a_decoder_s():
    g, _ = activation_problem()  # 14 ops
    enc = [f"enc.layers.{k // 2}.x" for k in range(4)]  # 2 layers of 2 ops
    dec = [f"dec.layers.{k // 4}.experts.{k % 4 // 2}.y" for k in range(8)]  # 2 layers of 4, each 2 experts of 2
    g.module_paths = ["emb", *dec[:4], *enc, *dec[4:], "head"]  # the lists in the order their first op runs
    assert candidate_blocks(g) == ["dec.layers.0", "dec.layers.1", "enc.layers.0", "enc.layers.1"]


@pytest.mark.parametrize("checkpoint_by", ["both", "moves"])
def test_with_every_layer_checkpointed_the_model_fits_and_the_search_finds_it_and_prunes_what_it_need_not(
    checkpoint_by,
):
    g, big = activation_problem()
    env = envs.SimEnv(g, big)
    plain, every = env.simulate(on_gpu(g, big)), env.simulate(on_gpu(g, big, candidate_blocks(g)))
    assert every.peak_bytes["gpu:0"] < 0.7 * plain.peak_bytes["gpu:0"] and every.step_time_s > plain.step_time_s
    # a GPU that holds the checkpointed plan's activations, not the plain one's: without checkpointing some layers
    # must run on the host (100x slower)
    cap = (plain.peak_bytes["gpu:0"] + every.peak_bytes["gpu:0"]) / 2
    g, cluster = activation_problem(cap)
    env = envs.SimEnv(g, cluster)
    assert not env.simulate(on_gpu(g, cluster)).ok and env.simulate(on_gpu(g, cluster, candidate_blocks(g))).ok
    with_ck = plan_with_homes(g, cluster, evals=600, headroom=1.0, checkpoint_by=checkpoint_by)
    without = plan_with_homes(g, cluster, evals=600, headroom=1.0, checkpoint=False)
    r, r0 = env.simulate(with_ck), env.simulate(without)
    assert r.ok and r0.ok and not without.checkpoint
    assert with_ck.indices(g).tolist() == [GPU] * g.num_ops and with_ck.checkpoint
    assert r.step_time_s < 0.2 * r0.step_time_s  # no layer on the host
    # pruned: fewer layers checkpointed than the six, the plan still fits
    assert 0 < len(with_ck.checkpoint) < 6, with_ck.checkpoint
    search = with_ck.meta["checkpoint_search"]
    assert list(search) == (["moves", "every"] if checkpoint_by == "both" else ["moves"])
    assert all(arm["fits"] and arm["of"] == 6 for arm in search.values())
    # the faster search's plan is the file's: the fastest set that fits (every subset tried: layers 2, 3 and 4, or
    # ties), which the moves find
    fastest = min(
        t.step_time_s
        for k in range(7)
        for sub in itertools.combinations(candidate_blocks(g), k)
        if (t := env.simulate(on_gpu(g, cluster, sub))).ok
    )
    assert r.step_time_s == pytest.approx(fastest, rel=1e-9)
    assert search["moves"]["step_time_s"] == pytest.approx(fastest, rel=1e-9)
    assert min(arm["step_time_s"] for arm in search.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert with_ck.meta["evals"] <= 600
    assert r.step_time_s == with_ck.meta["step_time_s"]


def test_the_scorer_checkpoints_what_each_placement_keeps_whole_and_prune_keeps_what_pays():
    g, big = activation_problem()
    env = envs.SimEnv(g, big)
    names = candidate_blocks(g)
    rows = np.full((2, g.num_ops), GPU)
    rows[1, 2] = CPU  # layer 0 split across devices in row 1: that row runs it without checkpointing
    t, failed = CheckpointScorer(env, g, names).step_times(rows)
    ck = checkpoint_blocks(g, names)
    t0 = env.batch(rows[:1], checkpoint=ck)[0][0]
    t1 = env.batch(rows[1:], checkpoint=np.where(np.isin(ck, [1]), -1, ck))[0][0]
    assert t.tolist() == [t0, t1] and not failed.any()
    assert kept_blocks(env, g, names, rows[1]) == names[1:]
    # with room for everything, checkpointing only costs: every block is turned off
    kept, step_s, oom, used = prune_blocks(env, g, rows[0], None, names, evals=100)
    assert kept == [] and not oom and step_s == env.simulate(on_gpu(g, big)).step_time_s and used <= 100
