"""``ilp``: placement and issue order by a constraint solver (OR-Tools CP-SAT), the exact rival.

The model is the eager executor of :mod:`envs.sim.schedule`, written as constraints
over *items* (the ops themselves when the graph is small enough, else the groups
of :func:`graphs.grouping.coarsen`, co-located ops always together):

* decisions: the device of each item (``x[i, d]``) and its issue position
  (``pos[i]``, a permutation; an item's ops are issued together, in node order);
* forward events in issue order: for each item, its incoming copies (one per
  producer and device, made at the first consumer issued there, in ``in_csr``
  order), then the item itself; every event has start/end times and the host
  clock before and after it. A GPU kernel starts after the host has dispatched
  it (``launch``), a host op and a copy into the host block the host, a copy
  waits for the host; every GPU stream and every link serves its events in
  issue order (pairwise ``start >= end`` under "before" literals), peer copies
  hold both streams;
* backward: every task starts after the forward was issued; each GPU and the one
  host queue run their backward tasks in reverse issue order after their forward
  work; a gradient copy waits for its consumers' backward and its link (reverse
  issue order of the producers, after the link's forward copies); a producer's
  backward waits for its gradient copies; a gradient copy between a GPU and the
  host also waits for that GPU's stream (and, host -> GPU, the host queue) and
  holds it (exact with one host device);
* redundant ``NoOverlap`` constraints over optional interval variables per GPU
  (forward and backward tasks) and per link (copies);
* memory: a device's static bytes and kept activations fit its capacity (all of
  them are live when its first backward task starts, so this is necessary);
* objective: the last end plus the largest optimizer update.

Every constraint is a lower bound on a start (``>=``), and the schedule of
simulator model 3 is the least solution of them, so for fixed decisions the
model's optimum is that simulated step (up to rounding to integer time units).
Since model 4 the simulator runs each thread's *ready* backward task with the
highest sequence number (:mod:`envs.sim.eager`), not strict reverse issue order:
the two differ where a task waits for a gradient from another device (0.3% on one
of the 15 brute-force cases in the tests), so with one item per op the solver's
optimum is the best plan under model 3's backward, and every plan is scored by
the simulator. With groups it is an approximation: the plan is
scored by the simulator, which is what the row reports.

Items: as many as fit ``time_limit_s`` (the model has about ``(items +
edges)^2 x devices x 3`` conditional constraints); ``max_items`` caps them. The
solver starts from the best of a few heuristics (``hint``) projected on the
items, with ``num_workers`` parallel workers. The row's ``meta`` has the
solver's objective, its proven bound (both for the item problem, in seconds),
its status, solve time and the item count.

Needs the ``ilp`` extra (``pip install ortools``, or ``pip install -e '.[ilp]'`` in placer's checkout).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

import envs
from envs import cost
from graphs import OpGraph, PlacerError
from graphs.dag import priority_order_of_edges
from graphs.grouping import coarsen, vote
from graphs.plan import Placement
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.ilp_model import Items, solve
from placer.methods.registry import HeuristicUnavailable, get, install_hint, register

#: Conditional constraints per second of ``time_limit_s`` the item count is sized for.
CONSTRAINTS_PER_S = 300

#: Heuristics tried as the solver's starting point (the fastest under the eager simulator wins).
DEFAULT_HINTS = "m_etf,heft,m_topo,single"


def build_items(graph: OpGraph, cluster, op_item: np.ndarray) -> Items:
    """Sum op costs into items; ``op_item`` must number items in a topological order of their graph."""
    fwd_s, bwd_s = cost.op_times(graph, cluster)
    K = int(op_item.max()) + 1 if graph.num_ops else 0
    D = cluster.num_devices
    host = np.asarray(cluster.kinds) == "cpu"
    launch_op = np.where(host[None, :], 0.0, np.where(fwd_s > 0, np.asarray(cluster.launch_overhead_s)[None, :], 0.0))
    fwd, bwd, launch = (np.zeros((K, D)) for _ in range(3))
    np.add.at(fwd, op_item, fwd_s)
    np.add.at(bwd, op_item, bwd_s)
    np.add.at(launch, op_item, launch_op)
    mem = np.bincount(op_item, weights=(cost.static_bytes(graph) + cost.activation_bytes(graph)).astype(np.float64), minlength=K)
    params = np.bincount(op_item, weights=graph.param_bytes.astype(np.float64), minlength=K)
    in_ptr, in_src, in_eid = graph.in_csr
    per_consumer: list[dict[int, dict[int, int]]] = [dict() for _ in range(K)]  # v -> u_item -> {u_op: bytes}
    for v in range(graph.num_ops):
        iv = int(op_item[v])
        for k in range(int(in_ptr[v]), int(in_ptr[v + 1])):
            u = int(in_src[k])
            iu = int(op_item[u])
            if iu == iv:
                continue
            by_op = per_consumer[iv].setdefault(iu, {})
            by_op[u] = max(by_op.get(u, 0), int(graph.edge_bytes[in_eid[k]]))
    edges = [(iu, iv, sum(by_op.values())) for iv in range(K) for iu, by_op in per_consumer[iv].items()]
    return Items(op_item.astype(np.int64), fwd, bwd, launch, mem, params, edges)


def choose_items(graph: OpGraph, cluster, time_limit_s: float, max_items: int | None) -> np.ndarray:
    """Item per op: single ops (co-located ones joined) when they fit the budget, else coarsened groups."""
    D = cluster.num_devices
    budget = CONSTRAINTS_PER_S * max(float(time_limit_s), 1.0)
    units = colocation_groups(graph)
    num_units = int(units.max()) + 1 if len(units) else 0
    cap = num_units if max_items is None else min(num_units, int(max_items))
    k = max(cap, 1)
    while True:
        if k >= num_units and _topological_units(graph, units):
            op_item = units
        else:
            op_item = coarsen(graph, max_groups=k).op_group.astype(np.int64)
        K = int(op_item.max()) + 1 if len(op_item) else 0
        a, b = op_item[graph.edge_src], op_item[graph.edge_dst]
        E = len(np.unique(a[a != b] * K + b[a != b]))
        if 3 * (K + E) ** 2 * D <= budget or k <= 2:
            return op_item
        k = max(2, min(int(k * 0.8), K - 1))


def _topological_units(graph: OpGraph, units: np.ndarray) -> bool:
    """True if co-location units, numbered by first op, have every cross edge going forward."""
    s, d = units[graph.edge_src], units[graph.edge_dst]
    return bool(np.all(s <= d))


def item_order_to_ops(op_item: np.ndarray, item_order: np.ndarray) -> np.ndarray:
    """Op issue order: items in ``item_order``, each item's ops in node order."""
    rank = np.empty(len(item_order), dtype=np.int64)
    rank[np.asarray(item_order, dtype=np.int64)] = np.arange(len(item_order))
    return np.lexsort((np.arange(len(op_item)), rank[op_item])).astype(np.int64)


def _hint(graph: OpGraph, cluster, env, methods: str, seed: int) -> tuple[str, np.ndarray, np.ndarray, float] | None:
    """The fastest of ``methods`` under the eager simulator, with its planned issue order."""

    best = None
    for name in [m.strip() for m in methods.split(",") if m.strip()]:
        if name == "ilp":
            continue
        try:
            idx = np.asarray(get(name)(graph, cluster, seed=seed), dtype=np.int64)
            order, _, t = env.plan_order(idx)
        except PlacerError:
            continue
        if best is None or t < best[3]:
            best = (name, idx, order, t)
    return best


def _project(op_item: np.ndarray, K: int, op_devices: np.ndarray, order: np.ndarray, weight: np.ndarray, D: int, edges) -> tuple[np.ndarray, np.ndarray]:
    """Item devices (the device holding most of an item's weight) and an item order (topological, by first issue)."""
    dev = vote(op_item, op_devices, K, D, weight + 1e-12)
    first = np.full(K, np.inf)
    np.minimum.at(first, op_item[np.asarray(order)], np.arange(len(order), dtype=np.float64))
    src, dst = [u for u, _, _ in edges], [v for _, v, _ in edges]
    return dev, priority_order_of_edges(K, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), first)


@register("ilp")
def ilp(graph: OpGraph, cluster, *, seed: int = 0, time_limit_s: float = 60.0, num_workers: int | None = None,
        max_items: int | None = None, hint: str = DEFAULT_HINTS, env: Any = None):
    """Placement and issue order from CP-SAT (see the module docstring); returns a ``Placement``."""
    try:
        import ortools  # noqa: F401  (an optional extra: checked before any work)
    except ImportError:
        raise HeuristicUnavailable(f"ilp: needs OR-Tools ({install_hint('ilp')})", "not installed") from None

    if not float(time_limit_s) > 0:
        raise PlacerError(f"ilp: time_limit_s must be positive, got {time_limit_s!r}")
    if max_items is not None and int(max_items) < 1:
        raise PlacerError(f"ilp: max_items must be >= 1, got {max_items!r}")
    workers = (os.cpu_count() or 1) if num_workers is None else int(num_workers)
    if workers < 1:
        raise PlacerError(f"ilp: num_workers must be >= 1, got {num_workers!r}")
    eager = env._as("eager") if env is not None and hasattr(env, "_as") else envs.SimEnv(graph, cluster)
    t0 = time.perf_counter()
    op_item = choose_items(graph, cluster, float(time_limit_s), max_items)
    items = build_items(graph, cluster, op_item)
    K = items.num_items
    hint_row = _hint(graph, cluster, eager, hint, seed) if hint else None
    hint_dev = hint_order = None
    if hint_row is not None:
        weight = (eager.fwd_s + eager.bwd_s).min(axis=1)
        hint_dev, hint_order = _project(op_item, K, hint_row[1], hint_row[2], weight, cluster.num_devices, items.edges)
    remaining = max(float(time_limit_s) - (time.perf_counter() - t0), 1.0)
    sol = solve(items, cluster, time_limit_s=remaining, num_workers=workers, seed=seed, hint_device=hint_dev, hint_order=hint_order)
    idx = sol.item_device[op_item].astype(np.int32)
    order = item_order_to_ops(op_item, sol.item_order)
    meta: dict[str, Any] = {
        "solver_status": sol.status, "solver_objective_s": sol.objective_s, "solver_bound_s": sol.bound_s,
        "solve_time_s": sol.solve_s, "items": K, "exact": bool(K == graph.num_ops),
        "time_limit_s": float(time_limit_s), "num_workers": workers, "executor": "eager",
    }
    if hint_row is not None:
        meta.update(hint=hint_row[0], hint_step_time_s=hint_row[3])
    step_s = float(eager.step_times(idx[None, :], order)[0][0])
    meta.update(issue_order="solver", step_time_s=step_s)
    return Placement.from_indices(graph, cluster.device_names, idx, cluster=getattr(cluster, "name", ""), method="ilp",
                                  meta=meta, order=order)
