"""MeasuredEnv on a local Ray of 2 CPUs: real training steps, failures as results, resumable log."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

from envs import Cluster  # noqa: E402
from envs.measured import LOG_NAME, MeasuredEnv, placement_hash, read_log  # noqa: E402


def tiny_builder():
    """A small MLP with batch norm; defined here, shipped to the actors by value."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    return model, (torch.randn(8, 16),)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def env(local_ray, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("measured")
    e = MeasuredEnv(tiny_builder, Cluster.preset("k80x2"), workers=2, device_map="*=cpu", warmup_steps=1, timed_steps=3, timeout_s=10, run_dir=run_dir)
    yield e
    e.close()


def _placements(env, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, env.cluster.num_devices, size=env.graph.num_ops) for _ in range(n)]


def _key(env, p):
    return env.keys([p])[0][0]


def test_batch_is_measured_by_two_workers(env):
    ps = _placements(env, 4, seed=0)
    env.start()
    assert len(env._actors) == 2 and not env._preparing
    assert env.cpus_per_worker == 1  # the node's 2 CPUs shared by its 2 workers
    results = env.evaluate(ps)
    assert [r.status for r in results] == ["ok"] * 4, [r.message for r in results]
    assert all(0 < r.step_time_s < 10 and r.source == "measured" for r in results)
    assert all(len(r.extra["step_times_s"]) == 3 and r.step_time_s == float(np.median(r.extra["step_times_s"])) for r in results)
    assert len({r.extra["worker"] for r in results}) == 2
    used = {env.cluster.device_names[i] for i in ps[0]}
    assert set(results[0].peak_bytes) == used
    logged = read_log(os.path.join(env.log_path), env.graph.content_hash)
    assert {_key(env, p) for p in ps} <= set(logged)


def test_worker_killed_mid_measurement_is_remeasured(env, tmp_path):
    ps = _placements(env, 3, seed=1)
    marker = tmp_path / "died"
    env.faults = {_key(env, ps[1]): f"exit_once:{marker}"}
    try:
        results = env.evaluate(ps)
    finally:
        env.faults = {}
    assert marker.exists()  # the worker really died once
    assert [r.status for r in results] == ["ok"] * 3, [r.message for r in results]


def test_worker_dying_every_time_is_an_error_after_bounded_retries(env):
    (p,) = _placements(env, 1, seed=2)
    env.faults = {_key(env, p): "exit"}
    env.max_retries = 0
    try:
        (r,) = env.evaluate([p])
    finally:
        env.faults, env.max_retries = {}, 2
    assert r.status == "error" and "died 1 times" in r.message


def test_hanging_step_times_out_and_worker_is_replaced(env):
    ps = _placements(env, 2, seed=3)
    env.faults = {_key(env, ps[0]): "sleep:600"}
    try:
        results = env.evaluate(ps)
    finally:
        env.faults = {}
    assert results[0].status == "timeout" and "10s" in results[0].message
    assert results[1].status == "ok"
    (again,) = env.evaluate(_placements(env, 1, seed=4))  # the replacement worker measures
    assert again.ok


def test_injected_oom_and_error_are_results(env):
    ps = _placements(env, 2, seed=5)
    env.faults = {_key(env, ps[0]): "oom", _key(env, ps[1]): "raise:boom in step"}
    try:
        oom, err = env.evaluate(ps)
    finally:
        env.faults = {}
    assert oom.status == "oom" and oom.step_time_s == float("inf")
    assert err.status == "error" and "boom in step" in err.message


def test_resumed_run_reads_its_log(env):
    ps = _placements(env, 2, seed=0)  # measured by the first test
    first = env.evaluate(ps)
    again = MeasuredEnv(tiny_builder, env.cluster, device_map="*=cpu", run_dir=os.path.dirname(env.log_path), graph=env.graph)
    results = again.evaluate(ps)
    assert again._actors == []  # nothing measured again
    assert [r.step_time_s for r in results] == [r.step_time_s for r in first]
    with open(env.log_path) as f:
        lines = [json.loads(x) for x in f]
    assert all(rec["graph_hash"] == env.graph.content_hash for rec in lines)
    assert len({rec["placement_hash"] for rec in lines}) == len(lines)  # nothing logged twice


def test_torn_log_line_is_skipped(tmp_path):
    path = tmp_path / LOG_NAME
    good = {"graph_hash": "g", "placement_hash": placement_hash(["cpu:0"]), "result": {"step_time_s": 0.5}}
    path.write_text(json.dumps(good) + "\n" + '{"graph_hash": "g", "placement_ha')
    assert list(read_log(str(path), "g").values())[0].step_time_s == 0.5
    assert read_log(str(path), "other") == {}
