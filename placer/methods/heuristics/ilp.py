"""``ilp``: placement and issue order by a constraint solver (OR-Tools CP-SAT), the exact method.

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

Items: the co-location groups, one each, when they fit ``time_limit_s`` (the
model has about ``(items + edges)^2 x devices x 3`` conditional constraints;
``max_items`` caps them): the model is then exact and its plan the optimum the
solver found. A larger graph is not coarsened (a grouping that can express the
best heuristic's placement needs hundreds of items on the zoo's graphs): the
solver improves the hint instead, window by window
(:mod:`placer.methods.heuristics.ilp_lns`: the window's groups one by one, the
rest of the plan kept), each result kept only if the simulator finds it
faster. The hint is the fastest of ``hint`` (comma-separated heuristics) that
fits in memory, with its planned issue order; the plan returned is never slower
than it, and never out of memory where the hint fits (plans are compared by
``(out of memory, step time)``: a plan that fits first). Without a
hint a large graph is solved once on coarsened groups, as before.

The row's ``meta``: ``hint`` and ``hint_step_time_s``; for one model the solver's
objective and proven bound (both for the item problem, in seconds), its status,
solve time and the item count; for windows (``solver_status`` "windows") how
many windows were solved and how many made the plan faster.

Needs the ``ilp`` extra (``pip install ortools``, or ``pip install -e '.[ilp]'`` in placer's checkout).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

import envs
from graphs import OpGraph, PlacerError
from graphs.dag import priority_order_of_edges
from graphs.grouping import vote
from graphs.plan import Placement
from placer.methods.heuristics import ilp_lns as lns
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.ilp_items import build_items, choose_items, item_order_to_ops
from placer.methods.heuristics.ilp_model import solve
from placer.methods.registry import HeuristicUnavailable, get, install_hint, register

#: Heuristics tried as the solver's starting point (the fastest under the eager simulator wins).
DEFAULT_HINTS = "m_etf,heft,m_topo,single"


def _hint(graph: OpGraph, cluster, env, methods: str, seed: int) -> tuple[str, lns.Incumbent] | None:
    """The best of ``methods`` under the eager simulator, in its planned issue order (the fastest that fits, or the
    fastest of all when none fits): its name and its plan."""

    best = None
    for name in [m.strip() for m in methods.split(",") if m.strip()]:
        if name == "ilp":
            continue
        try:
            op_devices = np.asarray(get(name)(graph, cluster, seed=seed), dtype=np.int64)
            order, _, _ = env.planner.plan(op_devices)
        except PlacerError:
            continue
        oom, step_time_s = lns.fitted_key(env, op_devices, order)
        plan = lns.Incumbent(op_devices, np.asarray(order), step_time_s, oom)
        if best is None or plan.key < best[1].key:
            best = (name, plan)
    return best


def _project(
    op_item: np.ndarray, K: int, op_devices: np.ndarray, order: np.ndarray, weight: np.ndarray, D: int, edges
) -> tuple[np.ndarray, np.ndarray]:
    """Item devices (the device holding most of an item's weight) and an item order (topological, by first issue)."""
    item_devices = vote(op_item, op_devices, K, D, weight + 1e-12)
    first = np.full(K, np.inf)
    np.minimum.at(first, op_item[np.asarray(order)], np.arange(len(order), dtype=np.float64))
    src, dst = [u for u, _, _ in edges], [v for _, v, _ in edges]
    return item_devices, priority_order_of_edges(
        K, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), first
    )


@register("ilp")
def ilp(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    time_limit_s: float = 60.0,
    num_workers: int | None = None,
    max_items: int | None = None,
    hint: str = DEFAULT_HINTS,
    env: Any = None,
    window_ops: int = 24,
):
    """Placement and issue order from CP-SAT (see the module docstring); returns a ``Placement``."""
    try:
        import ortools  # noqa: F401  (an optional extra: checked before any work)
    except ImportError:
        raise HeuristicUnavailable(f"ilp: needs OR-Tools ({install_hint('ilp')})", "not installed") from None

    if not float(time_limit_s) > 0:
        raise PlacerError(f"ilp: time_limit_s must be positive, got {time_limit_s!r}")
    if max_items is not None and int(max_items) < 1:
        raise PlacerError(f"ilp: max_items must be >= 1, got {max_items!r}")
    if int(window_ops) < 1:
        raise PlacerError(f"ilp: window_ops must be >= 1, got {window_ops!r}")
    workers = (os.cpu_count() or 1) if num_workers is None else int(num_workers)
    if workers < 1:
        raise PlacerError(f"ilp: num_workers must be >= 1, got {num_workers!r}")
    eager = env.with_executor("eager") if hasattr(env, "with_executor") else envs.SimEnv(graph, cluster)
    t0 = time.perf_counter()
    found = _hint(graph, cluster, eager, hint, seed) if hint else None
    hint_plan = found[1] if found is not None else None
    op_item = choose_items(graph, cluster, float(time_limit_s), max_items)
    whole = int(op_item.max()) + 1 == int(colocation_groups(graph).max()) + 1 if graph.num_ops else True
    meta: dict[str, Any] = {"time_limit_s": float(time_limit_s), "num_workers": workers, "executor": "eager"}
    if found is not None:
        meta.update(hint=found[0], hint_step_time_s=hint_plan.step_time_s)
    if hint_plan is not None and not whole:  # too large for one model of single ops: improve the hint window by window
        inc, stats = lns.search(
            graph,
            cluster,
            eager,
            hint_plan,
            deadline=t0 + float(time_limit_s),
            workers=workers,
            seed=seed,
            window_ops=int(window_ops),
        )
        op_devices, order, step_time_s = inc.op_devices.astype(np.int32), inc.order, inc.step_time_s
        meta.update(
            solver_status="windows",
            windows=stats.windows,
            windows_improved=stats.improved,
            windows_failed=stats.solver_failed,
            window_ops=int(window_ops),
            exact=False,
            issue_order="windows" if stats.improved else "hint (planned)",
        )
    else:
        op_devices, order, step_time_s = _solve_whole(
            graph, cluster, eager, op_item, hint_plan, t0 + float(time_limit_s), workers, seed, meta
        )
    meta["step_time_s"] = step_time_s
    return Placement.from_indices(
        graph,
        cluster.device_names,
        op_devices,
        cluster=getattr(cluster, "name", ""),
        method="ilp",
        meta=meta,
        order=order,
    )


def _solve_whole(
    graph: OpGraph,
    cluster,
    eager,
    op_item: np.ndarray,
    hint: lns.Incumbent | None,
    deadline: float,
    workers: int,
    seed: int,
    meta: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray, float]:
    """One model of the whole graph's items: the solver's plan, or the hint's where the solver's is slower."""
    items = build_items(graph, cluster, op_item)
    K = items.num_items
    hint_dev = hint_order = None
    if hint is not None:
        weight = (eager.fwd_s + eager.bwd_s).min(axis=1)
        hint_dev, hint_order = _project(
            op_item, K, hint.op_devices, hint.order, weight, cluster.num_devices, items.edges
        )
    remaining = max(deadline - time.perf_counter(), 1.0)
    sol = solve(
        items,
        cluster,
        time_limit_s=remaining,
        num_workers=workers,
        seed=seed,
        hint_device=hint_dev,
        hint_order=hint_order,
    )
    op_devices = sol.item_device[op_item].astype(np.int32)
    order = item_order_to_ops(op_item, sol.item_order)
    oom, step_time_s = lns.fitted_key(eager, op_devices, order)
    meta.update(
        solver_status=sol.status,
        solver_objective_s=sol.objective_s,
        solver_bound_s=sol.bound_s,
        solve_time_s=sol.solve_s,
        items=K,
        exact=bool(K == int(colocation_groups(graph).max()) + 1),
        issue_order="solver",
    )
    if hint is not None and hint.key < (oom, step_time_s):  # never worse than the hint it started from
        meta.update(
            solver_status=f"{sol.status}, hint kept (the solver's plan: {step_time_s * 1e3:.3f} ms)",
            issue_order="hint (planned)",
        )
        return np.asarray(hint.op_devices, dtype=np.int32), np.asarray(hint.order), float(hint.step_time_s)
    return op_devices, order, step_time_s
