"""The item problem of ``ilp``: ops summed into items (groups placed as one), the items to use, their order back to ops.

:class:`Items` is what the CP-SAT model (:mod:`placer.methods.heuristics.ilp_model`) is built over;
:func:`build_items` sums the cost model's op times, memory and edges into it; :func:`choose_items` picks
the items for a whole-graph solve; the large-neighbourhood search
(:mod:`placer.methods.heuristics.ilp_lns`) builds its windows' items itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.sim import cost
from graphs import OpGraph
from graphs.grouping import coarsen
from placer.methods.heuristics.groups import colocation_groups

#: Conditional constraints per second of ``time_limit_s`` the item count is sized for.
CONSTRAINTS_PER_S = 300


@dataclass
class Items:
    """The placement problem over items (ops or groups of ops)."""

    op_item: np.ndarray  # item per op
    fwd: np.ndarray  # [K, D] seconds
    bwd: np.ndarray  # [K, D]
    launch: np.ndarray  # [K, D] host dispatch seconds of the item on each GPU (0 on the host)
    mem: np.ndarray  # [K] static + activation bytes
    params: np.ndarray  # [K] parameter bytes
    edges: list[tuple[int, int, int]]  # (producer item, consumer item, bytes), consumers ascending, in_csr order
    fixed: np.ndarray | None = None  # [K] a device an item must take, or -1 (large-neighbourhood search: the context)
    rank: np.ndarray | None = None  # [K] a fixed issue position of every item (None: the solver chooses the order)

    @property
    def num_items(self) -> int:
        return len(self.fwd)


def build_items(graph: OpGraph, cluster, op_item: np.ndarray) -> Items:
    """Sum op costs into items; ``op_item`` must number items in a topological order of their graph."""
    fwd_s, bwd_s = cost.op_times(graph, cluster)
    K = int(op_item.max()) + 1 if graph.num_ops else 0
    D = cluster.num_devices
    host = cluster.host
    launch_op = np.where(host[None, :], 0.0, np.where(fwd_s > 0, np.asarray(cluster.launch_overhead_s)[None, :], 0.0))
    fwd, bwd, launch = (np.zeros((K, D)) for _ in range(3))
    np.add.at(fwd, op_item, fwd_s)
    np.add.at(bwd, op_item, bwd_s)
    np.add.at(launch, op_item, launch_op)
    mem = np.bincount(
        op_item, weights=(cost.static_bytes(graph) + cost.activation_bytes(graph)).astype(np.float64), minlength=K
    )
    params = np.bincount(op_item, weights=graph.param_bytes.astype(np.float64), minlength=K)
    in_ptr, in_src, in_eid = graph.in_csr
    per_consumer: list[dict[int, dict[int, int]]] = [dict() for _ in range(K)]  # v -> u_item -> {u_op: bytes}
    for v in range(graph.num_ops):
        iv = int(op_item[v])
        for k in range(int(in_ptr[v]), int(in_ptr[v + 1])):
            u = int(in_src[k])
            iu = int(op_item[u])
            if iu == iv:
                continue
            by_op = per_consumer[iv].setdefault(iu, {})
            by_op[u] = max(by_op.get(u, 0), int(graph.edge_bytes[in_eid[k]]))
    edges = [(iu, iv, sum(by_op.values())) for iv in range(K) for iu, by_op in per_consumer[iv].items()]
    return Items(op_item.astype(np.int64), fwd, bwd, launch, mem, params, edges)


def choose_items(graph: OpGraph, cluster, time_limit_s: float, max_items: int | None) -> np.ndarray:
    """Item per op: single ops (co-located ones joined) when they fit the budget, else coarsened groups."""
    D = cluster.num_devices
    budget = CONSTRAINTS_PER_S * max(float(time_limit_s), 1.0)
    units = colocation_groups(graph)
    num_units = int(units.max()) + 1 if len(units) else 0
    cap = num_units if max_items is None else min(num_units, int(max_items))
    k = max(cap, 1)
    while True:
        if k >= num_units and _topological_units(graph, units):
            op_item = units
        else:
            op_item = coarsen(graph, max_groups=k).op_group.astype(np.int64)
        K = int(op_item.max()) + 1 if len(op_item) else 0
        a, b = op_item[graph.edge_src], op_item[graph.edge_dst]
        E = len(np.unique(a[a != b] * K + b[a != b]))
        if 3 * (K + E) ** 2 * D <= budget or k <= 2:
            return op_item
        k = max(2, min(int(k * 0.8), K - 1))


def _topological_units(graph: OpGraph, units: np.ndarray) -> bool:
    """True if co-location units, numbered by first op, have every cross edge going forward."""
    s, d = units[graph.edge_src], units[graph.edge_dst]
    return bool(np.all(s <= d))


def item_order_to_ops(op_item: np.ndarray, item_order: np.ndarray) -> np.ndarray:
    """Op issue order: items in ``item_order``, each item's ops in node order."""
    rank = np.empty(len(item_order), dtype=np.int64)
    rank[np.asarray(item_order, dtype=np.int64)] = np.arange(len(item_order))
    return np.lexsort((np.arange(len(op_item)), rank[op_item])).astype(np.int64)
