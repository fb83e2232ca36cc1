"""Placer's own pipeline split: contiguous stages whose cuts are searched on the simulator of ranks.

The splits people use (:mod:`~placer.methods.heuristics.pipeline_splits`) balance one
number (layers, FLOPs, parameters). ``stage_search`` scores whole plans instead:
each candidate is a cut of the ops, in program order (the splits' sequence,
:func:`~envs.real.distributed.cut.split_sequence`, where ops write a buffer in place), into ``R x stages_per_rank``
contiguous stages (stage ``s`` on device ``s mod R``; under torch's V schedule ``zbv``,
2R stages down the devices and back), scored by
:class:`envs.sim.ranks.RankSim` (compute per microbatch, every tensor sent between
stages, the schedule's bubbles, the optimizer step, memory). It starts from the
fastest of the three splits people use, then moves one cut at a time to its best
position between its neighbours (every position is tried, in one batch), and then two
neighbouring cuts together by the same distance (the stage between them keeps its
ops' count and slides: work passes from the stage before to the stage after, two
ranks apart, which one cut moved alone cannot do without unbalancing the stage
between), until a round moves none: it is never slower than those splits on the
simulator. The two-cut moves (``pairs``, on by default) took ZB-V's simulated step at
LLM scale from 3.813 to 3.728 s (BENCHMARKS.md, "Torch's ZB-V schedule").

``merge=True`` (``placer place --method stage_search --option merge=true``) lets a cut
also move onto its neighbour or onto the sequence's end, as the measured loops' cuts
do (:class:`placer.learn.measured_search.CorrectedSearchOptions`): the stage between is
left empty and the plan runs on fewer ranks than the cluster has devices, where that is
faster (a rank much slower than the others; one microbatch, which runs the stages one
after another; a model too small to pay for the hand-offs). Off by default: the plan is
a split across every device, as the splits people use are.

>>> import envs
>>> from graphs import OpGraph, PlacerError
>>> g = OpGraph.from_edges(list("abcd"), [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)], flops=[1e9, 1e9, 1e9, 5e9])
>>> stage_search(g, envs.Cluster.preset("k80x2")).tolist()
[1, 1, 1, 2]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from envs.real.distributed.cut import StagedSplit, split_sequence
from envs.real.distributed.schedules import check_schedule, fitting_schedule, is_v
from envs.sim.ranks import RankSim
from graphs import OpGraph, PlacerError
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.pipeline_splits import (
    equal_layers,
    flops_balanced,
    num_stages,
    parameters_balanced,
    split_stages_per_rank,
    stage_map,
)
from placer.methods.registry import register


def cuts_of(op_stages: np.ndarray) -> list[int]:
    """Where each stage after the first begins (op positions).

    >>> cuts_of(np.array([0, 0, 1, 1, 1, 2]))
    [2, 5]
    """
    return (np.flatnonzero(np.diff(op_stages)) + 1).tolist()


def cut_range(cuts: list[int], k: int, num_ops: int, merge: bool = False) -> tuple[int, int]:
    """The positions cut ``k`` may take between its neighbours (``lo``, ``hi``, both included): no stage left empty.
    ``merge``: one position further either way, onto its neighbour (or the sequence's end), which leaves the stage
    between them empty: its ops join the next stage's device (at ``lo``) or the previous one's (at ``hi``), a plan of
    one stage fewer (:func:`split_of` drops it).

    >>> cut_range([2, 5], 0, 8), cut_range([2, 5], 1, 8), cut_range([2, 5], 1, 8, merge=True)
    ((1, 4), (3, 7), (2, 8))
    """
    lo, hi = (cuts[k - 1] + 1 if k > 0 else 1), (cuts[k + 1] - 1 if k + 1 < len(cuts) else num_ops - 1)
    return (lo - 1, hi + 1) if merge else (lo, hi)


def split_of(sequence: np.ndarray, cuts: list[int], num_ops: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The op devices of the split that gives stage ``s`` (ops ``cuts[s-1]`` to ``cuts[s]``) to ``sequence[s]``, and
    its own sequence and cuts: a stage that ``cuts`` leave empty (a cut on its neighbour or the sequence's end)
    is dropped.

    >>> op_devices, sequence, cuts = split_of(np.array([1, 2, 3]), [2, 6], 6)  # the last stage empty
    >>> op_devices.tolist(), sequence.tolist(), cuts
    ([1, 1, 2, 2, 2, 2], [1, 2], [2])
    """
    op_devices = np.asarray(sequence)[stages_of(cuts, num_ops)]
    kept = cuts_of(op_devices)
    return op_devices, op_devices[[0, *kept]], kept


def stages_of(cuts: list[int], num_ops: int) -> np.ndarray:
    """The stage of each op for ``cuts`` (the inverse of :func:`cuts_of`)."""
    return np.searchsorted(np.asarray(cuts), np.arange(num_ops), side="right")


#: What ``schedule=auto`` tries, in this order (ties keep the first): one stage per rank under the schedule that
#: fits the plan's window (GPipe or 1F1B), the looped schedules, then the V schedules.
AUTO_SCHEDULES = (None, "interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev")

#: ``schedule=auto`` keeps a plan of more stages than ranks only where the simulator puts it this much faster than
#: the plan of one stage per rank. Measured on two CPU ranks, such plans lost to the one-stage plan where the
#: simulator put them 2-7 % ahead; set on the LM, the encoder-decoder and the U-Net, reported on four other models
#: (BENCHMARKS.md, "The schedule chosen by the simulator"). What the simulator misses is mostly their waits, not
#: their compute: a rank of two stages receives twice the messages, and each may wait for the sender's busy core;
#: 4-26 ms a step over per rank with torch's posting of receives, 0-18 ms posted early (BENCHMARKS.md, "Where a
#: rank of two stages loses its time"). A cluster of ``placer profile --ranks`` now charges each message a fitted
#: hand-off for it, which ranked 5 of 7 such plans as measured (4 without); the margin stays for the rest (the fit
#: gave MobileNetV2 none, and left its looped plan 2.1 % ahead on the simulator, 13 % behind measured).
AUTO_MARGIN = 0.1


@register("stage_search")
def stage_search(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    stages_per_rank: int | None = None,
    schedule: str | None = None,
    rounds: int = 4,
    merge: bool = False,
    pairs: bool = True,
    margin: float | None = None,
    env: Any = None,
) -> np.ndarray | StagedSplit:
    """The contiguous split the simulator of ranks finds fastest (module doc); ``merge``: stages may be left empty,
    a plan on fewer devices; ``pairs``: also move two neighbouring cuts together (module doc). Under a V schedule,
    a :class:`StagedSplit`.

    ``schedule="auto"``: the search runs under each schedule of :data:`AUTO_SCHEDULES` that fits the plan's
    microbatches and window (the looped ones with ``stages_per_rank`` stages per rank, 2 when not given; with
    ``stages_per_rank=1`` one stage per rank only; the V ones not with ``merge``), and the fastest plan on the
    simulator wins: a :class:`StagedSplit` naming its schedule, with every schedule's simulated step in ``tried``.
    A plan of more stages than ranks wins only by more than ``margin`` (a fraction of the one-stage plan's step;
    default :data:`AUTO_MARGIN`), the simulator being optimistic about such plans.

    ``env``: the one-process simulator :func:`placer.methods.registry.place` hands a
    method with M > 1; only its microbatches M and window W are read, so the search
    scores plans as they will run.
    """
    del seed
    for name, value in (("merge", merge), ("pairs", pairs)):
        if not isinstance(value, bool):
            raise PlacerError(f"stage_search: {name} must be true or false, got {value!r}")
    if margin is not None and schedule != "auto":
        raise PlacerError(f"stage_search: margin={margin}: only with schedule=auto")
    if schedule == "auto":
        margin = AUTO_MARGIN if margin is None else margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise PlacerError(f"stage_search: margin={margin}: a fraction in [0, 1)")
        return _auto(graph, cluster, stages_per_rank, float(margin), rounds=rounds, merge=merge, pairs=pairs, env=env)
    per_rank = split_stages_per_rank(stages_per_rank, schedule, "stage_search")
    out, _ = _search(graph, cluster, per_rank, schedule, rounds=rounds, merge=merge, pairs=pairs, env=env)
    return out


stage_search.chooses_schedule = True  # type: ignore[attr-defined]  # schedule=auto: registry.place reads it


def _auto(
    graph: OpGraph,
    cluster,
    stages_per_rank: int | None,
    margin: float,
    *,
    rounds: int,
    merge: bool,
    pairs: bool,
    env: Any,
) -> StagedSplit:
    """``schedule="auto"`` (:func:`stage_search`): the search under each schedule that fits, the fastest kept, a
    plan of more stages than ranks only by more than ``margin``."""
    R = len(gpu_devices(cluster))
    M = int(getattr(env, "microbatches", 1) or 1)
    W = getattr(env, "inflight", None)
    looped = 2 if stages_per_rank is None else int(stages_per_rank)
    tried: dict[str, float | None] = {}
    best: tuple[float, np.ndarray | StagedSplit, str] | None = None
    reasons: list[str] = []
    for schedule in AUTO_SCHEDULES:
        if (looped < 2 and schedule is not None) or (merge and is_v(schedule)):
            continue  # stages_per_rank=1: one stage per rank only; merge leaves stages empty, and a V runs all 2R
        per_rank = 1 if schedule is None else 2 if is_v(schedule) else looped
        stage_ranks = stage_map(R, R * per_rank, schedule).tolist()
        name = schedule or fitting_schedule(stage_ranks, R, microbatches=M, inflight=W)
        try:
            check_schedule(name, stage_ranks, R, microbatches=M, inflight=W)
            out, step_s = _search(graph, cluster, per_rank, schedule, rounds=rounds, merge=merge, pairs=pairs, env=env)
        except PlacerError as e:
            tried[name] = None
            reasons.append(f"{name}: {e}")
            continue
        tried[name] = step_s
        score = step_s if per_rank == 1 else step_s / (1 - margin)  # more stages than ranks: ahead by the margin
        if best is None or score < best[0]:
            best = (score, out, name)
    if best is None or not np.isfinite(best[0]):
        raise PlacerError(f"stage_search: schedule=auto: no schedule fits ({'; '.join(reasons) or 'none ran'})")
    _, out, name = best
    return dataclasses.replace(StagedSplit.of(out), schedule=name, tried=tried, margin=margin)


def _search(
    graph: OpGraph,
    cluster,
    per_rank: int,
    schedule: str | None,
    *,
    rounds: int,
    merge: bool,
    pairs: bool,
    env: Any,
) -> tuple[np.ndarray | StagedSplit, float]:
    """The search of :func:`stage_search` under one schedule: its split, and that split's simulated step."""
    devices = gpu_devices(cluster)
    if merge and is_v(schedule):
        raise PlacerError(f"stage_search: merge=true leaves stages empty, and schedule {schedule!r} runs all 2R")
    S = num_stages(graph, cluster, per_rank, graph.num_ops, "stage_search")  # the option, checked
    M = int(getattr(env, "microbatches", 1) or 1)
    sim = RankSim(graph, cluster, microbatches=M, inflight=getattr(env, "inflight", None), schedule=schedule)
    n = graph.num_ops
    on = devices[stage_map(len(devices), S, schedule)]  # each stage's device
    turn = len(devices) - 1 if is_v(schedule) else None  # the cut between the two stages of the V's last device
    # cuts are positions of the sequence a split cuts (node order, unless ops write a buffer in place)
    order, _ = split_sequence(graph)
    position = np.argsort(order)
    cuts, best_s = starting_cuts(graph, cluster, sim, devices, per_rank, schedule)
    # each plan's step, by its cuts: a later round tries again many plans an earlier one scored (25-50 % of them on
    # the zoo's models), which are not simulated again
    scored: dict[tuple[int, ...], float] = {}
    for _ in range(rounds):
        moved = False
        moves = [(k, 1) for k in range(len(cuts))] + ([(k, 2) for k in range(len(cuts) - 1)] if pairs else [])
        for k, width in moves:
            tried = moved_cuts(cuts, k, n, merge=merge) if width == 1 else shifted_pair(cuts, k, n)
            if not tried:
                continue
            new = [c for c in tried if tuple(c) not in scored]  # (a move's plans differ from each other)
            if new:
                batch = np.stack([on[stages_of(c, n)][position] for c in new])
                if turn is None:
                    new_s, failed = sim.step_times(batch)
                else:
                    new_s, failed = sim.staged_step_times(batch, [(int(order[c[turn]]),) for c in new])
                scored.update(zip(map(tuple, new), np.where(failed, np.inf, new_s).tolist()))
            step_time_s = np.array([scored[tuple(c)] for c in tried])
            j = int(np.argmin(step_time_s))
            if step_time_s[j] < best_s * (1 - 1e-9):
                best_s, cuts, moved = float(step_time_s[j]), tried[j], True
        if not moved:
            break
    if hasattr(env, "count_simulated"):  # what the search spent, counted where the caller counts every search's
        env.count_simulated(sim.simulated)
    op_devices = on[stages_of(cuts, n)][position].astype(np.int32)
    return (op_devices if turn is None else StagedSplit(op_devices, (int(order[cuts[turn]]),))), float(best_s)


def moved_cuts(cuts: list[int], k: int, num_ops: int, merge: bool = False) -> list[list[int]]:
    """``cuts`` with cut ``k`` at every other position between its neighbours (:func:`cut_range`).

    >>> moved_cuts([2, 5], 0, 8)
    [[1, 5], [3, 5], [4, 5]]
    """
    lo, hi = cut_range(cuts, k, num_ops, merge=merge)
    return [cuts[:k] + [c] + cuts[k + 1 :] for c in range(lo, hi + 1) if c != cuts[k]]


def shifted_pair(cuts: list[int], k: int, num_ops: int) -> list[list[int]]:
    """``cuts`` with cuts ``k`` and ``k + 1`` moved together by every distance that leaves no stage empty.

    >>> shifted_pair([2, 4, 6], 0, 8)
    [[1, 3, 6], [3, 5, 6]]
    """
    lo = (cuts[k - 1] + 1 if k > 0 else 1) - cuts[k]
    hi = (cuts[k + 2] - 1 if k + 2 < len(cuts) else num_ops - 1) - cuts[k + 1]
    return [cuts[:k] + [cuts[k] + d, cuts[k + 1] + d] + cuts[k + 2 :] for d in range(lo, hi + 1) if d]


def starting_cuts(
    graph: OpGraph, cluster, sim: RankSim, devices: np.ndarray, stages_per_rank: int, schedule: str | None = None
) -> tuple:
    """``(cuts, step seconds)`` of the fastest of the splits people use on ``sim`` (those that can split the graph)
    under ``schedule`` (its layout: looped, or a V)."""
    best: tuple[list[int], float] | None = None
    for split in (flops_balanced, equal_layers, parameters_balanced):
        try:
            out = split(graph, cluster, stages_per_rank=stages_per_rank, schedule=schedule)
        except PlacerError:  # fewer layers than stages
            continue
        cuts = split_cuts(out, split_sequence(graph)[0])
        if len(cuts) != len(devices) * stages_per_rank - 1:
            continue  # a split that left a stage empty
        if isinstance(out, StagedSplit):  # a V: only the simulator of ranks reads stage starts
            step_time_s, failed = sim.staged_step_times(out.op_devices[None, :], [out.starts])
        else:  # any scorer (the measured loops' too)
            step_time_s, failed = sim.step_times(np.asarray(out)[None, :])
        t = float("inf") if failed[0] else float(step_time_s[0])
        if best is None or t < best[1]:
            best = (cuts, t)
    if best is None:
        raise PlacerError(f"stage_search: no split of {graph.name or 'the graph'} into {len(devices)} devices")
    return best


def split_cuts(out: np.ndarray | StagedSplit, order: np.ndarray | None = None) -> list[int]:
    """Where each stage after the first begins in a contiguous split (positions of ``order``, the sequence it was
    cut along, :func:`~envs.real.distributed.cut.split_sequence`; None: node order): where the device changes,
    and a :class:`StagedSplit`'s starts.

    >>> split_cuts(np.array([1, 2, 1, 2])), split_cuts(StagedSplit(np.array([1, 2, 2, 1]), (2,)))
    ([1, 2, 3], [1, 2, 3])
    """
    split = StagedSplit.of(out)
    op_devices = np.asarray(split.op_devices)
    starts = np.asarray(split.starts, dtype=np.int64)
    if order is not None:
        op_devices, starts = op_devices[order], np.argsort(order)[starts]
    begins = np.diff(op_devices) != 0
    begins[starts - 1] = True
    return (np.flatnonzero(begins) + 1).tolist()


__all__ = [
    "cut_range",
    "cuts_of",
    "moved_cuts",
    "shifted_pair",
    "split_cuts",
    "split_of",
    "AUTO_MARGIN",
    "AUTO_SCHEDULES",
    "stage_search",
    "stages_of",
    "starting_cuts",
]
