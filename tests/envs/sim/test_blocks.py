"""The block bound (envs/sim/blocks.py): cut tasks, each block's placement and copies solved exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import Cluster, SimEnv, lower_bound
from envs.cluster import Device, Link
from envs.sim.blocks import MAX_OPS, TaskGraph, block_bound_s
from envs.sim.bound import update_bound_s
from graphs import OpGraph
from graphs.ops import grad_mask
from tests.conftest import fast_first
from tests.envs.sim.test_bound import bursty_dag, random_cluster, random_topological_order


def fan(branches: int, latency: float) -> tuple[OpGraph, Cluster]:
    """s -> b0..bk -> j: every op 1 s forward and 2 s backward on either of two GPUs (100 s on the host),
    every copy ``latency`` seconds."""
    devices = [Device("cpu:0", "cpu", 1e15, 1.0, 1e30, 0.0)] + [
        Device(f"gpu:{i}", "gpu", 1e15, 100.0, 1e30, 0.0) for i in range(2)
    ]
    c = Cluster(
        name="fan",
        devices=devices,
        links={(a.name, b.name): Link(1e30, latency) for a in devices for b in devices if a.name != b.name},
    )
    br = [f"b{i}" for i in range(branches)]
    names = ["s"] + br + ["j"]
    g = OpGraph.from_edges(
        names,
        [("s", b, 0) for b in br] + [(b, "j", 0) for b in br],
        flops=[100.0] * len(names),
        op_types=["aten.mm.default"] * len(names),
    )
    return g, c


def _best(env: SimEnv, orders=(None,)) -> float:
    P = np.array(list(itertools.product(range(env.cluster.num_devices), repeat=env.num_ops)), dtype=np.int32)
    return min(float(env.step_times(P, **({} if o is None else {"order": o}))[0].min()) for o in orders)


@pytest.mark.parametrize("branches, latency, eager, dataflow", [(2, 0.5, 10.5, 10.0), (3, 0.25, 12.5, 12.0)])
def test_the_block_bound_charges_a_split_branch_its_copies(branches, latency, eager, dataflow):
    """Two branches, copies 0.5 s. The cut tasks s, j and their backwards take 6 s; the path bounds say 9 (3 forward,
    6 backward). Between the cuts the branches share a GPU (2 s forward, 4 s backward) or split. Split, the
    backward takes 2.5 s (a gradient copy, then 2 s, on either branch); the forward 1.5 s in dataflow (a copy and
    an op on each branch), 2 s in eager, where the two copies hold both GPUs' streams (0.5 + 1 + 0.5 on the GPU
    that runs s). So 10.5 s eager and 10 s dataflow, which brute force over every placement attains; three
    branches with 0.25 s copies: 12.5 and 12."""
    g, c = fan(branches, latency)
    for executor, want in (("eager", eager), ("dataflow", dataflow)):
        lb = lower_bound(g, c, executor, blocks_s=10.0)
        assert lb.name == "blocks" and lb == pytest.approx(want)
        assert lb.parts["critical path"] == pytest.approx(9.0) and lb.parts["communicating path"] == pytest.approx(9.0)
        env = SimEnv(g, c, executor=executor)
        assert _best(env, (None, "planned") if executor == "eager" else (None,)) == pytest.approx(want)
    assert "blocks" not in lower_bound(g, c).parts  # off unless given seconds


def _fast_host(c: Cluster) -> Cluster:
    """``c`` with its host as fast as its first GPU, so that placements on the host compete."""
    doc = c.to_dict()
    host, gpu = doc["devices"][0], doc["devices"][1]
    host["flops_per_s"], host["mem_bw_bytes_per_s"] = gpu["flops_per_s"], gpu["mem_bw_bytes_per_s"]
    return Cluster.from_dict(doc)


@pytest.mark.parametrize("seed", fast_first(range(16), 4))
def test_the_block_bound_is_below_every_placement_of_small_graphs(seed):
    """Chains and bursts of up to 7 ops on a randomly scaled k80x2 (copies; a host, as fast as a GPU for odd
    seeds): every placement, in node, planned and a random topological order, both executors, is no faster
    than the block bound."""
    rng = np.random.default_rng(seed)
    g = bursty_dag(1, seed)
    while g.num_ops > 7:
        seed += 1000
        g = bursty_dag(1, seed)
    c = random_cluster("k80x2", seed)
    if seed % 2:
        c = _fast_host(c)
    for executor in ("eager", "dataflow"):
        env = SimEnv(g, c, executor=executor)
        b = block_bound_s(
            env.sim_graph, c, env.fwd_s, env.bwd_s, grad_mask(env.sim_graph), executor, time_budget_s=20.0
        )
        b += update_bound_s(env.sim_graph, c)
        orders = (None, "planned", random_topological_order(g, rng)) if executor == "eager" else (None,)
        assert b * (1 - 1e-9) <= _best(env, orders)


@pytest.mark.slow  # 15 block bounds' programs: seconds
@settings(max_examples=15, deadline=None)
@given(
    bursts=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4"]),
    executor=st.sampled_from(["eager", "dataflow"]),
)
def test_the_block_bound_holds_on_bursty_graphs(bursts, seed, preset, executor):
    """Larger bursty graphs: the bound with blocks is below random placements and the list schedulers', in node
    and planned order."""
    from placer.methods import get

    g = bursty_dag(bursts, seed)
    c = random_cluster(preset, seed)
    env = SimEnv(g, c, executor=executor)
    lb = env.lower_bound(blocks_s=10.0)
    assert "blocks" in lb.parts and lb >= env.lower_bound()
    P = [np.random.default_rng(seed).integers(0, c.num_devices, size=g.num_ops), np.arange(g.num_ops) % c.num_devices]
    P += [np.asarray(get(h)(g, c, seed=seed)) for h in ("m_etf", "heft")]
    for p in P:
        for order in (None, env.planner.plan(p)[0]):
            t = env.simulate(p, order=order).extra["sim_step_time_s"]
            assert lb <= t, (lb.name, float(lb), t)


def test_cut_tasks_leave_out_ops_that_touch_no_other():
    """a -> b -> c and a lone counter update k: without leaving k out no task would be ordered with it."""
    g = OpGraph.from_edges(["a", "b", "c", "k"], [("a", "b", 4), ("b", "c", 4)], flops=[1e9] * 4)
    tg = TaskGraph(g, grad_mask(g))
    cut, _, _ = tg.cuts()
    n = g.num_ops
    assert cut == [0, 1, 2, n + 2, n + 1, n + 0]  # every task of the chain, forward then backward; k's are not kept
    assert 3 not in tg.kept and n + 3 not in tg.kept


def test_the_block_bound_without_time_is_the_blocks_longest_paths():
    """No seconds for the programs: each block counts its longest path, which never exceeds what the programs prove."""
    g, c = fan(2, 0.5)
    env = SimEnv(g, c)
    args = (env.sim_graph, c, env.fwd_s, env.bwd_s, grad_mask(env.sim_graph))
    assert block_bound_s(*args, time_budget_s=0.0) == pytest.approx(9.0)  # the critical path: 3 + 6
    assert block_bound_s(*args, time_budget_s=10.0) == pytest.approx(10.5)
    assert block_bound_s(*args, max_tasks=1) == pytest.approx(9.0)
    big = OpGraph.from_edges([f"o{i}" for i in range(MAX_OPS + 1)], [], flops=[1.0] * (MAX_OPS + 1))
    fwd = np.ones((big.num_ops, c.num_devices))
    assert block_bound_s(big, c, fwd, fwd, np.ones(big.num_ops, dtype=bool)) is None


def test_the_solver_cannot_write_to_standard_output(capfd):
    """HiGHS prints debugging lines from C++ to file descriptor 1; while it solves, that goes nowhere."""
    import os

    from envs.sim.blocks import quiet_stdout

    with quiet_stdout():
        os.write(1, b"solver chatter\n")
    print("after")
    out = capfd.readouterr().out
    assert "solver chatter" not in out and "after" in out
