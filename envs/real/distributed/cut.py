"""The stages of a plan: each maximal run of ops on one device, in the plan's issue order.

A stage is what one ``torch.distributed.pipelining.PipelineStage`` runs: a run of
consecutive ops (in issue order) on one logical device. The stages form a chain
(stage ``s`` feeds stage ``s + 1``); a device holds every stage cut on it, so a plan
that goes back and forth between two devices gives each of them several stages.

Two rules come first: a ``getitem`` runs where the op that made its tuple runs, right
after it (:class:`Tuples`). A tuple is not a tensor and cannot be sent to
another process; its elements can, once taken out. And the ops that touch a buffer
some op writes in place (spectral norm's power iteration, applied twice in one
forward) run in one stage, brought together in the issue order where that is safe
(:class:`BufferWrites`): a stage writes its own copy of what it receives, so a write
in a later stage would never reach the buffer, and a read in another stage would see
it before or after the wrong write.

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

A plan may also start a stage where the device does not change (``starts``, a
placement's ``stage_cuts``): two consecutive stages on one device, as torch's V
schedule runs them (stage ``R - 1`` and stage ``R`` on the last rank):

>>> g = OpGraph.from_edges(list("abcd"), [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)])
>>> [(s.device, s.ops) for s in cut_stages(g, [0, 1, 1, 0], ["gpu:0", "gpu:1"], starts=[2])]
[('gpu:0', (0,)), ('gpu:1', (1,)), ('gpu:1', (2,)), ('gpu:0', (3,))]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class StagedSplit:
    """A split whose stages are not all maximal runs on one device: each op's device (index), and the ops that begin
    a stage on the device of the stage before (a V's turn, :func:`envs.real.distributed.schedules.v_ranks`). What a
    pipeline split returns in place of its op devices where a cut into runs alone would merge two of its stages;
    a placement keeps ``starts`` as its ``stage_cuts``. ``schedule``: the schedule the split was made for, where
    the method chose it (``stage_search --option schedule=auto``), ``tried``: each schedule it tried, with its
    simulated step in seconds (None: it does not fit the plan), and ``margin``: what a plan of more stages than
    ranks had to win by; None and empty: the caller's schedule."""

    op_devices: np.ndarray
    starts: tuple[int, ...] = ()
    schedule: str | None = None
    tried: Mapping[str, float | None] = field(default_factory=dict)
    margin: float | None = None

    @classmethod
    def of(cls, out: "np.ndarray | StagedSplit") -> "StagedSplit":
        """A split's result (its op devices, or a StagedSplit) as a StagedSplit: no stage starts but the devices'.

        >>> StagedSplit.of(np.array([1, 2])).starts, StagedSplit.of(StagedSplit(np.array([1, 2, 2]), (2,))).starts
        ((), (2,))
        """
        return out if isinstance(out, cls) else cls(np.asarray(out))


class Tuples:
    """Every ``getitem`` on its tuple's device, issued right after the op that made it, for any plan of one graph
    (the graph read once; :meth:`devices` and :meth:`order` are the rule's two halves: the issue order's does not
    depend on the devices).

    The getitems of one tuple keep their relative order. An op without a tuple
    input is unchanged, so a plan without getitems comes back as it was.

    >>> g = OpGraph.from_edges(["lstm", "x", "out"], [("lstm", "out", 4)], op_types=["aten.lstm", "aten.relu", GETITEM])
    >>> tuples = Tuples(g)
    >>> tuples.devices([0, 1, 1]).tolist(), tuples.order(np.array([0, 1, 2])).tolist()
    ([0, 1, 0], [0, 2, 1])
    """

    def __init__(self, graph: OpGraph) -> None:
        is_getitem = np.array([t == GETITEM for t in graph.op_types], dtype=bool)
        self.tuple_of: dict[int, int] = {}
        if is_getitem.any():
            for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
                if is_getitem[d]:
                    self.tuple_of[d] = s
        # a getitem of a getitem (a nested tuple) runs where the op that made the outermost tuple runs
        items = sorted(self.tuple_of)
        roots = []
        for op in items:
            root = self.tuple_of[op]
            while root in self.tuple_of:
                root = self.tuple_of[root]
            roots.append(root)
        self.getitems = np.array(items, dtype=np.int64)
        self.roots = np.array(roots, dtype=np.int64)

    def devices(self, op_devices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``op_devices`` (a copy) with every getitem on its tuple's device."""
        op_devices = np.asarray(op_devices, dtype=np.int32).copy()
        op_devices[self.getitems] = op_devices[self.roots]
        return op_devices

    def order(self, order: np.ndarray) -> np.ndarray:
        """``order`` with every getitem issued right after the op that made its tuple (their relative order kept)."""
        if not self.tuple_of:
            return order
        tuple_of = self.tuple_of
        followers: dict[int, list[int]] = {}
        for op in order.tolist():
            if op in tuple_of:
                followers.setdefault(tuple_of[op], []).append(op)
        out: list[int] = []
        for op in order.tolist():
            if op in tuple_of:
                continue
            out.append(op)
            # a getitem of a getitem (a nested tuple) follows its own tuple in turn
            pending = list(followers.get(op, ()))
            while pending:
                item = pending.pop(0)
                out.append(item)
                pending[:0] = followers.get(item, [])
        return np.asarray(out, dtype=np.int64)


def cut_stages(
    graph: OpGraph,
    op_devices: Sequence[int] | np.ndarray,
    devices: Sequence[str],
    order: Sequence[int] | np.ndarray | None = None,
    starts: Sequence[int] | np.ndarray = (),
) -> list[Stage]:
    """The stages of a plan (see the module doc): ``op_devices`` indexes ``devices``; ``order`` is the issue order;
    ``starts``: ops (indices) that begin a stage even where the device does not change. A start at a ``getitem``
    moves past the getitems that follow its tuple's op (the tuple rule comes first).

    Raises :class:`PlacerError` for an order that is not a topological order of the graph.
    """
    return StageCutter(graph, devices)(op_devices, order, starts)


class BufferWrites:
    """The ops that touch a buffer some op writes in place (capture's ``meta["buffer_readers"]``,
    :func:`graphs.buffer_writes.buffer_accesses`: they read it, write it or make an alias of it) run in one stage:
    the span of the issue order from the first of them to the last goes on the first one's device (:meth:`spans`).
    Buffers that one op touches together (spectral norm's ``u`` and ``v``) make one group.

    So that the span holds little else, :meth:`order` brings them together: the later ones, with their ancestors
    issued after the first, move to right after the first (their relative order kept), unless an op they pass
    touches a buffer one of them writes, or writes a buffer one of them touches (the writes would then land in
    another order than the program's). A graph without such writes (no ``buffer_readers``) keeps its plans.

    >>> g = OpGraph.from_edges(list("abcde"), [("a", "b", 4), ("b", "d", 4), ("c", "d", 4), ("a", "e", 4)])
    >>> g.meta["buffer_readers"] = {"u": ["a", "e"]}  # a writes the buffer u, e reads it
    >>> writes = BufferWrites(g, Tuples(g))
    >>> order = writes.order(np.arange(5))
    >>> order.tolist(), writes.spans(order)
    ([0, 4, 1, 2, 3], [(0, 1)])
    """

    def __init__(self, graph: OpGraph, tuples: Tuples) -> None:
        readers = graph.meta.get("buffer_readers") or {}
        index = graph.index
        self.tuples = tuples
        # buffers an op touches together (a region writing spectral norm's u and v) make one group
        groups: list[set[int]] = []
        for _, ops in sorted(readers.items()):
            group = {index[n] for n in ops if n in index}
            for other in [g for g in groups if g & group]:
                groups.remove(other)
                group |= other
            groups.append(group)
        self.groups = [np.array(sorted(g), dtype=np.int64) for g in groups if len(g) > 1]
        self.touches: dict[int, set[str]] = {}
        for name, ops in readers.items():
            for op in ops:
                if op in index:
                    self.touches.setdefault(index[op], set()).add(name)
        self.writes: dict[int, set[str]] = {}
        for op, name, *_ in graph.meta.get("buffer_writes") or ():
            if op in index:
                self.writes.setdefault(index[op], set()).add(name)
        self.in_csr = graph.in_csr if self.groups else None

    def order(self, order: np.ndarray) -> np.ndarray:
        """``order`` with each buffer's touching ops brought together where that is safe (the class doc)."""
        if not self.groups:
            return order
        order = np.asarray(order, dtype=np.int64)
        for group in self.groups:
            position = np.empty(len(order), dtype=np.int64)
            position[order] = np.arange(len(order))
            first = int(position[group].min())
            moved = self._closure(group, position, first)
            if not moved:
                continue
            last = max(int(position[m]) for m in moved)
            passed = [int(op) for op in order[first + 1 : last + 1] if int(op) not in moved]
            if not passed or not self._safe(moved, passed):
                continue
            ahead = sorted(moved, key=lambda op: position[op])
            order = np.concatenate([order[: first + 1], ahead, passed, order[last + 1 :]]).astype(np.int64)
        return self.tuples.order(order)

    def _closure(self, group: np.ndarray, position: np.ndarray, first: int) -> set[int]:
        """The group's ops issued after ``first``, with their ancestors issued after it."""
        indptr, src, _ = self.in_csr
        todo = [int(op) for op in group if position[op] > first]
        moved = set(todo)
        while todo:
            op = todo.pop()
            for p in src[indptr[op] : indptr[op + 1]].tolist():
                if position[p] > first and p not in moved:
                    moved.add(p)
                    todo.append(p)
        return moved

    def _safe(self, moved: set[int], passed: list[int]) -> bool:
        """Whether ``moved`` may run before ``passed``: no buffer written by one side and touched by the other."""
        empty: set[str] = set()
        touched = set().union(*(self.touches.get(op, empty) for op in moved))
        written = set().union(*(self.writes.get(op, empty) for op in moved))
        for op in passed:
            if self.writes.get(op, empty) & touched or self.touches.get(op, empty) & written:
                return False
        return True

    def arranged(self, order: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """``order`` with each getitem after its tuple's op and each buffer's ops brought together, and its
        :meth:`spans`: what a stage cut and a split (:func:`split_sequence`) cut along."""
        order = self.order(self.tuples.order(np.asarray(order, dtype=np.int64)))
        return order, self.spans(order)

    def spans(self, order: np.ndarray) -> list[tuple[int, int]]:
        """The positions ``(first, last)`` of ``order`` (an issue order) that must run in one stage, overlapping
        spans merged: from each buffer's first touching op (its tuple's op, for a getitem) to its last (and the
        getitems that follow it)."""
        if not self.groups:
            return []
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        tuple_of = self.tuples.tuple_of
        raw = []
        for group in self.groups:
            ops = [int(op) for op in group]
            for k, op in enumerate(ops):
                while op in tuple_of:
                    op = tuple_of[op]
                ops[k] = op
            first, last = int(position[ops].min()), int(position[ops].max())
            while last + 1 < len(order) and int(order[last + 1]) in tuple_of:
                last += 1
            raw.append((first, last))
        merged: list[tuple[int, int]] = []
        for first, last in sorted(raw):
            if merged and first <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        return merged


class StageCutter:
    """:func:`cut_stages` for many plans of one graph: its tuples and buffer writes are read once, and each issue
    order is checked and rearranged once (the simulator of ranks scores thousands of plans in node order)."""

    def __init__(self, graph: OpGraph, devices: Sequence[str]) -> None:
        if graph.num_ops == 0:
            raise PlacerError(f"plan: graph {graph.name or ''} has no ops to cut into stages")
        self.graph, self.devices = graph, list(devices)
        self.tuples = Tuples(graph)
        self.buffer_writes = BufferWrites(graph, self.tuples)
        self._orders: dict[bytes | None, tuple[np.ndarray, list[tuple[int, int]]]] = {}

    def _issue(self, order: Sequence[int] | np.ndarray | None) -> tuple[np.ndarray, list[tuple[int, int]]]:
        if order is not None and not (isinstance(order, np.ndarray) and order.dtype.kind in "iu"):
            return self.buffer_writes.arranged(check_order(order, self.graph, source="plan: order"))
        key = None if order is None else order.astype(np.int64).tobytes()
        if key not in self._orders:
            if len(self._orders) > 64:  # (a search over orders: keep the latest few)
                self._orders.clear()
            checked = (
                np.arange(self.graph.num_ops) if order is None else check_order(order, self.graph, source="plan: order")
            )
            self._orders[key] = self.buffer_writes.arranged(checked)
        return self._orders[key]

    def issue_order(self, order: Sequence[int] | np.ndarray | None) -> np.ndarray:
        """``order`` (None: node order) checked, with each getitem right after its tuple's op and the ops that touch
        a written buffer brought together (:class:`BufferWrites`); remembered."""
        return self._issue(order)[0]

    def __call__(
        self,
        op_devices: Sequence[int] | np.ndarray,
        order: Sequence[int] | np.ndarray | None = None,
        starts: Sequence[int] | np.ndarray = (),
    ) -> list:
        """The stages of one plan (:func:`cut_stages`)."""
        return [
            Stage(k, device, tuple(run.tolist()))
            for k, (device, run) in enumerate(self.runs(op_devices, order, starts))
        ]

    def runs(
        self,
        op_devices: Sequence[int] | np.ndarray,
        order: Sequence[int] | np.ndarray | None = None,
        starts: Sequence[int] | np.ndarray = (),
    ) -> list[tuple[str, np.ndarray]]:
        """The stages of one plan as ``(device, op indices in issue order)``, the ops an int64 array (a view of the
        issue order): what :meth:`__call__` makes its :class:`Stage` objects of, for a caller that reads the ops as
        an array (the simulator of ranks, which scores thousands of plans)."""
        order, spans = self._issue(order)
        on = self.tuples.devices(op_devices)[order]
        for first, last in spans:  # a written buffer's ops: one stage, on the first one's device
            on[first : last + 1] = on[first]
        begins = on[1:] != on[:-1]
        if len(starts):
            position = np.empty(len(order), dtype=np.int64)
            position[order] = np.arange(len(order))
            for p in position[np.asarray(starts, dtype=np.int64)].tolist():
                while p < len(order) and int(order[p]) in self.tuples.tuple_of:  # past its tuple's getitems
                    p += 1
                for first, last in spans:  # a start within a written buffer's span: after it
                    if first < p <= last:
                        p = last + 1
                if 0 < p < len(order):
                    begins[p - 1] = True
        starts = np.flatnonzero(begins) + 1
        firsts = [0, *starts.tolist()]
        devices = self.devices
        return [(devices[d], run) for d, run in zip(on[firsts].tolist(), np.split(order, starts))]


def split_sequence(graph: OpGraph) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The sequence of ops a contiguous pipeline split cuts, and the spans of it (positions, both ends included)
    that must stay in one stage: node order and none, unless ops write a buffer in place; then the stage cut's
    order of node order (:class:`BufferWrites` brings each such buffer's ops together) and its spans, so that a
    split along it is cut as it was made.

    >>> g = OpGraph.from_edges(list("abc"), [("a", "b", 4), ("b", "c", 4)])
    >>> order, spans = split_sequence(g)
    >>> order.tolist(), spans
    ([0, 1, 2], [])
    """
    writes = BufferWrites(graph, Tuples(graph))
    if not writes.groups:
        return np.arange(graph.num_ops, dtype=np.int64), []
    return writes.arranged(np.arange(graph.num_ops, dtype=np.int64))


__all__ = ["GETITEM", "BufferWrites", "Stage", "StageCutter", "StagedSplit", "Tuples", "cut_stages", "split_sequence"]
