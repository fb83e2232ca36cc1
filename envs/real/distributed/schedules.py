"""The schedule of a plan across processes: torch's own where the plan matches one, else the plan's issue order.

A plan's stages sit on ranks in a *layout*: one stage per rank, in rank order
(``"one_per_rank"``); several per rank, stage ``s`` on rank ``s mod R``
(``"looped"``); two per rank in a V, stage ``s`` on rank ``s`` and then on rank
``2R - 1 - s`` (``"v"``: stages ``R - 1`` and ``R`` both on the last rank, cut apart by
the plan's ``stage_cuts``); or any other way (``"other"``). With its microbatches M and window
W (the most microbatches in flight at a stage, :mod:`envs.microbatch`), that picks
the schedule when the plan names none (:func:`fitting_schedule`):

==================  ===================  ============================================
layout              window               schedule
==================  ===================  ============================================
one per rank        W = M (fill-drain)   ``gpipe`` (torch's ``ScheduleGPipe``)
one per rank        S <= W < M           ``1f1b`` (``Schedule1F1B``: stage s holds S - s)
looped              W = M                ``looped_bfs`` (``ScheduleLoopedBFS``)
any other                                ``planned``: placer's own issue order
==================  ===================  ============================================

``planned`` is the host program placer runs in one process
(:func:`envs.microbatch.issue_segments`, each stage one unit) as a list of actions
per rank, run by torch's ``_PipelineScheduleRuntime`` (:func:`planned_actions`).
A plan may also name a schedule: torch's ``interleaved_1f1b`` runs looped layouts,
and keeps as many microbatches in flight as its own warm-up rule says;
``interleaved_zb``, torch's ``ScheduleInterleavedZeroBubble`` (the ZB1P schedule of
Qi et al. 2024), runs them too, with each backward split into its input part (``I``:
the gradient the stage sends back) and its weight part (``W``: the parameters'
gradients), the weight parts put off to fill the waits (:data:`SPLIT_BACKWARD`; the
stage programs are cut for it, :func:`~envs.real.distributed.stage_modules.stage_programs`).
``zbv``, torch's ``ScheduleZBVZeroBubble`` (the ZB-V schedule of the same paper),
runs a V layout with its backward split likewise. A V puts two *consecutive* stages
on one rank, which a cut into maximal runs on one device never makes: the plan names
where the second begins (``stage_cuts``), and torch's runtime hands the activations
and gradients between those two stages within the rank, with no send. ``dualpipev``,
torch's ``ScheduleDualPipeV`` (DeepSeek's DualPipe folded into a V), runs the same
layout with at least as many microbatches as stages; in its steady state a rank runs
one stage's forward and the other's backward as one action (``OVERLAP_F_B``), whose
sends leave when both are done.
A named schedule must fit the plan (:func:`check_schedule`).

>>> fitting_schedule([0, 1], 2, microbatches=4, inflight=4), fitting_schedule([0, 1], 2, microbatches=4, inflight=2)
('gpipe', '1f1b')
>>> fitting_schedule([0, 1, 0, 1], 2, microbatches=4, inflight=1)
'planned'
>>> planned_actions([0, 1], 2, microbatches=2, inflight=1)[1]
[(1, 'F', 0), (1, 'B', 0), (1, 'F', 1), (1, 'B', 1)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envs.microbatch import BACKWARD, FORWARD, issue_segments
from graphs import PlacerError
from graphs.plan import SCHEDULES, check_inflight

#: An action of a rank: (stage index, "F" forward, "B" backward, or a backward's "I" input and "W" weight part,
#: microbatch); "FO": a forward run with the backward that follows it as one action (torch's ``OVERLAP_F_B``), whose
#: sends leave after that backward's.
Action = tuple[int, str, int]

#: The schedules that split each backward into its input part and its weight part (module doc).
SPLIT_BACKWARD = ("interleaved_zb", "zbv", "dualpipev")


def v_ranks(num_ranks: int) -> list[int]:
    """The rank of each stage in a V of ``num_ranks`` ranks: down the ranks and back.

    >>> v_ranks(2), v_ranks(3)
    ([0, 1, 1, 0], [0, 1, 2, 2, 1, 0])
    """
    return [*range(num_ranks), *reversed(range(num_ranks))]


def v_stage(stage: int, num_ranks: int) -> int:
    """The rank of stage ``stage`` of a V (:func:`v_ranks`): ``s`` for ``s < R``, else ``2R - 1 - s``."""
    return stage if stage < num_ranks else 2 * num_ranks - 1 - stage


def layout(stage_ranks: Sequence[int], num_ranks: int) -> str:
    """How the stages sit on the ranks: ``"one_per_rank"``, ``"looped"``, ``"v"`` or ``"other"`` (see the module
    doc). One rank's two stages are looped, not a V.

    >>> layout([0, 1], 2), layout([0, 1, 0, 1], 2), layout([0, 1, 1, 0], 2), layout([1, 0], 2)
    ('one_per_rank', 'looped', 'v', 'other')
    """
    S = len(stage_ranks)
    if list(stage_ranks) == list(range(S)) and S == num_ranks:
        return "one_per_rank"
    if S > num_ranks and S % num_ranks == 0 and all(r == s % num_ranks for s, r in enumerate(stage_ranks)):
        return "looped"
    if list(stage_ranks) == v_ranks(num_ranks):
        return "v"
    return "other"


def fitting_schedule(stage_ranks: Sequence[int], num_ranks: int, *, microbatches: int, inflight: int | None) -> str:
    """The schedule of a plan that names none (the table of the module doc)."""
    M = int(microbatches)
    W = check_inflight(inflight, M)
    S = len(stage_ranks)
    shape = layout(stage_ranks, num_ranks)
    if shape == "one_per_rank" and W == M:
        return "gpipe"
    if shape == "one_per_rank" and S <= W < M:
        return "1f1b"
    if shape == "looped" and W == M:
        return "looped_bfs"
    return "planned"


#: The layout each named schedule needs (``planned`` runs any).
NEEDS_LAYOUT = {
    "gpipe": "one_per_rank",
    "1f1b": "one_per_rank",
    "looped_bfs": "looped",
    "interleaved_1f1b": "looped",
    "interleaved_zb": "looped",
    "zbv": "v",
    "dualpipev": "v",
}


def is_v(schedule: str | None) -> bool:
    """Whether ``schedule`` runs its stages in a V (:data:`NEEDS_LAYOUT`).

    >>> is_v("zbv"), is_v("interleaved_zb"), is_v(None)
    (True, False, False)
    """
    return NEEDS_LAYOUT.get(schedule or "") == "v"


def check_schedule(
    name: str, stage_ranks: Sequence[int], num_ranks: int, *, microbatches: int, inflight: int | None
) -> None:
    """Raise :class:`PlacerError` (one line, saying why) unless schedule ``name`` can run the plan.

    A schedule fits when the stages sit as it needs (:data:`NEEDS_LAYOUT`), torch's
    own conditions on M hold, and a fill-drain or 1F1B schedule keeps no more
    microbatches in flight than the plan's window W allows.
    """
    if name not in SCHEDULES:
        raise PlacerError(f"schedule {name!r}: not one of {', '.join(SCHEDULES)}")
    M = int(microbatches)
    W = check_inflight(inflight, M)
    S, R = len(stage_ranks), num_ranks
    shape = layout(stage_ranks, R)
    where = f"the plan has {S} stages on {R} ranks ({' '.join(map(str, stage_ranks))})"
    need = NEEDS_LAYOUT.get(name)
    if need == "one_per_rank" and shape != need:
        raise PlacerError(f"schedule {name!r} runs one stage per rank, stage s on rank s; {where}")
    if need == "looped" and shape != need:
        raise PlacerError(f"schedule {name!r} runs several stages per rank, stage s on rank s mod {R}; {where}")
    if need == "v" and shape != need:
        raise PlacerError(
            f"schedule {name!r} runs two stages per rank in a V ({' '.join(map(str, v_ranks(R)))}; the second on a "
            f"rank begins at one of the plan's stage_cuts); {where}"
        )
    if name in ("gpipe", "looped_bfs") and W < M:
        raise PlacerError(f"schedule {name!r} runs all {M} microbatches' forwards first; the plan keeps at most {W}")
    if name in ("1f1b", "dualpipev") and M < S:
        raise PlacerError(f"schedule {name!r} needs at least as many microbatches as stages ({S}); the plan has {M}")
    if name == "1f1b" and W < S:
        raise PlacerError(f"schedule '1f1b' keeps {S} microbatches in flight at its first stage; the plan keeps {W}")
    rounds = max(1, M // R)
    if name.startswith("interleaved") and M % rounds:
        raise PlacerError(f"schedule {name!r} needs the microbatches ({M}) to be a multiple of its rounds ({rounds})")


def planned_actions(
    stage_ranks: Sequence[int], num_ranks: int, *, microbatches: int, inflight: int | None
) -> dict[int, list[Action]]:
    """Placer's issue order of a step, per rank: ``rank -> [(stage, "F" | "B", microbatch), ...]``.

    The one-process host program (:func:`envs.microbatch.issue_segments`, with each
    stage one unit) is one sequence of forwards and backward calls; a backward call
    over microbatches runs each one's stages last to first. A rank runs the actions
    of its stages in that sequence's order, so a rank never waits for an action
    that comes later in it: the lists cannot deadlock.
    """
    S, M = len(stage_ranks), int(microbatches)
    out: dict[int, list[Action]] = {r: [] for r in range(num_ranks)}
    for kind, lo, hi in issue_segments(S, M, inflight, starts=list(range(S))).tolist():
        if kind == FORWARD:
            steps = [(p % S, "F", p // S) for p in range(lo, hi)]
        else:
            assert kind == BACKWARD
            steps = [(s, "B", m) for m in range(lo // S, (hi - 1) // S + 1) for s in reversed(range(S))]
        for stage, what, m in steps:
            out[stage_ranks[stage]].append((stage, what, m))
    return out


# ------------------------------------------------------------------ torch's objects
def runtime_schedule(stages: list, microbatches: int, loss_fn: Callable, actions: dict[int, list[Action]]) -> Any:
    """Torch's runtime running ``actions`` (compute only; it adds the sends and receives itself).

    Torch 2.13 runs a custom list of actions only through its private
    ``_PipelineScheduleRuntime`` (the base of its own looped schedules); this is
    the one place placer uses it.
    """
    from torch.distributed.pipelining.schedules import (
        _Action,  # noqa: PLC2701 (no public action type)
        _PipelineScheduleRuntime,  # noqa: PLC2701 (nor runtime)
    )

    schedule = _PipelineScheduleRuntime(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
    order = {rank: [_Action.from_str(f"{s}{kind}{m}") for s, kind, m in acts] for rank, acts in actions.items()}
    schedule.pipeline_order = order
    schedule._prepare_schedule_with_comms(order)  # noqa: SLF001 (what its subclasses call in their __init__)
    return schedule


def _single(cls_name: str) -> Callable[..., Any]:
    def build(stages: list, microbatches: int, loss_fn: Callable, actions: Any) -> Any:
        from torch.distributed.pipelining import schedules

        if len(stages) != 1:
            raise PlacerError(f"{cls_name} runs one stage per rank; this rank holds {len(stages)}")
        return getattr(schedules, cls_name)(stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)

    return build


def _multi(cls_name: str) -> Callable[..., Any]:
    def build(stages: list, microbatches: int, loss_fn: Callable, actions: Any) -> Any:
        from torch.distributed.pipelining import schedules

        return getattr(schedules, cls_name)(stages, microbatches, loss_fn=loss_fn, scale_grads=False)

    return build


#: Schedule name -> builder ``(this rank's stages, M, loss_fn, planned actions) -> torch schedule``.
BUILDERS: dict[str, Callable[..., Any]] = {
    "gpipe": _single("ScheduleGPipe"),
    "1f1b": _single("Schedule1F1B"),
    "looped_bfs": _multi("ScheduleLoopedBFS"),
    "interleaved_1f1b": _multi("ScheduleInterleaved1F1B"),
    "interleaved_zb": _multi("ScheduleInterleavedZeroBubble"),
    "zbv": _multi("ScheduleZBVZeroBubble"),
    "dualpipev": _multi("ScheduleDualPipeV"),
    "planned": runtime_schedule,
}


__all__ = [
    "Action",
    "BUILDERS",
    "NEEDS_LAYOUT",
    "SPLIT_BACKWARD",
    "check_schedule",
    "fitting_schedule",
    "is_v",
    "layout",
    "planned_actions",
    "runtime_schedule",
    "v_ranks",
    "v_stage",
]
