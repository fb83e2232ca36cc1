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
    preset=st.sampled_from(["k80x2", "k80x4", "v100x4", "h100x8", "h200x1"]),
    degree=st.floats(1.0, 3.0),
    max_flops=st.sampled_from([1e5, 1e8, 1e11]),
)
def test_lower_bound_below_every_simulated_time(n, seed, preset, degree, max_flops):
    g = random_dag(n, seed=seed, avg_degree=degree, max_flops=max_flops)
    c = Cluster.preset(preset)
    env = SimEnv(g, c)
    lb = env.lower_bound()
    assert lb == lower_bound(g, c) and lb > 0
    rng = np.random.default_rng(seed)
    P = np.concatenate([rng.integers(0, c.num_devices, size=(16, n)), np.repeat(np.arange(c.num_devices)[:, None], n, axis=1)])
    times, _ = env.step_times(P)
    assert np.all(lb <= times), (lb, times.min())


def test_lower_bound_tight_for_a_chain_on_one_fast_device(toy):
    g = toy.graph(["a", "b", "c"], [("a", "b", 1), ("b", "c", 1)], [1, 2, 3])
    c = toy.cluster()
    assert abs(lower_bound(g, c) - 18.0) < 1e-6  # forward 6 + backward 12; nothing runs in parallel


def test_work_bound_weights_fast_devices():
    # one device 10x slower than two others: the best weights give total / 2.1, not / 3
    work = np.array([[10.0, 1.0, 1.0]] * 21)
    assert abs(work_bound_s(work, iterations=500) - 21 / 2.1) < 0.05
    assert work_bound_s(work) >= 21 / 3
