"""The measured loop's view of the simulator: step times corrected by a model of its error, and the pool of
candidates every search on it fills (:class:`placer.learn.measured_search.CorrectedSearch` measures from it)."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np

from envs.result import Result
from graphs.plan import as_indices
from placer.learn.correction import Correction, PlacementFeatures


def placement_key(op_devices: np.ndarray) -> bytes:
    """A placement vector's key (its int32 bytes, hashed)."""
    return hashlib.blake2b(np.ascontiguousarray(op_devices, dtype=np.int32).tobytes(), digest_size=16).digest()


class Pool:
    """Candidates to measure: placements, their simulated step times and features, at most ``size`` kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.op_devices: list[np.ndarray] = []
        self.simulated_s: list[float] = []
        self.features: list[np.ndarray] = []
        self.keys: dict[bytes, int] = {}

    def add(self, op_devices: np.ndarray, simulated_s: np.ndarray, features: np.ndarray, score: np.ndarray) -> None:
        """Add the rows of a batch whose ``score`` (lower is better) ranks among the best ``size`` seen in it."""
        for k in np.argsort(score, kind="stable")[: self.size]:
            if not np.isfinite(score[k]):
                continue
            key = placement_key(op_devices[k])
            if key not in self.keys:
                self.keys[key] = len(self.op_devices)
                self.op_devices.append(np.asarray(op_devices[k], dtype=np.int32).copy())
                self.simulated_s.append(float(simulated_s[k]))
                self.features.append(features[k])

    def rescore(self, sim: Any, features: PlacementFeatures) -> None:
        """Simulate every pooled placement again on ``sim`` (the simulator refitted to the measurements), with its
        features."""
        if not self.op_devices:
            return
        op_devices = np.stack(self.op_devices)
        simulated_s, _ = sim.step_times(op_devices)
        simulated_s = np.asarray(simulated_s, dtype=np.float64)
        self.simulated_s = simulated_s.tolist()
        self.features = list(features(op_devices, simulated_s))

    def prune(self, score: np.ndarray) -> None:
        """Keep the ``size`` best by ``score`` (one per pooled placement)."""
        keep = np.argsort(score, kind="stable")[: self.size]
        self.op_devices = [self.op_devices[k] for k in keep]
        self.simulated_s = [self.simulated_s[k] for k in keep]
        self.features = [self.features[k] for k in keep]
        self.keys = {placement_key(p): j for j, p in enumerate(self.op_devices)}

    def __len__(self) -> int:
        return len(self.op_devices)


class CorrectedSimulator:
    """The simulator's step times times exp(mean - ``kappa`` std) of the correction's residual: a scorer a search
    can run on (its ``schedule`` is the simulator's). Every placement it scores is offered to ``pool``.

    ``model`` None: the plain simulator's step times (the ablation), still pooled.
    """

    def __init__(
        self, sim: Any, features: PlacementFeatures, model: Correction | None, kappa: float, pool: Pool
    ) -> None:
        self.sim, self.features, self.model, self.kappa, self.pool = sim, features, model, kappa, pool

    def bound(self, simulated_s: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean prediction, optimistic bound)`` in seconds of placements simulated at ``simulated_s``."""
        if self.model is None:
            return simulated_s, simulated_s
        mean, std = self.model.predict(x)
        return simulated_s * np.exp(mean), simulated_s * np.exp(mean - self.kappa * std)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int32))
        kw = {} if order is None else {"order": order}
        simulated_s, failed = self.sim.step_times(op_devices, **kw)
        simulated_s, failed = np.asarray(simulated_s, dtype=np.float64), np.asarray(failed, dtype=bool)
        x = self.features(op_devices, simulated_s)
        _, bound = self.bound(simulated_s, x)
        self.pool.add(op_devices, simulated_s, x, np.where(failed, np.inf, bound))
        return bound, failed

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        names = list(self.sim.cluster.device_names)
        op_devices = np.stack([as_indices(p, self.sim.graph, names, source="placement") for p in placements])
        step_time_s, failed = self.step_times(op_devices)
        return [Result(float(t), "oom" if f else "ok", source="corrected sim") for t, f in zip(step_time_s, failed)]

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        return self.sim.schedule(op_devices, order)

    def schedule_order(self, op_devices: np.ndarray) -> np.ndarray:
        return self.sim.schedule_order(op_devices)
