"""The compiled kernel gives exactly the reference scheduler's results on random DAGs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs import Cluster, SimEnv
from envs.sim.kernel import HAVE_NUMBA
from graphs.dag import random_order
from graphs.synthetic import random_dag


def shrunk(name: str, memory_bytes: float) -> Cluster:
    """A preset with every device's memory set to ``memory_bytes`` (to make OOM likely)."""
    doc = Cluster.preset(name).to_dict()
    for d in doc["devices"]:
        d["memory_bytes"] = memory_bytes
    return Cluster.from_dict(doc)


def two_hosts(name: str, memory_bytes: float) -> Cluster:
    """A preset whose last GPU is turned into a second host (``cpu``) device."""
    doc = shrunk(name, memory_bytes).to_dict()
    doc["devices"][-1]["kind"] = "cpu"
    return Cluster.from_dict(doc)


random_topological_order = random_order  # Kahn's algorithm taking a uniformly random ready op each time

#: Op types drawn for random graphs: what autograd keeps differs (graphs.ops.saved_mask), views take no memory.
TYPES = (
    "aten.relu.default",
    "aten.add.Tensor",
    "aten.linear.default",
    "aten.view.default",
    "aten.mul.Tensor",
    "custom.op",
)


def typed(g, rng):
    """``g`` with op types drawn from :data:`TYPES`: some outputs are freed before backward, the kernel's sweep too."""
    return dataclasses.replace(g, op_types=[TYPES[i] for i in rng.integers(0, len(TYPES), g.num_ops)])


FIELDS = (
    "fwd_start_s",
    "fwd_end_s",
    "bwd_start_s",
    "bwd_end_s",
    "xfer_kind",
    "xfer_op",
    "xfer_src",
    "xfer_dst",
    "xfer_bytes",
    "xfer_start_s",
    "xfer_end_s",
    "update_s",
)


def test_numba_is_used():
    assert HAVE_NUMBA, "numba is not installed: the simulator runs ~100x slower"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4", "h100x8", "h200x1"]),
    degree=st.floats(1.0, 3.0),
    memory_mb=st.sampled_from([5.0, 30.0, 100.0, 1e6]),
)
def test_kernel_matches_reference(n, seed, preset, degree, memory_mb):
    g = random_dag(n, seed=seed, avg_degree=degree, window=8, max_bytes=4 << 20)
    c = shrunk(preset, memory_mb * 1e6)
    if seed % 4 == 0:  # an optimizer step with a bandwidth of its own (Device.update_bw_bytes_per_s): both take it
        devices = [dataclasses.replace(d, update_bw_bytes_per_s=3 * d.mem_bw_bytes_per_s) for d in c.devices]
        c = Cluster(name=c.name, devices=devices, links=c.links)
    rng = np.random.default_rng(seed)
    if seed % 3:
        g = typed(g, rng)
    P = rng.integers(0, c.num_devices, size=(4, n))
    P[0] = rng.integers(0, c.num_devices)  # one single-device placement
    ref = SimEnv(g, c, backend="reference", executor="dataflow")
    fast = SimEnv(g, c, executor="dataflow")
    times, oom = fast.step_times(P)
    for k in range(len(P)):
        a = ref.simulate(P[k])
        sa, sb = ref.schedule(P[k]), fast.schedule(P[k])
        for field in FIELDS:
            assert np.array_equal(getattr(sa, field), getattr(sb, field)), field
        assert sa.backward_end_s == sb.backward_end_s
        assert times[k] == a.extra["sim_step_time_s"]
        assert oom[k] == (a.status == "oom")
        b = fast.simulate(P[k])
        assert b.peak_bytes == a.peak_bytes and b.busy_s == a.busy_s and b.status == a.status


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4", "h100x8", "h200x1"]),
    hosts=st.sampled_from([1, 2]),
    degree=st.floats(1.0, 3.0),
    memory_mb=st.sampled_from([5.0, 30.0, 100.0, 1e6]),
    host_costs=st.booleans(),
)
def test_eager_kernel_matches_reference(n, seed, preset, hosts, degree, memory_mb, host_costs):
    g = random_dag(n, seed=seed, avg_degree=degree, window=8, max_bytes=4 << 20)
    c = two_hosts(preset, memory_mb * 1e6) if hosts == 2 and preset != "h200x1" else shrunk(preset, memory_mb * 1e6)
    rng = np.random.default_rng(seed)
    if seed % 3:
        g = typed(g, rng)
    if host_costs:  # measured staging copies and contention (simulator model 4)
        c = Cluster(
            c.name,
            [
                dataclasses.replace(
                    d,
                    stage_latency_s=rng.random() * 2e-5,
                    stage_bandwidth_bytes_per_s=(0.5 + rng.random()) * 1e10,
                    contention_op=rng.random(),
                    contention_issue=rng.random(),
                )
                if d.kind == "cpu"
                else d
                for d in c.devices
            ],
            c.links,
        )
    if seed % 2:  # a GPU profile measured in context: per-op issue times, forward and backward (some unknown)
        issue = lambda scale: np.where(rng.random(n) < 0.1, np.nan, rng.random(n) * scale)  # noqa: E731
        g = dataclasses.replace(g, profile={"gpu": {"issue_fwd_s": issue(2e-4), "issue_bwd_s": issue(3e-4)}})
    P = rng.integers(0, c.num_devices, size=(4, n))
    P[0] = rng.integers(0, c.num_devices)  # one single-device placement
    orders = np.stack([np.arange(n)] + [random_topological_order(g, rng) for _ in range(3)])
    ref = SimEnv(g, c, backend="reference")
    fast = SimEnv(g, c)
    assert fast.executor == ref.executor == "eager"
    times, oom = fast.step_times(P, orders)
    shared, _ = fast.step_times(P, orders[2])
    for k in range(len(P)):
        a = ref.simulate(P[k], order=orders[k])
        sa, sb = ref.schedule(P[k], orders[k]), fast.schedule(P[k], orders[k])
        for field in FIELDS:
            assert np.array_equal(getattr(sa, field), getattr(sb, field)), field
        assert sa.backward_end_s == sb.backward_end_s
        assert times[k] == a.extra["sim_step_time_s"]
        assert oom[k] == (a.status == "oom")
        assert shared[k] == ref.simulate(P[k], order=orders[2]).extra["sim_step_time_s"]
        b = fast.simulate(P[k], order=orders[k])
        assert b.peak_bytes == a.peak_bytes and b.busy_s == a.busy_s and b.status == a.status
        assert a.extra["executor"] == b.extra["executor"] == "eager"
    ref_times, ref_oom = ref.step_times(P, orders)
    assert np.array_equal(ref_times, times) and np.array_equal(ref_oom, oom)


def test_batch_on_a_larger_graph_matches_scalar():
    g = random_dag(2000, seed=5)
    c = shrunk("k80x4", 2.2e9)  # all on one GPU: a peak of 2.28 GB, over
    env = SimEnv(g, c)
    rng = np.random.default_rng(1)
    P = rng.integers(0, c.num_devices, size=(6, g.num_ops))
    P[1] = 2
    P[2] = np.repeat(np.arange(1, 5), g.num_ops // 4)
    times, oom = env.step_times(P)
    results = env.evaluate(list(P))
    assert oom.any() and not oom.all()
    for k, r in enumerate(results):
        assert times[k] == r.extra["sim_step_time_s"] and oom[k] == (r.status == "oom")
    # batch order does not matter: workspaces are reset between placements
    t2, o2 = env.step_times(P[::-1])
    assert np.array_equal(t2, times[::-1]) and np.array_equal(o2, oom[::-1])


def test_step_times_rejects_bad_shapes():
    from graphs import PlacerError

    env = SimEnv(random_dag(10), Cluster.preset("k80x2"))
    with pytest.raises(PlacerError, match=r"\[K, 10\]"):
        env.step_times(np.zeros((2, 9), dtype=int))
    with pytest.raises(PlacerError, match="out of range"):
        env.step_times(np.full((1, 10), 3))
