"""The actions each rank runs in a step across processes, as the real runtime runs them.

A plan across processes runs on torch's pipeline runtime with one of the schedules of
:mod:`envs.real.distributed.schedules`. The simulator of ranks (:mod:`envs.sim.ranks`)
times the very lists of actions that runtime follows, taken from their one source each:

* ``planned``: placer's issue order, :func:`envs.real.distributed.schedules.planned_actions`;
* ``looped_bfs``, ``interleaved_1f1b``, ``interleaved_zb``, ``zbv``, ``dualpipev``: torch's own
  schedule classes, which compute every rank's order from the number of stages, ranks and microbatches alone (their
  ``_calculate_single_rank_operations``, which their runtime executes). Torch keeps idle
  slots (``None``) and gradient reductions in those lists; only the forwards and
  backwards (``interleaved_zb``, ``zbv``: their input parts ``I`` and weight parts ``W``) are
  kept here, since the simulator finds the waits itself (torch's zero-bubble class
  then inserts idle slots between them, which change no rank's order). ``dualpipev``'s
  overlapped actions (``OVERLAP_F_B``) become their forward, kind ``"FO"``, then their backward:
  torch's runtime runs the two one after the other, each waiting for its own receive, and posts
  the forward's sends with the backward's, after both;
* ``gpipe``: torch's ``ScheduleGPipe._get_pipeline_order`` (:func:`torch_actions`) is
  placer's fill-drain order list for list (tests/envs/sim/test_ranks.py checks it), so
  that order is taken from ``planned_actions``, without importing torch;
* ``1f1b``: the rule ``Schedule1F1B._step_microbatches`` runs (stage ``s`` warms up
  with ``min(M, S - s)`` forwards, then alternates one backward and one forward, then
  drains), :func:`one_f_one_b`. Torch's ``Schedule1F1B._get_pipeline_order``, a
  picture of it, is not that rule: it gives the last stage microbatches 1..M, not 0..M-1.

>>> schedule_actions("gpipe", [0, 1], 2, microbatches=2, inflight=2)[1]
[(1, 'F', 0), (1, 'F', 1), (1, 'B', 0), (1, 'B', 1)]
>>> schedule_actions("1f1b", [0, 1], 2, microbatches=3, inflight=2)[0]
[(0, 'F', 0), (0, 'F', 1), (0, 'B', 0), (0, 'F', 2), (0, 'B', 1), (0, 'B', 2)]
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from envs.real.distributed.schedules import Action, check_schedule, planned_actions

#: Torch's schedule class of each named schedule placer runs, and whether it holds one stage per rank.
TORCH_CLASSES = {
    "gpipe": ("ScheduleGPipe", True),
    "looped_bfs": ("ScheduleLoopedBFS", False),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", False),
    "interleaved_zb": ("ScheduleInterleavedZeroBubble", False),
    "zbv": ("ScheduleZBVZeroBubble", False),
    "dualpipev": ("ScheduleDualPipeV", False),
}


def torch_order(name: str, num_stages: int, num_ranks: int, microbatches: int) -> dict[int, list[Any]]:
    """Every rank's list under torch's schedule ``name`` as torch keeps it: its ``_Action`` objects, idle slots
    (``None``) and gradient reductions included (stage ``s`` on rank ``s mod R``; ``zbv``: in a V).

    Torch builds these lists in its schedule's constructor from a few numbers; the
    constructor also wants real stages and a process group, so the numbers are
    handed to the method that computes the lists directly.
    """
    from torch.distributed.pipelining import schedules

    cls_name, single = TORCH_CLASSES[name]
    cls = getattr(schedules, cls_name)
    M, R = int(microbatches), int(num_ranks)
    rounds = max(1, M // R)
    state = SimpleNamespace(
        _num_stages=num_stages,
        num_stages=num_stages,
        _n_microbatches=M,
        pp_group_size=R,
        _stages=[None] * (num_stages // R),
        n_local_stages=num_stages // R,
        number_of_rounds=rounds,
        microbatches_per_round=M // rounds,
    )
    if single:
        return dict(cls._get_pipeline_order(state))  # noqa: SLF001 (torch's one source of this schedule's order)
    return {r: list(cls._calculate_single_rank_operations(state, r)) for r in range(R)}  # noqa: SLF001


@lru_cache(maxsize=256)
def torch_actions(name: str, num_stages: int, num_ranks: int, microbatches: int) -> dict[int, tuple[Action, ...]]:
    """Every rank's forwards and backwards under torch's schedule ``name`` (:func:`torch_order` without its idle
    slots and reductions; a split backward's parts ``I`` and ``W`` kept)."""
    out: dict[int, tuple[Action, ...]] = {}
    for rank, acts in torch_order(name, num_stages, num_ranks, microbatches).items():
        kept: list[Action] = []
        for a in acts:
            if a is not None and a.sub_actions:  # OVERLAP_F_B: a forward and a backward, run one after the other
                (f, b) = a.sub_actions
                kept.append((int(f.stage_index), "FO", int(f.microbatch_index)))
                kept.append((int(b.stage_index), b.computation_type.value, int(b.microbatch_index)))
            elif a is not None and a.computation_type.value in ("F", "B", "I", "W"):
                kept.append((int(a.stage_index), a.computation_type.value, int(a.microbatch_index)))
        out[rank] = tuple(kept)
    return out


def one_f_one_b(num_stages: int, microbatches: int) -> dict[int, list[Action]]:
    """The actions of torch's ``Schedule1F1B`` (one stage per rank, stage ``s`` on rank ``s``; module doc).

    >>> one_f_one_b(2, 3)[1]
    [(1, 'F', 0), (1, 'B', 0), (1, 'F', 1), (1, 'B', 1), (1, 'F', 2), (1, 'B', 2)]
    """
    S, M = int(num_stages), int(microbatches)
    out: dict[int, list[Action]] = {}
    for s in range(S):
        warm = min(M, S - s)
        acts: list[Action] = [(s, "F", m) for m in range(warm)]
        for m in range(M - warm):
            acts += [(s, "B", m), (s, "F", warm + m)]
        acts += [(s, "B", m) for m in range(M - warm, M)]
        out[s] = acts
    return out


def schedule_actions(
    name: str, stage_ranks: Sequence[int], num_ranks: int, *, microbatches: int, inflight: int | None
) -> dict[int, list[Action]]:
    """``rank -> [(stage, "F" | "B", microbatch), ...]`` of schedule ``name`` for a plan whose stage ``s`` runs on
    ``stage_ranks[s]``.

    Raises :class:`graphs.PlacerError` (one line) when the schedule does not fit the plan
    (:func:`envs.real.distributed.schedules.check_schedule`).
    """
    check_schedule(name, stage_ranks, num_ranks, microbatches=microbatches, inflight=inflight)
    if name == "planned" or name == "gpipe":
        # GPipe's order is placer's fill-drain order, list for list (tests/envs/sim/test_ranks.py checks it against
        # torch's): taken from placer's, a simulation needs no torch (whose import takes seconds)
        return planned_actions(stage_ranks, num_ranks, microbatches=microbatches, inflight=inflight)
    if name == "1f1b":
        return one_f_one_b(len(stage_ranks), int(microbatches))
    lists = torch_actions(name, len(stage_ranks), num_ranks, int(microbatches))
    return {r: list(lists.get(r, ())) for r in range(num_ranks)}


__all__ = ["TORCH_CLASSES", "one_f_one_b", "schedule_actions", "torch_actions", "torch_order"]
