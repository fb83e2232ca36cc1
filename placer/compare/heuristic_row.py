"""One heuristic's row of a comparison: placed and scored under each plan shape ``(M, W)``, its fastest kept.

>>> microbatch_counts([1, 2], "microbatches"), plan_shapes([2], None, "inflight")
([1, 2], [(2, 2)])
"""

from __future__ import annotations

import time
from typing import Any

from envs.microbatch import plan_shapes as all_plan_shapes
from envs.sim import SimEnv
from graphs import OpGraph, PlacerError
from graphs.plan import Placement, check_microbatches
from graphs.schema import check_int
from placer.compare.report import Row
from placer.methods import registry
from placer.methods.registry import HeuristicUnavailable, accepts, placement_of


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def microbatch_counts(value: Any, what: str) -> list[int]:
    """One M or several (a list or tuple), each checked; ``what`` names them in errors."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise PlacerError(f"{what}: give at least one number of microbatches")
    return [check_microbatches(v, what) for v in values]


def plan_shapes(ms: list[int], value: Any, what: str) -> list[tuple[int, int]]:
    """Every ``(M, W)`` to try: each M with each in-flight window of ``value`` (one, several, or None: all)."""
    windows = list(value) if isinstance(value, (list, tuple)) else [value]
    if not windows:
        raise PlacerError(f"{what}: give at least one in-flight window (or None for all)")
    return all_plan_shapes(ms, [None if w is None else check_int(w, what, least=1) for w in windows])


def scored_row(row: Row, env: Any, placement: Any, best_single_s: float | None, order: Any = None) -> Row:
    """``row`` filled in from simulating ``placement`` (op devices, or a Placement with its own issue order and
    microbatches) in ``order`` (None: the placement's own, else node order)."""
    result = env.simulate(placement, order=order)
    row.microbatches = int(result.extra.get("microbatches", 1))
    W = int(result.extra.get("inflight", row.microbatches))
    row.inflight = None if W == row.microbatches else W
    row.status = result.status
    row.peak_bytes = dict(result.peak_bytes)
    row.message = result.message
    row.sim_step_time_s = result.extra.get("sim_step_time_s")
    if result.status == "ok":
        row.step_time_s = float(result.step_time_s)
        if best_single_s is not None and row.step_time_s > 0:
            row.speedup = best_single_s / row.step_time_s
    return row


class HeuristicAttempt:
    """One heuristic placed and scored under several plan shapes ``(M, W)``, its output kept when it is blind to M."""

    def __init__(
        self,
        method: str,
        graph: OpGraph,
        cluster: Any,
        env: SimEnv,
        own: dict[str, Any],
        seed: int,
        model: Any,
        best_single_s: float | None,
        order: str | None = None,
        scorer: Any = None,
    ) -> None:
        self.method, self.graph, self.cluster, self.env = method, graph, cluster, env
        self.scorer = env if scorer is None else scorer  # what scores the row (the method searches on env)
        self.own, self.seed, self.model, self.best_single_s = own, seed, model, best_single_s
        self.order = order  # "planned": searched and scored in each placement's planned issue order; None: node order
        self.fn = registry.get(method)
        self.uses_env = accepts(self.fn, "env")
        self.placed: tuple[Any, float] | None = None  # a method blind to M places once for all of them

    def kwargs(self, M: int, W: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"seed": self.seed, **self.own}
        if self.model is not None and accepts(self.fn, "model"):
            kwargs["model"] = self.model
        if self.uses_env:
            kwargs["env"] = self.env.with_microbatches(M, W).in_order(self.order)
        return kwargs

    def row(self, M: int, W: int) -> Row:
        """The row of the plan with M microbatches, W in flight: placed (a failure is the row's status), then scored."""
        row = Row(method=self.method, microbatches=M, inflight=None if W == M else W)
        kwargs = self.kwargs(M, W)
        t0 = time.perf_counter()
        try:
            if self.placed is None or self.uses_env:
                self.placed = (self.fn(self.graph, self.cluster, **kwargs), time.perf_counter() - t0)
            out, row.place_time_s = self.placed
        except HeuristicUnavailable as e:
            row.status, row.message = e.status, str(e)
        except Exception as e:  # one failing method must not sink the table
            row.status, row.message = "error", one_line(e)
        else:
            row.placement = placement_of(
                out,
                self.graph,
                self.cluster,
                self.method,
                meta={"seed": self.seed},
                microbatches=M,
                inflight=W,
                schedule=self.own.get("schedule"),  # across processes, what the method placed for (and is scored by)
            )
            if isinstance(out, Placement):  # a method that plans its issue order too (ilp): its run's record
                row.meta = dict(out.meta)
            try:
                if self.order == "planned" and row.placement.order is None:  # the order the searches scored in
                    placement = row.placement
                    placement.order = self.env.with_microbatches(M, W).schedule_order(
                        placement.indices(self.graph, self.cluster.device_names)
                    )
                    placement.meta["issue_order"] = "schedule"
                scored_row(row, self.scorer, row.placement, self.best_single_s)
            except Exception as e:
                row.status, row.message = "error", one_line(e)
        if row.place_time_s is None and row.status == "error":
            row.place_time_s = time.perf_counter() - t0
        return row

    def best(self, shapes: list[tuple[int, int]]) -> Row:
        """The fastest row over ``shapes`` (the first row if none ran); its place time is the search's, over all of
        them."""
        tried: list[Row] = []
        for M, W in shapes:
            tried.append(self.row(M, W))
            if tried[-1].placement is None:
                break  # the method cannot place here; another M will not change that
        ok = [r for r in tried if r.status == "ok"]
        best = min(ok, key=lambda r: r.step_time_s) if ok else tried[0]
        if len(tried) > 1 and self.uses_env:  # the search over M took all of them
            best.place_time_s = sum(r.place_time_s or 0.0 for r in tried)
        return best
