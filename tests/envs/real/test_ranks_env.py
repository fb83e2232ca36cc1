"""Measured mode across processes: each placement one Ray job of two gloo ranks, on a real (local) Ray cluster.

One ``ray.cluster_utils.Cluster`` (a head with 2 CPUs) is started for the module and
shut down after. The job is logged and cached as the measured env's measurements
are; measured again on request; a rank that dies is an error once the retries are
spent (the retry rule itself is tested without Ray).
"""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

import envs  # noqa: E402
from envs.real.ray.jobs import JobLost, RanksEnv  # noqa: E402
from envs.real.slices import supported  # noqa: E402
from envs.result import Result  # noqa: E402
from graphs import PlacerError  # noqa: E402
from graphs.plan import Placement  # noqa: E402
from tests.conftest import RAY_UNNICED, importable_module  # noqa: E402

MODEL_SRC = textwrap.dedent(
    """
    import os
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 2)

        def forward(self, x, y):
            return F.cross_entropy(self.b(torch.relu(self.a(x))), y)


    def build():
        torch.manual_seed(0)
        return Net(), (torch.randn(4, 8), torch.randint(0, 2, (4,)))


    class Dying(Net):
        def forward(self, x, y):
            if os.environ.get("RANK") == "1":  # the rank of the second stage dies as it builds its stages
                os._exit(9)
            return super().forward(x, y)


    def dying():
        torch.manual_seed(0)
        return Dying(), (torch.randn(4, 8), torch.randint(0, 2, (4,)))
    """
)


@pytest.fixture(scope="module")
def ray_cluster():
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, "_system_config": RAY_UNNICED}
    )
    ray.init(address=cluster.address, log_to_driver=False, include_dashboard=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    return importable_module(tmp_path, monkeypatch, "ranks_model", MODEL_SRC)


def _env(source: str, run_dir, cluster: str = "k80x2", **options) -> RanksEnv:
    options = {"warmup_steps": 1, "timed_steps": 2, "measure_timeout_s": 120, "start_timeout_s": 120, **options}
    return RanksEnv(source, envs.resolve_cluster(cluster), run_dir=run_dir, **options)


def _split(env: RanksEnv, **plan) -> Placement:
    n = env.graph.num_ops
    devices = ["gpu:0" if i < n // 2 else "gpu:1" for i in range(n)]
    return Placement.from_indices(env.graph, env.cluster.device_names, [1 + (d == "gpu:1") for d in devices], **plan)


def test_a_placement_is_one_job_of_two_processes_logged_cached_and_measured_again(ray_cluster, workdir):
    env = _env("ranks_model:build", workdir / "run")
    try:
        placement = _split(env, microbatches=2)
        (first,) = env.evaluate([placement])
        assert first.ok and first.step_time_s > 0, first.message
        assert set(first.peak_bytes) == {"gpu:0", "gpu:1"} and first.extra["schedule"] == "gpipe"
        assert [r["rank"] for r in first.extra["ranks"]] == [0, 1] and len(first.extra["step_times_s"]) == 2
        assert all(r["thread_cache_off"] for r in first.extra["ranks"])  # the actors' processes: envs.real.allocator
        assert env.evaluate([placement])[0] is first  # cached: no second job
        assert len(env._job_actors) == 2  # a job that ended ok leaves its ranks' processes for the next
        (again,) = env.evaluate([placement], again=True)
        assert again.ok and again is not first and env.evaluate([placement])[0] is first
        pids = [r["pid"] for r in first.extra["ranks"]]
        assert [r["pid"] for r in again.extra["ranks"]] == pids and len(set(pids)) == 2  # the same two processes
        # the second job took the first's export, and started from the model as built: the same losses, step by step
        assert [r["program_reused"] for r in first.extra["ranks"]] == [False, False]
        assert [r["program_reused"] for r in again.extra["ranks"]] == [True, True]
        assert again.extra["losses"] == first.extra["losses"] and len(first.extra["losses"]) == 2
        assert list(first.extra["ranks"][0]["setup_s"]) == ["join", "build", "export", "stages", "steps"]
        records = [json.loads(line) for line in (workdir / "run" / "measurements.jsonl").read_text().splitlines()]
        assert [r.get("again", False) for r in records] == [False, True]
        assert records[0]["placement_hash"].startswith("ranks-") and records[0]["placement_hash"].endswith("-gpipe")
    finally:
        env.close()
    # a new env on the same run directory reads the job back instead of running it
    resumed = _env("ranks_model:build", workdir / "run")
    try:
        assert resumed.evaluate([placement])[0].step_time_s == first.step_time_s
    finally:
        resumed.close()
    # each rank pinned to its cores (the last usable core for rank 0, the first for rank 1), gloo's threads at a short
    # slice: a job of its own, not the unpinned one read back, whose every rank ran where and as it was told
    cores = sorted(os.sched_getaffinity(0))
    pinned = _env(
        "ranks_model:build",
        workdir / "run",
        rank_cpus=[(cores[-1],), (cores[0],)],
        helper_slice_us=200,
        reuse_actors=False,
    )
    try:
        (measured,) = pinned.evaluate([placement])
        assert measured.ok and measured is not first, measured.message
        assert [r["cpus"] for r in measured.extra["ranks"]] == [[cores[-1]], [cores[0]]]
        assert pinned._job_actors == [] and pinned._job_group is None  # reuse_actors=False: gone with the job
        assert [r["short_slices"] for r in first.extra["ranks"]] == [0, 0]
        if supported():  # gloo's threads (its loop and workers) at 200 us
            assert all(r["short_slices"] >= 1 for r in measured.extra["ranks"]), measured.extra["ranks"]
        one_rank = Placement.from_indices(pinned.graph, pinned.cluster.device_names, [1] * pinned.graph.num_ops)
        assert pinned.plans([one_rank])[0][0].endswith(f"-cpus{cores[-1]}-slice200us")  # one rank: the first cores
    finally:
        pinned.close()
    with pytest.raises(PlacerError, match=r"measured env: rank_cpus: cores \[100000\] are not among"):
        _env("ranks_model:build", None, rank_cpus=[(cores[0],), (100000,)])
    with pytest.raises(PlacerError, match="placement 0: 2 ranks, but rank_cpus gives cores for 1 only"):
        _env("ranks_model:build", None, rank_cpus=[(cores[0],)]).plans([placement])


def test_a_rank_that_dies_is_an_error_result(ray_cluster, workdir):
    env = _env("ranks_model:dying", None, max_retries=0)
    try:
        (result,) = env.evaluate([_split(env)])
        assert result.status == "error" and "a rank died 1 times" in result.message, result.message
        assert env._job_actors == [] and env._job_group is None  # a failed job's processes are never reused
    finally:
        env.close()


def test_a_gymnasium_environment_scores_its_placements_as_jobs_of_ranks(ray_cluster, workdir):
    """The multi-process runs behind placer.gym as the simulator is: one step is one job of two ranks.

    On a cluster of two devices (cpu:0, gpu:0): the problem's reward scale measures each device alone first, one job
    per device (k80x2's three devices made it three)."""
    from placer.gym.problem import Outcome
    from placer.gym.views import PlaceAllEnv

    env = _env("ranks_model:build", None, cluster="h200x1")
    try:
        assert env.cluster.device_names == ["cpu:0", "gpu:0"]
        gym_env = PlaceAllEnv(graph=env.graph, cluster=env.cluster, scorer=env)
        gym_env.reset(seed=0)
        n = env.graph.num_ops
        action = np.array([0 if i < n // 2 else 1 for i in range(gym_env.action_space.shape[0])])  # cpu:0, gpu:0
        _, reward, terminated, _, info = gym_env.step(action)
        split = Placement.from_indices(env.graph, env.cluster.device_names, action[:n])
        (measured,) = env.evaluate([split])  # the same plan: the env's cached job
        assert terminated and measured.ok and info["step_time_s"] == measured.step_time_s > 0
        assert [r["rank"] for r in measured.extra["ranks"]] == [0, 1]
        assert reward == gym_env.problem.reward(Outcome.of(measured)) and info["peak_bytes"] == measured.peak_bytes
    finally:
        env.close()


def test_a_job_whose_rank_died_runs_again_and_a_lost_node_is_not_counted(workdir, monkeypatch):
    """The retry rule alone (no Ray): two deaths are retried, the third is the result; a lost node is free."""
    env = _env("ranks_model:build", None, max_retries=2)
    outcomes = iter(
        [JobLost("died", node_left=True), JobLost("died", False), JobLost("died", False), "ok", JobLost("d", False)]
        + [JobLost("died", False)] * 3
    )

    def run_job(plan):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return Result(0.5, "ok", source="measured")

    monkeypatch.setattr(env, "_run_job", run_job)
    assert env._measure_job(None).ok  # lost node (free), two deaths (retries 1 and 2), then the job
    failed = env._measure_job(None)  # four deaths: the third is past max_retries
    assert failed.status == "error" and "a rank died 3 times" in failed.message
    assert next(outcomes, "none left").__class__ is JobLost


def test_a_job_whose_port_was_taken_runs_again_on_a_fresh_one(workdir, monkeypatch):
    """The port rule alone (no Ray): another process may take the port chosen for a job's process group before the
    group listens on it (EADDRINUSE, seen once in CI): the job runs again, at most PORT_RETRIES times."""
    from envs.real.ray.jobs import PORT_RETRIES

    env = _env("ranks_model:build", None)
    taken = Result(
        float("inf"),
        "error",
        "DistNetworkError: ... code: -98, name: EADDRINUSE, message: address already in use",
        source="measured",
    )
    outcomes = iter([taken, taken, Result(0.5, "ok", source="measured")] + [taken] * (PORT_RETRIES + 1))
    monkeypatch.setattr(env, "_run_job", lambda plan: next(outcomes))
    assert env._measure_job(None).ok  # twice taken, then the job
    again = env._measure_job(None)  # taken every time: the last is the result
    assert again.status == "error" and "EADDRINUSE" in again.message
    assert next(outcomes, "none left") == "none left"


def test_a_plan_that_cannot_run_is_one_line_before_any_job(ray_cluster, workdir):
    env = _env("ranks_model:build", None)
    try:
        with pytest.raises(PlacerError, match="schedule '1f1b' needs at least as many microbatches as stages"):
            env.evaluate([_split(env, schedule="1f1b")])
    finally:
        env.close()


def test_a_job_larger_than_the_local_ray_is_one_line_at_once(workdir, monkeypatch):
    """On the local Ray the env started (its size fixed), 3 ranks of 1 CPU on 2 CPUs can never be reserved: one line
    now, not a wait of start_timeout_s; on a Ray cluster joined by address (it may grow), the wait stays."""
    import envs.real.ray.jobs as jobs

    env = _env("ranks_model:build", None)
    monkeypatch.setattr(jobs.ray, "cluster_resources", lambda: {"CPU": 2.0})
    env._check_room(3, 0)  # joined, not started here: no check
    env._started_ray = True
    try:
        env._check_room(2, 0)
        with pytest.raises(PlacerError, match=r"3 processes of 1 CPU each \(3 in all\); the local Ray has 2: use a "):
            env._check_room(3, 0)
        with pytest.raises(PlacerError, match="of 1 GPU each"):
            env._check_room(2, 1)
    finally:
        env._started_ray = False


def test_only_a_job_that_ended_ok_leaves_its_processes_for_the_next_of_as_many_ranks(workdir, monkeypatch):
    """The reuse rule alone (no Ray): fresh actors for the first job, for a job of another size and after any job
    that did not end ok (an error, a timeout, a dead actor); never with ``reuse_actors=False``."""
    env = _env("ranks_model:build", None)
    started, released, outcomes = [], [], iter([])

    def start(n):
        env._release_actors()
        env._job_actors = [f"actor {len(started)}.{r}" for r in range(n)]
        started.append(n)

    def release():
        if env._job_actors:
            released.append(list(env._job_actors))
        env._job_actors = []

    def wait_job(plan):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(env, "_start_actors", start)
    monkeypatch.setattr(env, "_release_actors", release)
    monkeypatch.setattr(env, "_wait_job", wait_job)
    monkeypatch.setattr(env, "_job_result", lambda plan, status: Result(0.5 if status == "ok" else 1e9, status))
    alive = iter([True] * 5 + [False])  # the actors left answer, but not before the last job
    monkeypatch.setattr(env, "_actors_alive", lambda: next(alive))

    class Plan:
        def __init__(self, n):
            self.num_ranks = n

    outcomes = iter(["ok", "ok", "ok", "oom", "ok", "timeout", "ok", JobLost("died", False), "ok", "ok", "ok"])
    statuses = []
    for n in (2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1):
        try:
            statuses.append(env._run_job(Plan(n)).status)
        except JobLost:
            statuses.append("lost")
    assert statuses == ["ok", "ok", "ok", "oom", "ok", "timeout", "ok", "lost", "ok", "ok", "ok"]
    # started: the first job, the first of 1 rank, after the oom, the timeout and the lost actor, and where the
    # actor left did not answer (the last job)
    assert started == [2, 1, 1, 1, 1, 1]
    assert len(released) == 5 and env._job_actors == ["actor 5.0"]  # the last ok job's actor is kept
    env.reuse_actors = False
    outcomes = iter(["ok"])
    assert env._run_job(Plan(1)).ok and env._job_actors == [] and len(started) == 7
