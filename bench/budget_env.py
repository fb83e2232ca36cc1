"""The scorer every method of the equal-budget benchmark (:mod:`bench.budget`) scores through: it counts every
simulated placement, stops the method when its budget is spent and records its best-so-far curve."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import envs


class BudgetSpent(Exception):
    """Raised by :class:`BudgetEnv` once its budget is used up."""


@dataclass
class Budget:
    """``kind`` "evals" (simulated placements) or "seconds", and how many."""

    kind: str
    value: float

    @property
    def label(self) -> str:
        return f"{self.value / 1000:g}k placements" if self.kind == "evals" else f"{self.value:g} s"


class BudgetEnv:
    """``env.step_times`` for one method: counts placements, enforces the budget, keeps the best one and its curve.

    ``order`` ("planned" or None) is applied to every call, unless the method asks for an order of its own.
    A batch that would overrun ``max_evals`` is cut: its first placements are scored
    (and count), then :class:`BudgetSpent` is raised.
    """

    def __init__(
        self,
        env: envs.SimEnv,
        *,
        max_evals: int | None = None,
        deadline_s: float | None = None,
        order: str | None = None,
    ) -> None:
        self.env, self.max_evals, self.deadline_s, self.order = env, max_evals, deadline_s, order
        self.t0 = time.perf_counter()
        self.evals = 0
        self.best_key: tuple[bool, float] = (True, math.inf)
        self.best_op_devices: np.ndarray | None = None
        self.curve: dict[str, list[float]] = {"evals": [], "wall_s": [], "best_s": []}

    def __getattr__(self, name: str) -> Any:  # graph, cluster, microbatches... of the wrapped env
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        step_time_s, failed, _ = self._scored(op_devices, order, overflow=False)
        return step_time_s, failed

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._scored(op_devices, order, overflow=True)

    def _scored(self, op_devices: np.ndarray, order: Any, *, overflow: bool):
        if self.deadline_s is not None and self.elapsed_s() >= self.deadline_s:
            raise BudgetSpent
        op_devices = np.asarray(op_devices, dtype=np.int32)
        left = len(op_devices) if self.max_evals is None else self.max_evals - self.evals
        if left <= 0:
            raise BudgetSpent
        cut = op_devices[:left]
        kw = {} if self.order is None else {"order": self.order}
        if order is not None:
            kw = {"order": order}
        out = self.env.overflow(cut, **kw) if overflow else (*self.env.step_times(cut, **kw), None)
        self._record(cut, out[0], out[1])
        self.evals += len(cut)
        if len(cut) < len(op_devices):
            raise BudgetSpent
        return out

    def _record(self, op_devices: np.ndarray, step_time_s: np.ndarray, failed: np.ndarray) -> None:
        step_time_s, failed = np.asarray(step_time_s, dtype=float), np.asarray(failed, dtype=bool)
        for k in range(len(op_devices)):
            ok = not failed[k] and math.isfinite(step_time_s[k])
            key = (not ok, float(step_time_s[k]) if math.isfinite(step_time_s[k]) else math.inf)
            if key < self.best_key:
                self.best_key, self.best_op_devices = key, op_devices[k].copy()
                if ok:
                    self.curve["evals"].append(self.evals + k + 1)
                    self.curve["wall_s"].append(self.elapsed_s())
                    self.curve["best_s"].append(key[1])
