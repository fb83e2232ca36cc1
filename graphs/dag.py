"""DAG algorithms on op graphs: topological orders, cycles, levels and the critical path.

Pure functions, graph first, in the style of ``networkx.algorithms.dag``. They read
an :class:`graphs.OpGraph` (ops in topological order, CSR adjacency), or bare edge
arrays where the graph is still being built (:func:`kahn`, :func:`find_cycle`).

* orders: :func:`kahn` (depth-first Kahn over edge arrays), :func:`priority_order`
  (the ready op of smallest priority first; :func:`priority_order_of_edges` over edge arrays), :func:`random_order` (a
  uniformly random ready op: any topological order can come out);
* cycles: :func:`find_cycle`, :func:`cycle_text`;
* levels: :func:`top_level` (longest path ending before an op), :func:`bottom_level`
  (longest path from an op on, inclusive; with edge costs it is HEFT's upward rank),
  :func:`levels` (both);
* :func:`critical_path`: the longest forward-then-backward path of a training step.

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("a", "c", 8)])
>>> top, bottom = levels(g, np.array([1.0, 2.0, 3.0]))
>>> top.tolist(), bottom.tolist()
([0.0, 1.0, 1.0], [4.0, 2.0, 3.0])
>>> priority_order(g, np.array([0.0, 1.0, 0.5])).tolist()
[0, 2, 1]
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from graphs.ir import OpGraph


# ---------------------------------------------------------------- orders
def csr(n: int, key: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr, other sorted by key, edge ids)``: the neighbours ``other`` of node ``i`` are
    ``[indptr[i]:indptr[i+1]]``."""
    order = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=n) if len(key) else np.zeros(n, dtype=np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, other[order].astype(np.int32), order.astype(np.int64)


def kahn(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Depth-first Kahn: (order, remaining in-degree). Chains stay adjacent in the order.

    Nodes left out of the order (in-degree still > 0) lie on or after a cycle.

    >>> kahn(3, np.array([0, 0]), np.array([2, 1]))[0]
    [0, 1, 2]
    """
    indeg_a = np.bincount(dst, minlength=n) if len(dst) else np.zeros(n, dtype=np.int64)
    indptr, nbr, _ = csr(n, src, dst)
    stack = np.flatnonzero(indeg_a == 0)[::-1].tolist()
    indeg = indeg_a.tolist()  # list items: ~5x faster to update one by one than numpy scalars
    indptr_l, nbr_l = indptr.tolist(), nbr.tolist()
    order: list[int] = []
    push, pop, emit = stack.append, stack.pop, order.append
    while stack:
        u = pop()
        emit(u)
        for v in nbr_l[indptr_l[u] : indptr_l[u + 1]]:
            indeg[v] -= 1
            if not indeg[v]:
                push(v)
    return order, np.asarray(indeg, dtype=np.int64)


def priority_order(graph: OpGraph, priority: np.ndarray) -> np.ndarray:
    """The topological order issuing, among ready ops, the one of smallest ``(priority, index)`` first (int64).

    A list schedule's order: e.g. a priority of 1 for host ops and 0 for the others
    issues every ready device op before any host op (``SimEnv.order_candidates``).
    """
    n = graph.num_ops
    indeg = np.bincount(graph.edge_dst, minlength=n) if graph.num_edges else np.zeros(n, dtype=np.int64)
    out_ptr, out_dst, _ = graph.out_csr
    return _priority_kahn(n, out_ptr, out_dst, indeg, priority)


def priority_order_of_edges(n: int, src: np.ndarray, dst: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """:func:`priority_order` of ``n`` nodes joined by the edges ``src[k] -> dst[k]`` (a graph under construction).

    >>> priority_order_of_edges(3, np.array([0]), np.array([2]), np.array([2.0, 1.0, 0.0])).tolist()
    [1, 0, 2]
    """
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    indeg = np.bincount(dst, minlength=n) if len(dst) else np.zeros(n, dtype=np.int64)
    indptr, nbr, _ = csr(n, src, dst)
    return _priority_kahn(n, indptr, nbr, indeg, priority)


def _priority_kahn(n: int, indptr: np.ndarray, nbr: np.ndarray, indeg: np.ndarray, priority: np.ndarray) -> np.ndarray:
    key = np.asarray(priority).tolist()
    indeg = indeg.tolist()
    ready = [(key[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(u)
        for v in nbr[indptr[u] : indptr[u + 1]].tolist():
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, (key[v], v))
    return np.asarray(order, dtype=np.int64)


def random_order(graph: OpGraph, rng: np.random.Generator) -> np.ndarray:
    """A topological order taking a uniformly random ready op at each step: any topological order can come out
    (int64)."""
    indeg = np.bincount(graph.edge_dst, minlength=graph.num_ops)
    ready = list(np.flatnonzero(indeg == 0))
    order = []
    while ready:
        i = ready.pop(int(rng.integers(len(ready))))
        order.append(i)
        for j in graph.successors(i):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return np.asarray(order, dtype=np.int64)


# ---------------------------------------------------------------- cycles
def find_cycle(n: int, src: np.ndarray, dst: np.ndarray) -> list[int]:
    """Node indices along one directed cycle (first node repeated at the end), or [] if acyclic."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    order, indeg = kahn(n, src, dst)
    if len(order) == n:
        return []
    # Every node Kahn could not emit has a predecessor it could not emit either, so
    # walking predecessors among them must come back to a node already seen.
    left = indeg > 0
    keep = left[src] & left[dst]
    pred_of = np.full(n, -1, dtype=np.int64)
    pred_of[dst[keep]] = src[keep]
    u = int(np.flatnonzero(left)[0])
    seen: dict[int, int] = {}
    path: list[int] = []
    while u not in seen:
        seen[u] = len(path)
        path.append(u)
        u = int(pred_of[u])
    cycle = path[seen[u] :][::-1]
    return cycle + [cycle[0]]


def cycle_text(cycle: list[int], names: Sequence[str], limit: int = 6) -> str:
    """``'a' -> 'b' -> 'a'``: a cycle of :func:`find_cycle` by name, at most ``limit`` names shown."""
    shown = [repr(names[i]) for i in cycle]
    if len(shown) > limit:
        shown = shown[: limit - 1] + [f"... {len(shown) - limit} more ...", shown[-1]]
    return " -> ".join(shown)


# ---------------------------------------------------------------- levels
def top_level(graph: OpGraph, weight: np.ndarray) -> np.ndarray:
    """Per op, the longest weighted path ending just before it (its earliest start with unlimited devices)."""
    n = graph.num_ops
    top = np.zeros(n)
    if not graph.num_edges:
        return top
    indptr, pred, _ = graph.in_csr
    for i in range(n):  # ops are in topological order
        a, b = indptr[i], indptr[i + 1]
        if b > a:
            p = pred[a:b]
            top[i] = np.max(top[p] + weight[p])
    return top


def bottom_level(graph: OpGraph, weight: np.ndarray, edge_weight: np.ndarray | None = None) -> np.ndarray:
    """Per op, the longest weighted path from it on, itself included.

    With ``edge_weight`` (per edge, added along the path) this is HEFT's upward rank:
    ``weight[i] + max over successors j of (edge_weight[i->j] + rank[j])``.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)])
    >>> bottom_level(g, np.array([1.0, 2.0]), np.array([0.5])).tolist()
    [3.5, 2.0]
    """
    rank = np.array(weight, dtype=np.float64)
    if not graph.num_edges:
        return rank
    indptr, succ, eid = graph.out_csr
    for i in range(graph.num_ops - 1, -1, -1):
        a, b = indptr[i], indptr[i + 1]
        if b > a:
            after = rank[succ[a:b]] if edge_weight is None else edge_weight[eid[a:b]] + rank[succ[a:b]]
            rank[i] += float(np.max(after))
    return rank


def levels(graph: OpGraph, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(top_level, bottom_level)`` of every op (see :func:`top_level` and :func:`bottom_level`)."""
    return top_level(graph, weight), bottom_level(graph, weight)


def critical_path(graph: OpGraph, fwd: np.ndarray, bwd: np.ndarray) -> tuple[float, list[int]]:
    """Longest forward-then-backward path of a training step with per-op times ``fwd``/``bwd``: ``(seconds, ops)``.

    ``ops`` lists the path's ops in order of first appearance: the forward chain,
    then the ops only its backward part visits (a chain ``a -> b`` gives ``[a, b]``,
    its path being ``fwd a, fwd b, bwd b, bwd a``). Ties keep the earlier op and an
    op's own forward before its consumers' backward.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)])
    >>> critical_path(g, np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    (9.0, [0, 1])
    """
    n = graph.num_ops
    if n == 0:
        return 0.0, []
    in_ptr, in_src, _ = graph.in_csr
    out_ptr, out_dst, _ = graph.out_csr
    f = fwd.tolist()
    b = bwd.tolist()
    src = in_src.tolist()
    dst = out_dst.tolist()
    ip = in_ptr.tolist()
    op = out_ptr.tolist()
    ef = [0.0] * n
    via_f = [-1] * n  # the predecessor whose forward ends last
    for v in range(n):
        ready = 0.0
        for k in range(ip[v], ip[v + 1]):
            if ef[src[k]] > ready:
                ready = ef[src[k]]
                via_f[v] = src[k]
        ef[v] = ready + f[v]
    eb = [0.0] * n
    via_b = [-1] * n  # the consumer whose backward ends last, if later than this op's forward
    for u in range(n - 1, -1, -1):
        ready = ef[u]
        for k in range(op[u], op[u + 1]):
            if eb[dst[k]] > ready:
                ready = eb[dst[k]]
                via_b[u] = dst[k]
        eb[u] = ready + b[u]
    last = max(range(n), key=eb.__getitem__)
    backward = [last]
    while via_b[backward[-1]] >= 0:
        backward.append(via_b[backward[-1]])
    forward = [backward[-1]]
    while via_f[forward[-1]] >= 0:
        forward.append(via_f[forward[-1]])
    return eb[last], list(dict.fromkeys(forward[::-1] + backward[::-1]))
