"""Where placements are scored: clusters, the cost model, the simulator, measurement.

``import envs`` loads numpy only; the compiled simulator kernel (numba) loads on
the first batch, torch and ray only inside the measurement harness.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> g = random_dag(20, seed=1)
>>> c = envs.resolve_cluster("k80x2")
>>> r = envs.simulate(g, [1] * 20, c)
>>> r.status, r.step_time_s >= envs.lower_bound(g, c)
('ok', True)
"""

from __future__ import annotations

from envs.bound import lower_bound
from envs import profiler as _profiler  # noqa: F401  (defines Cluster.with_profile)
from envs.cluster import CLUSTER_ARG_HELP, Cluster, Device, Link
from envs.presets import resolve_cluster  # also defines Cluster.preset / Cluster.presets
from envs.result import Result
from envs.simulator import SimEnv, simulate

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
    "MeasuredEnv",
]


def __getattr__(name: str):
    # The Ray harness loads torch and ray: only on first use of envs.MeasuredEnv.
    if name == "MeasuredEnv":
        from envs.measured import MeasuredEnv

        return MeasuredEnv
    raise AttributeError(f"module 'envs' has no attribute {name!r}")
