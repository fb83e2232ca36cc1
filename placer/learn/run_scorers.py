"""What a training run scores placements with: the scorers by name, a cache, the reward scale.

Every scorer has one shape, :class:`envs.scorer.Scorer` (:class:`envs.SimEnv`,
:class:`envs.real.measured.MeasuredEnv`, a test's fake); :data:`ENVS` builds the
one ``--env`` names, :class:`CachedScorer` scores each distinct placement once per
run, and :func:`reference_time` is the reward scale.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Callable

import numpy as np

import envs
from envs.scorer import Scorer, can_measure_again, can_overflow
from graphs import OpGraph, PlacerError, zoo
from graphs.plan import single_device_rows
from graphs.sources import looks_like_callable, stand_in_loss
from placer.learn.config import TrainConfig

if TYPE_CHECKING:
    from envs.cluster import Cluster
    from placer.learn.home_moves import HomeCodes


class CachedScorer:
    """Scores op-device arrays ``[K, num_ops]`` once each: ``(step_time_s, failed)``.

    Uses the scorer's ``step_times`` (:class:`envs.scorer.Scorer`); an object with ``evaluate``
    only (a test's fake) is scored through that. The cache key is a digest of the index array's bytes;
    identical placements of a batch are scored once.

    ``overflow`` (and a scorer that can tell, :func:`envs.scorer.can_overflow`): every placement is scored through
    the scorer's ``overflow``, and :meth:`scored` gives how far over capacity each is too (a run with home moves:
    its move search's descents then know how near a plan is to fitting, as ``plan_with_homes``'s do).
    """

    def __init__(self, env: Scorer, order: str | None = None, *, overflow: bool = False) -> None:
        self.env = env
        self.order = order  # passed to env.step_times ("planned": SimEnv's planned order per placement)
        self.overflows = overflow and can_overflow(env) and hasattr(env, "step_times")
        self.cache: dict[bytes, tuple[float, bool, float]] = {}  # step time, failed, peak / capacity (nan: unknown)
        self.evaluated = 0

    @staticmethod
    def key(op_devices: np.ndarray) -> bytes:
        return hashlib.blake2b(np.ascontiguousarray(op_devices, dtype=np.int32).tobytes(), digest_size=16).digest()

    def fresh(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score ``op_devices`` anew, on the scorer itself (a re-measurement): this cache is bypassed, and a measured
        env, which caches its own results, is asked to measure again. Not counted in ``evaluated``."""
        if can_measure_again(self.env):
            step_time_s, failed = self.env.measure_again(op_devices)
            return np.asarray(step_time_s, dtype=float), np.asarray(failed, dtype=bool)
        return self._scored(op_devices)[:2]

    def _scored(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step_time_s, failed, over)`` of ``op_devices``: through the scorer's ``overflow`` where
        :attr:`overflows`, else its ``step_times`` (in this scorer's order) or ``evaluate``, ``over`` nan."""
        kw = {} if self.order is None else {"order": self.order}
        if self.overflows:
            step_time_s, failed, over = self.env.overflow(op_devices, **kw)
            return (
                np.asarray(step_time_s, dtype=float),
                np.asarray(failed, dtype=bool),
                np.asarray(over, dtype=float),
            )
        nan = np.full(len(op_devices), np.nan)
        if hasattr(self.env, "step_times"):
            step_time_s, failed = self.env.step_times(op_devices, **kw)
            return np.asarray(step_time_s, dtype=float), np.asarray(failed, dtype=bool), nan
        results = self.env.evaluate(list(op_devices))
        return (np.array([r.step_time_s for r in results], dtype=float), np.array([not r.ok for r in results]), nan)

    def __call__(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.scored(op_devices)[:2]

    def scored(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(step_time_s, failed, over)`` of ``op_devices``, each distinct placement scored once; ``over``: its
        peak / capacity on the device most over (``overflow``'s), nan where this cache does not ask."""
        op_devices = np.asarray(op_devices, dtype=np.int32)
        keys = [self.key(p) for p in op_devices]
        todo = {k: i for i, k in reversed(list(enumerate(keys))) if k not in self.cache}
        if todo:
            step_time_s, failed, over = self._scored(op_devices[list(todo.values())])
            for k, t, f, o in zip(todo, step_time_s, failed, over):
                self.cache[k] = (float(t), bool(f), float(o))
            self.evaluated += len(todo)
        out = np.array([self.cache[k] for k in keys], dtype=float).reshape(len(keys), 3)
        return out[:, 0], out[:, 1].astype(bool), out[:, 2]


def sim_env(config: TrainConfig, graph: OpGraph, cluster: Cluster, logdir: str) -> Scorer:
    """The simulator; with ``--ranks`` the simulator of plans across processes (:class:`envs.sim.ranks.RankSim`)."""
    if config.ranks:
        return rank_sim(config, graph, cluster)
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
    # the measured env's options, the same across processes (RanksEnv is a MeasuredEnv)
    common = dict(
        graph=graph,
        run_dir=logdir,
        device_map=config.device_map,
        ray_address=config.ray_address,
        measure_timeout_s=config.measure_timeout_s,
    )
    if config.ranks:  # each placement one Ray job of one process per device
        from envs.real.ray.jobs import RanksEnv

        plan = dict(microbatches=config.microbatches, inflight=config.inflight, schedule=config.schedule)
        return RanksEnv(config.source, cluster, backend=config.backend, **plan, **common)
    from envs.real.measured import MeasuredEnv  # ray and torch: only for --env measured

    return MeasuredEnv(config.source, cluster, workers=config.workers, **common)


def rank_sim(config: TrainConfig, graph: OpGraph, cluster: Cluster) -> Scorer:
    """The simulator of the run's plans across processes (its M, W and schedule)."""
    from envs.sim.ranks import RankSim

    return RankSim(
        graph,
        cluster,
        microbatches=config.microbatches,
        inflight=config.inflight,
        schedule=config.schedule,
        one_stage_per_rank=config.one_stage_per_rank,
    )


def home_codes(config: TrainConfig, graph: OpGraph, cluster: Cluster) -> HomeCodes | None:
    """The codes of a run with home moves (``--homes``; :mod:`placer.learn.home_moves`), or None for op placements
    only: "auto" homes when the move search scores on the simulator in one process and the model's training state
    does not fit the GPUs (:func:`placer.methods.heuristics.costs.fits_gpus`); "on" always (the config refused
    what cannot have them, :meth:`TrainConfig.validate`); a cluster without a host and a GPU is a one-line error."""
    from placer.learn.home_moves import HomeCodes
    from placer.methods.heuristics.costs import fits_gpus

    if config.homes == "off":
        return None
    if config.homes == "auto":
        searched = config.algo == "moves" and config.env == "sim" and not config.ranks
        has_both = "cpu" in cluster.kinds and len(cluster.gpu_indices()) > 0
        if not searched or not has_both or fits_gpus(graph, cluster):
            return None
    try:
        return HomeCodes(graph, cluster, cluster.gpu_indices())
    except PlacerError as e:
        raise PlacerError(f"--homes on: {cluster.name}: {e}") from None


def checkpointing_blocks(config: TrainConfig, graph: OpGraph, homes: bool) -> list[str]:
    """The layers a run checkpoints where its placements keep them whole (``--checkpointing``;
    :mod:`placer.learn.checkpoint_choice`), [] for none: "auto" when the run searches parameter homes (``homes``) on
    the simulator in one process with one microbatch; "on" always (the config refused what cannot have them); a model
    without a repeated list of layers has none ("on": a one-line error)."""
    from placer.learn.checkpoint_choice import candidate_blocks

    if config.checkpointing == "off":
        return []
    if config.checkpointing == "auto":
        simple = config.env == "sim" and not config.ranks and config.microbatches == 1 and config.executor == "eager"
        return candidate_blocks(graph) if homes and simple else []
    blocks = candidate_blocks(graph)
    if not blocks:
        raise PlacerError(
            f"--checkpointing on: {graph.name or 'the model'} has no repeated list of layers to checkpoint"
        )
    return blocks


ENVS: dict[str, Callable[[TrainConfig, OpGraph, Cluster, str], Scorer]] = {"sim": sim_env, "measured": measured_env}


def reference_time(score: CachedScorer, graph: OpGraph, cluster: Cluster, executor: str) -> float:
    """The reward scale: the best single-device step time (memory ignored).

    A scorer that gives a failed placement no time (a real device's OOM: ``inf``)
    may leave every single-device placement without one (a model that fits on no
    single device); the simulator's time of those placements, memory ignored, is
    the scale then (an infinite scale made every reward NaN).
    """
    single = single_device_rows(len(cluster.device_names), graph.num_ops)
    step_time_s, _ = score(single)
    step_time_s = step_time_s[np.isfinite(step_time_s) & (step_time_s > 0)]
    if not len(step_time_s):
        step_time_s, _ = envs.SimEnv(graph, cluster, executor=executor).step_times(single)
    return float(np.min(step_time_s))
