"""Measured mode across processes: every placement is one Ray job of one process per device.

:class:`RanksEnv` is :class:`envs.real.measured.MeasuredEnv` (the same Ray start or
join, shipping of the user's module, log, cache and re-measurement) whose
``evaluate`` runs each placement across processes: it compiles the plan here
(:func:`envs.real.distributed.rank_plan.compile_plan`: a bad plan is a
:class:`PlacerError` before anything starts), reserves one bundle per rank in a Ray
placement group (``num_cpus`` and, with nccl, one GPU each), starts one rank actor
per bundle, gives them rank 0's address and a free port there, and runs
:func:`envs.real.distributed.worker.run_rank` in each: the same process group, stages
and timed steps that ``placer run --nproc-per-node`` runs. Ray Train's
``TorchTrainer`` would do the same setup; it is an extra (``ray[train]``) this
project does not require, so the placement group is used everywhere.

Failures are results, as in the measured env: a rank that raises makes the job an
``"error"`` (``"oom"`` for out of memory) with the rank's first line; a job past
``start_timeout_s + measure_timeout_s`` a ``"timeout"``; a job whose actor died is run
again on fresh actors, at most ``max_retries`` times, and not counted when the dead
actor's node has left the cluster (the job goes on the nodes left). A job whose process
group could not listen on its port (taken between the moment rank 0's node found it free
and the moment the group bound it, by another process's connection: ``EADDRINUSE``) is run
again on a fresh port, at most :data:`PORT_RETRIES` times. A placement
group that cannot be reserved within ``start_timeout_s`` (not enough CPUs or GPUs on
the cluster) is a :class:`PlacerError`.

A job that ends ``"ok"`` leaves its actors and placement group for the next job of
as many ranks (``reuse_actors``): each job still builds the model anew, starts its
own process group on a fresh port and times its own steps, but does not pay for N new
processes that import torch and placer (about 3 s each on this project's CI machine).
Any other ending (an error, a timeout, a dead actor), a job of another size and
:meth:`RanksEnv.close` remove them; with ``reuse_actors=False`` every job's are removed
when it ends.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from envs.real.distributed.launch import free_port, port_in_use
from envs.real.distributed.rank_plan import RankPlan, compile_plan
from envs.real.distributed.worker import RankJob, check_cpus, run_rank
from envs.real.measure_log import placement_key
from envs.real.measured import MeasuredEnv, actor_runtime_env
from envs.real.shipping import shipped_root
from envs.real.timing import failure_status
from envs.real.worker import one_line
from envs.result import Result
from graphs import PlacerError
from graphs.plan import Placement


class RankActor:
    """One process of a job: runs :func:`run_rank` with torch's environment set for its rank."""

    def __init__(self, source_dir: str | None = None, shipped: str | None = None) -> None:
        self.search_dir = (shipped_root(shipped) or source_dir) if shipped else source_dir

    def address(self) -> tuple[str, int, str]:
        """This actor's node address, a port free there now, and its Ray node id."""
        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip), ray.get_runtime_context().get_node_id()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run(self, job: RankJob, rank: int, world_size: int, master: tuple[str, int]) -> dict[str, Any] | None:
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",  # Ray gives each actor its own devices: its GPU is cuda:0
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
        )
        return run_rank(dataclasses.replace(job, source_dir=self.search_dir))


#: Times a job whose process group found its port taken (:func:`port_taken`) is run again on a fresh one.
PORT_RETRIES = 3


def port_taken(result: Result) -> bool:
    """Whether ``result`` is a job's error because its process group could not listen on the port chosen for it.

    >>> port_taken(Result(float("inf"), "error", "DistNetworkError: ... code: -98, name: EADDRINUSE, ..."))
    True
    >>> port_taken(Result(float("inf"), "error", "RuntimeError: shapes differ"))
    False
    """
    return result.status == "error" and port_in_use(result.message)


#: Seconds a job whose rank raised waits for its other ranks before the error is the job's: one of them may have died
#: first (see :meth:`RanksEnv._wait_job`).
PEER_DEATH_GRACE_S = 5.0


def _lost(e: RayActorError, node: str) -> "JobLost":
    """The :class:`JobLost` of a rank's actor that died (``e``) on ``node``."""
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return JobLost(one_line(e), node_left=node not in alive)


class JobLost(Exception):
    """An actor of the job died: ``node_left`` when its node is no longer in the cluster."""

    def __init__(self, message: str, node_left: bool) -> None:
        super().__init__(message)
        self.node_left = node_left


class RanksEnv(MeasuredEnv):
    """The measured env with every placement run across processes, one per device (see the module doc).

    Args (beyond :class:`MeasuredEnv`'s: ``source``, ``cluster``, ``ray_address``,
    ``warmup_steps``, ``timed_steps``, ``measure_timeout_s``, ``start_timeout_s``,
    ``run_dir``, ``max_retries``, ``graph``, ``lr``):
        backend: the process group, ``"gloo"`` (CPU tensors; one CPU per rank) or
            ``"nccl"`` (one GPU per rank).
        rank_map, device_map: which rank and torch device each logical device is
            (:func:`envs.real.distributed.ranks.assign_ranks`).
        cpus_per_rank: Ray CPUs (and torch threads) of each rank.
        rank_cpus: the cores each rank runs on, by rank (``[(0,), (1,)]``: rank 0 on core 0, rank 1 on
            core 1; :attr:`RankJob.cpus`; a plan of fewer ranks uses the first); None: where Ray starts it. Only
            on a Ray cluster of this one machine (the cores are checked here); a pinned job's log key differs
            from the same plan's unpinned one.
        helper_slice_us: gloo's threads in each rank ask the scheduler for a slice this short
            (:attr:`RankJob.helper_slice_us`, :mod:`envs.real.slices`); None: its defaults. A job with it has
            its own log key.
        microbatches, inflight, schedule: the plan of a placement given as a vector
            or mapping (a :class:`graphs.plan.Placement` carries its own).
        reuse_actors: a job that ended ``"ok"`` leaves its rank actors for the next
            job of as many ranks (the module doc); False: fresh processes every job.
        reuse_program: a kept actor's next job of the same model skips the export, its program's weights put
            back as built (:attr:`RankJob.reuse_program`); False: every job exports anew.

    A :class:`graphs.plan.Placement` is measured with its issue order, microbatches,
    window and schedule; its key in the log covers all of them.
    """

    def __init__(
        self,
        source: str,
        cluster: Any,
        *,
        backend: str = "gloo",
        rank_map: str | Mapping[str, int] | None = None,
        cpus_per_rank: int = 1,
        rank_cpus: Sequence[Sequence[int]] | None = None,
        helper_slice_us: int | None = None,
        microbatches: int = 1,
        inflight: int | None = None,
        schedule: str | None = None,
        reuse_actors: bool = True,
        reuse_program: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(source, cluster, cpus_per_worker=cpus_per_rank, **options)
        self.reuse_actors = reuse_actors
        self.reuse_program = reuse_program
        self._job_group: Any = None  # the placement group of self._job_actors
        self.backend, self.rank_map, self.cpus_per_rank = backend, rank_map, cpus_per_rank
        self.rank_cpus = check_cpus(rank_cpus, "measured env: rank_cpus")
        self.helper_slice_us = helper_slice_us
        self.plan_options = {"microbatches": microbatches, "inflight": inflight, "schedule": schedule}
        self._program_graphs: dict[int, Any] = {}  # microbatches -> the graph of one microbatch's program
        self._job_actors: list[Any] = []

    # ------------------------------------------------------------ plans
    def _placement(self, p: Any) -> Placement:
        if isinstance(p, Placement):
            return p
        idx = placement_key(p, self.graph, list(self.cluster.device_names), "placement")[1]
        return Placement(
            assignment=idx,
            graph_hash=self.graph.content_hash,
            devices=list(self.cluster.device_names),
            **self.plan_options,
        )

    def _program_graph(self, microbatches: int) -> Any:
        """The graph of the model exported at one microbatch's size (the stages are cut from it)."""
        if microbatches not in self._program_graphs:
            from envs.real.pipeline import split_batch
            from envs.real.worker import build_model
            from graphs.torch_capture import export_program, graph_from_program

            model, inputs = build_model(self.source, search_dir=self.source_dir)
            self._program_graphs[microbatches] = graph_from_program(
                export_program(model, split_batch(inputs, microbatches)[0])
            )
        return self._program_graphs[microbatches]

    def plans(self, placements: Sequence[Any]) -> list[tuple[str, RankPlan]]:
        """(log key, compiled plan) of each placement; a bad one is a :class:`PlacerError` naming it."""
        out = []
        for k, p in enumerate(placements):
            placement = self._placement(p)
            M = placement.microbatches
            plan = compile_plan(
                self.graph,
                placement,
                program=self._program_graph(M) if M > 1 else None,
                rank_map=self.rank_map,
                backend=self.backend,
                nproc_per_node=1,
                device_map=self.device_map,
            )
            key = placement_key(placement, self.graph, list(self.cluster.device_names), f"placement {k}")[0]
            cpus = self._cpus(plan)
            if cpus is not None and len(cpus) < plan.num_ranks:
                raise PlacerError(
                    f"placement {k}: {plan.num_ranks} ranks, but rank_cpus gives cores for {len(cpus)} only"
                )
            # across processes, with its plan: never the key of the same placement measured in one process
            key = f"ranks-{key}-m{M}-w{placement.inflight or M}-{plan.schedule}"
            pinned = "" if cpus is None else "-cpus" + "_".join(".".join(map(str, c)) for c in cpus)
            sliced = f"-slice{self.helper_slice_us}us" if self.helper_slice_us else ""
            out.append((key + pinned + sliced, plan))
        return out

    def _cpus(self, plan: RankPlan) -> tuple | None:
        """The cores of the plan's ranks (the first of ``rank_cpus``); None: unpinned."""
        return None if self.rank_cpus is None else self.rank_cpus[: plan.num_ranks]

    # ------------------------------------------------------------ scoring
    def evaluate(self, placements: Sequence[Any], *, again: bool = False) -> list[Result]:
        """Measure each placement as one job (logged ones are read back; ``again``: every one measured anew)."""
        keyed = self.plans(placements)
        self._begin(again)
        for key, plan in keyed:
            if again or key not in self._cache:
                self._record(key, self._measure_job(plan))
        return self._results([key for key, _ in keyed])

    def _measure_job(self, plan: RankPlan) -> Result:
        retries = taken = 0
        while True:
            try:
                result = self._run_job(plan)
                if port_taken(result) and taken < PORT_RETRIES:
                    taken += 1  # another process took the port first: a fresh one (its actors were released)
                    continue
                return result
            except JobLost as e:
                if e.node_left:
                    continue  # measured again on the nodes left, as the measured env does
                retries += 1
                if retries > self.max_retries:
                    return Result(float("inf"), "error", f"a rank died {retries} times: {e}", source="measured")

    def _run_job(self, plan: RankPlan) -> Result:
        ok = False
        try:
            if not self._reusable(plan.num_ranks):
                self._start_actors(plan.num_ranks)
            try:
                result = self._job_result(plan, self._wait_job(plan))
                ok = result.status == "ok"
                return result
            except RayTaskError as e:  # a rank raised
                return task_failure(e)
            except GetTimeoutError:
                return Result(float("inf"), "timeout", "a rank did not start in time", source="measured")
        finally:
            if not (ok and self.reuse_actors):
                self._release_actors()

    def _reusable(self, ranks: int) -> bool:
        """The actors left by the last job serve a job of ``ranks`` ranks: as many, and every one alive."""
        return bool(self.reuse_actors and len(self._job_actors) == ranks and self._actors_alive())

    def _actors_alive(self) -> bool:
        """Every actor left by the last job answers (one that died, or whose node left, does not)."""
        try:
            ray.get([a.node.remote() for a in self._job_actors], timeout=self.start_timeout_s)
        except (RayActorError, GetTimeoutError):
            return False
        return True

    def _start_actors(self, N: int) -> None:
        """Reserve a placement group of ``N`` bundles and start one rank actor in each (what was left before goes)."""
        self._release_actors()
        ray_ = self._ensure_ray()
        gpus = 1 if self.backend == "nccl" else 0
        self._check_room(N, gpus)
        group = self._job_group = placement_group([{"CPU": self.cpus_per_rank, "GPU": gpus}] * N, strategy="PACK")
        ready, _ = ray_.wait([group.ready()], timeout=self.start_timeout_s)
        if not ready:
            raise PlacerError(
                f"measured env: could not reserve {N} processes ({self.cpus_per_rank} CPUs"
                f"{' and a GPU' if gpus else ''} each) within {self.start_timeout_s:g}s: does the Ray cluster "
                "have them free?"
            )
        cls = ray_.remote(num_cpus=self.cpus_per_rank, num_gpus=gpus, max_restarts=0)(RankActor)
        shipped = self.shipment.module if self.shipment else None
        self._job_actors = [
            cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r),
                runtime_env=actor_runtime_env(),
            ).remote(self.source_dir, shipped)
            for r in range(N)
        ]

    def _release_actors(self) -> None:
        """Kill the rank actors and remove their placement group, if any."""
        for a in self._job_actors:
            ray.kill(a, no_restart=True)
        self._job_actors = []
        if self._job_group is not None:
            remove_placement_group(self._job_group)
            self._job_group = None

    def _check_room(self, ranks: int, gpus: int) -> None:
        """On the local Ray this env started (a fixed size), a job larger than the whole cluster is one line now,
        not a wait of ``start_timeout_s`` for room that never comes (a cluster joined by address may grow)."""
        if not self._started_ray:
            return
        have = ray.cluster_resources()
        for what, each in (("CPU", self.cpus_per_rank), ("GPU", gpus)):
            need = ranks * each
            if need > have.get(what, 0):
                raise PlacerError(
                    f"measured env: the plan runs {ranks} processes of {each} {what}{'s' if each != 1 else ''} each "
                    f"({need} in all); the local Ray has {have.get(what, 0):g}: use a cluster of at most "
                    f"{int(have.get(what, 0) // each)} devices here"
                )

    def _wait_job(self, plan: RankPlan) -> dict[str, Any] | None:
        """Start every rank and wait for rank 0's report (None: past the deadline)."""
        deadline = time.monotonic() + self.start_timeout_s + self.measure_timeout_s
        nodes = ray.get([a.node.remote() for a in self._job_actors], timeout=self.start_timeout_s)
        ip, port, _ = ray.get(self._job_actors[0].address.remote(), timeout=self.start_timeout_s)
        job = RankJob(
            source=self.source,
            plan=plan.to_dict(),
            backend=self.backend,
            warmup=self.warmup_steps,
            steps=self.timed_steps,
            lr=self.lr,
            timeout_s=self.measure_timeout_s,
            threads=self.cpus_per_rank,
            cpus=self._cpus(plan),
            helper_slice_us=self.helper_slice_us,
            reuse_program=self.reuse_program,
        )
        refs = [a.run.remote(job, r, plan.num_ranks, (ip, port)) for r, a in enumerate(self._job_actors)]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                return None
            try:
                ray.get(done[0])
            except RayActorError as e:
                raise _lost(e, nodes[refs.index(done[0])]) from None
            except RayTaskError:
                # a rank whose peer died raises too (gloo: "Connection reset by peer"), often before the death is
                # reported: the death is the cause, so the job is lost, not failed
                for ref in ray.wait(pending, num_returns=len(pending), timeout=PEER_DEATH_GRACE_S)[0]:
                    try:
                        ray.get(ref)
                    except RayActorError as e:
                        raise _lost(e, nodes[refs.index(ref)]) from None
                    except RayTaskError:
                        pass
                raise
        return ray.get(refs[0])

    def _job_result(self, plan: RankPlan, report: Mapping[str, Any] | None) -> Result:
        if report is None:
            limit = self.start_timeout_s + self.measure_timeout_s
            return Result(float("inf"), "timeout", f"the job ran past {limit:g}s", source="measured")
        return Result(
            report["step_time_s"],
            "ok",
            peak_bytes={r["device"]: r["peak_bytes"] for r in report["ranks"]},
            source="measured",
            extra={k: report[k] for k in ("step_times_s", "spread_s", "losses", "schedule", "stages", "ranks")},
        )

    def close(self) -> None:
        """Kill a job's actors if one is running, then what :meth:`MeasuredEnv.close` does."""
        if ray.is_initialized():
            self._release_actors()
        super().close()


def task_failure(e: RayTaskError) -> Result:
    """A rank that raised: the job's result, ``"oom"`` or ``"error"`` with the cause's first line."""
    cause = e.cause or e
    status = failure_status(cause)
    return Result(float("inf"), status, f"{type(cause).__name__}: {one_line(cause)}", source="measured")


__all__ = ["JobLost", "RankActor", "RanksEnv", "task_failure"]
