"""What the training loop scores placements with: the scorers by name, a cache, the reward scale.

Every scorer has one shape, :class:`envs.scorer.Scorer` (:class:`envs.SimEnv`,
:class:`envs.real.measured.MeasuredEnv`, a test's fake); :class:`CachedScorer`
scores each distinct placement once per run.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

import envs
from envs.scorer import Scorer, can_measure_again
from graphs import OpGraph, PlacerError, zoo
from graphs.plan import single_device_rows
from placer.learn.config import TrainConfig
from placer.sources import looks_like_callable, stand_in_loss

if TYPE_CHECKING:
    from envs.cluster import Cluster


class CachedScorer:
    """Scores op-device arrays ``[K, num_ops]`` once each: ``(step_time_s, failed)``.

    Uses the scorer's ``step_times`` (:class:`envs.scorer.Scorer`); an object with ``evaluate``
    only (a test's fake) is scored through that. The cache key is a digest of the index array's bytes;
    identical rows of a batch are scored once.
    """

    def __init__(self, env: Scorer, order: str | None = None) -> None:
        self.env = env
        self.order = order  # passed to env.step_times ("planned": SimEnv's planned order per row)
        self.cache: dict[bytes, tuple[float, bool]] = {}
        self.evaluated = 0

    @staticmethod
    def key(row: np.ndarray) -> bytes:
        return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.int32).tobytes(), digest_size=16).digest()

    def fresh(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score ``rows`` anew, on the scorer itself (a re-measurement): this cache is bypassed, and a measured
        env, which caches its own results, is asked to measure again. Not counted in ``evaluated``."""
        if can_measure_again(self.env):
            t, failed = self.env.measure_again(rows)
            return np.asarray(t, dtype=float), np.asarray(failed, dtype=bool)
        return self._score(rows)

    def _score(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` through the scorer's ``step_times`` (in this scorer's order) or ``evaluate``."""
        if hasattr(self.env, "step_times"):
            t, failed = self.env.step_times(rows) if self.order is None else self.env.step_times(rows, order=self.order)
            return np.asarray(t, dtype=float), np.asarray(failed, dtype=bool)
        results = self.env.evaluate(list(rows))
        return (np.array([r.step_time_s for r in results], dtype=float), np.array([not r.ok for r in results]))

    def __call__(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        op_devices = np.asarray(op_devices, dtype=np.int32)
        keys = [self.key(r) for r in op_devices]
        todo = {k: i for i, k in reversed(list(enumerate(keys))) if k not in self.cache}
        if todo:
            t, failed = self._score(op_devices[list(todo.values())])
            for k, ti, fi in zip(todo, np.asarray(t, dtype=float), np.asarray(failed, dtype=bool)):
                self.cache[k] = (float(ti), bool(fi))
            self.evaluated += len(todo)
        out = [self.cache[k] for k in keys]
        return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def sim_env(config: TrainConfig, graph: OpGraph, cluster: Cluster, logdir: str) -> Scorer:
    return envs.SimEnv(
        graph, cluster, executor=config.executor, microbatches=config.microbatches, inflight=config.inflight
    )


def measured_env(config: TrainConfig, graph: OpGraph, cluster: Cluster, logdir: str) -> Scorer:
    """Real training steps on Ray actors; needs a runnable SOURCE (zoo name or module:callable)."""
    if not (config.source in zoo.names() or looks_like_callable(config.source)):
        raise PlacerError(
            f"--env measured: SOURCE {config.source!r} is not runnable (need a zoo name or module:callable, "
            "not a graph file)"
        )
    why = stand_in_loss(graph)
    if why:  # real training steps train the model as it is: it must return its loss
        raise PlacerError(
            f"--env measured: {config.source}: {why}; real training steps need the loss (wrap the model "
            "so that forward returns it, e.g. forward(inputs, labels) -> cross_entropy(...))"
        )
    from envs.real.measured import MeasuredEnv  # ray and torch: only for --env measured

    return MeasuredEnv(
        config.source,
        cluster,
        graph=graph,
        run_dir=logdir,
        device_map=config.device_map,
        workers=config.workers,
        ray_address=config.ray_address,
        measure_timeout_s=config.measure_timeout_s,
    )


ENVS: dict[str, Callable[[TrainConfig, OpGraph, Cluster, str], Scorer]] = {"sim": sim_env, "measured": measured_env}


def measured_heuristics(
    score: CachedScorer, found: Mapping[str, tuple[float, np.ndarray | None]], count: int
) -> dict[str, float]:
    """Step times, on the run's own scorer, of the heuristics with the ``count`` fastest simulated placements.

    ``found``: name -> (simulated step time, op devices). The ``count`` fastest
    distinct placements are scored in one batch (so a measured run's workers
    measure them side by side); every heuristic whose placement is one of them gets
    its time (heuristics often agree), ``inf`` where it failed on the real devices.
    """
    ranked = [
        name for t, name in sorted((t, name) for name, (t, idx) in found.items() if idx is not None and np.isfinite(t))
    ]
    rows: dict[bytes, np.ndarray] = {}
    for name in ranked:
        row = np.asarray(found[name][1], dtype=np.int32)
        if len(rows) < count or CachedScorer.key(row) in rows:
            rows.setdefault(CachedScorer.key(row), row)
    if not rows:
        return {}
    t, failed = score(np.stack(list(rows.values())))
    times = {k: float("inf") if f else float(ti) for k, ti, f in zip(rows, t, failed)}
    keys = {name: CachedScorer.key(np.asarray(found[name][1], dtype=np.int32)) for name in ranked}
    return {name: times[keys[name]] for name in ranked if keys[name] in times}


def reference_time(score: CachedScorer, graph: OpGraph, cluster: Cluster, executor: str) -> float:
    """The reward scale: the best single-device step time (memory ignored).

    A scorer that gives a failed placement no time (a real device's OOM: ``inf``)
    may leave every single-device placement without one (a model that fits on no
    single device); the simulator's time of those placements, memory ignored, is
    the scale then (an infinite scale made every reward NaN).
    """
    single = single_device_rows(len(cluster.device_names), graph.num_ops)
    t, _ = score(single)
    t = t[np.isfinite(t) & (t > 0)]
    if not len(t):
        t, _ = envs.SimEnv(graph, cluster, executor=executor).step_times(single)
    return float(np.min(t))
