"""The move search's budget: every placement it simulates counted against a number or a deadline, and its curve.

:class:`SearchBudget` scores placements through a scorer's ``step_times`` (or ``overflow``), counts
each against ``max_evals``, stops at ``deadline``, and records the best placement
and the curve of the best step time; :class:`BudgetScorer` lends that budget to
:func:`~placer.methods.heuristics.module_search.module_search` as a scorer, so
the placements it simulates are counted too. A failed (out of memory) placement's
cost is its step time times :data:`OOM_FACTOR`, and times how far over capacity it is where the scorer
can say (:func:`oom_costs`); the best placement recorded is one that fits if any did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.scorer import can_overflow
from graphs import PlacerError

#: A failed (out of memory) placement costs this many times its step time (and more, :func:`oom_costs`).
OOM_FACTOR = 10.0


def oom_costs(step_time_s: np.ndarray, oom: np.ndarray, over: np.ndarray | None) -> np.ndarray:
    """The search's cost of each placement: its step time; out of memory, ``OOM_FACTOR`` times it, times ``over``
    (its peak / capacity on the device most over, where the scorer says; None: not known), so that of two plans out
    of memory the one nearer to fitting costs less, and a move toward fitting is a move down.

    >>> oom_costs(np.array([1.0, 1.0, 2.0]), np.array([False, True, True]), np.array([0.5, 1.5, 1.1])).tolist()
    [1.0, 15.0, 22.0]
    """
    scale = OOM_FACTOR if over is None else OOM_FACTOR * np.maximum(np.asarray(over, dtype=np.float64), 1.0)
    return np.where(oom, step_time_s * scale, step_time_s)


def soft_costs(step_time_s: np.ndarray, oom: np.ndarray, over: np.ndarray | None, slope: float) -> np.ndarray:
    """The cost of each placement under a soft memory penalty: out of memory, its step time times ``1 + slope *
    (over - 1)``, so that a plan a few percent over capacity and much faster than those that fit costs less than
    they do (the move search's oscillation, ``MoveSearchOptions.oscillate``); :func:`oom_costs` where the scorer
    cannot say how far over a placement is (``over`` None).

    >>> soft_costs(np.array([1.0, 1.0, 2.0]), np.array([False, True, True]), np.array([0.5, 1.25, 1.5]), 4.0).tolist()
    [1.0, 2.0, 6.0]
    """
    if over is None:
        return oom_costs(step_time_s, oom, over)
    return np.where(
        oom, step_time_s * (1.0 + slope * (np.maximum(np.asarray(over, dtype=np.float64), 1.0) - 1.0)), step_time_s
    )


@dataclass
class SearchCurve:
    """The best step time after each improvement: placements simulated, seconds, step time."""

    evals: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    best_s: list[float] = field(default_factory=list)


class BudgetSpent(Exception):
    """The search's budget of simulated placements or seconds is used up."""


class SearchBudget:
    """Scores placements through ``env.step_times``, each counted against ``max_evals``; records the curve."""

    def __init__(self, env: Any, max_evals: int | None, deadline: float | None, order: str | None) -> None:
        self.env, self.max_evals, self.deadline, self.order = env, max_evals, deadline, order
        self.evals, self.t0 = 0, time.perf_counter()
        self.curve, self.best = SearchCurve(), float("inf")  # the best step time of a placement that fits
        self.best_cost, self.best_op_devices, self.best_oom = float("inf"), None, False  # the least cost seen
        # whether the scorer can say how far over capacity a placement is (the simulator can; a run's scorer cannot)
        self.overflow = can_overflow(env)

    def _better(self, cost: float, oom: bool) -> bool:
        """Whether a placement of ``cost`` (``oom``: out of memory) is the new best: one that fits beats any that
        does not, whatever their costs (an out-of-memory step ten times faster than the only plan that fits would
        otherwise win: the op-only search of a 1.54 B model capped at 16 GiB returned everything on the GPU, 22.88
        GiB, over the host's 11.2 s); among alike, the least cost."""
        if self.best_op_devices is None or (self.best_oom and not oom):
            return True
        return oom == self.best_oom and cost < self.best_cost

    def left(self) -> int:
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return 0
        return (self.max_evals - self.evals) if self.max_evals is not None else 1 << 40

    def score(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(cost, oom)`` of the placements (:func:`oom_costs`); at most what is left."""
        step_time_s, oom, over = self.simulate(op_devices, overflow=True)
        return oom_costs(step_time_s, oom, over), oom

    def simulate(
        self, op_devices: np.ndarray, overflow: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(step time, oom, how far over capacity or None)`` of the placements, at most what is left; counted and
        recorded.

        ``overflow``: ask the scorer how far over capacity each placement is (a scorer that cannot tell gives None).
        """
        k = min(len(op_devices), self.left())
        if k <= 0:
            raise BudgetSpent
        op_devices = np.ascontiguousarray(op_devices[:k], dtype=np.int32)
        kw = {} if self.order is None else {"order": self.order}
        over = None
        if overflow and self.overflow:
            step_time_s, oom, over = self.env.overflow(op_devices, **kw)
        else:
            step_time_s, oom = self.env.step_times(op_devices, **kw)
        step_time_s = np.where(np.isfinite(step_time_s), np.asarray(step_time_s, dtype=np.float64), np.inf)
        oom = np.asarray(oom, dtype=bool)
        self.evals += k
        cost = oom_costs(step_time_s, oom, over)
        fits = np.flatnonzero(~oom)
        j = int(fits[np.argmin(cost[fits])]) if len(fits) else int(np.argmin(cost))
        if self._better(float(cost[j]), bool(oom[j])):
            self.best_cost, self.best_op_devices, self.best_oom = float(cost[j]), op_devices[j].copy(), bool(oom[j])
        if len(fits) and step_time_s[fits].min() < self.best:
            self.best = float(step_time_s[fits].min())
            self.curve.evals.append(self.evals)
            self.curve.wall_s.append(time.perf_counter() - self.t0)
            self.curve.best_s.append(self.best)
        return step_time_s, oom, over


class BudgetScorer:
    """``step_times`` for :func:`module_search` through a :class:`SearchBudget`: counted, recorded, in the search's
    order.

    Where the scorer cannot say how far over capacity a placement is, its step time stands in for it (placements
    out of memory then rank by step time, as the move search ranks them).
    """

    def __init__(self, budget: SearchBudget) -> None:
        self.budget = budget

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        step_time_s, oom, _ = self._scored(op_devices, order, overflow=False)
        return step_time_s, oom

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        step_time_s, oom, over = self._scored(op_devices, order, overflow=True)
        return step_time_s, oom, over if over is not None else step_time_s

    def _scored(self, op_devices: np.ndarray, order: Any, *, overflow: bool):
        if order is not None:
            raise PlacerError("the move search scores in its own issue order; give order=None")
        step_time_s, oom, over = self.budget.simulate(np.asarray(op_devices), overflow)
        if len(step_time_s) < len(op_devices):  # the budget ran out within the batch
            raise BudgetSpent
        return step_time_s, oom, over
