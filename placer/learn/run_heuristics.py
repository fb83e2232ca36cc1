"""The heuristics a training run starts from and is compared with, scored as the run scores.

:func:`score_heuristics` runs them through :func:`placer.compare.compare` (simulated),
re-scores their placements through the run's scorer where the run scores in its
own issue order, and under ``--env measured`` measures the fastest few on the
run's workers (:func:`measured_heuristics`). The best of them is the run's
incumbent: the move search's start, the policy's imitation target, the time to
beat. A run with home moves adds FSDP2's offload as a plan (:func:`with_offload_baselines`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from envs.cluster import Cluster
from graphs import OpGraph
from placer.compare import compare, default_methods
from placer.learn.config import TrainConfig
from placer.learn.progress import Progress, ms
from placer.learn.run_scorers import CachedScorer


@dataclass
class RunHeuristics:
    """The heuristics of one run: their times, the best of them, and what they simulated."""

    times: dict[str, float]
    """name -> simulated step time (``inf``: no placement that runs), in the run's score order."""
    measured: dict[str, float]
    """--env measured: name -> step time on the run's workers, for those measured."""
    best_name: str
    best_step_time_s: float
    """the fastest of ``measured`` where some were measured, else of ``times``."""
    best_op_devices: np.ndarray | None
    """its placement (None: no heuristic placement runs)."""
    time_to_beat_s: float | None
    """the best heuristic's time as the run's placements are scored (None: a measured run that measured none)."""
    simulated: int
    """placements the heuristics simulated (their searches and their scoring)."""


def compare_heuristics(
    graph: OpGraph, cluster: Cluster, config: TrainConfig, progress: Progress
) -> tuple[dict[str, tuple[float, np.ndarray | None]], int]:
    """name -> (simulated step time, op devices) of the heuristics, via ``placer.compare``; and the placements
    they simulated in all (their searches and their scoring).

    Methods that cannot run get ``inf``.
    """
    # by default every heuristic but ilp: a solver run of a minute whose plan rests on its own issue order
    methods = list(config.heuristics) if config.heuristics is not None else default_methods(exclude=("ilp",))
    if methods == []:
        return {}, 0
    progress.phase(f"scoring {len(methods)} heuristics on {cluster.name} (simulated): the times to beat and the start")
    progress.start("scoring", total=len(methods), unit="heuristics")
    try:
        report = compare(
            graph,
            cluster,
            methods=methods,
            seed=config.seed,
            executor=config.executor,
            microbatches=config.microbatches,
            inflight=config.inflight,
            score_order=config.score_order,
            progress=lambda done, name: progress.update(done, name),
            ranks=config.ranks,
        )
    finally:  # Ctrl-C here too: the bar ends before the message that follows
        progress.close()
    rows = [row for row in report.rows if row.kind == "heuristic"]
    found: dict[str, tuple[float, np.ndarray | None]] = {}
    for row in rows:
        ok = row.status == "ok" and row.step_time_s is not None and row.placement is not None
        op_devices = row.placement.indices(graph, cluster.device_names) if row.placement is not None else None
        found[row.method] = (float(row.step_time_s) if ok else float("inf"), op_devices)
    return found, sum(row.simulated for row in rows)


def measured_heuristics(
    score: CachedScorer, found: dict[str, tuple[float, np.ndarray | None]], count: int
) -> dict[str, float]:
    """Step times, on the run's own scorer, of the heuristics with the ``count`` fastest simulated placements.

    ``found``: name -> (simulated step time, op devices). The ``count`` fastest
    distinct placements are scored in one batch (so a measured run's workers
    measure them side by side); every heuristic whose placement is one of them gets
    its time (heuristics often agree), ``inf`` where it failed on the real devices.
    """
    ranked = [
        name
        for step_time_s, name in sorted(
            (step_time_s, name)
            for name, (step_time_s, op_devices) in found.items()
            if op_devices is not None and np.isfinite(step_time_s)
        )
    ]
    placements: dict[bytes, np.ndarray] = {}
    for name in ranked:
        op_devices = np.asarray(found[name][1], dtype=np.int32)
        if len(placements) < count or CachedScorer.key(op_devices) in placements:
            placements.setdefault(CachedScorer.key(op_devices), op_devices)
    if not placements:
        return {}
    step_time_s, failed = score(np.stack(list(placements.values())))
    times = {k: float("inf") if f else float(t) for k, t, f in zip(placements, step_time_s, failed)}
    keys = {name: CachedScorer.key(np.asarray(found[name][1], dtype=np.int32)) for name in ranked}
    return {name: times[keys[name]] for name in ranked if keys[name] in times}


def score_heuristics(
    graph: OpGraph, cluster: Cluster, config: TrainConfig, score: CachedScorer, progress: Progress
) -> RunHeuristics:
    """The heuristics scored as the run scores (see the module docstring); a line on ``progress`` names the best."""
    found, simulated = compare_heuristics(graph, cluster, config, progress)
    if score.order is not None or (config.ranks and config.env == "sim"):
        # compare searched and scored them in the run's order already (across processes: on the simulator of ranks
        # with the schedule that fits); scored again through the run's scorer, so the warm start, the search's start
        # and "beat the best heuristic" are its own numbers (its schedule's, --ranks --schedule)
        found = {
            name: (_scored(score, op_devices) if op_devices is not None and np.isfinite(t) else t, op_devices)
            for name, (t, op_devices) in found.items()
        }
    times = {name: t for name, (t, _) in found.items()}
    # --env measured: the heuristics measured on the same workers, so the comparison is measured with measured
    measured_run = config.env == "measured"
    if measured_run and config.measure_heuristics:
        progress.phase(
            f"measuring the heuristics of the {config.measure_heuristics} fastest simulated placements on the workers"
        )
    measured = measured_heuristics(score, found, config.measure_heuristics) if measured_run else {}
    candidates = measured or times
    best_name, best_s = min(candidates.items(), key=lambda kv: kv[1]) if candidates else ("none", float("inf"))
    best_op_devices = found[best_name][1] if np.isfinite(best_s) else None
    if found:
        kind = " (measured)" if measured else " (simulated)" if measured_run else ""
        found_one = best_op_devices is not None
        progress.phase(
            f"best heuristic: {best_name} {ms(best_s)}{kind}" if found_one else "no heuristic placement fits"
        )
    return RunHeuristics(
        times=times,
        measured=measured,
        best_name=best_name,
        best_step_time_s=best_s,
        best_op_devices=best_op_devices,
        # scored as the samples are (a measured run that measured no heuristic has no time to beat)
        time_to_beat_s=best_s if measured or not measured_run else None,
        simulated=simulated,
    )


#: The heuristics' names of FSDP2's ``CPUOffloadPolicy`` as a plan in a run with home moves: every op on the first
#: GPU, every parameter that can live apart homed on the host; and the same with every candidate layer checkpointed
#: (a run whose moves checkpoint layers too).
FSDP2_OFFLOAD, FSDP2_OFFLOAD_CHECKPOINTED = "fsdp2_offload", "fsdp2_offload_checkpointed"


def with_offload_baselines(
    h: RunHeuristics, graph: OpGraph, cluster: Cluster, codes: Any, score: CachedScorer
) -> RunHeuristics:
    """``h`` with FSDP2's offload as a plan among the heuristics (:data:`FSDP2_OFFLOAD`,
    :func:`placer.learn.offload_plan.fsdp2_offload_plan`; with checkpoint moves also
    :data:`FSDP2_OFFLOAD_CHECKPOINTED`, every candidate layer checkpointed), encoded in the run's ``codes``
    (:class:`placer.learn.home_moves.HomeCodes` or :class:`placer.learn.checkpoint_moves.BlockCodes` over them)
    and scored by the run's scorer: the rival a run for a model that does not fit the GPUs is judged against,
    and its start where it is the fastest. Its homed parameters are stepped as the run steps them
    (``--host-step``): during the backward, FSDP2's plan is faster than FSDP2 runs it, a stronger rival. A
    simulated run only (home moves are)."""
    from placer.learn.offload_plan import fsdp2_offload_plan

    if (codes.homes if codes.has_blocks else codes) is None:
        return h
    fsdp2 = fsdp2_offload_plan(graph, cluster)
    op_devices, where = fsdp2.indices(graph, cluster.device_names), fsdp2.home_indices(graph, cluster.device_names)
    plans = {FSDP2_OFFLOAD: codes.encode(op_devices, where)}
    if codes.has_blocks:
        plans[FSDP2_OFFLOAD_CHECKPOINTED] = codes.encode(op_devices, where, codes.names_all)
    times, best = dict(h.times), (h.best_name, h.best_step_time_s, h.best_op_devices)
    for name, plan in plans.items():
        if plan is None:
            continue
        times[name] = _scored(score, plan)
        if times[name] < best[1]:
            best = (name, times[name], plan)
    return replace(
        h,
        times=times,
        best_name=best[0],
        best_step_time_s=best[1],
        best_op_devices=best[2],
        time_to_beat_s=best[1],  # (scored by the run's scorer, which counts them)
    )


def _scored(score: CachedScorer, op_devices: np.ndarray) -> float:
    step_time_s, failed = score(np.asarray(op_devices, dtype=np.int32)[None])
    return float("inf") if failed[0] else float(step_time_s[0])
