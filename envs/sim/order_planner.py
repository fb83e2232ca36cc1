"""The order planner: the issue order a placement runs with, picked on the simulator.

Under the eager executor the host issues ops in the plan's issue order (a
topological order of the graph), and the order changes the step: a host op
issued early blocks the host while the GPUs starve. :class:`OrderPlanner` tries
a few candidate orders of a placement and keeps the fastest under the eager
model (what :func:`placer.apply` runs), unless its gain is within the margin
orders measured for real have missed by (:mod:`envs.sim.order_trust`).
:class:`InOrder` is a simulator that scores every placement in its planned order
(what a search in a planned run searches with).

>>> import envs
>>> from graphs.synthetic import random_dag
>>> env = envs.SimEnv(random_dag(20, seed=1), envs.Cluster.preset("k80x2"))
>>> order, name, step_time_s = OrderPlanner(env).plan([1] * 20)
>>> name in OrderPlanner(env).candidates([1] * 20), sorted(order.tolist()) == list(range(20))
(True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from envs.sim.order_trust import kept
from graphs.dag import priority_order
from graphs.errors import PlacerError

if TYPE_CHECKING:
    from envs.sim.simulator import SimEnv


class OrderPlanner:
    """Picks the issue order of a placement on ``env`` (a :class:`~envs.sim.simulator.SimEnv`).

    The orders are those of ``env``'s graph; a placement with its own ``microbatches`` is planned on ``env``'s twin
    for them (:meth:`~envs.sim.simulator.SimEnv.for_placement`).
    """

    def __init__(self, env: "SimEnv") -> None:
        self.env = env

    def candidates(self, placement: Any) -> dict[str, np.ndarray]:
        """Issue orders worth trying for ``placement`` (each a topological order of the graph).

        * ``node``: the graph's own order (what an unordered placement runs);
        * ``devices-first``: Kahn's algorithm issuing every ready op placed on a
          device before any ready host (``cpu``) op, in node order otherwise: the
          host launches the asynchronous work before it blocks on its own;
        * ``schedule``: the forward start times of the dataflow schedule (the
          paper's executor, which overlaps all that the graph allows), host ops
          after device ops on ties, then node order.
        """
        env = self.env
        op_devices = env.indices(placement)
        host = env.cluster.host[op_devices]
        out = {"node": np.arange(env.num_ops, dtype=np.int64)}
        out["devices-first"] = priority_order(env.graph, host)  # ready host ops last
        out["schedule"] = self.schedule_order(op_devices)
        return out

    def schedule_order(self, placement: Any) -> np.ndarray:
        """The ``schedule`` issue order of :meth:`candidates` (forward starts of the dataflow schedule).

        On the zoo graphs it is the candidate :meth:`plan` picks for heuristic
        and sampled placements alike (nmt-2, k80x4: 16 of 16, 15% faster than node
        order on average), and the cheapest to compute (one dataflow schedule):
        what ``step_times(..., order="planned")`` scores samples with.
        """
        return self.schedule_orders(self.env.indices(placement)[None])[0]

    def schedule_orders(self, op_devices: np.ndarray) -> np.ndarray:
        """:meth:`schedule_order` of each row of a ``[K, num_ops]`` batch of device indices (checked), ``[K, num_ops]``:
        one sort for the batch (a search scores every placement of a round in planned order)."""
        env = self.env
        n = env.num_ops
        dataflow = env.with_executor("dataflow")
        start = np.empty(op_devices.shape)
        for k, row in enumerate(op_devices):  # with microbatches: the first's; not a placement scored
            start[k] = dataflow.forward_starts(row)[:n]
        host = env.cluster.host[op_devices]
        return np.lexsort((np.broadcast_to(np.arange(n), op_devices.shape), host, start), axis=-1).astype(np.int64)

    def plan(self, placement: Any) -> tuple[np.ndarray, str, float]:
        """``(order, name, step_time_s)``: the fastest of :meth:`candidates` under the eager model, and its step time.

        The eager executor is what :func:`placer.apply` runs, so the order is
        judged there whatever the env's executor; ties keep the node order, and
        so does a gain of at most the env's ``order_margin`` (node order's step
        times ``1 - order_margin``: where orders measured for real were slower
        than the simulator said, :mod:`envs.sim.order_trust`). Memory is ignored
        here (the order barely moves the peak).
        """
        env = self.env.for_placement(placement)
        if env is not self.env:
            return OrderPlanner(env).plan(placement)
        candidates = self.candidates(placement)
        op_devices = env.indices(placement)
        names = list(candidates)
        step_time_s, _ = env.with_executor("eager").step_times(
            np.repeat(op_devices[None, :], len(names), axis=0), np.stack([candidates[k] for k in names])
        )
        best = int(np.argmin(step_time_s))  # first minimum: "node" on ties
        if best and not (step_time_s[0] > 0 and kept(step_time_s[best] / step_time_s[0], env.order_margin)):
            best = 0
        return candidates[names[best]], names[best], float(step_time_s[best])


class InOrder:
    """A :class:`~envs.sim.simulator.SimEnv` whose ``step_times`` scores in one issue order where the caller gives none.

    Everything else is the env's own; :meth:`with_microbatches` keeps the order. Made by
    :meth:`envs.sim.simulator.SimEnv.in_order`.
    """

    def __init__(self, env: "SimEnv", order: str) -> None:
        if order != "planned":
            raise PlacerError(f"in_order: order {order!r}: give 'planned' or None")
        self.env, self.order = env, order

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        return self.env.step_times(op_devices, self.order if order is None else order)

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.env.overflow(op_devices, self.order if order is None else order)

    def with_microbatches(self, microbatches: int, inflight: int | None = None) -> "InOrder":
        return InOrder(self.env.with_microbatches(microbatches, inflight), self.order)
