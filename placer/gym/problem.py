"""One placement problem, whatever the view: the graph and its items, the cluster, the scorer, the reward.

The *items* are what an agent places: the graph's co-location groups coarsened to
at most ``groups`` (default :func:`graphs.grouping.default_num_groups`, the
paper's hierarchical setting and ``placer train``'s default), or every op
(``groups=0``). An item placement expands to a placement vector ``op_devices``
(a device per op) before it is scored.

The reward is :func:`placer.learn.algos.reward`, the rule of placer's own
REINFORCE: ``-sqrt(step_time_s / t_ref)``, where ``t_ref`` is the best
single-device step time of the graph on the cluster (memory ignored), and a
placement that fails (out of memory, an error, a timeout) counts as
``fail_factor * t_ref`` (default 10: reward ``-sqrt(10)``). A placement no
better than one device gets about -1.

>>> from graphs.synthetic import random_dag
>>> p = Problem(random_dag(6), "k80x2", groups=0)
>>> p.num_items, p.num_devices
(6, 3)
>>> outcome = p.score(np.ones(6, dtype=np.int32))
>>> outcome.status, p.reward(outcome) == float(-np.sqrt(outcome.step_time_s / p.t_ref))
('ok', True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import envs
from envs.result import Result
from graphs import OpGraph, PlacerError
from graphs.grouping import Grouping, coarsen, default_num_groups
from graphs.plan import Placement
from placer.gym import datasets
from placer.gym.scorers import make_scorer
from placer.learn.algos import reward as reinforce_reward
from placer.learn.run_scorers import reference_time

#: What an environment made with no arguments places: the paper's 2-layer NMT on 1 CPU + 4 K80s.
DEFAULT_GRAPH, DEFAULT_CLUSTER = "nmt-2", "k80x4"
#: The issue orders a placement can be scored in: the graph's own, or each placement's planned order (the simulator).
ORDERS = ("node", "planned")


@dataclass
class Outcome:
    """What scoring one placement gave.

    ``step_time_s`` is the scorer's step time: the simulator's ignores memory (``failed`` says it does not fit),
    a measured one is ``inf`` where the placement did not run. ``peak_bytes`` (device -> bytes) is None when
    the environment was made with ``peak_memory=False``.
    """

    step_time_s: float
    failed: bool
    status: str = "ok"
    message: str = ""
    peak_bytes: dict[str, int] | None = None

    @classmethod
    def of(cls, result: Result) -> "Outcome":
        step_time_s = float(result.extra.get("sim_step_time_s", result.step_time_s))
        return cls(step_time_s, not result.ok, result.status, result.message, dict(result.peak_bytes))


class Problem:
    """A graph to place on a cluster, scored by a scorer; see the module doc.

    Args:
        graph: an :class:`OpGraph`, or a name :func:`placer.gym.datasets.graph` resolves (a dataset item such as
            ``synthetic/moe-300-s0``, a zoo name, a graph file, a ``module:callable``); default nmt-2.
        cluster: an :class:`envs.Cluster`, a preset name or a cluster file; default k80x4.
        scorer: ``"sim"`` (default), ``"measured"``, ``"local"`` or a scorer object (:mod:`placer.gym.scorers`).
        groups: the most items (co-location groups coarsened); 0: one item per op; default
            ``min(256, 20 * devices)``.
        order: the issue order placements are scored in: ``"node"`` (default, as ``placer compare``) or
            ``"planned"`` (each its planned order, as ``placer train``; the simulator only).
        fail_factor: a failed placement costs this many times ``t_ref``.
        peak_memory: score each placement's peak memory per device too (the simulator's full result, about
            twice the cost of a step time alone).
        scorer_options: keyword arguments of the scorer named by ``scorer`` (e.g. ``{"executor": "dataflow"}``).
    """

    def __init__(
        self,
        graph: OpGraph | str | None = None,
        cluster: envs.Cluster | str | None = None,
        scorer: Any = "sim",
        *,
        groups: int | None = None,
        order: str = "node",
        fail_factor: float = 10.0,
        peak_memory: bool = True,
        scorer_options: dict[str, Any] | None = None,
    ) -> None:
        graph = DEFAULT_GRAPH if graph is None else graph
        cluster = DEFAULT_CLUSTER if cluster is None else cluster
        self.source = graph if isinstance(graph, str) else ""
        self.graph = datasets.graph(graph) if isinstance(graph, str) else _check_graph(graph)
        self.cluster = envs.resolve_cluster(cluster) if isinstance(cluster, str) else _check_cluster(cluster)
        if self.graph.num_ops == 0:
            raise PlacerError(f"graph {self.graph.name or self.source!r}: has no ops, so there is nothing to place")
        self.grouping = _items(self.graph, self.cluster, groups)
        self.items_graph = self.grouping.graph if self.grouping is not None else self.graph
        self.num_items, self.num_devices = self.items_graph.num_ops, self.cluster.num_devices
        if order not in ORDERS:
            raise PlacerError(f"order={order!r}: unknown (known: {', '.join(ORDERS)})")
        if not (isinstance(fail_factor, (int, float)) and math.isfinite(fail_factor) and fail_factor > 0):
            raise PlacerError(f"fail_factor={fail_factor!r}: give a positive number")
        self.order, self.fail_factor, self.peak_memory = order, float(fail_factor), bool(peak_memory)
        self.owns_scorer = isinstance(scorer, str)
        self.scorer = make_scorer(scorer, self.graph, self.cluster, source=self.source, **(scorer_options or {}))
        if order == "planned" and not callable(getattr(self.scorer, "schedule_order", None)):
            raise PlacerError(f"order='planned': the scorer {type(self.scorer).__name__} plans no issue order")
        executor = getattr(self.scorer, "executor", "eager")
        # the reward scale, as placer train computes it (through the scorer, in the scored order)
        self.t_ref = reference_time(self.step_times, self.graph, self.cluster, executor)

    # ------------------------------------------------------------------ items
    def expand(self, item_devices: np.ndarray) -> np.ndarray:
        """The placement vector (a device per op, int32) of a device per item."""
        item_devices = np.asarray(item_devices)
        op_devices = self.grouping.expand(item_devices) if self.grouping is not None else item_devices
        return np.asarray(op_devices, dtype=np.int32)

    def contract(self, op_devices: np.ndarray) -> np.ndarray:
        """A device per item of a placement vector, by majority vote inside each item (int64)."""
        if self.grouping is None:
            return np.asarray(op_devices, dtype=np.int64)
        return self.grouping.vote(op_devices, self.num_devices)

    # ------------------------------------------------------------------ scoring
    def step_times(self, op_devices: np.ndarray, order: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(step_time_s, failed)`` of a ``[K, num_ops]`` batch, through the scorer, in ``order`` (None: this
        problem's order)."""
        if order is None and self.order == "planned":
            order = "planned"
        return self.scorer.step_times(op_devices, order=order)

    def score(self, op_devices: np.ndarray) -> Outcome:
        """Score one placement vector: its step time, whether it failed and (``peak_memory``) its peak memory."""
        op_devices = np.asarray(op_devices, dtype=np.int32)
        if self.peak_memory and callable(getattr(self.scorer, "simulate", None)):  # the simulator's full result
            return Outcome.of(self.scorer.simulate(op_devices, order=self.issue_order(op_devices)))
        if self.peak_memory:
            return Outcome.of(self.scorer.evaluate([op_devices])[0])
        step_time_s, failed = self.step_times(op_devices[None])
        ok = not bool(failed[0])
        return Outcome(float(step_time_s[0]), not ok, "ok" if ok else "failed")

    def reward(self, outcome: Outcome) -> float:
        """placer's REINFORCE reward of an outcome (:func:`placer.learn.algos.reward`)."""
        rewards = reinforce_reward(
            np.array([outcome.step_time_s]), np.array([outcome.failed]), self.t_ref, self.fail_factor
        )
        return float(rewards[0])

    def issue_order(self, op_devices: np.ndarray) -> np.ndarray | None:
        """The issue order a placement is scored in: None (node order), or its planned order."""
        return self.scorer.schedule_order(op_devices) if self.order == "planned" else None

    def placement(self, op_devices: np.ndarray, method: str = "gym") -> Placement:
        """A :class:`graphs.Placement` of a placement vector, in the order it is scored in (to save or apply)."""
        names = self.cluster.device_names
        return Placement(
            assignment={op: names[d] for op, d in zip(self.graph.names, np.asarray(op_devices).tolist())},
            graph_hash=self.graph.content_hash,
            devices=list(names),
            cluster=self.cluster.name,
            method=method,
            order=self.issue_order(np.asarray(op_devices, dtype=np.int32)),
        )

    def close(self) -> None:
        """Release the scorer's workers when this problem made the scorer."""
        if self.owns_scorer and callable(getattr(self.scorer, "close", None)):
            self.scorer.close()


def _check_graph(graph: Any) -> OpGraph:
    if not isinstance(graph, OpGraph):
        raise PlacerError(f"graph: a {type(graph).__name__} is not a graph (give an OpGraph or a name)")
    return graph


def _check_cluster(cluster: Any) -> envs.Cluster:
    if not isinstance(cluster, envs.Cluster):
        raise PlacerError(f"cluster: a {type(cluster).__name__} is not a cluster (give an envs.Cluster or a name)")
    return cluster


def _items(graph: OpGraph, cluster: envs.Cluster, groups: int | None) -> Grouping | None:
    """The grouping whose groups are the items, None for one item per op."""
    if groups is None:
        groups = default_num_groups(cluster.num_devices)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 0:
        raise PlacerError(f"groups={groups!r}: give a whole number >= 0 (0: one item per op)")
    if groups == 0 or graph.num_ops <= 1:
        return None
    return coarsen(graph, int(groups))
