"""What each process of a job across processes runs: build the model, its stages, check a step, time steps.

:func:`run_rank` is the entry point torch's launcher starts in every process
(:mod:`~envs.real.distributed.launch`), and Ray's actors call
(:mod:`envs.real.ray`). It joins the process group from the environment torch's
launchers set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), with
every collective and send bounded by ``timeout_s``; takes rank 0's job (the plan and
options node 0 was given: every rank must run the same steps); builds the model from its source
(seeded, so every rank has the same weights) and exports it at the microbatch size;
then:

* with ``check``: runs one step and sends its loss and gradients to rank 0, which
  compares them with the float64 one-process step (:mod:`envs.real.conformance`);
* runs ``warmup`` then ``steps`` training steps (forward, backward, Adam step) on
  each rank's stages, each step begun by all ranks together (a barrier), and records
  each rank's step times and peak memory (:func:`envs.real.timing.measure_steps`), and
  each action's time (:class:`~envs.real.distributed.trace.ActionRecorder`).

Rank 0 returns the job's report (:func:`job_report`), the others None. The job's
step time is, per step, the slowest rank's; its median over the timed steps is the
result, with the fastest and slowest step beside it. Each rank's phases (forward,
backward, optimizer, the rest: :func:`envs.timeline.phases`) are medians over the
timed steps; the report's ``timeline`` is every rank's actions in the median step.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils._pytree import tree_leaves  # noqa: PLC2701 (torch has no public pytree module)

from envs.real.allocator import thread_cache_off
from envs.real.compared import float64_cpu
from envs.real.conformance import Reference, model_buffers, plan_reference, relative_error, verdict
from envs.real.distributed.rank_plan import RankPlan
from envs.real.distributed.ranks import check_world
from envs.real.distributed.runtime import RankSchedule
from envs.real.distributed.trace import ActionRecorder
from envs.real.fixed_draws import fixed_draws
from envs.real.pipeline import export_microbatch
from envs.real.slices import shorten_helper_slices
from envs.real.timing import Protocol, adam, measure_steps, time_limit
from envs.real.worker import build_model
from graphs import PlacerError
from graphs.export import one_process_world
from graphs.hash_seed import hash_seed_hint
from graphs.torch_capture import export_program, graph_from_program


@dataclass(frozen=True)
class RankJob:
    """What every process of a job needs (it travels to the processes, pickled by torch's launcher or Ray).

    Attributes:
        source: a zoo name or ``module:callable`` returning ``(model, example_inputs)``.
        plan: :meth:`RankPlan.to_dict` of the compiled plan.
        source_dir: where a ``module:callable`` resolves (the driver's working directory).
        backend: ``"gloo"`` or ``"nccl"``.
        warmup, steps: untimed, then timed training steps.
        lr: Adam's learning rate.
        check: compare one step's loss and gradients with the one-process step first.
        timeout_s: the most any collective, send or receive may wait, and the most
            the timed steps may take.
        threads: torch threads per process.
        steady_malloc: glibc's malloc keeps what a step frees (:class:`envs.real.timing.Protocol`); False: its
            defaults (the A/B of ``bench.repeatability --malloc``).
        early_receives: post every receive of a step as it begins (:class:`RankSchedule`'s; None: on CPU ranks
            under the schedules of :data:`~envs.real.distributed.runtime.EARLY_RECEIVES`; the A/B of
            ``bench.repeatability --receives``).
        cpus: the cores each process runs on, by its global rank (``cpus[rank]``; None: where its launcher left
            it). Set before the process group starts, so that gloo's threads start there too (:func:`pin_rank`).
        helper_slice_us: once the process group is up, every thread of the process but the one that computes
            (gloo's) asks the scheduler for a slice this short, so a message's hand-off does not wait for the
            tick (:mod:`envs.real.slices`); None: the scheduler's defaults (the A/B of ``bench.repeatability
            --slice``).
        reuse_program: a process that ran a job of the same model before skips the export and takes that job's
            program, its weights put back as built (:class:`ProgramCache`); False: every job exports anew (the A/B
            of ``docs/ranks/cpu2/reuse/program_ab.py``).
    """

    source: str
    plan: dict[str, Any]
    source_dir: str | None = None
    backend: str = "gloo"
    warmup: int = 2
    steps: int = 10
    lr: float = 1e-3
    check: bool = False
    timeout_s: float = 600.0
    threads: int = 1
    steady_malloc: bool = True
    early_receives: bool | None = None
    cpus: tuple[tuple[int, ...], ...] | None = None
    helper_slice_us: int | None = None
    reuse_program: bool = True


def check_cpus(cpus: Sequence[Sequence[int]] | None, what: str = "rank cpus") -> tuple | None:
    """``cpus`` (one set of cores a rank) as :attr:`RankJob.cpus`, each core one this process may run on (the ranks
    are started on this machine); else :class:`PlacerError` naming ``what``."""
    if cpus is None:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise PlacerError(f"{what}: pinning a process to cores needs os.sched_setaffinity (Linux)")
    out = tuple(tuple(int(c) for c in each) for each in cpus)
    allowed = os.sched_getaffinity(0)
    if not out or not all(out):
        raise PlacerError(f"{what}: give each rank a set of cores, none empty (got {[list(c) for c in out]})")
    missing = sorted({c for each in out for c in each} - allowed)
    if missing:
        raise PlacerError(f"{what}: cores {missing} are not among this machine's usable ones {sorted(allowed)}")
    return out


def one_core_each(ranks: int | None = None) -> tuple[tuple[int, ...], ...]:
    """:attr:`RankJob.cpus` with rank r on the r-th core this process may use (wrapping round where ``ranks`` is more
    than the cores; None: one rank a core)."""
    cores = sorted(os.sched_getaffinity(0))
    return tuple((cores[r % len(cores)],) for r in range(len(cores) if ranks is None else ranks))


def pin_rank(cpus: Sequence[Sequence[int]] | None) -> None:
    """This process (and the threads it starts from now on) on ``cpus[RANK]`` (``RANK`` as the launcher set it);
    None: nothing."""
    if cpus is not None:
        os.sched_setaffinity(0, set(cpus[int(os.environ.get("RANK", "0")) % len(cpus)]))


class PipelineStep(nn.Module):
    """One training step's forwards and backwards on this rank, as a module :func:`measure_steps` times.

    Its forward waits for every rank (so the ranks begin each step together), tells
    ``recorder`` the step begins, runs :meth:`RankSchedule.step` (backward included:
    torch's schedule interleaves the two) and returns the loss, detached: its
    ``backward()`` has nothing left to do. Ranks without the last stage return 0.
    """

    def __init__(self, schedule: RankSchedule, recorder: ActionRecorder | None = None) -> None:
        super().__init__()
        self.schedule, self.recorder = schedule, recorder

    def forward(self, *inputs: Any) -> torch.Tensor:
        dist.barrier()
        if self.recorder is not None:
            self.recorder.begin_step()
        loss = self.schedule.step(*inputs)  # a model failing on a microbatch: a PlacerError naming the cut
        return (torch.zeros(()) if loss is None else loss.detach().cpu()).requires_grad_(True)


def _the_loss(outputs: torch.Tensor) -> torch.Tensor:
    return outputs


def gather_to_first(value: Any, group: Any = None) -> list[Any] | None:
    """Every rank's ``value`` on rank 0 (in rank order), None on the others."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, out, dst=0, group=group)
    return out


def step_gradients(schedule: RankSchedule, inputs: Sequence[Any]) -> dict[str, Any]:
    """One step on this rank: the loss (on the last stage's rank), its parameters' gradients and its stages' buffers
    after the step (:func:`envs.real.conformance.model_buffers`), float64 on the CPU; its random draws held at
    their likeliest values, as the reference's (:func:`envs.real.fixed_draws.fixed_draws`)."""
    with fixed_draws():
        loss = schedule.step(*inputs)
    grads = {k: float64_cpu(p.grad) for k, p in schedule.named_parameters().items() if p.grad is not None}
    for p in schedule.parameters():
        p.grad = None
    buffers = {k: b for m in schedule.modules for k, b in model_buffers(m).items()}
    return {"loss": None if loss is None else float(loss), "grads": grads, "buffers": buffers}


def _held_buffers(parts: Sequence[Mapping[str, Any]], ref: Reference) -> dict[str, torch.Tensor]:
    """Each buffer the ranks hold, the copy farthest from ``ref``'s where several ranks hold one (a rank whose
    copy missed a write fails the check)."""
    held: dict[str, torch.Tensor] = {}
    for part in parts:
        for k, b in part.get("buffers", {}).items():
            if k in held and k in ref.buffers and held[k].shape == b.shape == ref.buffers[k].shape:
                if relative_error(b, ref.buffers[k]) <= relative_error(held[k], ref.buffers[k]):
                    continue
            held[k] = b
    return held


def check_report(parts: Sequence[Mapping[str, Any]], ref: Reference, tied: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Every rank's :func:`step_gradients` against the one-process ``ref``: ``{"ok", "worst", ...}``; not ok where
    the step draws random numbers (``"draws"``: no verdict, :data:`envs.real.conformance.DRAWS`).

    A tied parameter is reported under the names its stages read it by; its other
    names (``tied``, the graph's ``meta["tied_params"]``) get the same gradient.
    """
    if ref.unchecked:
        return verdict(ref, None, {})
    grads: dict[str, torch.Tensor] = {}
    for part in parts:
        grads.update(part["grads"])
    for names in tied:
        have = [n for n in names if n in grads]
        for n in names:
            if have:
                grads.setdefault(n, grads[have[0]])
    loss = next(p["loss"] for p in parts if p["loss"] is not None)
    return verdict(ref, torch.tensor(loss, dtype=torch.float64), grads, _held_buffers(parts, ref))


def median_step(per_step: Sequence[float]) -> int:
    """The index of the step whose time is the median (the lower middle one of an even count)."""
    order = sorted(range(len(per_step)), key=lambda k: per_step[k])
    return order[(len(order) - 1) // 2] if order else -1


def job_report(ranks: Sequence[Mapping[str, Any]], plan: RankPlan, check: Mapping[str, Any] | None) -> dict[str, Any]:
    """The job's result from each rank's part: the median of the slowest rank's step time, per rank what it ran
    and its phases, and the timeline of the median step (every rank's actions; absent where a rank kept none)."""
    per_step = [max(times) for times in zip(*(r["step_times_s"] for r in ranks))]
    losses = next((r["losses"] for r in ranks if r["has_last"]), [])
    k = median_step(per_step)
    traces = [r.get("trace") or [] for r in ranks]
    timeline = [row for t in traces for row in t[k]] if k >= 0 and all(len(t) == len(per_step) for t in traces) else []
    return {
        "status": "ok",
        "step_time_s": float(statistics.median(per_step)),
        "step_times_s": per_step,
        "spread_s": [min(per_step), max(per_step)],
        "losses": losses,
        "schedule": plan.schedule,
        "microbatches": plan.microbatches,
        "stages": len(plan.stages),
        "ranks": [{key: v for key, v in r.items() if key not in ("losses", "has_last", "trace")} for r in ranks],
        "check": dict(check) if check is not None else None,
        "timeline": {"step": k, "events": timeline} if timeline else None,
    }


def train_steps(
    schedule: RankSchedule,
    inputs: Sequence[Any],
    *,
    lr: float,
    warmup: int,
    steps: int,
    timeout_s: float,
    steady_malloc: bool = True,
) -> dict[str, Any]:
    """``warmup`` then ``steps`` timed training steps (forward, backward, Adam) of this rank's stages, each begun by
    every rank together: this rank's part of the job's report (its step times, peak memory, phases and timeline)."""
    plan, rank = schedule.plan, schedule.rank
    device = next(d for d, where in plan.devices.items() if where.rank == rank)
    params = list(schedule.parameters())  # a rank whose stages hold no parameters (the loss alone) steps nothing
    optimizer = adam(params, lr=lr) if params else NoParameters()
    recorder = ActionRecorder(rank, schedule.stages, optimizer)
    with time_limit(timeout_s):
        m = measure_steps(
            PipelineStep(schedule, recorder),
            tuple(inputs),
            optimizer,
            {device: schedule.torch_device},
            warmup_steps=warmup,
            timed_steps=steps,
            loss_fn=_the_loss,
            protocol=Protocol(steady_malloc=steady_malloc),
        )
    return {
        "rank": rank,
        "device": device,
        "torch_device": str(schedule.torch_device),
        "stages": schedule.stage_indices,
        "step_times_s": m["step_times_s"],
        "peak_bytes": m["peak_bytes"][device],
        "losses": m["losses"],
        "has_last": schedule.has_last,
        **recorder.report(len(m["step_times_s"])),
    }


def program_for(model: nn.Module, inputs: tuple, plan: RankPlan) -> tuple[Any, Any]:
    """The program the plan's stages are cut from: the model exported at the microbatch's size."""
    if plan.microbatches > 1:
        program = export_microbatch(model, inputs, plan.microbatches)
    else:
        program = export_program(model, inputs)
    graph = graph_from_program(program)
    check_program(graph, plan)
    return program, graph


def check_program(graph: Any, plan: RankPlan) -> None:
    """A :class:`PlacerError` unless ``graph`` (this process's program) is the one ``plan`` was compiled for."""
    if graph.content_hash != plan.program_hash:
        raise PlacerError(
            f"this process exported graph {graph.content_hash}, the plan was compiled for {plan.program_hash} "
            f"(another torch version, or a model that builds differently here?){hash_seed_hint()}"
        )


class ProgramCache:
    """The programs this process exported, for the next job of the same model (a measured env's rank actors run one
    job after another): a job whose model comes from the same source, with inputs of the same shapes and dtypes, at
    the same microbatch count, reuses the program (and its graph) and skips the export, about a quarter of a small
    model's measurement.

    The program then takes this job's freshly built model as its own (:func:`adopt`): each of its parameters and
    buffers is the new model's tensor of that name, as a fresh export's would be, so the job starts from the model
    as built, not from what the last job's steps left. Where the new model lacks one of them, or has it in another
    shape or dtype, the job exports anew. At most ``size`` programs are kept, the latest used."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._programs: dict[tuple, tuple[Any, Any]] = {}

    @staticmethod
    def key(source: Any, source_dir: str | None, inputs: tuple, microbatches: int = 1) -> tuple | None:
        """What makes one export the same as another (the inputs' shapes and dtypes and the microbatch count give
        the exported microbatch's); None where the source is not a name (a callable: never kept)."""
        if not isinstance(source, str):
            return None
        leaves = tuple(
            (tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t) for t in tree_leaves(inputs)
        )
        return (source, source_dir, leaves, microbatches)

    def get(self, source: Any, source_dir: str | None, model: nn.Module, inputs: tuple, plan: RankPlan):
        """``(program, graph, reused)`` for ``plan`` (:func:`program_for`); ``reused``: this cache held the export."""
        key = self.key(source, source_dir, inputs, plan.microbatches)
        if key is not None and key in self._programs:
            program, graph = self._programs.pop(key)
            check_program(graph, plan)
            if adopt(program, model):
                self._programs[key] = (program, graph)  # the latest used last
                return program, graph, True
        program, graph = program_for(model, inputs, plan)
        if key is not None and self.size > 0:
            self._programs[key] = (program, graph)
            while len(self._programs) > self.size:
                self._programs.pop(next(iter(self._programs)))
        return program, graph, False

    def release(self) -> None:
        """Let go of the last job's tensors: every kept program's parameters and buffers become meta tensors of the
        same shapes and dtypes until the next job's model is adopted. Else a program would hold its last job's
        weights between jobs, on the GPU where the job moved them (``nn.Module.to`` moves a parameter's data in
        place), beside the next job's, of another program."""
        for program, _ in self._programs.values():
            state = program.state_dict
            for k, v in list(state.items()):
                state[k] = torch.empty_like(v, device="meta")


def adopt(program: Any, model: nn.Module) -> bool:
    """Make ``model``'s parameters and buffers ``program``'s, by name (those an export of ``model`` would hold),
    and its tensor constants where ``model`` has a tensor of that name; False, and ``program`` unchanged, where
    ``model`` lacks one of the program's parameters or buffers or differs in its shape or dtype. A constant the
    model does not name (a tensor the forward made, lifted by the export) stays the program's: the program never
    writes it."""
    tensors = dict(model.state_dict(keep_vars=True))
    tensors.update(dict(model.named_buffers(remove_duplicate=False)))  # the buffers not in the state (persistent=False)
    state = program.state_dict

    def same(k: str, v: torch.Tensor) -> bool:
        t = tensors.get(k)
        return isinstance(t, torch.Tensor) and t.shape == v.shape and t.dtype == v.dtype

    if not all(same(k, v) for k, v in state.items()):
        return False
    for k in list(state):
        state[k] = tensors[k]
    for k, v in list(program.constants.items()):
        if isinstance(v, torch.Tensor) and same(k, v):
            program.constants[k] = tensors[k]
    return True


#: This process's exports (:class:`ProgramCache`), kept from one job to the next.
PROGRAMS = ProgramCache()


@record
def run_rank(job: RankJob) -> dict[str, Any] | None:
    """The entry point of every process (see the module doc); rank 0 returns the job's report."""
    clock = SetupClock()
    torch.set_num_threads(max(1, job.threads))
    pin_rank(job.cpus)
    dist.init_process_group(job.backend, timeout=datetime.timedelta(seconds=job.timeout_s))
    try:
        rank = dist.get_rank()
        objects = dist.new_group(backend="gloo") if job.backend != "gloo" else None
        # node 0's job is the job: every rank must run the same steps (another node's options are its launcher's)
        shared = [job]
        dist.broadcast_object_list(shared, src=0, group=objects)
        job = shared[0]
        helpers = shorten_helper_slices(job.helper_slice_us) if job.helper_slice_us else []
        plan = RankPlan.from_dict(job.plan)
        check_world(list(plan.devices), dist.get_world_size())
        clock.lap("join")
        with one_process_world():  # the model is one process's (graphs.export.one_process_world)
            model, inputs = build_model(job.source, search_dir=job.source_dir)
            clock.lap("build")
            ref = (
                plan_reference(model, inputs, plan.microbatches, plan.loss_reduction)
                if job.check and rank == 0
                else None
            )
        if job.reuse_program:
            program, graph, reused = PROGRAMS.get(job.source, job.source_dir, model, inputs, plan)
        else:
            (program, graph), reused = program_for(model, inputs, plan), False
        clock.lap("export")
        schedule = RankSchedule(plan, program, inputs, rank, early_receives=job.early_receives)
        clock.lap("stages")
        check = None
        if job.check:
            parts = gather_to_first(step_gradients(schedule, inputs), objects)
            check = check_report(parts, ref, graph.meta.get("tied_params", [])) if rank == 0 else None
            clock.lap("check")
        part = train_steps(
            schedule,
            inputs,
            lr=job.lr,
            warmup=job.warmup,
            steps=job.steps,
            timeout_s=job.timeout_s,
            steady_malloc=job.steady_malloc,
        )
        clock.lap("steps")
        if hasattr(os, "sched_getaffinity"):
            part["cpus"] = sorted(os.sched_getaffinity(0))  # the cores this rank ran on
        part["short_slices"] = len(helpers)  # the threads that ran with job.helper_slice_us
        part["pid"] = os.getpid()  # the process (a measured env may run several jobs in one)
        part["thread_cache_off"] = thread_cache_off()  # glibc's, as the process started (envs.real.allocator)
        part["setup_s"] = clock.laps  # where this rank's job spent its wall time, phase by phase
        part["program_reused"] = reused  # an earlier job's export (ProgramCache), not this job's own
        parts = gather_to_first(part, objects)
        return job_report(parts, plan, check) if rank == 0 else None
    finally:
        PROGRAMS.release()
        dist.destroy_process_group()


class SetupClock:
    """Wall seconds between named points of a rank's job (``laps``: phase name to seconds, in order)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 4)
        self._last = now


class NoParameters:
    """The optimizer of a rank whose stages hold no parameters: nothing to zero, nothing to step."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


__all__ = [
    "NoParameters",
    "PROGRAMS",
    "PipelineStep",
    "ProgramCache",
    "RankJob",
    "SetupClock",
    "check_cpus",
    "adopt",
    "check_program",
    "check_report",
    "gather_to_first",
    "job_report",
    "median_step",
    "one_core_each",
    "pin_rank",
    "program_for",
    "run_rank",
    "step_gradients",
    "train_steps",
]
