"""A stand-in reality: the simulator of a cluster that differs from the one the search is told, as a measured env.

Learning from measurements needs measurements, and CI has no GPU. :class:`StandIn` scores placements the way a
measured env does (the scorer protocol: ``evaluate``, ``step_times``, ``measure_again``; each placement measured
once and cached, re-measured on request), but its "real" step time is the simulator's on a hidden, distorted copy
of the cluster (:func:`distorted`): a device slower than the cluster file says (in all it does, or only where its
compute or only where its memory bandwidth bounds an op: ``slow_part``), host copies costlier; and, with
``op_noise``, each op's FLOPs off by a hidden factor of its own (:func:`distorted_ops`: an error of the cost model
per op, which no device's or link's rate explains). The
simulator the search uses keeps the cluster as given, so its best placement is not the stand-in's best, and the
test knows by how much. A multiplicative noise (lognormal, ``noise`` its standard deviation in log space) makes
two measurements of one placement differ, as real ones do. :meth:`StandIn.stream` gives a method a noise stream of
its own, so that what one method draws does not move another's measurements.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> g, c = random_dag(20, seed=0), envs.resolve_cluster("k80x2")
>>> real = StandIn(g, c, slow_device="gpu:1", slowdown=3.0)
>>> on_gpu1 = np.full((1, 20), c.index("gpu:1"))
>>> ratio = real.step_times(on_gpu1)[0][0] / envs.SimEnv(g, c).step_times(on_gpu1)[0][0]
>>> bool(ratio > 2.0)
True
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import zlib
from typing import Any, Sequence

import numpy as np

import envs
from envs.cluster import Cluster
from envs.result import Result
from graphs import OpGraph, PlacerError
from graphs.plan import as_indices

#: Which of the slow device's rates :func:`distorted` slows: both (a device uniformly slower), or one of them.
SLOW_PARTS = ("all", "compute", "memory")


def distorted(
    cluster: Cluster,
    *,
    slow_device: str | None = None,
    slowdown: float = 1.0,
    copy_factor: float = 1.0,
    slow_part: str = "all",
    machine_slowdown: float = 1.0,
):
    """A copy of ``cluster`` whose ``slow_device`` computes ``slowdown`` times slower and whose links to and from the
    host take ``copy_factor`` times longer. ``machine_slowdown``: besides, every device computes and every link copies
    (bandwidth over, latency times) that many times slower: a cluster file for another machine, such as a GPU preset
    for CPU ranks, which is off by one scale and, with ``slow_device``, by the shape of one device too.
    ``slow_part`` (:data:`SLOW_PARTS`): "all" slows its FLOPs and memory bandwidth both; "compute" its FLOPs only,
    "memory" its memory bandwidth only, so that it is slower only on the ops whose time that rate bounds (the cost
    model's roofline): a slowdown that depends on which ops a plan puts there, which no one speed of the device
    explains."""
    if slowdown <= 0 or copy_factor <= 0 or machine_slowdown <= 0:
        raise PlacerError(
            f"stand-in: slowdowns and copy factor must be positive, got {slowdown}, {machine_slowdown}, {copy_factor}"
        )
    if slow_part not in SLOW_PARTS:
        raise PlacerError(f"stand-in: the slow part must be one of {', '.join(SLOW_PARTS)}, got {slow_part!r}")
    slow = cluster.index(slow_device) if slow_device is not None else None
    flops = slowdown if slow_part in ("all", "compute") else 1.0
    memory = slowdown if slow_part in ("all", "memory") else 1.0
    m = machine_slowdown
    devices = [
        dataclasses.replace(
            d,
            flops_per_s=d.flops_per_s / m / (flops if k == slow else 1.0),
            mem_bw_bytes_per_s=d.mem_bw_bytes_per_s / m / (memory if k == slow else 1.0),
        )
        for k, d in enumerate(cluster.devices)
    ]
    host = {d.name for d in cluster.devices if d.kind == "cpu"}
    links = {
        pair: dataclasses.replace(
            link,
            bandwidth_bytes_per_s=link.bandwidth_bytes_per_s / m / (copy_factor if host & set(pair) else 1.0),
            latency_s=link.latency_s * m,
        )
        for pair, link in cluster.links.items()
    }
    return Cluster(f"{cluster.name} (distorted)", devices, links, cluster.description)


def distorted_ops(graph: OpGraph, op_noise: float, seed: int = 0) -> OpGraph:
    """A copy of ``graph`` whose every op's FLOPs are multiplied by its own factor ``exp(N(0, op_noise))``, drawn once
    from ``seed`` (``op_noise`` 0: ``graph`` itself)."""
    if op_noise < 0:
        raise PlacerError(f"stand-in: the op noise must be >= 0, got {op_noise}")
    if op_noise == 0:
        return graph
    factor = np.exp(np.random.default_rng(seed).normal(0.0, op_noise, size=graph.num_ops))
    return dataclasses.replace(graph, flops=graph.flops * factor)


class StandIn:
    """A measured env whose reality is the simulator on :func:`distorted` ``cluster`` (see the module doc);
    ``simulator(graph, cluster)`` makes that simulator (default :class:`envs.SimEnv`; a plan across processes:
    ``lambda g, c: RankSim(g, c, microbatches=M)``).

    ``measured``: placements measured so far (re-measurements included), as a measured env counts them.
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        *,
        slow_device: str | None = None,
        slowdown: float = 1.0,
        copy_factor: float = 1.0,
        slow_part: str = "all",
        machine_slowdown: float = 1.0,
        op_noise: float = 0.0,
        noise: float = 0.0,
        seed: int = 0,
        simulator: Any = None,
    ) -> None:
        if not noise >= 0:  # (NaN too)
            raise PlacerError(f"stand-in: the noise must be >= 0, got {noise}")
        self.graph, self.cluster, self.noise = graph, cluster, noise
        hidden = distorted(
            cluster,
            slow_device=slow_device,
            slowdown=slowdown,
            copy_factor=copy_factor,
            slow_part=slow_part,
            machine_slowdown=machine_slowdown,
        )
        # the reality's simulator: envs.SimEnv (one process), or e.g. envs.sim.ranks.RankSim (plans across processes),
        # on the hidden cluster and the graph with its ops' hidden errors (one draw for every seed of the noise)
        self.truth = (simulator or envs.SimEnv)(distorted_ops(graph, op_noise), hidden)
        self.seed, self.rng = seed, np.random.default_rng(seed)
        self._cache: dict[bytes, tuple[float, bool]] = {}
        self.measured = 0

    def stream(self, name: str) -> StandIn:
        """This reality with a noise stream of its own, drawn from this one's seed and ``name``, a cache of its own,
        and its own count of measurements. Two methods each given ``stream("methods")`` draw the same noise in the
        same order (common random numbers: equal code, equal results), and neither draws from the other's stream;
        one shared stream would let one method's number of draws change every later method's measurements.

        >>> import envs
        >>> from graphs.synthetic import random_dag
        >>> g, c = random_dag(20, seed=0), envs.resolve_cluster("k80x2")
        >>> real = StandIn(g, c, noise=0.1, seed=3)
        >>> p = np.zeros((1, 20), dtype=np.int32)
        >>> a, b = real.stream("methods"), real.stream("methods")
        >>> _ = a.measure_again(p), a.measure_again(p)  # the first method draws twice
        >>> bool(b.measure_again(p)[0][0] == real.stream("methods").measure_again(p)[0][0])
        True
        >>> bool(real.stream("side-by-side").measure_again(p)[0][0] != b.measure_again(p)[0][0])
        True
        """
        other = copy.copy(self)
        other.rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        other._cache, other.measured = {}, 0
        return other

    def true_step_times(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The noiseless "real" step times (what a test compares with; not counted as measurements)."""
        return self.truth.step_times(np.atleast_2d(np.asarray(op_devices, dtype=np.int32)))

    def _measure(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        step_time_s, failed = self.true_step_times(op_devices)
        self.measured += len(step_time_s)
        if self.noise > 0:
            step_time_s = step_time_s * np.exp(self.rng.normal(0.0, self.noise, size=len(step_time_s)))
        return np.where(failed, np.inf, step_time_s), np.asarray(failed, dtype=bool)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Each placement's first measurement (measured now if it has none); node order only, as a measured env."""
        if order is not None:
            raise PlacerError("a measured env measures placement vectors in node order; give order=None")
        op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int32))
        keys = [hashlib.blake2b(p.tobytes(), digest_size=16).digest() for p in op_devices]
        todo = [k for k, key in enumerate(keys) if key not in self._cache]
        if todo:
            step_time_s, failed = self._measure(op_devices[todo])
            for k, t, f in zip(todo, step_time_s, failed):
                self._cache[keys[k]] = (float(t), bool(f))
        out = [self._cache[key] for key in keys]
        return np.array([t for t, _ in out]), np.array([f for _, f in out])

    def measure_again(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Measure anew (a fresh noise draw), past the cache."""
        return self._measure(np.atleast_2d(np.asarray(op_devices, dtype=np.int32)))

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        names = list(self.cluster.device_names)
        op_devices = np.stack(
            [as_indices(p, self.graph, names, source=f"placement {k}") for k, p in enumerate(placements)]
        )
        step_time_s, failed = self.step_times(op_devices)
        return [Result(float(t), "oom" if f else "ok", source="stand-in") for t, f in zip(step_time_s, failed)]
