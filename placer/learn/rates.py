"""A correction of the simulator through its own parameters: each device's speed and the links' speed, fitted to
the measurements, and the simulator run again on the cluster they give.

The linear correction (:mod:`placer.learn.correction`) learns log(real / simulated) as a linear function of a
placement's features. Where the simulator's error is a wrong rate (a device slower than its cluster file says, a
link costlier), the real step time is a maximum over the devices' and links' work: it bends where the bottleneck
moves from one device to another, and no linear residual bends with it (on the stand-in of splits the linear
correction added nothing over the simulator's own ranking; BENCHMARKS.md, "The measured loop moves cuts"). Here
the rates themselves are fitted, and the simulator, which knows where the bottleneck is, runs on them.

The parameters, ``theta``: one log speed per device (its FLOPs and memory bandwidth both; ``exp(theta[d])`` times
the cluster file's), and two log link speeds (bandwidth up and latency down by the same factor): the links that
touch a host, and the others. :func:`rescaled` makes that cluster. :class:`RateFit` fits ``theta`` by robust least
squares (scipy's ``least_squares``, soft-L1 loss) of log(simulated / measured) in units of the measurements' noise,
with a Gaussian prior centred on the cluster file (``prior_std`` in log space): a rate no measurement singles out
stays near the file. Besides the file's rates, each fit starts from them with every rate moved at once by the median
residual, so that a machine many times slower than its file (CPU ranks under a GPU preset: 17x) is fitted too; from
the file alone the robust loss, whose pull is bounded far out, left it near the file. (Two other priors were tried
on the stand-ins and dropped: one around a common scale of all the rates dragged every GPU toward one slow GPU, or
explained a slow GPU as a slow machine; BENCHMARKS.md, "The measured loop refits the simulator's rates".) Memory is
not refitted: which placements do not fit does not depend on ``theta``.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> g, c = random_dag(30, seed=0), envs.resolve_cluster("k80x2")
>>> truth = envs.SimEnv(g, rescaled(c, np.array([0.0, 0.0, np.log(0.5)]), np.zeros(2)))
>>> rng = np.random.default_rng(0)
>>> ops = rng.integers(1, 3, size=(6, 30)).astype(np.int32)
>>> fit = RateFit(c, envs.SimEnv(g, c)).fit(ops, truth.step_times(ops)[0])
>>> round(float(np.exp(fit.theta[c.index("gpu:1")])), 1)
0.5
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from envs.cluster import Cluster
from graphs import PlacerError

#: Link groups of ``theta`` after the devices' speeds: the links that touch a host, and the others.
LINK_GROUPS = ("host links", "device links")


#: A fit whose root-mean-square residual exceeds this many noise widths starts again from the measurements' scale.
FAR_OFF = 2.0


def rescaled(cluster: Cluster, log_speed: np.ndarray, log_link: np.ndarray) -> Cluster:
    """A copy of ``cluster`` whose device ``d`` computes ``exp(log_speed[d])`` times as fast (FLOPs and memory
    bandwidth) and whose links of each group of :data:`LINK_GROUPS` copy ``exp(log_link[g])`` times as fast
    (bandwidth times, latency over, that factor)."""
    speed, link = np.exp(np.asarray(log_speed, dtype=np.float64)), np.exp(np.asarray(log_link, dtype=np.float64))
    if len(speed) != cluster.num_devices or len(link) != len(LINK_GROUPS):
        raise PlacerError(f"rescaled: {len(speed)} speeds and {len(link)} link factors for {cluster.name}")
    devices = [
        dataclasses.replace(d, flops_per_s=d.flops_per_s * s, mem_bw_bytes_per_s=d.mem_bw_bytes_per_s * s)
        for d, s in zip(cluster.devices, speed)
    ]
    host = {d.name for d in cluster.devices if d.kind == "cpu"}
    links = {}
    for pair, old in cluster.links.items():
        f = link[0] if (pair[0] in host or pair[1] in host) else link[1]
        links[pair] = dataclasses.replace(
            old, bandwidth_bytes_per_s=old.bandwidth_bytes_per_s * f, latency_s=old.latency_s / f
        )
    return Cluster(cluster.name, devices, links, cluster.description)


class RateFit:
    """The cluster's rates fitted to measurements (module doc); :attr:`simulator` is ``sim`` on the fitted cluster.

    Args:
        cluster: the cluster as its file says.
        sim: the simulator on ``cluster``; its ``with_cluster(c)`` makes the same simulator on ``c``
            (:class:`envs.SimEnv`, :class:`envs.sim.ranks.RankSim`).
        prior_std: the prior's standard deviation of each log rate (1: a rate off by e times is one standard
            deviation away).
        noise_std: the measurements' assumed noise, relative (log space): the scale of the robust loss, and of
            the data against the prior.
    """

    def __init__(self, cluster: Cluster, sim: Any, *, prior_std: float = 1.0, noise_std: float = 0.05) -> None:
        if prior_std <= 0 or noise_std <= 0:
            raise PlacerError(f"rate fit: prior and noise must be positive, got {prior_std}, {noise_std}")
        self.cluster, self.base, self.prior_std, self.noise_std = cluster, sim, prior_std, noise_std
        self.theta = np.zeros(cluster.num_devices + len(LINK_GROUPS))
        self.simulator = sim
        self.n = 0
        self.evaluations = 0
        """simulators built by the fits so far (each scores the measured placements once)."""

    def names(self) -> list[str]:
        return [f"speed/{d}" for d in self.cluster.device_names] + list(LINK_GROUPS)

    def cluster_at(self, theta: np.ndarray) -> Cluster:
        D = self.cluster.num_devices
        return rescaled(self.cluster, theta[:D], theta[D:])

    def simulated(self, theta: np.ndarray, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(step_time_s, failed)`` of ``op_devices`` on the cluster at ``theta``."""
        self.evaluations += 1
        t, failed = self.base.with_cluster(self.cluster_at(theta)).step_times(op_devices)
        return np.asarray(t, dtype=np.float64), np.asarray(failed, dtype=bool)

    def fit(self, op_devices: np.ndarray, real_s: np.ndarray) -> "RateFit":
        """Fit ``theta`` to the measured ``real_s [m]`` of ``op_devices [m, n]`` (failed or infinite ones left out),
        from the last fit and from the file's rates, the fit of least cost kept; returns self. Where that fit is
        still far from the measurements (its root-mean-square residual over :data:`FAR_OFF` noise widths: a machine many
        times slower than its file, which the robust loss, whose pull is bounded far out, leaves near the file), it
        starts again from each start moved as a whole by the median residual there (every rate at once: time scales
        as one over them)."""
        from scipy.optimize import least_squares

        op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int32))
        real_s = np.asarray(real_s, dtype=np.float64)
        keep = np.isfinite(real_s) & (real_s > 0)
        if keep.any():
            _, failed = self.base.step_times(op_devices[keep])
            keep[np.flatnonzero(keep)[np.asarray(failed, dtype=bool)]] = False
        self.n = int(keep.sum())
        if not self.n:
            return self
        ops, log_real = op_devices[keep], np.log(real_s[keep])

        def residuals(theta: np.ndarray) -> np.ndarray:
            t, failed = self.simulated(theta, ops)
            t = np.where(failed | ~np.isfinite(t), np.exp(log_real) * 1e3, t)
            return np.concatenate([(np.log(t) - log_real) / self.noise_std, theta / self.prior_std])

        def shifted(theta: np.ndarray) -> np.ndarray:
            """``theta`` with every rate moved at once by the median residual there."""
            t, _ = self.simulated(theta, ops)
            return theta - float(np.median(log_real - np.log(t)))

        def solve(x0: np.ndarray) -> Any:
            # tolerances of 1e-4 (a rate to 0.01 %, the cost to 0.01 % of itself): scipy's 1e-8 took 4x the
            # simulations and moved the fitted rates by under 0.05 % on the measured loop's fits
            return least_squares(
                residuals, x0, loss="soft_l1", f_scale=1.0, diff_step=1e-3, max_nfev=300, xtol=1e-4, ftol=1e-4
            )

        starts = [self.theta] if not self.theta.any() else [self.theta, np.zeros_like(self.theta)]
        best = min((solve(x0) for x0 in starts), key=lambda found: found.cost)
        misfit = float(np.sqrt(np.mean(best.fun[: len(log_real)] ** 2)))  # in noise widths
        if misfit > FAR_OFF:  # the fit stopped far from the measurements: start again where their scale is
            best = min([best, *(solve(shifted(x0)) for x0 in starts)], key=lambda found: found.cost)
        self.theta = np.asarray(best.x, dtype=np.float64)
        self.simulator = self.base.with_cluster(self.cluster_at(self.theta))
        return self

    def weights(self) -> dict[str, float]:
        """Each rate's fitted factor over the file's (``exp(theta)``), by name."""
        return {name: float(np.exp(t)) for name, t in zip(self.names(), self.theta)}
