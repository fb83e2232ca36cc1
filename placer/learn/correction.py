"""A learned correction of the simulator: the residual log(real / simulated) step time, from a few measurements.

The simulator ranks placements well where it is calibrated and badly where it is not (on an H100 capped at 24 GiB
it put the GPU-heavy plans 4x too fast, and ranked 16 placements with Spearman 0.14; BENCHMARKS.md, "Offload").
Compiler autotuners learn a cost model from the measurements they take and let it choose what to measure next
(Ansor, TLP); here the cost model is the simulator, and what is learned is its error.

:class:`PlacementFeatures` describes a placement as the simulator sees it, each figure relative to its simulated
step time ``T``: the work on each device (``/ T``: how busy the device is, so one minus its idle share), the memory on
each device (``/`` its capacity), the bytes crossing devices (as seconds at the cluster's mean link speed ``/ T``),
those to or from the host, the share of edges that cross, the busiest device's and all devices' work (``/ T``: the
schedule's idle on its critical device, and its overlap), and ``log(T / T_ref)``. Nothing measured is in it: the
features of a placement are known before it runs.

:class:`Correction` is a Bayesian linear regression of the residual on those features (a Gaussian prior on the
weights, centred on "the simulator is right"; the prior's and the noise's precisions fitted by evidence
maximisation, as scikit-learn's ``BayesianRidge`` does). With no measurement it predicts 0 with the prior's
uncertainty; each measurement narrows it where that measurement's features lie. :meth:`Correction.predict` returns
the mean residual and its standard deviation (the weights' uncertainty only: what more measurements would remove).

>>> import envs
>>> from graphs.synthetic import random_dag
>>> g, c = random_dag(30, seed=0), envs.resolve_cluster("k80x2")
>>> pf = PlacementFeatures(g, c)
>>> x = pf(np.zeros((2, 30), dtype=np.int64), np.array([1.0, 2.0]))
>>> x.shape == (2, pf.width)
True
>>> model = Correction(pf.width)
>>> mean, std = model.predict(x)
>>> mean.tolist(), bool((std > 0).all())
([0.0, 0.0], True)
"""

from __future__ import annotations

import numpy as np

from envs.cluster import Cluster
from envs.sim import cost
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph

#: Features besides the two per device (work, memory): copies' seconds, host copies' seconds, the share of edges that
#: cross, the busiest device's work, all devices' work, log(T / T_ref), and the intercept.
SHARED_FEATURES = 7


class PlacementFeatures:
    """``pf(op_devices [K, n], step_time_s [K]) -> [K, width]``: a placement as the simulator sees it (module doc).

    ``reference_s``: ``T_ref`` of the ``log(T / T_ref)`` column (default: the best single-device step time the
    cost model gives, memory ignored).
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, reference_s: float | None = None) -> None:
        sim = schedule_graph(graph)
        fwd, bwd = cost.op_times(graph, cluster)
        self.work = (fwd + bwd).astype(np.float64)  # [n, D]
        self.mem = (cost.static_bytes(graph) + cost.activation_bytes(graph)).astype(np.float64)
        self.capacity = np.maximum(np.asarray(cluster.memory_bytes, dtype=np.float64), 1.0)
        self.num_devices = D = cluster.num_devices
        host = cluster.host
        self.host = host
        bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)
        off = ~np.eye(D, dtype=bool)
        self.mean_bw = float(np.mean(bw[off])) if D > 1 else 1.0
        host_links = off & (host[:, None] | host[None, :])
        self.host_bw = float(np.mean(bw[host_links])) if host_links.any() else self.mean_bw
        self.src, self.dst = sim.edge_src.astype(np.int64), sim.edge_dst.astype(np.int64)
        self.edge_bytes = sim.edge_bytes.astype(np.float64)
        self.reference_s = float(reference_s) if reference_s else float(self.work.sum(axis=0).min())

    @property
    def width(self) -> int:
        return 2 * self.num_devices + SHARED_FEATURES

    def names(self, device_names: list[str] | None = None) -> list[str]:
        """The columns' names (``device_names``: the cluster's, else ``d0``, ``d1``...)."""
        devices = device_names or [f"d{d}" for d in range(self.num_devices)]
        return (
            [f"work/{d}" for d in devices]
            + [f"memory/{d}" for d in devices]
            + ["copies", "host copies", "crossing edges", "busiest", "all work", "log T/T_ref", "intercept"]
        )

    def __call__(self, op_devices: np.ndarray, step_time_s: np.ndarray) -> np.ndarray:
        op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int64))
        K, n = op_devices.shape
        D = self.num_devices
        T = np.maximum(np.asarray(step_time_s, dtype=np.float64).reshape(K), 1e-12)
        T_safe = np.where(np.isfinite(T), T, self.reference_s)
        at = np.arange(K)[:, None] * D + op_devices  # [K, n]: each op's (placement, device) cell
        load = np.bincount(at.ravel(), weights=self.work[np.arange(n)[None], op_devices].ravel(), minlength=K * D)
        load = load.reshape(K, D)
        mem = np.bincount(at.ravel(), weights=np.broadcast_to(self.mem, (K, n)).ravel(), minlength=K * D)
        mem = mem.reshape(K, D)
        a, b = op_devices[:, self.src], op_devices[:, self.dst]
        cross = a != b
        crossing = cross * self.edge_bytes[None]
        touches_host = cross & (self.host[a] | self.host[b])
        x = np.empty((K, self.width))
        x[:, :D] = load / T_safe[:, None]
        x[:, D : 2 * D] = np.minimum(mem / self.capacity[None], 4.0)
        col = 2 * D
        x[:, col] = crossing.sum(axis=1) / self.mean_bw / T_safe
        x[:, col + 1] = (touches_host * self.edge_bytes[None]).sum(axis=1) / self.host_bw / T_safe
        x[:, col + 2] = cross.mean(axis=1) if cross.shape[1] else 0.0
        x[:, col + 3] = load.max(axis=1) / T_safe
        x[:, col + 4] = load.sum(axis=1) / T_safe
        x[:, col + 5] = np.log(T_safe / self.reference_s)
        x[:, col + 6] = 1.0
        return x


class Correction:
    """Bayesian linear regression of log(real / simulated) on placement features, fitted by evidence (module doc).

    Args:
        width: the features' width.
        prior_std: the prior standard deviation of each weight before any measurement (the evidence refits it once
            there are measurements).
        min_noise_std: the noise standard deviation is never taken below this (a measurement repeats to about
            this, relative; a fit to fewer measurements than features must not call itself exact).
    """

    def __init__(self, width: int, *, prior_std: float = 0.5, min_noise_std: float = 0.01) -> None:
        self.width, self.min_noise_std = width, min_noise_std
        self.alpha = 1.0 / prior_std**2  # prior precision of each weight
        self.beta = 1.0 / max(0.1, min_noise_std) ** 2  # noise precision
        self.mean = np.zeros(width)
        self.cov = np.eye(width) / self.alpha
        self.n = 0

    def fit(self, x: np.ndarray, residual: np.ndarray, iterations: int = 100) -> "Correction":
        """Fit to ``x [m, width]`` and the measured ``residual [m]`` (log real / simulated); returns self."""
        x, y = np.asarray(x, dtype=np.float64), np.asarray(residual, dtype=np.float64)
        keep = np.isfinite(y) & np.isfinite(x).all(axis=1)
        x, y = x[keep], y[keep]
        self.n = len(y)
        if not self.n:
            return self
        xtx, xty = x.T @ x, x.T @ y
        eig = np.clip(np.linalg.eigvalsh(xtx), 0.0, None)
        alpha, beta = self.alpha, 1.0 / max(float(np.var(y)), self.min_noise_std**2)
        max_beta = 1.0 / self.min_noise_std**2
        for _ in range(iterations):  # MacKay's fixed point for the two precisions
            mean = beta * np.linalg.solve(alpha * np.eye(self.width) + beta * xtx, xty)
            gamma = float(np.sum(beta * eig / (alpha + beta * eig)))
            sse = float(np.sum((y - x @ mean) ** 2))
            new_alpha = gamma / max(float(mean @ mean), 1e-12)
            new_beta = min(max(self.n - gamma, 1e-6) / max(sse, 1e-12), max_beta)
            done = abs(new_alpha - alpha) < 1e-6 * alpha and abs(new_beta - beta) < 1e-6 * beta
            alpha, beta = min(max(new_alpha, 1e-6), 1e6), new_beta
            if done:
                break
        self.alpha, self.beta = alpha, beta
        precision = alpha * np.eye(self.width) + beta * xtx
        self.cov = np.linalg.inv(precision)
        self.mean = beta * self.cov @ xty
        return self

    @property
    def noise_std(self) -> float:
        return float(1.0 / np.sqrt(self.beta))

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)`` of the residual at ``x [K, width]`` (std: the weights' uncertainty, noise excluded)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        std = np.sqrt(np.maximum(np.einsum("kj,jl,kl->k", x, self.cov, x), 0.0))
        return x @ self.mean, std
