"""MeasuredEnv on a local Ray of 2 CPUs: real training steps, failures as results, resumable log."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

from envs import Cluster  # noqa: E402
from envs.real.measured import LOG_NAME, MeasuredEnv, Worker, placement_hash, read_log  # noqa: E402
from graphs import PlacerError  # noqa: E402
from tests.conftest import RAY_UNNICED  # noqa: E402

# Faults the test actors act on, by placement hash (the file is read by the actors,
# which get this module by value, so the path is fixed when the module loads).
FAULTS = Path(tempfile.mkdtemp(prefix="placer-faults-")) / "faults.json"


class FaultyWorker(Worker):
    """A worker that, just before the training steps of a placement named in FAULTS, acts:
    ``sleep:S``, ``raise:MSG``, ``oom``, ``memory``, ``exit`` or ``exit_once:MARKER``."""

    def measure(self, assignment, *args, **kwargs):
        faults = json.loads(FAULTS.read_text()) if FAULTS.exists() else {}
        self.fault = faults.get(placement_hash(list(assignment.values())), "")
        return super().measure(assignment, *args, **kwargs)

    def _steps(self, *args, **kwargs):
        import torch

        action, _, arg = self.fault.partition(":")
        if action == "sleep":
            time.sleep(float(arg))
        elif action == "raise":
            raise RuntimeError(arg)
        elif action == "oom":
            raise torch.OutOfMemoryError("injected out of memory")
        elif action == "memory":
            raise MemoryError()
        elif action == "exit" or (action == "exit_once" and not os.path.exists(arg)):
            if arg:
                Path(arg).write_text(str(os.getpid()))
            os._exit(1)
        return super()._steps(*args, **kwargs)


class FaultyEnv(MeasuredEnv):
    worker_cls = FaultyWorker


@contextlib.contextmanager
def faults(env, by_placement):
    """Inject ``{placement: fault}`` for the duration of the block."""
    FAULTS.write_text(json.dumps({_key(env, p): f for p, f in by_placement}))
    try:
        yield
    finally:
        FAULTS.unlink()


def tiny_builder():
    """A small MLP with batch norm; defined here, shipped to the actors by value."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    return model, (torch.randn(8, 16),)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _system_config=RAY_UNNICED,
    )
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def env(local_ray, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("measured")
    e = FaultyEnv(
        tiny_builder,
        Cluster.preset("k80x2"),
        workers=2,
        device_map="*=cpu",
        warmup_steps=1,
        timed_steps=3,
        measure_timeout_s=10,
        start_timeout_s=300,
        run_dir=run_dir,
    )
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
    assert len(env._actors) == 2 and not env._starting
    assert env.cpus_per_worker == 1  # the node's 2 CPUs shared by its 2 workers
    results = env.evaluate(ps)
    assert [r.status for r in results] == ["ok"] * 4, [r.message for r in results]
    assert all(0 < r.step_time_s and r.source == "measured" for r in results)
    assert all(
        len(r.extra["step_times_s"]) == 3 and r.step_time_s == float(np.median(r.extra["step_times_s"]))
        for r in results
    )
    assert len({r.extra["worker"] for r in results}) == 2
    assert all(r.extra["thread_cache_off"] for r in results)  # the actors start so (envs.real.allocator)
    used = {env.cluster.device_names[i] for i in ps[0]}
    assert set(results[0].peak_bytes) == used
    logged = read_log(os.path.join(env.log_path), env.graph.content_hash)
    assert {_key(env, p) for p in ps} <= set(logged)


def test_again_measures_anew_on_the_workers_logs_a_re_measurement_and_keeps_the_first(env):
    ps = _placements(env, 2, seed=10)
    first = env.evaluate(ps[:1])[0]
    with open(env.log_path) as f:
        before = len(f.readlines())
    t, failed = env.measure_again(np.stack(ps))  # ps[0] measured again, ps[1] for the first time
    assert not failed.any()
    assert t[0] != first.step_time_s  # a fresh measurement (timings of real steps never repeat to the bit)
    with open(env.log_path) as f:
        added = [json.loads(x) for x in f.readlines()[before:]]
    assert sorted((rec["placement_hash"], bool(rec.get("again"))) for rec in added) == sorted(
        [(_key(env, ps[0]), True), (_key(env, ps[1]), False)]
    )
    assert env.evaluate(ps[:1])[0] is first  # the cache keeps the first result


def test_worker_killed_mid_measurement_is_remeasured(env, tmp_path):
    ps = _placements(env, 3, seed=1)
    marker = tmp_path / "died"
    with faults(env, [(ps[1], f"exit_once:{marker}")]):
        results = env.evaluate(ps)
    assert marker.exists()  # the worker really died once
    assert [r.status for r in results] == ["ok"] * 3, [r.message for r in results]


def test_worker_dying_every_time_is_an_error_after_bounded_retries(env):
    (p,) = _placements(env, 1, seed=2)
    env.max_retries = 0
    try:
        with faults(env, [(p, "exit")]):
            (r,) = env.evaluate([p])
    finally:
        env.max_retries = 2
    assert r.status == "error" and "died 1 times" in r.message


def test_hanging_step_times_out_and_worker_is_replaced(env):
    ps = _placements(env, 2, seed=3)
    env.measure_timeout_s = 4  # the other placement's measurement takes well under a second
    try:
        with faults(env, [(ps[0], "sleep:600")]):
            results = env.evaluate(ps)
    finally:
        env.measure_timeout_s = 10
    assert results[0].status == "timeout" and "4s" in results[0].message
    assert results[1].status == "ok"
    (again,) = env.evaluate(_placements(env, 1, seed=4))  # the replacement worker measures
    assert again.ok


def test_injected_oom_and_error_are_results(env):
    ps = _placements(env, 3, seed=5)
    with faults(env, [(ps[0], "oom"), (ps[1], "raise:boom in step"), (ps[2], "memory")]):
        oom, err, memory = env.evaluate(ps)
    assert oom.status == "oom" and oom.step_time_s == float("inf")
    assert err.status == "error" and "boom in step" in err.message
    assert memory.status == "oom" and "MemoryError" in memory.message  # Python's MemoryError is out of memory too


def hanging_builder():
    """Builds in the driver; hangs in a Ray worker."""
    if ray.is_initialized():
        time.sleep(3600)
    return tiny_builder()


#: The build's timeout in the test below: the build hangs for an hour, so any timeout expires.
BUILD_S = 4


def test_model_build_hanging_in_a_worker_times_out(env):
    hanging = MeasuredEnv(
        hanging_builder,
        env.cluster,
        graph=env.graph,
        device_map="*=cpu",
        workers=1,
        cpus_per_worker=0,
        start_timeout_s=300,  # to start (a loaded machine too); then BUILD_S to build, where it hangs
        build_timeout_s=BUILD_S,
    )
    try:
        with pytest.raises(PlacerError, match=rf"could not build the model .* within {BUILD_S}s"):
            hanging.evaluate(_placements(env, 1, seed=6))
    finally:
        hanging.close()


def test_worker_that_cannot_start_times_out(env):
    starved = MeasuredEnv(
        tiny_builder, env.cluster, graph=env.graph, device_map="*=cpu", workers=1, cpus_per_worker=64, start_timeout_s=3
    )
    try:
        with pytest.raises(PlacerError, match=r"could not start a worker .*64 CPUs.* within 3s"):
            starved.start()
    finally:
        starved.close()


def test_measure_timeout_must_be_a_positive_finite_number(env):
    for bad in (0, -1, float("nan"), float("inf"), "10", True):
        with pytest.raises(PlacerError, match="--measure-timeout"):
            MeasuredEnv(tiny_builder, env.cluster, graph=env.graph, measure_timeout_s=bad)
        with pytest.raises(PlacerError, match="start_timeout_s"):
            MeasuredEnv(tiny_builder, env.cluster, graph=env.graph, start_timeout_s=bad)


def test_resumed_run_reads_its_log(env):
    ps = _placements(env, 2, seed=0)  # measured by the first test
    first = env.evaluate(ps)
    again = MeasuredEnv(
        tiny_builder, env.cluster, device_map="*=cpu", run_dir=os.path.dirname(env.log_path), graph=env.graph
    )
    results = again.evaluate(ps)
    assert again._actors == []  # nothing measured again
    assert [r.step_time_s for r in results] == [r.step_time_s for r in first]
    with open(env.log_path) as f:
        lines = [json.loads(x) for x in f]
    assert all(rec["graph_hash"] == env.graph.content_hash for rec in lines)
    first = [rec for rec in lines if not rec.get("again")]  # a re-measurement (evaluate(again=True)) is logged too
    assert len({rec["placement_hash"] for rec in first}) == len(first)  # nothing measured twice for its first result


def test_torn_log_line_is_skipped(tmp_path):
    path = tmp_path / LOG_NAME
    good = {"graph_hash": "g", "placement_hash": placement_hash(["cpu:0"]), "result": {"step_time_s": 0.5}}
    path.write_text(json.dumps(good) + "\n" + '{"graph_hash": "g", "placement_ha')
    assert list(read_log(str(path), "g").values())[0].step_time_s == 0.5
    assert read_log(str(path), "other") == {}
