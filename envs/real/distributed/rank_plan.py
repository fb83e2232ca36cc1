"""A plan compiled for processes: its stages, their ranks and the schedule, checked once before anything starts.

:func:`compile_plan` turns a :class:`graphs.plan.Placement` into a :class:`RankPlan`:
it checks the placement against the model's graph (its hash, every op placed), cuts
the stages (:func:`~envs.real.distributed.cut.cut_stages`, at its ``stage_cuts`` too), gives each logical
device its rank (:func:`~envs.real.distributed.ranks.assign_ranks`) and picks or
checks the schedule (:mod:`~envs.real.distributed.schedules`). Every bad input is a
one-line :class:`PlacerError` here, in the process that launches the job, not a
failure in the ranks after they have started. A ``RankPlan`` is JSON, so it travels
to the ranks (torch's launcher, Ray actors) and into a report.

With M > 1 microbatches the stages are cut from the program exported at the
microbatch's size (``program``), whose ops must be the whole batch's, one for one
(they are unless torch specialises a size-1 dimension: a microbatch of one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from envs.real.distributed.cut import cut_stages
from envs.real.distributed.ranks import RankDevice, assign_ranks, plan_devices
from envs.real.distributed.schedules import check_schedule, fitting_schedule, planned_actions
from graphs import OpGraph, PlacerError
from graphs.plan import Placement, as_indices


@dataclass(frozen=True)
class StageSpec:
    """One stage of a :class:`RankPlan`: its logical device, its rank and its ops (names, in issue order)."""

    device: str
    rank: int
    ops: tuple[str, ...]


@dataclass
class RankPlan:
    """A plan ready to run across processes (see the module doc).

    Attributes:
        stages: the chain of stages, stage ``s`` feeding ``s + 1``.
        devices: logical device -> its rank and torch device.
        microbatches: M.
        inflight: W (None: M).
        schedule: the schedule's name (:data:`graphs.plan.SCHEDULES`), picked or checked.
        graph_hash: the hash of the model's graph (the whole batch's program).
        program_hash: the hash of the program the stages are cut from (the microbatch's).
        loss_reduction: how the model's loss reduces over the batch, ``"mean"`` or ``"sum"``.
        source: where the placement came from, for messages.
    """

    stages: list[StageSpec]
    devices: dict[str, RankDevice]
    microbatches: int
    inflight: int | None
    schedule: str
    graph_hash: str
    program_hash: str
    loss_reduction: str = "mean"
    source: str = field(default="placement")

    @property
    def num_ranks(self) -> int:
        return len(self.devices)

    @property
    def stage_ranks(self) -> list[int]:
        return [s.rank for s in self.stages]

    def rank_stages(self, rank: int) -> list[int]:
        """The indices of the stages rank ``rank`` runs, in chain order."""
        return [i for i, s in enumerate(self.stages) if s.rank == rank]

    def actions(self) -> dict[int, list[tuple[int, str, int]]]:
        """Placer's issue order per rank (:func:`~envs.real.distributed.schedules.planned_actions`)."""
        return planned_actions(self.stage_ranks, self.num_ranks, microbatches=self.microbatches, inflight=self.inflight)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["stages"] = [{"device": s.device, "rank": s.rank, "ops": list(s.ops)} for s in self.stages]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "RankPlan":
        fields = dict(doc)
        fields["stages"] = [StageSpec(s["device"], int(s["rank"]), tuple(s["ops"])) for s in doc["stages"]]
        fields["devices"] = {d: RankDevice(**v) for d, v in doc["devices"].items()}
        return cls(**fields)


def compile_plan(
    graph: OpGraph,
    placement: Placement | Any,
    *,
    program: OpGraph | None = None,
    rank_map: str | Mapping[str, int] | None = None,
    backend: str = "gloo",
    nproc_per_node: int | None = None,
    device_map: str | Mapping[str, str] | None = None,
    loss_reduction: str = "mean",
) -> RankPlan:
    """Check ``placement`` against ``graph`` and compile it for processes (see the module doc).

    ``placement``: a :class:`Placement` (or a mapping op name -> device: node order,
    M = 1). ``program``: the graph of the program exported at the microbatch size
    (needed when M > 1). The other arguments say where each device runs
    (:func:`~envs.real.distributed.ranks.assign_ranks`).
    """
    source = getattr(placement, "source", "") or "placement"
    if loss_reduction not in ("mean", "sum"):
        raise PlacerError(f"loss_reduction {loss_reduction!r}: 'mean' or 'sum'")
    device_list = list(getattr(placement, "devices", None) or sorted(set(dict(placement).values())))
    op_devices = as_indices(placement, graph, device_list, source=source)
    order = placement.issue_order(graph) if isinstance(placement, Placement) else None
    M = int(getattr(placement, "microbatches", 1))
    W = getattr(placement, "inflight", None)
    cut_from = graph if M == 1 else _same_program(graph, program, M, source)
    devices = plan_devices({n: device_list[int(d)] for n, d in zip(graph.names, op_devices)}, device_list)
    ranks = assign_ranks(devices, rank_map, backend=backend, nproc_per_node=nproc_per_node, device_map=device_map)
    starts = placement.stage_starts(graph) if isinstance(placement, Placement) else ()
    stages = [
        StageSpec(s.device, ranks[s.device].rank, tuple(cut_from.names[i] for i in s.ops))
        for s in cut_stages(cut_from, op_devices, device_list, order, starts)
    ]
    stage_ranks = [s.rank for s in stages]
    named = getattr(placement, "schedule", None)
    schedule = named or fitting_schedule(stage_ranks, len(devices), microbatches=M, inflight=W)
    try:
        check_schedule(schedule, stage_ranks, len(devices), microbatches=M, inflight=W)
    except PlacerError as e:
        raise PlacerError(f"{source}: {e}") from None
    return RankPlan(
        stages=stages,
        devices=ranks,
        microbatches=M,
        inflight=W,
        schedule=schedule,
        graph_hash=graph.content_hash,
        program_hash=cut_from.content_hash,
        loss_reduction=loss_reduction,
        source=source,
    )


def _same_program(graph: OpGraph, program: OpGraph | None, microbatches: int, source: str) -> OpGraph:
    """The microbatch's program, which must have the whole batch's ops (names and types, in order)."""
    if program is None:
        raise PlacerError(f"{source}: a plan of {microbatches} microbatches needs the program of one microbatch")
    if program.names != graph.names or program.op_types != graph.op_types:
        raise PlacerError(
            f"{source}: exported at the size of one of {microbatches} microbatches, the model has other ops than "
            "at the whole batch (torch specialises a dimension of size 1); use fewer microbatches"
        )
    return program


def stage_table(plan: RankPlan) -> list[str]:
    """One line per stage: index, device, rank and op count (for ``placer run``'s text output)."""
    width = len(str(len(plan.stages) - 1))
    return [
        f"stage {i:>{width}}  {s.device:<8} rank {s.rank}  {len(s.ops):>5} ops  {s.ops[0]} .. {s.ops[-1]}"
        for i, s in enumerate(plan.stages)
    ]


def microbatch_size(batch: int, microbatches: int, source: str = "inputs") -> int:
    """``batch / M``, which must be whole."""
    if batch % microbatches:
        raise PlacerError(f"{source}: batch size {batch} is not a multiple of {microbatches} microbatches")
    return batch // microbatches


def check_batched(inputs: Sequence[Any], microbatches: int, source: str = "inputs") -> None:
    """With M > 1, the inputs must hold a batch to split: the first tensor input's dimension 0, a multiple of M.

    Every tensor input with that size there is split into the microbatches; any other input (a table shared by the
    batch, as FLUX's position ids) goes whole to every microbatch, as in one process
    (:func:`envs.real.pipeline.split_batch`; across processes
    :func:`envs.real.distributed.runtime.chunk_specs`)."""
    if microbatches == 1:
        return
    shapes = [tuple(getattr(x, "shape", ())) for x in inputs]
    tensors = [s for s in shapes if s]
    if not tensors:
        raise PlacerError(f"{source}: no tensor input to split into {microbatches} microbatches")
    microbatch_size(tensors[0][0], microbatches, source)


__all__ = [
    "RankPlan",
    "StageSpec",
    "check_batched",
    "compile_plan",
    "microbatch_size",
    "stage_table",
]
