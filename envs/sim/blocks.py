"""The block bound: the step cut at the tasks every other task waits for or is waited for by, each block's
placement and copies solved exactly.

The step's tasks are each op's forward and backward, with the edges of
:func:`envs.sim.energetic.task_windows`. A *cut task* is one that every other task
either precedes or follows (an Inception block's concatenation, in the forward
and again in the backward). Every schedule runs the tasks between two
consecutive cut tasks ``c`` and ``c'`` (a *block*) inside ``[end(c), start(c')]``,
and different blocks' windows do not overlap. So the step is at least the cut
tasks' own times plus, for each block, the shortest window any placement of the
block allows. That window is a small mixed-integer program (scipy's HiGHS):

* each task takes one device and its time there (an op's backward the device of
  its forward, where both are in the block; ``c`` and ``c'`` take devices too);
* a task starts after its predecessors end, plus the copy where a predecessor
  is on another device (latency + the edge's bytes over bandwidth, on the
  cheapest link; a gradient only where both ops are in autograd);
* each device runs its tasks one at a time inside the window (their times sum to
  at most its length);
* ``eager``: a forward copy holds GPU streams for its duration, the
  destination's and, from a GPU, the source's (a peer copy is a two-way stream
  barrier and a copy to the host blocks its source stream, :mod:`envs.sim.eager`);
  so each copy adds to those devices' sums. A copy to the host holds the host
  thread, which runs the host's ops.

This is what the path bounds cannot see: a branch sent to another GPU pays for
its activations on both streams, and a branch kept on the same GPU waits its
turn; the program charges both against the same placement.

The bound uses HiGHS's proven lower bound of each program, not its incumbent, so
a time limit or a solver tolerance only weakens it; a block past ``max_tasks``
tasks, or past the time budget, counts its longest path. Ops that touch no other
op (a batch norm's counter update) are left out of the analysis, which only
removes work: otherwise every task would be unordered with them and no task would
be a cut.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable, Iterator, NamedTuple

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from envs.cluster import Cluster
from envs.sim.cost import copy_costs
from graphs.ir import OpGraph

#: Past this many ops the cut analysis (a bit set of ancestors per task) is skipped.
MAX_OPS = 6_000
#: An edge's bytes where no copy is made whatever the devices (an op's forward to its backward).
NO_COPY = -1.0
_US = 1e6  # the programs are solved in microseconds, so that their numbers are O(1..1e5)


class TaskGraph:
    """The step's ``2 n`` tasks (forward ``v``, backward ``n + v``), their edges and copy bytes, in a topological
    order."""

    def __init__(self, graph: OpGraph, grad: np.ndarray) -> None:
        n = self.n = graph.num_ops
        src, dst, nbytes = (
            graph.edge_src.tolist(),
            graph.edge_dst.tolist(),
            graph.edge_bytes.astype(np.float64).tolist(),
        )
        g = np.asarray(grad, dtype=bool).tolist()
        # (from, to, bytes copied when the two are on different devices; NO_COPY: none)
        self.edges: list[tuple[int, int, float]] = []
        for u, w, b in zip(src, dst, nbytes):
            self.edges.append((u, w, b))
            if g[w]:  # a backward waits for its consumers' backward; the gradient crosses only into autograd
                self.edges.append((n + w, n + u, b if g[u] else NO_COPY))
        self.edges += [(v, n + v, NO_COPY) for v in range(n)]
        self.order = list(range(n)) + [n + v for v in range(n - 1, -1, -1)]
        touched = np.zeros(n, dtype=bool)
        touched[graph.edge_src] = touched[graph.edge_dst] = True
        self.kept = [task for task in self.order if touched[task % n]]
        self.kept_bits = sum(1 << task for task in self.kept)

    def cuts(self) -> tuple[list[int], list[int], list[int]]:
        """``(cut tasks in order, ancestor bits, descendant bits)`` over the kept tasks (bit ``i``: task ``i``)."""
        N = 2 * self.n
        pred: list[list[int]] = [[] for _ in range(N)]
        succ: list[list[int]] = [[] for _ in range(N)]
        for a, b, _ in self.edges:
            pred[b].append(a)
            succ[a].append(b)
        anc, desc = [0] * N, [0] * N
        for task in self.order:
            bits = 0
            for u in pred[task]:
                bits |= anc[u] | (1 << u)
            anc[task] = bits
        for task in reversed(self.order):
            bits = 0
            for w in succ[task]:
                bits |= desc[w] | (1 << w)
            desc[task] = bits
        kept, total = self.kept_bits, len(self.kept)
        cut = [
            task for task in self.kept if (anc[task] & kept).bit_count() + (desc[task] & kept).bit_count() + 1 == total
        ]
        return cut, anc, desc


def _bits(b: int) -> list[int]:
    out = []
    while b:
        low = b & -b
        out.append(low.bit_length() - 1)
        b ^= low
    return out


def _longest_path(
    tasks: list[int], order_pos: dict[int, int], edges: list[tuple[int, int, float]], p: np.ndarray
) -> float:
    """The longest path through ``tasks`` (each at its fastest device, copies free)."""
    inside = set(tasks)
    preds: dict[int, list[int]] = {}
    for a, b, _ in edges:
        if a in inside and b in inside:
            preds.setdefault(b, []).append(a)
    start: dict[int, float] = {}
    for task in sorted(tasks, key=order_pos.__getitem__):
        start[task] = max((start[u] + p[u] for u in preds.get(task, ())), default=0.0)
    return max((start[task] + p[task] for task in tasks), default=0.0)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send the process's standard output to the null device meanwhile: HiGHS's MIP solver prints debugging lines
    to it from C++ whatever its options, which would corrupt a command's ``--json`` output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1 (an embedded interpreter): nothing to protect
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            try:
                yield
            finally:
                os.dup2(saved, 1)
    finally:
        os.close(saved)


class Block(NamedTuple):
    """The tasks between two consecutive cut tasks (None: the step's start or end) and the edges among them."""

    tasks: list[int]
    before: int | None
    after: int | None
    edges: list[tuple[int, int, float]]


def block_windows_s(
    blocks: list[Block],
    dur: np.ndarray,
    copy_s: Callable[[float], float],
    n: int,
    *,
    gpu: np.ndarray | None = None,
    time_limit_s: float = 10.0,
) -> float:
    """The least sum of the blocks' windows ``[end(before), start(after)]`` over the placements of their tasks
    (a proven lower bound, seconds). Blocks solved together share one placement: an op's forward in one and
    its backward in another take the same device.

    ``dur``: ``[2 n, D]`` task seconds per device; a block's ``edges``: the task graph's ``(from, to, bytes)``
    among its tasks and its two cut tasks; ``copy_s(bytes)``: the cheapest copy of that many bytes between two
    devices; ``gpu``: which devices are GPUs, given for ``eager``, where a forward copy holds its destination
    (a GPU's stream or the host thread) and a GPU source's stream (None: copies hold nothing, ``dataflow``).
    """
    D = dur.shape[1]
    nodes: list[int] = []
    for b in blocks:
        nodes += [task for task in b.tasks + [b.before, b.after] if task is not None and task not in nodes]
    at = {task: i for i, task in enumerate(nodes)}
    V = len(nodes)
    integral: list[int] = [1] * (V * D)  # x[i, d]: node i on device d
    upper: list[float] = [1.0] * (V * D)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(coefs: dict[int, float], low: float, high: float = np.inf) -> None:
        for c, v in coefs.items():
            rows.append(len(lo))
            cols.append(c)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    def var(ub: float = np.inf) -> int:
        integral.append(0)
        upper.append(ub)
        return len(upper) - 1

    us = dur * _US
    x = lambda task, d: at[task] * D + d  # noqa: E731
    for task in nodes:
        row({x(task, d): 1.0 for d in range(D)}, 1.0, 1.0)
        if task < n and n + task in at:  # an op's forward and backward on one device
            for d in range(D):
                row({x(task, d): 1.0, x(n + task, d): -1.0}, 0.0, 0.0)
    # devices with the same times for every node are interchangeable here (a copy costs the same on every
    # link), so the first node takes the first of each such class
    seen: set[bytes] = set()
    for d in range(D):
        key = us[nodes, d].tobytes() + (b"g" if gpu is not None and gpu[d] else b"")
        if key in seen:
            row({x(nodes[0], d): 1.0}, 0.0, 0.0)
        seen.add(key)
    windows = []
    for b in blocks:
        G = var()
        windows.append(G)
        members = set(b.tasks)
        start = {task: var() for task in b.tasks + ([b.after] if b.after is not None else [])}
        consumers: dict[int, list[tuple[int, float]]] = {}
        for a, c, nbytes in b.edges:  # start(c) >= end(a) + copy x [devices differ]; end(before) = 0
            coefs: dict[int, float] = {start[c]: 1.0}
            if a in members:
                coefs[start[a]] = -1.0
                for d in range(D):
                    coefs[x(a, d)] = -us[a, d]
            if nbytes != NO_COPY:
                cost = copy_s(nbytes) * _US
                z = var(1.0)
                coefs[z] = -cost
                for d in range(D):
                    row({z: 1.0, x(a, d): -1.0, x(c, d): 1.0}, 0.0)
                if gpu is not None and a < n and c < n:
                    consumers.setdefault(a, []).append((c, cost))
            row(coefs, 0.0)
        for task in b.tasks:  # every task ends inside the window
            row({G: 1.0, start[task]: -1.0, **{x(task, d): -us[task, d] for d in range(D)}}, 0.0)
        if b.after is not None:
            row({G: 1.0, start[b.after]: -1.0}, 0.0)
        load: list[dict[int, float]] = [{G: 1.0, **{x(task, d): -us[task, d] for task in b.tasks}} for d in range(D)]
        for u, cons in consumers.items():  # eager forward copies hold streams
            cost = min(c for _, c in cons)
            ys = []
            for d in range(D):
                y = var(1.0)  # u's output copied to d
                ys.append(y)
                for v, _ in cons:
                    row({y: 1.0, x(v, d): -1.0, x(u, d): 1.0}, 0.0)
                load[d][y] = -cost  # the destination's stream, or the host thread, waits
            for d in range(D):
                if gpu[d]:  # the copies sent from a GPU hold its stream too, when u is there
                    q = var()
                    row({q: 1.0, x(u, d): -float(D), **{y: -1.0 for y in ys}}, -float(D))
                    load[d][q] = -cost
        for coefs in load:
            row(coefs, 0.0)
    nv = len(upper)
    A = sparse.csr_matrix((vals, (rows, cols)), shape=(len(lo), nv))
    objective = np.zeros(nv)
    objective[windows] = 1.0
    with quiet_stdout():
        res = milp(
            objective,
            constraints=LinearConstraint(A, lo, hi),
            integrality=np.array(integral),
            bounds=Bounds(0.0, np.array(upper)),
            options={"time_limit": max(time_limit_s, 0.05), "mip_rel_gap": 1e-6},
        )
    bound = getattr(res, "mip_dual_bound", None)
    if bound is None or not np.isfinite(bound):
        return 0.0
    return max(float(bound), 0.0) / _US


def block_bound_s(
    graph: OpGraph,
    cluster: Cluster,
    fwd_s: np.ndarray,
    bwd_s: np.ndarray,
    grad: np.ndarray,
    executor: str = "eager",
    *,
    time_budget_s: float = 30.0,
    max_tasks: int = 400,
) -> float | None:
    """The block bound (see the module docstring) in seconds, or None past :data:`MAX_OPS` ops or with one device.

    ``time_budget_s``: the solver's seconds, shared by the blocks; a block left without time, or with more
    than ``max_tasks`` tasks, counts its longest path.
    """
    n, D = fwd_s.shape
    if n == 0 or n > MAX_OPS or D < 2:
        return None
    t0 = time.perf_counter()
    grad = np.asarray(grad, dtype=bool)
    dur = np.concatenate([fwd_s, np.where(grad[:, None], bwd_s, 0.0)])
    fastest = dur.min(axis=1)
    tg = TaskGraph(graph, grad)
    cut, anc, desc = tg.cuts()
    pos = {task: i for i, task in enumerate(tg.order)}
    lat, inv_bw = copy_costs(cluster)
    off = ~np.eye(D, dtype=bool)
    lat_off, inv_off = lat[off], inv_bw[off]

    def copy_s(nbytes: float) -> float:
        return float((lat_off + nbytes * inv_off).min())

    gpu = np.asarray(cluster.kinds) == "gpu" if executor == "eager" else None
    kept_bits = tg.kept_bits
    ends = [None] + cut + [None]
    blocks: list[Block] = []
    for c0, c1 in zip(ends[:-1], ends[1:]):
        between = (desc[c0] if c0 is not None else kept_bits) & (anc[c1] if c1 is not None else kept_bits) & kept_bits
        tasks = sorted(_bits(between), key=pos.__getitem__)
        if tasks:
            members = set(tasks)
            inside = members | {c0, c1}
            edges = [
                (a, b, nb)
                for a, b, nb in tg.edges
                if a in inside and b in inside and (a in members or b in members or (a == c0 and b == c1))
            ]
            blocks.append(Block(tasks, c0, c1, edges))
    total = float(fastest[cut].sum()) if cut else 0.0
    # a forward block and the backward block of the same ops are solved together (one placement)
    backward_of = {frozenset(task - n for task in b.tasks): i for i, b in enumerate(blocks) if min(b.tasks) >= n}
    groups: list[list[Block]] = []
    paired: set[int] = set()
    for i, b in enumerate(blocks):
        j = backward_of.get(frozenset(b.tasks)) if max(b.tasks) < n else None
        if i in paired:
            continue
        if j is not None and j not in paired:
            groups.append([b, blocks[j]])
            paired |= {i, j}
        else:
            groups.append([b])
            paired.add(i)
    size = lambda g: sum(len(b.tasks) for b in g)  # noqa: E731
    left = sum(1 < size(g) <= max_tasks for g in groups)
    for group in sorted(groups, key=size):  # the largest last, with the time the others left
        paths = sum(_longest_path(b.tasks, pos, b.edges, fastest) for b in group)
        window = paths
        if 1 < size(group) <= max_tasks:
            remaining = time_budget_s - (time.perf_counter() - t0)
            if remaining > 0:
                window = max(
                    window, block_windows_s(group, dur, copy_s, n, gpu=gpu, time_limit_s=remaining / max(left, 1))
                )
            left -= 1
        total += window
    return total
