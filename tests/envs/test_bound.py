"""The lower bound never exceeds a simulated step time, and is tight where it should be."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import Cluster, SimEnv, lower_bound
from envs.bound import work_bound_s
from graphs.synthetic import random_dag


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
    P = np.concatenate([rng.integers(0, c.num_devices, size=(16, n)), np.repeat(np.arange(c.num_devices)[:, None], n, axis=1)])
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
        for a in np.linspace(0, 1, 101) for b in np.linspace(0, 1 - a, 101)
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
