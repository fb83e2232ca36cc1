"""The pipeline splits people use: contiguous stages in program order, one per device (or several, looped).

Each cuts the graph's ops, in program (node) order, into contiguous stages (where ops
write a buffer in place, in the stage cut's order, which brings each such buffer's ops
together, and never within them: :func:`~envs.real.distributed.cut.split_sequence`); stage
``s`` goes to device ``s mod R`` of the ``R`` devices used (the cluster's GPUs, all its
devices when it has none), so ``stages_per_rank=1`` runs under GPipe or 1F1B and
``stages_per_rank=2`` under the looped schedules (:mod:`envs.real.distributed.schedules`).
Under torch's V schedule (``--option schedule=zbv``) the 2R stages go down the devices and
back instead (stage ``s`` on device ``s``, then ``2R - 1 - s``), and the split returns a
:class:`~envs.real.distributed.cut.StagedSplit` naming where the last device's second
stage begins.

* ``equal_layers``: torchtitan's default split (``generate_llm_fqn_per_model_part``):
  the model's *layers* are its repeated modules (``layers.0``, ``layers.1``...), with
  what comes before the first (the embedding) and after the last (norm, head, loss)
  counting as one layer each (its ``input_weight = output_weight = 1``); every stage
  gets the same number of layers, the first ones one more while they do not divide.
* ``flops_balanced``: the FLOPs-balanced split (torchtitan PR #2113; the dynamic
  program of pytorch PR #179212): the contiguous cut of the ops minimising the
  largest stage's forward FLOPs (exact: :func:`~placer.methods.heuristics.groups.linear_partition`;
  equal op counts for a graph without FLOPs).
* ``parameters_balanced``: DeepSpeed's ``partition_method="parameters"``: the
  contiguous cut of the layers (as ``equal_layers`` finds them) minimising the
  largest stage's parameter bytes (equal layer counts for a model without parameters).

None of them looks at time, memory or communication: that is what they are.

>>> from graphs import OpGraph
>>> paths = ["embed", "layers.0.mm", "layers.1.mm", "layers.2.mm", "layers.3.mm", "head"]
>>> g = OpGraph.from_edges(paths, [(a, b, 4) for a, b in zip(paths, paths[1:])], module_paths=paths)
>>> layer_units(g).tolist()
[0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from envs.real.distributed.cut import StagedSplit, split_sequence
from envs.real.distributed.schedules import is_v, v_ranks
from graphs import OpGraph, PlacerError
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.groups import linear_partition
from placer.methods.registry import register

#: A module path's repeated part: ``<prefix>.<index>`` (a ModuleList's child).
REPEATED = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")


def repeated_block(path: str, prefixes: set[str]) -> str | None:
    """The repeated module (``"layers.3"``) ``path`` lies in, among the lists ``prefixes``; None outside them."""
    parts = path.split(".")
    for k in range(1, len(parts)):
        if ".".join(parts[:k]) in prefixes and parts[k].isdigit():
            return ".".join(parts[: k + 1])
    return None


def list_prefixes(paths: list[str]) -> set[str]:
    """The outermost module lists of blocks: prefixes ``P`` with children ``P.0``, ``P.1``... (two or more) that
    hold submodules of their own (a stack of blocks, not the layers of one ``nn.Sequential``); any outermost list
    when none does.

    >>> sorted(list_prefixes(["layers.0.attn", "layers.1.attn", "bottom.0", "bottom.2", "layers.1.mlp.0"]))
    ['layers']
    """
    children: dict[str, set[str]] = {}
    deep: set[str] = set()
    for path in paths:
        parts = path.split(".")
        for k in range(1, len(parts)):
            if parts[k].isdigit():
                prefix = ".".join(parts[:k])
                children.setdefault(prefix, set()).add(parts[k])
                if len(parts) > k + 1:
                    deep.add(prefix)
    lists = {p for p, kids in children.items() if len(kids) >= 2}
    outer = {p for p in lists if not any(p.startswith(q + ".") for q in lists if q != p)}
    blocks = {p for p in lists if p in deep and not any(p.startswith(q + ".") for q in lists & deep if q != p)}
    return blocks or outer


def atoms(num_items: int, spans: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Each position's item, every span (positions ``first`` to ``last``) one item, numbered in order: what a split
    may not cut within.

    >>> atoms(6, [(1, 3)]).tolist()
    [0, 1, 1, 1, 2, 3]
    """
    start = np.arange(num_items)
    for first, last in spans:
        start[first : last + 1] = start[first]
    return np.unique(start, return_inverse=True)[1].astype(np.int64)


def layer_units(graph: OpGraph, order: np.ndarray | None = None, spans: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """The layer of each op, numbered in program order (see the module doc): the ops before the first repeated
    module are layer 0, each repeated module a layer, the ops after the last one the last layer; an op between
    two repeated modules, outside both, joins the layer before it, and so does an op of an earlier layer that
    comes after a later one's (layers are contiguous in program order). A graph without repeated modules has one
    layer per op. ``order``: the sequence to number (:func:`~envs.real.distributed.cut.split_sequence`), the
    result then by its positions, a layer that meets one of its ``spans`` joined with the layer before; None:
    node order."""
    paths = [p or "" for p in (graph.module_paths or [""] * graph.num_ops)]
    if order is not None:
        paths = [paths[i] for i in order.tolist()]
    prefixes = list_prefixes(paths)
    keys = [repeated_block(p, prefixes) for p in paths]
    if all(k is None for k in keys):
        return atoms(graph.num_ops, spans)
    first = next(i for i, k in enumerate(keys) if k is not None)
    last = max(i for i, k in enumerate(keys) if k is not None)
    numbers: dict[str, int] = {}
    units = np.zeros(graph.num_ops, dtype=np.int64)
    base = 1 if first > 0 else 0
    for i, key in enumerate(keys):
        if i < first:
            units[i] = 0
        elif i > last:
            units[i] = base + len(numbers)
        elif key is None:
            units[i] = units[i - 1]
        else:
            units[i] = numbers.setdefault(key, base + len(numbers))
    # an op of an earlier layer issued after a later layer's ops joins the later one: stages stay contiguous
    units = np.maximum.accumulate(units)
    if not spans:
        return units
    return np.unique(units[atoms(len(units), spans)], return_inverse=True)[1].astype(np.int64)


def equal_counts(num_units: int, num_stages: int) -> np.ndarray:
    """The stage of each of ``num_units`` layers: equal counts, the first stages one more while they do not divide.

    >>> equal_counts(7, 3).tolist()
    [0, 0, 0, 1, 1, 2, 2]
    """
    base, extra = divmod(num_units, num_stages)
    sizes = [base + (1 if s < extra else 0) for s in range(num_stages)]
    return np.repeat(np.arange(num_stages), sizes)


def balanced(weights: np.ndarray, num_stages: int) -> np.ndarray:
    """The contiguous cut of ``weights`` into ``num_stages`` non-empty stages minimising the largest stage's sum;
    equal counts when every weight is 0 (nothing to balance).

    >>> balanced(np.array([4.0, 1, 1, 1, 1, 4]), 2).tolist(), balanced(np.zeros(4), 2).tolist()
    ([0, 0, 0, 1, 1, 1], [0, 0, 1, 1])

    Every stage gets at least one item, the bottleneck unchanged:

    >>> balanced(np.array([5.0, 1, 1, 5]), 3).tolist()
    [0, 1, 1, 2]
    >>> balanced(np.array([5.0, 1, 1, 1]), 4).tolist()
    [0, 1, 2, 3]
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() <= 0:
        return equal_counts(len(weights), num_stages)
    first = linear_partition(weights, num_stages)
    limit = np.bincount(first, weights=weights).max()
    # the same bottleneck with no stage left empty: cut early when the items left are just enough for the stages
    # left (each alone is within the bottleneck, so it stays the optimum)
    out = np.empty(len(weights), dtype=np.int64)
    stage, load = 0, 0.0
    for i, w in enumerate(weights):
        must = len(weights) - i <= num_stages - 1 - stage
        if i > 0 and stage < num_stages - 1 and (must or load + w > limit * (1 + 1e-9)):
            stage, load = stage + 1, 0.0
        out[i], load = stage, load + w
    return out


def stage_map(num_devices: int, num_stages: int, schedule: str | None = None) -> np.ndarray:
    """Each stage's device position (into the devices used): ``s mod R``, or down and back in a V.

    >>> stage_map(2, 4).tolist(), stage_map(2, 4, "zbv").tolist()
    ([0, 1, 0, 1], [0, 1, 1, 0])
    """
    if is_v(schedule):
        return np.asarray(v_ranks(num_devices), dtype=np.int64)
    return np.arange(num_stages, dtype=np.int64) % num_devices


def stage_devices(
    cluster,
    op_stages: np.ndarray,
    schedule: str | None = None,
    order: np.ndarray | None = None,
    spans: Sequence[tuple[int, int]] = (),
) -> np.ndarray | StagedSplit:
    """The split's result: each op's device, stage ``s`` on device ``s mod R``; in a V (:func:`stage_map`), a
    :class:`StagedSplit` with the op that begins the last device's second stage. ``order``: ``op_stages`` is by
    the positions of this sequence (:func:`~envs.real.distributed.cut.split_sequence`), and a stage that begins
    within one of its ``spans`` (a buffer's ops, which run in one stage) begins after it."""
    devices = gpu_devices(cluster)
    op_stages = np.asarray(op_stages).copy()
    for first, last in spans:
        op_stages[first : last + 1] = op_stages[first]
    positions = stage_map(len(devices), int(op_stages.max()) + 1, schedule)
    by_position = devices[positions[op_stages]].astype(np.int32)
    order = np.arange(len(op_stages)) if order is None else np.asarray(order)
    op_devices = np.empty_like(by_position)
    op_devices[order] = by_position
    if not is_v(schedule):
        return op_devices
    R = len(devices)
    turn = np.flatnonzero(op_stages == R)
    if not len(turn):
        raise PlacerError(f"the split's stage {R} lies within ops that write a buffer in one stage; no V to cut")
    return StagedSplit(op_devices, (int(order[turn[0]]),))


def split_stages_per_rank(stages_per_rank: int | None, schedule: str | None, method: str) -> int:
    """The option ``stages_per_rank``: 1 when not given, 2 under a V schedule, which runs no other number.

    >>> split_stages_per_rank(None, None, "m"), split_stages_per_rank(None, "zbv", "m")
    (1, 2)
    """
    if not is_v(schedule):
        return 1 if stages_per_rank is None else int(stages_per_rank)
    if stages_per_rank not in (None, 2):
        raise PlacerError(
            f"{method}: --option stages_per_rank={stages_per_rank}: schedule {schedule!r} runs 2 stages per rank"
        )
    return 2


def num_stages(graph: OpGraph, cluster, stages_per_rank: int, layers: int, method: str) -> int:
    """``R x stages_per_rank`` stages, which must be at least 1 and at most the layers to split."""
    if int(stages_per_rank) < 1:
        raise PlacerError(f"{method}: --option stages_per_rank={stages_per_rank}: at least 1")
    S = len(gpu_devices(cluster)) * int(stages_per_rank)
    if S > layers:
        raise PlacerError(f"{method}: {S} stages for a model of {layers} layers ({graph.name or 'graph'})")
    return S


@register("equal_layers")
def equal_layers(
    graph: OpGraph, cluster, *, seed: int = 0, stages_per_rank: int | None = None, schedule: str | None = None
) -> np.ndarray | StagedSplit:
    """Torchtitan's default split: the same number of layers per stage (module doc)."""
    del seed
    order, spans = split_sequence(graph)
    units = layer_units(graph, order, spans)
    per_rank = split_stages_per_rank(stages_per_rank, schedule, "equal_layers")
    S = num_stages(graph, cluster, per_rank, int(units.max()) + 1, "equal_layers")
    return stage_devices(cluster, equal_counts(int(units.max()) + 1, S)[units], schedule, order, spans)


@register("flops_balanced")
def flops_balanced(
    graph: OpGraph, cluster, *, seed: int = 0, stages_per_rank: int | None = None, schedule: str | None = None
) -> np.ndarray | StagedSplit:
    """The contiguous split of the ops minimising the largest stage's forward FLOPs (module doc)."""
    del seed
    per_rank = split_stages_per_rank(stages_per_rank, schedule, "flops_balanced")
    order, spans = split_sequence(graph)
    items = atoms(graph.num_ops, spans)
    S = num_stages(graph, cluster, per_rank, int(items.max()) + 1, "flops_balanced")
    flops = np.bincount(items, weights=graph.flops[order].astype(np.float64))
    return stage_devices(cluster, balanced(flops, S)[items], schedule, order, spans)


@register("parameters_balanced")
def parameters_balanced(
    graph: OpGraph, cluster, *, seed: int = 0, stages_per_rank: int | None = None, schedule: str | None = None
) -> np.ndarray | StagedSplit:
    """DeepSpeed's ``parameters`` partition: the contiguous split of the layers minimising the largest stage's
    parameter bytes (module doc)."""
    del seed
    order, spans = split_sequence(graph)
    units = layer_units(graph, order, spans)
    per_rank = split_stages_per_rank(stages_per_rank, schedule, "parameters_balanced")
    S = num_stages(graph, cluster, per_rank, int(units.max()) + 1, "parameters_balanced")
    weights = graph.param_bytes[order].astype(np.float64)
    unit_bytes = np.bincount(units, weights=weights, minlength=int(units.max()) + 1)
    return stage_devices(cluster, balanced(unit_bytes, S)[units], schedule, order, spans)


__all__ = [
    "atoms",
    "balanced",
    "equal_counts",
    "equal_layers",
    "flops_balanced",
    "layer_units",
    "parameters_balanced",
    "split_stages_per_rank",
    "stage_devices",
    "stage_map",
]
