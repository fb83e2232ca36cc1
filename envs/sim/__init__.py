"""The simulator: one training step of a placed graph, scheduled on a cluster's model.

:mod:`~envs.sim.schedule` is the specification (the ``eager`` and ``dataflow``
executor models in plain Python), :mod:`~envs.sim.kernel` the same schedulers
compiled with numba, :mod:`~envs.sim.memory` the memory sweep,
:mod:`~envs.sim.simulator` the scorer (:class:`SimEnv`, :func:`simulate`),
:mod:`~envs.sim.bound` the lower bound and :mod:`~envs.sim.trace` the
Chrome/Perfetto trace of a schedule. Costs come from :mod:`envs.sim.cost`.
"""

from __future__ import annotations

from envs.sim.bound import LowerBound, lower_bound
from envs.sim.sim_graph import schedule_graph
from envs.sim.simulator import SimEnv, plan_order, simulate

__all__ = ["SimEnv", "simulate", "plan_order", "schedule_graph", "lower_bound", "LowerBound"]
