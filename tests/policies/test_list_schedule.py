"""The gnn policy's schedule decoder: its list-schedule features by hand, its order, and what it can learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import envs
from envs.sim.cost import activation_bytes, op_times, static_bytes
from graphs.ir import OpGraph
from graphs.synthetic import branch_dag, chain_dag
from placer.learn.algos import imitate
from placer.learn.config import AlgoOptions
from policies.gnn import GNNNet, GNNPolicy
from policies.list_schedule import DYN_DIM, ListSchedule, decode_order, teacher_forced


def _two_ops() -> OpGraph:
    return OpGraph.from_edges(
        ["a", "b"],
        [("a", "b", 40_000_000)],
        op_types=["aten.mm.default", "aten.relu.default"],
        flops=[4e11, 1e9],
        param_bytes=[1_000_000, 0],
    )


def test_features_of_an_op_whose_input_sits_on_gpu0_match_a_hand_computed_list_schedule():
    g, c = _two_ops(), envs.resolve_cluster("k80x2")  # cpu:0, gpu:0, gpu:1; 10 GB/s, 10 us between any two
    fwd, bwd = op_times(g, c)
    t = fwd + bwd
    s = ListSchedule(g, c, k=1)
    assert s.order.tolist() == [0, 1]
    fa = s.features(0)[0]
    assert fa[:, 1].tolist() == [0.0, 0.0, 0.0]  # no inputs: no input bytes anywhere
    s.place(0, np.array([1]))  # a on gpu:0, from 0 to t[a, gpu:0]
    f = s.features(1)[0]
    fin_a = t[0, 1]
    send = 1e-5 + 40_000_000 / 1e10
    finish = np.array([fin_a + send + t[1, 0], fin_a + t[1, 1], fin_a + send + t[1, 2]])
    tmin = t.min(axis=1)
    tau = tmin[1] + tmin.mean()
    mem = static_bytes(g) + activation_bytes(g)
    cap = np.asarray(c.memory_bytes, dtype=float)
    expect = np.stack(
        [
            np.log1p((finish - finish.min()) / tau),
            [0.0, 1.0, 0.0],  # all of b's input bytes are on gpu:0
            np.minimum((np.array([0, mem[0], 0]) + mem[1]) / cap, 2.0),
            np.log1p(np.array([0.0, fin_a, 0.0]) / tau),  # gpu:0's queue runs fin_a past the idle devices'
            (finish == finish.min()).astype(float),
        ],
        axis=1,
    )
    assert f.shape == (3, DYN_DIM)
    np.testing.assert_allclose(f, expect, rtol=1e-9)
    assert f[1, 4] == 1.0  # staying beside its input is what finishes first here


def test_decode_order_is_topological_and_breaks_ties_by_name():
    g = OpGraph.from_edges(["z", "y", "x"], [("z", "x", 8), ("y", "x", 8)])  # z and y: same start, same depth
    top = np.zeros(3)
    order = decode_order(g, top)
    names = [g.names[i] for i in order]
    assert names == ["y", "z", "x"]
    g2 = branch_dag(200, seed=4)
    order = decode_order(g2, np.zeros(g2.num_ops))
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    assert (pos[g2.edge_src] < pos[g2.edge_dst]).all()


def test_sampled_log_probs_equal_those_recomputed_from_scratch():
    g, c = branch_dag(80, seed=2), envs.resolve_cluster("k80x4")
    torch.manual_seed(1)
    p = GNNPolicy(g, c.num_devices, cluster=c, hidden=16, rounds=1)
    s = p.sample(4, generator=torch.Generator().manual_seed(3))
    p._forced.clear()  # the decoding loop's features, recomputed along the samples by teacher forcing
    lp, _ = p.log_prob(s.actions)
    assert torch.allclose(lp, s.log_prob, atol=1e-3)
    np.testing.assert_allclose(teacher_forced(g, c, s.op_devices)[0], p._dyn(s.op_devices)[0].numpy(), rtol=1e-6)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_imitation_along_its_own_samples_teaches_the_schedule_decoder_a_two_gpu_split():
    # Teacher forcing alone fits the label's decisions given the label's own history (its loss falls), but
    # free-running greedy decoding then follows its first wrong "stay beside the input" to the end: DAgger
    # steps, which imitate the label from the states the policy's samples reach, are what fix that.
    g, c = chain_dag(60, seed=0), envs.resolve_cluster("k80x2")
    label = np.where(np.arange(g.num_ops) < g.num_ops // 2, 1, 2)  # first half gpu:0, second half gpu:1
    torch.manual_seed(0)
    p = GNNPolicy(g, c.num_devices, cluster=c, net=GNNNet(hidden=32, rounds=2))
    first = float(p.imitation_loss(label).detach())
    steps = imitate(p, label, AlgoOptions(warm_start_steps=200, warm_start_lr=1e-2))  # placer train's warm start
    assert steps < 200  # it stopped because greedy decoding is the label
    assert float(p.imitation_loss(label).detach()) < first / 5
    assert np.array_equal(p.greedy(), label)


@pytest.mark.parametrize("decoder", ["schedule", "independent"])
def test_over_groups_the_policy_places_whole_groups_and_rescores_its_samples(decoder):
    g, c = branch_dag(120, seed=1), envs.resolve_cluster("k80x4")
    torch.manual_seed(0)
    p = GNNPolicy(g, c.num_devices, cluster=c, max_groups=12, net=GNNNet(hidden=16, rounds=1, decoder=decoder))
    assert p.num_ops == g.num_ops and p.num_items == p.grouping.num_groups <= 12 and p.graph is p.grouping.graph
    s = p.sample(5, generator=torch.Generator().manual_seed(2))
    assert s.op_devices.shape == (5, g.num_ops) and s.actions["devices"].shape == (5, p.num_items)
    np.testing.assert_array_equal(s.op_devices, p.grouping.expand(s.actions["devices"].numpy()))  # whole groups
    p._forced.clear()
    lp, _ = p.log_prob(s.actions)
    assert torch.allclose(lp, s.log_prob, atol=1e-3)
    assert p.greedy().shape == (g.num_ops,)
    np.testing.assert_array_equal(p.contract(s.op_devices), s.actions["devices"].numpy())


def test_over_refined_groups_the_warm_start_reproduces_a_placement_that_splits_the_coarse_groups():
    # 4 coarse groups of 10 ops; the label changes device in the middle of a group, so the groups are cut there
    # (refine) and imitation over the items can reproduce it exactly, as placer train's warm start needs
    g, c = chain_dag(40, seed=0), envs.resolve_cluster("k80x2")
    label = np.where(np.arange(40) < 15, 1, 2)
    torch.manual_seed(0)
    p = GNNPolicy(g, c.num_devices, cluster=c, max_groups=4, refine=label, net=GNNNet(hidden=32, rounds=2))
    assert p.num_items == 5  # 0-9, 10-14 | 15-19, 20-29, 30-39
    steps = imitate(p, label, AlgoOptions(warm_start_steps=200, warm_start_lr=1e-2))
    assert steps < 200
    np.testing.assert_array_equal(p.greedy(), label)
