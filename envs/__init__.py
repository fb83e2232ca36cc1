"""Where placements are scored: clusters, the cost model, the simulator (``envs.sim``), real runs (``envs.real``).

``import envs`` loads numpy only; the compiled simulator kernel (numba) loads on
the first batch, torch and ray only with the real runtime (:mod:`envs.real`,
imported where it is used; ``envs.MeasuredEnv`` loads it on first use).

>>> import envs
>>> from graphs.synthetic import random_dag
>>> g = random_dag(20, seed=1)
>>> c = envs.resolve_cluster("k80x2")
>>> r = envs.simulate(g, [1] * 20, c)
>>> r.status, r.step_time_s >= envs.lower_bound(g, c)
('ok', True)
"""

from __future__ import annotations

from envs.cluster import CLUSTER_ARG_HELP, Cluster, Device, Link, resolve_cluster
from envs.result import Result
from envs.sim import SimEnv, lower_bound, simulate

cluster_arg_help = CLUSTER_ARG_HELP

__all__ = [
    "Cluster",
    "Device",
    "Link",
    "resolve_cluster",
    "cluster_arg_help",
    "simulate",
    "SimEnv",
    "lower_bound",
    "Result",
    "MeasuredEnv",  # noqa: F822 (module __getattr__ loads it on first use)
]


def __getattr__(name: str):
    # The Ray harness loads torch and ray: only on first use of envs.MeasuredEnv.
    if name == "MeasuredEnv":
        from envs.real.measured import MeasuredEnv

        return MeasuredEnv
    raise AttributeError(f"module 'envs' has no attribute {name!r}")
