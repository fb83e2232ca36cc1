"""The stages of a plan: each maximal run of ops on one device, in the plan's issue order.

A stage is what one ``torch.distributed.pipelining.PipelineStage`` runs: a run of
consecutive ops (in issue order) on one logical device. The stages form a chain
(stage ``s`` feeds stage ``s + 1``); a device holds every stage cut on it, so a plan
that goes back and forth between two devices gives each of them several stages.

One rule comes first: a ``getitem`` runs where the op that made its tuple runs, right
after it (:func:`tuples_kept_whole`). A tuple is not a tensor and cannot be sent to
another process; its elements can, once taken out.

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)])
>>> [(s.index, s.device, s.ops) for s in cut_stages(g, [0, 0, 1, 0], ["gpu:0", "gpu:1"])]
[(0, 'gpu:0', (0, 1)), (1, 'gpu:1', (2,)), (2, 'gpu:0', (3,))]

The issue order decides the runs. Two independent branches on two devices, issued
one after the other, are two stages; interleaved, four:

>>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "c", 4), ("b", "d", 4)])
>>> len(cut_stages(g, [0, 1, 0, 1], ["gpu:0", "gpu:1"], order=[0, 2, 1, 3]))
2
>>> len(cut_stages(g, [0, 1, 0, 1], ["gpu:0", "gpu:1"], order=[0, 1, 2, 3]))
4
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.plan import check_order

#: The op type of ``operator.getitem`` in an OpGraph (:func:`graphs.flops.op_type`).
GETITEM = "getitem"


@dataclass(frozen=True)
class Stage:
    """One stage: a run of ops, in issue order, on one logical device.

    Attributes:
        index: its place in the chain (stage ``index`` feeds stage ``index + 1``).
        device: the logical device it runs on (``"gpu:1"``).
        ops: op indices of the graph, in issue order.
    """

    index: int
    device: str
    ops: tuple[int, ...]


def tuples_kept_whole(graph: OpGraph, op_devices: Sequence[int] | np.ndarray, order: np.ndarray) -> tuple:
    """``(op_devices, order)`` with every ``getitem`` on its tuple's device, issued right after the op that made it.

    The getitems of one tuple keep their relative order. An op without a tuple
    input is unchanged, so a plan without getitems comes back as it was.

    >>> g = OpGraph.from_edges(["lstm", "x", "out"], [("lstm", "out", 4)], op_types=["aten.lstm", "aten.relu", GETITEM])
    >>> op_devices, order = tuples_kept_whole(g, [0, 1, 1], [0, 1, 2])
    >>> op_devices.tolist(), order.tolist()
    ([0, 1, 0], [0, 2, 1])
    """
    op_devices = np.asarray(op_devices, dtype=np.int32).copy()
    is_getitem = np.array([t == GETITEM for t in graph.op_types], dtype=bool)
    if not is_getitem.any():
        return op_devices, np.asarray(order, dtype=np.int64)
    tuple_of = {}
    for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
        if is_getitem[d]:
            tuple_of[d] = s
    followers: dict[int, list[int]] = {}
    for op in np.asarray(order).tolist():
        if op in tuple_of:
            op_devices[op] = op_devices[tuple_of[op]]
            followers.setdefault(tuple_of[op], []).append(op)
    out: list[int] = []
    for op in np.asarray(order).tolist():
        if op in tuple_of:
            continue
        out.append(op)
        # a getitem of a getitem (a nested tuple) follows its own tuple in turn
        pending = list(followers.get(op, ()))
        while pending:
            item = pending.pop(0)
            out.append(item)
            pending[:0] = followers.get(item, [])
    return op_devices, np.asarray(out, dtype=np.int64)


def cut_stages(
    graph: OpGraph,
    op_devices: Sequence[int] | np.ndarray,
    devices: Sequence[str],
    order: Sequence[int] | np.ndarray | None = None,
) -> list[Stage]:
    """The stages of a plan (see the module doc): ``op_devices`` indexes ``devices``; ``order`` is the issue order.

    Raises :class:`PlacerError` for an order that is not a topological order of the graph.
    """
    if graph.num_ops == 0:
        raise PlacerError(f"plan: graph {graph.name or ''} has no ops to cut into stages")
    order = np.arange(graph.num_ops) if order is None else check_order(order, graph, source="plan: order")
    op_devices, order = tuples_kept_whole(graph, op_devices, order)
    stages: list[Stage] = []
    run: list[int] = []
    for op in order.tolist():
        if run and op_devices[op] != op_devices[run[-1]]:
            stages.append(Stage(len(stages), devices[int(op_devices[run[-1]])], tuple(run)))
            run = []
        run.append(op)
    stages.append(Stage(len(stages), devices[int(op_devices[run[-1]])], tuple(run)))
    return stages


__all__ = ["GETITEM", "Stage", "cut_stages", "tuples_kept_whole"]
