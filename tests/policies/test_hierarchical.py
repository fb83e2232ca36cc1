"""The hierarchical policy: its grouper gets credit, and what it samples is what it scores."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import envs
from graphs import OpGraph
from graphs.synthetic import random_dag
from placer.learn.algos import Reinforce
from placer.learn.config import TrainConfig
from policies import POLICIES


def _hierarchical(graph: OpGraph, devices: int, **kw):
    kw = {"num_groups": 2, "hidden": 8, "grouper_hidden": 8, **kw}
    return POLICIES["hierarchical"](graph, devices, **kw)


def _loo_advantages(reward: np.ndarray) -> torch.Tensor:
    """Leave-one-out, normalised by the batch's reward std: what placer.train does by default."""
    adv = reward - (reward.sum() - reward) / (len(reward) - 1)
    return torch.as_tensor(adv / (reward.std() + 1e-8), dtype=torch.float32)


def test_grouper_gradient_is_nonzero_under_leave_one_out_advantages():
    """With zero-sum advantages, a grouping shared by the K samples gets exactly no policy gradient."""
    torch.manual_seed(0)
    p = _hierarchical(random_dag(30, seed=4), 3, num_groups=6)
    s = p.sample(8, generator=torch.Generator().manual_seed(0))
    reward = -np.random.default_rng(0).uniform(1.0, 2.0, size=8)
    adv = _loo_advantages(reward)
    assert abs(float(adv.sum())) < 1e-5
    p.zero_grad()
    (-(adv * s.log_prob).mean()).backward()  # Reinforce.update's policy-gradient term (no entropy bonus)
    grouper = torch.cat([w.grad.flatten() for w in p.grouper.parameters()]).norm()
    placer = torch.cat([w.grad.flatten() for w in p.placer.parameters()]).norm()
    assert float(grouper) > 1e-2 * float(placer) > 0
    # and the K samples really are K groupings, each scored with its own log-probability
    assert s.actions["groups"].shape == (8, 30) and len({tuple(r) for r in s.actions["groups"].tolist()}) > 1


def _outcome_table(p, num_ops: int, num_devices: int) -> tuple[list[tuple], torch.Tensor]:
    """Every (grouping, devices) action of a tiny policy and its probability exp(log_prob)."""
    groupings = list(itertools.product(range(p.num_groups), repeat=num_ops))
    devices = list(itertools.product(range(num_devices), repeat=p.num_groups))
    groups = torch.tensor([gr for gr in groupings for _ in devices])
    devs = torch.tensor([d for _ in groupings for d in devices])
    with torch.no_grad():
        logp, _ = p.log_prob({"groups": groups, "devices": devs})
    keys = [tuple(g) + tuple(d) for g, d in zip(groups.tolist(), devs.tolist())]
    return keys, logp.exp()


def test_sampled_frequencies_match_exp_log_prob():
    """Chi-square: 3 ops, 2 groups, 2 devices (32 outcomes); sampler and scorer are one distribution."""
    g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("b", "c", 8)], flops=[1.0, 2.0, 3.0])
    torch.manual_seed(0)
    p = _hierarchical(g, 2, temperature=1.0, tanh_c=5.0)
    with torch.no_grad():  # a skewed distribution, so that a mismatch shows
        for w in p.parameters():
            w.normal_(0.0, 1.0)
    keys, prob = _outcome_table(p, 3, 2)
    assert float(prob.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(prob.max()) > 3 * float(prob.min())
    gen = torch.Generator().manual_seed(0)
    counts = dict.fromkeys(keys, 0)
    n = 0
    for _ in range(10):
        s = p.sample(2000, generator=gen)
        for row in torch.cat([s.actions["groups"], s.actions["devices"]], dim=1).tolist():
            counts[tuple(row)] += 1
        n += 2000
    expected = prob.numpy() * n
    observed = np.array([counts[k] for k in keys], dtype=np.float64)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    # 31 degrees of freedom: P(chi2 > 70) is about 1e-4
    assert chi2 < 70.0, chi2


def test_sample_log_prob_and_op_devices_agree_per_sample():
    """Each sample's op devices are its own grouping's groups' devices, and log_prob re-scores it."""
    torch.manual_seed(1)
    p = _hierarchical(random_dag(20, seed=3), 3, num_groups=5)
    s = p.sample(6, generator=torch.Generator().manual_seed(2))
    logp, ent = p.log_prob(s.actions)
    torch.testing.assert_close(logp, s.log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, s.entropy, rtol=1e-5, atol=1e-5)
    for k in range(6):  # one sample alone gives the same numbers as in the batch
        one = {"groups": s.actions["groups"][k : k + 1], "devices": s.actions["devices"][k : k + 1]}
        torch.testing.assert_close(p.log_prob(one)[0][0], s.log_prob[k], rtol=1e-5, atol=1e-5)
        groups = s.actions["groups"][k].numpy()
        _, order = p._group_inputs(groups)
        dev_of_group = np.empty(p.num_groups, dtype=np.int64)
        dev_of_group[order] = s.actions["devices"][k].numpy()
        assert np.array_equal(s.op_devices[k], dev_of_group[groups])


def interleaved_chains(length: int = 4) -> OpGraph:
    """Two independent chains of heavy ops, interleaved in topological order, told apart by op type.

    On k80x2 under the eager executor the optimum puts one chain per GPU (2 of the 3^8
    placements). With 2 groups only the grouping {chain a} / {chain b} can express it,
    and no contiguous chunking of the topological order does.
    """
    names = [f"{c}{i}" for i in range(length) for c in "ab"]
    edges = [(f"{c}{i}", f"{c}{i + 1}", 1024) for c in "ab" for i in range(length - 1)]
    types = ["matmul" if n[0] == "a" else "conv" for n in names]
    return OpGraph.from_edges(names, edges, flops=[2e11] * len(names), op_types=types, name="interleaved-chains")


@pytest.mark.slow
def test_learns_the_grouping_only_a_good_grouping_solves():
    g = interleaved_chains()
    env = envs.SimEnv(g, envs.resolve_cluster("k80x2"))
    every = np.array(list(itertools.product(range(3), repeat=g.num_ops)), dtype=np.int32)
    t, failed = env.step_times(every)
    t = np.where(failed, np.inf, t)
    optimum = float(t.min())
    optimal = every[t <= optimum * (1 + 1e-9)]
    assert sorted(map(tuple, optimal)) == [(1, 2) * 4, (2, 1) * 4]  # chain a / chain b on the two GPUs
    t_ref = float(env.step_times(np.ones((1, g.num_ops), dtype=np.int32))[0][0])
    assert optimum < 0.7 * t_ref

    torch.manual_seed(0)
    p = _hierarchical(g, 3, hidden=16, grouper_hidden=16)
    opt = torch.optim.Adam(p.parameters(), lr=0.01)
    config, gen = TrainConfig(), torch.Generator().manual_seed(0)
    solved_at = None
    for it in range(400):  # the training loop's steps: sample, score, leave-one-out advantages, REINFORCE
        if it % 10 == 0 and float(env.step_times(p.greedy()[None])[0][0]) <= optimum * (1 + 1e-9):
            solved_at = it
            break
        s = Reinforce.sample(p, 8, gen)
        st, sf = env.step_times(s.op_devices)
        reward = -np.sqrt(np.where(sf, config.fail_factor * t_ref, st) / t_ref)
        Reinforce.update(p, opt, s, _loo_advantages(reward), config)
    assert solved_at is not None, "the greedy grouping + placement never reached the optimum"
    groups = p._group_logp().argmax(dim=1).numpy()
    assert groups[0::2].tolist() == [groups[0]] * 4 and groups[1::2].tolist() == [1 - groups[0]] * 4


def test_imitation_reproduces_a_placement_contiguous_chunks_cannot_express():
    """The warm start: chain a on one GPU, chain b on the other, interleaved in topological order.

    With 2 groups, chunking the topological order (the old imitation target) mixes both
    chains in each group and the majority vote loses half the ops; a device-aligned
    grouping, with the incumbent's device as a grouper input, expresses it exactly.
    """
    g = interleaved_chains()
    target = np.array([1, 2] * 4, dtype=np.int32)
    torch.manual_seed(0)
    p = _hierarchical(g, 3, hidden=16, grouper_hidden=16, refine=target)
    groups = p.imitation_target(target)
    assert len(set(groups[0::2])) == 1 and len(set(groups[1::2])) == 1 and groups[0] != groups[1]
    opt = torch.optim.Adam(p.parameters(), lr=0.02)
    for _ in range(100):
        opt.zero_grad()
        p.imitation_loss(target, generator=torch.Generator().manual_seed(0)).backward()
        opt.step()
    assert np.array_equal(p.greedy(), target)
    assert float(p.imitation_loss(target).detach()) < 0.05
