"""Large-neighbourhood search for ``ilp``: CP-SAT re-places a window of single ops, the rest of the plan kept.

When the whole graph is too large for the exact model, ``ilp`` improves its hint
window by window instead of coarsening it (which loses the hint: a grouping that
can express the hint exactly needs hundreds of items on the zoo's graphs). Each
step takes a contiguous window of the incumbent's issue order and builds the
model of :mod:`placer.methods.heuristics.ilp_model` over:

* the window's co-location groups, one item each (the ops placed one by one;
  a group that also has ops outside the window keeps its device);
* the context: the ops before the window, one item per device they are on,
  and the ops after it, likewise; each keeps its device. Edges inside the
  context are dropped (they do not depend on the window's decisions), so the
  items stay a DAG.

The issue order is fixed to the incumbent's (the model then decides devices
only, which makes it small enough to solve in seconds). The solution's devices
are spliced into the incumbent and the result simulated, in the incumbent's
order and in its planned order: it replaces the incumbent only if the
simulator says it is faster. So the search never returns a plan slower than
the one it started from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from graphs import OpGraph, PlacerError
from graphs.dag import priority_order_of_edges
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.ilp_items import Items, build_items
from placer.methods.heuristics.ilp_model import solve

#: Items (window plus context) a window's model may hold.
MAX_ITEMS = 28
#: Seconds of solver time per window (at most; the first solution found is usually the one kept).
WINDOW_S = 4.0


@dataclass
class Incumbent:
    op_devices: np.ndarray
    order: np.ndarray
    step_time_s: float
    oom: bool = False  # out of memory: any plan that fits beats it, whatever its step time

    @property
    def key(self) -> tuple[bool, float]:
        return self.oom, self.step_time_s


@dataclass
class LnsStats:
    windows: int = 0
    improved: int = 0
    solver_failed: int = 0


def window_groups(graph: OpGraph, units: np.ndarray, inside: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Item per op of the window (-1 outside): its co-location groups, cycles merged, numbered topologically."""
    _, label = np.unique(units[inside], return_inverse=True)
    U = int(label.max()) + 1 if len(label) else 0
    lab = np.full(graph.num_ops, -1, dtype=np.int64)
    lab[inside] = label.reshape(-1)
    e = inside[graph.edge_src] & inside[graph.edge_dst]
    s, d = lab[graph.edge_src[e]], lab[graph.edge_dst[e]]
    cross = s != d
    adj = coo_matrix((np.ones(int(cross.sum()), dtype=np.int8), (s[cross], d[cross])), shape=(U, U)).tocsr()
    n_scc, scc = connected_components(adj, directed=True, connection="strong")
    s, d = scc[s[cross]], scc[d[cross]]
    first = np.full(n_scc, np.inf)
    np.minimum.at(first, scc[lab[inside]], position[inside].astype(np.float64))
    order = priority_order_of_edges(
        n_scc, s[s != d], d[s != d], first
    )  # topological, as close to the incumbent's as can be
    rank = np.empty(n_scc, dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(n_scc)
    out = np.full(graph.num_ops, -1, dtype=np.int64)
    out[inside] = rank[scc[lab[inside]]]
    return out


def window_items(
    graph: OpGraph, units: np.ndarray, inc: Incumbent, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """``(op_item, fixed, movable, num_before, num_window)`` for the window ``order[start:stop]``.

    Items are numbered: the context before the window (one per device), the
    window's groups in a topological order, the context after. ``movable[i]``:
    the solver places item i; every other item keeps device ``fixed[i]`` (in the
    model; the ops of a window item that merged groups on several devices keep
    theirs, the model sees them on the first one's).
    """
    n = graph.num_ops
    pos = np.empty(n, dtype=np.int64)
    pos[inc.order] = np.arange(n)
    inside = (pos >= start) & (pos < stop)
    op_devices = inc.op_devices
    win = window_groups(graph, units, inside, pos)
    before, after = ~inside & (pos < start), ~inside & (pos >= stop)
    ctx_before, ctx_after = np.unique(op_devices[before]), np.unique(op_devices[after])
    nb, nw = len(ctx_before), int(win.max()) + 1 if inside.any() else 0
    op_item = np.empty(n, dtype=np.int64)
    op_item[before] = np.searchsorted(ctx_before, op_devices[before])
    op_item[inside] = nb + win[inside]
    op_item[after] = nb + nw + np.searchsorted(ctx_after, op_devices[after])
    K = nb + nw + len(ctx_after)
    fixed = np.full(K, -1, dtype=np.int64)
    fixed[:nb], fixed[nb + nw :] = ctx_before, ctx_after
    first_op = np.full(nw, n, dtype=np.int64)
    np.minimum.at(first_op, win[inside], np.flatnonzero(inside))
    fixed[nb : nb + nw] = op_devices[first_op]
    movable = np.zeros(K, dtype=bool)
    movable[nb : nb + nw] = True
    # a group with ops outside the window keeps its device there, so its ops inside keep it too; so does an
    # item that merged groups now on different devices (the model gives an item one device)
    partial = inside & np.isin(units, np.unique(units[~inside]))
    movable[nb + np.unique(win[partial])] = False
    mixed = np.zeros(nw, dtype=bool)
    np.logical_or.at(mixed, win[inside], op_devices[inside] != fixed[nb + win[inside]])
    movable[nb : nb + nw] &= ~mixed
    return op_item, fixed, movable, nb, nw


def context_edges(items: Items, num_before: int, num_window: int) -> Items:
    """``items`` without the edges inside the context before (or after) the window: they would close cycles."""
    lo, hi = num_before, num_before + num_window

    def ctx(i: int) -> int:
        return 0 if i < lo else (2 if i >= hi else 1)

    edges = [(u, v, b) for u, v, b in items.edges if not (ctx(u) == ctx(v) != 1)]
    return Items(
        items.op_item, items.fwd, items.bwd, items.launch, items.mem, items.params, edges, items.fixed, items.rank
    )


def splice_order(inc: Incumbent, op_item: np.ndarray, rank: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The incumbent's order with its window ``[start, stop)`` reissued item by item in ``rank`` order."""
    window = inc.order[start:stop]
    keyed = window[np.lexsort((np.arange(len(window)), rank[op_item[window]]))]
    return np.concatenate([inc.order[:start], keyed, inc.order[stop:]])


def improve_window(
    graph: OpGraph,
    cluster,
    env,
    units: np.ndarray,
    inc: Incumbent,
    start: int,
    stop: int,
    *,
    seconds: float,
    workers: int,
    seed: int,
) -> Incumbent | None:
    """CP-SAT's placement of the window's items (order fixed), spliced in; the better plan if it is faster, else
    None."""
    op_item, fixed, movable, nb, nw = window_items(graph, units, inc, start, stop)
    if not movable.any():
        return None
    K = len(fixed)
    rank = np.arange(K)  # context before, the window's items in a topological order, context after
    model_fixed = np.where(movable, -1, fixed)
    items = context_edges(build_items(graph, cluster, op_item), nb, nw)
    items = Items(
        items.op_item, items.fwd, items.bwd, items.launch, items.mem, items.params, items.edges, model_fixed, rank
    )
    sol = solve(
        items, cluster, time_limit_s=seconds, num_workers=workers, seed=seed, hint_device=fixed, hint_order=rank
    )
    op_devices = inc.op_devices.copy()
    free = movable[op_item]
    op_devices[free] = sol.item_device[op_item[free]]
    order = splice_order(inc, op_item, rank, start, stop)
    if np.array_equal(op_devices, inc.op_devices) and np.array_equal(order, inc.order):
        return None
    planned, _, _ = env.planner.plan(op_devices)
    planned = np.asarray(planned, dtype=np.int64)
    kept, replanned = (fitted_key(env, op_devices, o) for o in (order, planned))
    key, chosen = min((kept, 0), (replanned, 1))
    if not key < inc.key:
        return None
    return Incumbent(op_devices, order if chosen == 0 else planned, key[1], key[0])


def fitted_key(env, op_devices: np.ndarray, order: np.ndarray) -> tuple[bool, float]:
    """``(out of memory, step seconds)`` of a plan: what the plans are compared by, a plan that fits first."""
    step_time_s, failed = env.step_times(np.asarray(op_devices, dtype=np.int32)[None], order)[:2]
    return bool(failed[0]), float(step_time_s[0])


def search(
    graph: OpGraph, cluster, env, inc: Incumbent, *, deadline: float, workers: int, seed: int, window_ops: int = 24
) -> tuple[Incumbent, LnsStats]:
    """Windows of about ``window_ops`` ops at random places of the incumbent's order until ``deadline``."""
    rng = np.random.default_rng(seed)
    units = colocation_groups(graph)
    stats = LnsStats()
    n = graph.num_ops
    width = min(window_ops, n)
    while time.perf_counter() + 1.0 < deadline:
        start = int(rng.integers(0, n - width + 1))
        seconds = min(WINDOW_S, deadline - time.perf_counter())
        try:
            better = improve_window(
                graph,
                cluster,
                env,
                units,
                inc,
                start,
                start + width,
                seconds=seconds,
                workers=workers,
                seed=seed + stats.windows,
            )
        except PlacerError:  # no solution in the window's time: the incumbent stays
            stats.solver_failed += 1
            better = None
        stats.windows += 1
        if better is not None:
            inc, stats.improved = better, stats.improved + 1
    return inc, stats
