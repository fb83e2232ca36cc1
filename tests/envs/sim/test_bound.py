"""The lower bound never exceeds a simulated step time, and is tight where it should be."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import Cluster, SimEnv, lower_bound
from envs.sim.bound import critical_path_s
from envs.sim.work_bound import lp_work_bound_s, work_bound_s
from graphs import OpGraph
from graphs.dag import priority_order
from graphs.synthetic import random_dag
from tests.conftest import fast_first


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4", "h100x8", "h200x1", "mixed"]),
    degree=st.floats(1.0, 3.0),
    max_flops=st.sampled_from([1e5, 1e8, 1e11]),
    executor=st.sampled_from(["eager", "dataflow"]),
)
def test_lower_bound_below_every_simulated_time(n, seed, preset, degree, max_flops, executor):
    g = random_dag(n, seed=seed, avg_degree=degree, max_flops=max_flops)
    c = mixed_cluster() if preset == "mixed" else Cluster.preset(preset)
    env = SimEnv(g, c, executor=executor)
    lb = env.lower_bound()
    assert lb == lower_bound(g, c, executor) and lb > 0
    rng = np.random.default_rng(seed)
    P = np.concatenate(
        [rng.integers(0, c.num_devices, size=(16, n)), np.repeat(np.arange(c.num_devices)[:, None], n, axis=1)]
    )
    times, _ = env.step_times(P)
    assert np.all(lb <= times), (lb, times.min())


def mixed_cluster() -> Cluster:
    """Host CPU + three different GPUs (four distinct device columns)."""
    doc = Cluster.preset("k80x4").to_dict()
    for d, (flops, bw) in zip(doc["devices"][2:], ((14e12, 7.7e11), (60e12, 2.85e12), (2e12, 1e11))):
        d["flops_per_s"], d["mem_bw_bytes_per_s"] = flops, bw
    return Cluster.from_dict(doc)


def test_work_bound_with_distinct_devices_near_the_maximum():
    work = np.random.default_rng(0).random((50, 3)) * np.array([5.0, 1.0, 2.0])
    grid = max(
        float(np.min(work * np.array([a, b, 1 - a - b]), axis=1).sum())
        for a in np.linspace(0, 1, 101)
        for b in np.linspace(0, 1 - a, 101)
    )
    assert grid * 0.999 <= work_bound_s(work) <= grid * 1.01


def test_lower_bound_tight_for_a_chain_on_one_fast_device(toy):
    g = toy.graph(["a", "b", "c"], [("a", "b", 1), ("b", "c", 1)], [1, 2, 3])
    c = toy.cluster()
    assert abs(lower_bound(g, c) - 18.0) < 1e-6  # forward 6 + backward 12; nothing runs in parallel


def test_work_bound_weights_fast_devices():
    # one device 10x slower than two others: the best weights give total / 2.1, not / 3
    work = np.array([[10.0, 1.0, 1.0]] * 21)
    assert abs(work_bound_s(work, iterations=500) - 21 / 2.1) < 0.05
    assert work_bound_s(work) >= 21 / 3


def _branchy_dag(n: int, seed: int) -> OpGraph:
    """Random DAG with parallel branches (many issue orders), some zero-time views, some parameters."""
    rng = np.random.default_rng(seed)
    names = [f"o{i}" for i in range(n)]
    edges = []
    for v in range(1, n):
        k = int(rng.integers(0, 3))
        for u in rng.choice(v, size=min(v, k), replace=False):
            edges.append((names[int(u)], names[v], int(np.exp(rng.uniform(np.log(4), np.log(6e7))))))
    types = rng.choice(
        ["aten.mm.default", "aten.relu.default", "aten.view.default"], size=n, p=[0.5, 0.35, 0.15]
    ).tolist()
    flops = np.exp(rng.uniform(np.log(1e3), np.log(1e10), size=n)).tolist()
    params = ((rng.random(n) < 0.3) * rng.integers(1 << 10, 1 << 26, size=n)).astype(np.int64)
    return OpGraph.from_edges(names, edges, flops=flops, op_types=types, param_bytes=params)


def random_cluster(preset: str, seed: int) -> Cluster:
    """A preset with every device and link number scaled at random (and maybe a second host CPU)."""
    rng = np.random.default_rng(seed)
    doc = Cluster.preset(preset).to_dict()
    for d in doc["devices"]:
        for key in ("flops_per_s", "mem_bw_bytes_per_s", "launch_overhead_s"):
            d[key] *= float(np.exp(rng.uniform(-1.5, 1.5)))
    if len(doc["devices"]) > 2 and rng.random() < 0.3:
        doc["devices"][-1]["kind"] = "cpu"
    for link in doc.get("links", []):
        link["bandwidth_bytes_per_s"] *= float(np.exp(rng.uniform(-2, 1)))
        link["latency_s"] *= float(np.exp(rng.uniform(-1, 1)))
    return Cluster.from_dict(doc)


def random_topological_order(graph: OpGraph, rng) -> np.ndarray:
    return priority_order(graph, rng.random(graph.num_ops))


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 14),
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4", "h200x1"]),
    executor=st.sampled_from(["eager", "dataflow"]),
)
def test_best_bound_below_random_placements_in_any_order(n, seed, preset, executor):
    g = _branchy_dag(n, seed)
    c = random_cluster(preset, seed)
    env = SimEnv(g, c, executor=executor)
    lb = lower_bound(g, c, executor)
    assert float(lb) == float(env.lower_bound()) and lb >= lb.previous and lb.name in lb.parts
    rng = np.random.default_rng(seed)
    P = np.concatenate(
        [rng.integers(0, c.num_devices, size=(8, n)), np.repeat(np.arange(c.num_devices)[:, None], n, axis=1)]
    )
    for p in P:
        planned, _, _ = env.planner.plan(p)
        for order in (None, planned, random_topological_order(g, rng)):
            t = env.simulate(p, order=order).extra["sim_step_time_s"]
            assert lb <= t, (lb.name, float(lb), t)


def test_host_issue_bound_is_tighter_where_the_host_is_the_bottleneck():
    # 400 tiny independent ops: every placement pays a dispatch per op on the one host thread
    n = 400
    g = OpGraph.from_edges([f"o{i}" for i in range(n)], [], flops=[1e3] * n)
    c = Cluster.preset("v100x4")
    lb = lower_bound(g, c)
    assert lb.name.startswith("host issue") and lb > lb.previous * 1.5
    assert lower_bound(g, c, "dataflow").name in ("critical path", "work")  # no host thread there
    env = SimEnv(g, c)
    rng = np.random.default_rng(0)
    times, _ = env.step_times(rng.integers(0, c.num_devices, size=(16, n)))
    assert np.all(lb <= times)


def test_lp_work_bound_is_the_maximum():
    work = np.random.default_rng(0).random((50, 3)) * np.array([5.0, 1.0, 2.0])
    grid = max(
        float(np.min(work * np.array([a, b, 1 - a - b]), axis=1).sum())
        for a in np.linspace(0, 1, 101)
        for b in np.linspace(0, 1 - a, 101)
    )
    assert grid <= lp_work_bound_s(work) * (1 + 1e-9) and lp_work_bound_s(work) <= grid * 1.01
    assert lp_work_bound_s(work) >= work_bound_s(work) * (1 - 1e-9)


def test_communicating_path_charges_the_copies_the_critical_path_ignores():
    """a -> b, a fastest on the host and b on a GPU: the path pays a copy each way, or runs one op slowly."""
    from envs.sim.bound import communicating_path_s

    c = Cluster.preset("k80x2")  # cpu:0, gpu:0, gpu:1
    lat, bw = np.asarray(c.latency_s), np.asarray(c.bandwidth_bytes_per_s)
    nbytes = int(bw[0, 1] * (1.0 - lat[0, 1]))  # about one second host -> GPU
    g = OpGraph.from_edges(["a", "b"], [("a", "b", nbytes)])
    fwd = np.array([[1.0, 10.0, 10.0], [10.0, 1.0, 1.0]])
    there, back = lat[0, 1] + nbytes / bw[0, 1], lat[1, 0] + nbytes / bw[1, 0]
    assert communicating_path_s(g, c, fwd, 2 * fwd) == pytest.approx(1 + there + 1 + 2 + back + 2)  # ~8 s
    assert critical_path_s(g, fwd.min(axis=1), 2 * fwd.min(axis=1)) == pytest.approx(6.0)  # free copies
    # with gradients not sent back to a (outside autograd), only the forward copy is charged on b's side
    assert communicating_path_s(g, c, fwd, 2 * fwd, grad=np.array([True, False])) == pytest.approx(1 + there + 1 + 2)


@pytest.mark.parametrize("executor", ["eager", "dataflow"])
@pytest.mark.parametrize("seed", fast_first(range(6), 2))
def test_communicating_path_below_the_best_placement(seed, executor):
    """Every placement of a 5-op graph on a host and two different GPUs, node and planned order, is no faster."""
    import itertools

    from envs.sim.bound import communicating_path_s

    g = random_dag(5, seed=seed, avg_degree=2.0, max_flops=1e10)
    c = mixed_cluster()
    env = SimEnv(g, c, executor=executor)
    P = np.array(list(itertools.product(range(c.num_devices), repeat=g.num_ops)), dtype=np.int32)
    best = min(float(env.step_times(P)[0].min()), float(env.step_times(P, order="planned")[0].min()))
    bound = communicating_path_s(env.sim_graph, c, env.fwd_s, env.bwd_s)
    assert bound <= best * (1 + 1e-12) and env.lower_bound() <= best


def test_energetic_reasoning_proves_three_unit_tasks_need_two_rounds_on_two_devices():
    """Three independent unit tasks on two devices: the critical path says 1, the work 1.5; no schedule ends before 2.

    At any T < 2 each task must cover [T - 1, 1] (it starts by T - 1 and ends no earlier than 1), so that window is
    owed 3 (2 - T) against 2 (2 - T) of capacity."""
    from envs.sim.energetic import energetic_bound_s

    zeros, ones = np.zeros(3), np.ones(3)
    assert energetic_bound_s(zeros, zeros, ones, 2, lo=1.5) == pytest.approx(2.0, rel=1e-3)
    assert energetic_bound_s(zeros, zeros, ones, 3, lo=1.0) == 1.0  # three devices: nothing beyond what was known
    assert energetic_bound_s(zeros, zeros, ones, 2, lo=2.5) == 2.5  # never below the bound it was given


def test_the_energetic_bound_charges_parallel_work_wider_than_the_devices(toy):
    """s -> x1..x4 -> j on three devices at 1 FLOP/s (forward = FLOPs, backward twice that), copies free.

    Critical path 9 (1+1+1 forward, 2+2+2 backward), work 18 / 3 = 6. The four backward tasks of the x ops (2 s each)
    start after j's backward (at 5 at the earliest) and end before s's backward (by T - 2), so each covers
    [T - 4, 7]: below T = 11 that window is owed 4 (11 - T) against 3 (11 - T) on three devices (two rounds of
    them: 5 + 4 + 2). Every placement in both orders takes 12 (two rounds forward too), so the bound holds."""
    import itertools

    names = ["s", "x1", "x2", "x3", "x4", "j"]
    edges = [("s", x, 0) for x in names[1:5]] + [(x, "j", 0) for x in names[1:5]]
    g = toy.graph(names, edges, [1, 1, 1, 1, 1, 1])
    c = toy.cluster()
    lb = lower_bound(g, c)
    assert lb.name == "energetic" and lb == pytest.approx(11.0, rel=1e-3)
    assert lb.parts["critical path"] == pytest.approx(9.0) and lb.parts["work"] == pytest.approx(6.0)
    for executor in ("eager", "dataflow"):
        env = SimEnv(g, c, executor=executor)
        P = np.array(list(itertools.product(range(c.num_devices), repeat=g.num_ops)), dtype=np.int32)
        best = min(float(env.step_times(P)[0].min()), float(env.step_times(P, order="planned")[0].min()))
        assert env.lower_bound() <= best == pytest.approx(12.0), (executor, best)


def bursty_dag(bursts: int, seed: int) -> OpGraph:
    """Chains that fork into bursts of 2-8 parallel ops and join again: in the bursts, work wider than the devices."""
    rng = np.random.default_rng(seed)
    names, edges, last = ["in"], [], "in"
    for b in range(bursts):
        for i in range(int(rng.integers(0, 4))):  # a chain segment
            names.append(f"c{b}_{i}")
            edges.append((last, names[-1], int(rng.integers(4, 1 << 20))))
            last = names[-1]
        join = f"j{b}"
        for k in range(int(rng.integers(2, 9))):  # the burst
            names.append(f"x{b}_{k}")
            edges += [
                (last, names[-1], int(rng.integers(4, 1 << 20))),
                (names[-1], join, int(rng.integers(4, 1 << 20))),
            ]
        names.append(join)
        last = join
    flops = np.exp(rng.uniform(np.log(1e8), np.log(4e9), size=len(names))).tolist()
    order = {n: i for i, n in enumerate(names)}
    edges.sort(key=lambda e: (order[e[1]], order[e[0]]))
    return OpGraph.from_edges(names, edges, flops=flops, op_types=["aten.mm.default"] * len(names))


@pytest.mark.parametrize("executor", ["eager", "dataflow"])
@pytest.mark.parametrize("microbatches", [1, 2])
@pytest.mark.parametrize("seed", fast_first(range(4)))
def test_the_energetic_bound_is_below_the_best_placement_of_a_burst(seed, microbatches, executor, toy):
    """s -> x1..x5 -> j (1-4 FLOPs each) on three equal devices: every placement, in node and planned order, is no
    faster than the bound, which is within 1.4x of the best and energetic reasoning's in most of these cases."""
    import itertools

    names = ["s"] + [f"x{k}" for k in range(5)] + ["j"]
    edges = [("s", x, 0) for x in names[1:6]] + [(x, "j", 0) for x in names[1:6]]
    g = toy.graph(names, edges, np.random.default_rng(seed).uniform(1, 4, size=7).tolist())
    c = toy.cluster()
    env = SimEnv(g, c, executor=executor, microbatches=microbatches)
    P = np.array(list(itertools.product(range(c.num_devices), repeat=g.num_ops)), dtype=np.int32)
    best = min(float(env.step_times(P)[0].min()), float(env.step_times(P, order="planned")[0].min()))
    lb = env.lower_bound()
    assert best / 1.4 < lb <= best * (1 + 1e-12), (lb.name, float(lb), best)


@settings(max_examples=30, deadline=None)
@given(
    bursts=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4"]),
    executor=st.sampled_from(["eager", "dataflow"]),
    microbatches=st.sampled_from([1, 2, 4]),
)
def test_the_bound_holds_on_bursty_graphs_and_pipelined_steps(bursts, seed, preset, executor, microbatches):
    """Bursty graphs on randomly scaled presets (copies, a host, maybe two): the bound is below the list schedulers'
    placements and random ones, in node and planned order, with one or several microbatches, fill-drain and (the
    same bound, as compare uses it) one-forward-one-backward."""
    from placer.methods import get

    g = bursty_dag(bursts, seed)
    c = random_cluster(preset, seed)
    env = SimEnv(g, c, executor=executor, microbatches=microbatches)
    lb = env.lower_bound()
    P = [np.random.default_rng(seed).integers(0, c.num_devices, size=g.num_ops), np.arange(g.num_ops) % c.num_devices]
    P += [np.asarray(get(h)(g, c, seed=seed)) for h in ("m_etf", "heft")]
    envs = [env] + ([env.with_microbatches(microbatches, 1)] if microbatches > 1 and executor == "eager" else [])
    for e in envs:
        for p in P:
            planned, _, _ = e.planner.plan(p)
            for order in (None, planned):
                t = e.simulate(p, order=order).extra["sim_step_time_s"]
                assert lb <= t, (lb.name, float(lb), t, e.inflight)


def test_energetic_reasoning_wins_on_bursty_graphs_with_microbatches():
    """The bursty family does exercise the energetic bound, pipelined too (so the property test above tests it)."""
    wins = {
        (preset, M): sum(
            SimEnv(bursty_dag(3, seed), Cluster.preset(preset), microbatches=M).lower_bound().name == "energetic"
            for seed in range(10)
        )
        for preset, M in (("k80x2", 1), ("k80x4", 2))
    }
    assert min(wins.values()) >= 3, wins


@pytest.mark.slow  # every one of 3^8 placements, in node and in planned order (~7 s)
def test_the_host_issue_path_waits_for_every_ancestor_to_be_issued():
    """s -> x1..x4 -> j -> k1 -> k2 on a slow host and two GPUs (1 s launch and issue per GPU op; small ops 1.1 s on a
    GPU, 10 s on the host; k1, k2 6 s; backward twice the FLOPs). The host issues j's five ancestors before j, one
    second each, so j starts at 5 at the earliest, where the critical path has 2.2: forward 5 + 1.1 + 6 + 6, backward
    12 + 12 + 2.2 + 2.2 + 2.2, 48.7 s against the critical path's 45.9. Every placement in both orders is slower."""
    import itertools

    from envs.cluster import Device, Link

    devices = [Device("cpu:0", "cpu", 1e15, 1.0, 1e30, 0.0)] + [
        Device(f"gpu:{i}", "gpu", 1e15, 100.0, 1e30, 1.0) for i in range(2)
    ]
    c = Cluster(
        name="slow host",
        devices=devices,
        links={(a.name, b.name): Link(1.0, 0.0) for a in devices for b in devices if a.name != b.name},
    )
    names = ["s", "x1", "x2", "x3", "x4", "j", "k1", "k2"]
    edges = [("s", x, 0) for x in names[1:5]] + [(x, "j", 0) for x in names[1:5]] + [("j", "k1", 0), ("k1", "k2", 0)]
    g = OpGraph.from_edges(names, edges, flops=[10] * 6 + [500, 500], op_types=["aten.mm.default"] * 8)
    env = SimEnv(g, c)
    lb = env.lower_bound()
    assert lb.parts["host issue + path"] == pytest.approx(48.7) and lb.parts["critical path"] == pytest.approx(45.9)
    assert lb >= lb.parts["host issue + path"]
    P = np.array(list(itertools.product(range(c.num_devices), repeat=g.num_ops)), dtype=np.int32)
    best = min(float(env.step_times(P)[0].min()), float(env.step_times(P, order="planned")[0].min()))
    assert lb <= best == pytest.approx(52.0)
    # a pipelined step may call backward() between forwards (1F1B): its bound does not wait for the whole forward
    for inflight in (1, 2):
        env2 = SimEnv(g, c, microbatches=2, inflight=inflight)
        assert env2.lower_bound() <= min(
            float(env2.step_times(P)[0].min()), float(env2.step_times(P, order="planned")[0].min())
        )


def test_ancestor_sums_exact_and_past_the_limit_the_longest_path():
    """A diamond a -> b, c -> d: d's ancestors cost a + b + c; past ``exact_ops`` the heaviest path into d (a + c)."""
    from envs.sim.bound import ancestor_sums

    g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1)])
    cost = np.array([1.0, 2.0, 4.0, 8.0])
    assert ancestor_sums(g, cost).tolist() == [0.0, 1.0, 1.0, 7.0]
    assert ancestor_sums(g, cost, exact_ops=3).tolist() == [0.0, 1.0, 1.0, 5.0]


def test_a_pipelined_bound_holds_for_one_forward_one_backward():
    """One op a on one GPU whose host issue (3 s, profiled) outlasts its kernels (1 s forward, 2 s backward per
    microbatch), two microbatches. 1F1B (W = 1): issue a@0 [0, 3], kernel [3, 4], backward [4, 6] while the host
    issues a@1 [3, 6], kernel [6, 7], backward [7, 9]: 9 s. Fill-drain (W = 2): both forwards, then both backwards,
    11 s. Only the last microbatch's backward must follow the whole forward's issue, so the bound is
    3 + 3 + 2 = 8 s, for either window; charging every backward after the issue (10 s) is above the 1F1B step."""
    import dataclasses

    from envs.cluster import Device, Link

    devices = [Device("cpu:0", "cpu", 1e15, 1.0, 1e30, 0.0), Device("gpu:0", "gpu", 1e15, 100.0, 1e30, 0.0)]
    c = Cluster(
        name="slow issue",
        devices=devices,
        links={(a.name, b.name): Link(1.0, 0.0) for a in devices for b in devices if a.name != b.name},
    )
    g = OpGraph.from_edges(["a"], [], flops=[200.0], op_types=["aten.mm.default"])
    g = dataclasses.replace(g, profile={"gpu": {"issue_fwd_s": np.array([3.0])}})
    steps = {W: SimEnv(g, c, microbatches=2, inflight=W).simulate(np.array([1])).step_time_s for W in (1, 2)}
    assert steps == {1: pytest.approx(9.0), 2: pytest.approx(11.0)}
    for W in (1, 2):
        lb = SimEnv(g, c, microbatches=2, inflight=W).lower_bound()
        assert lb == pytest.approx(8.0) and lb.name.startswith("host issue")
        assert max(lb.parts.values()) <= steps[1]
    one = SimEnv(g, c)  # one microbatch (2 s forward, 4 s backward): every backward follows the issue, 3 + 4
    assert one.lower_bound() == pytest.approx(7.0) and one.simulate(np.array([1])).step_time_s == pytest.approx(9.0)


def test_the_update_bound_takes_the_optimizer_steps_own_bandwidth():
    """One op of 1 GB of parameters: Adam's 7 passes take 7 GB over the update's bandwidth, the device's memory
    bandwidth unless it has one of its own (Device.update_bw_bytes_per_s), as the simulator's step does."""
    import dataclasses

    from envs.cluster import Device
    from envs.sim.bound import update_bound_s

    g = OpGraph.from_edges(["w"], [], param_bytes=[1_000_000_000])
    plain = Device("cpu:0", "cpu", 1e12, 1e9, 7e9, 0.0)
    assert update_bound_s(g, Cluster("c", [plain], {})) == pytest.approx(1.0)
    fast = dataclasses.replace(plain, update_bw_bytes_per_s=14e9)
    assert update_bound_s(g, Cluster("c", [fast], {})) == pytest.approx(0.5)
