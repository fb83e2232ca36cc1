"""Recursive min-cut bisection with Kernighan–Lin (networkx).

The op graph, made undirected and contracted by co-location groups (edge weight =
tensor bytes), is bisected with :func:`networkx.algorithms.community.kernighan_lin_bisection`
and each half again, until there is one part per GPU. Kernighan–Lin swaps pairs
of vertices, so it balances vertex counts, not weights: each bisection starts
from the topological prefix holding its GPUs' share of the groups, and KL then
lowers the cut without changing how many groups each side holds. (Starting from
a compute-balanced prefix instead was slower on every zoo graph but gpt2: one
group, such as a large softmax, can hold half the compute.) Not memory-aware.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
from networkx.algorithms.community import kernighan_lin_bisection

from graphs import OpGraph
from graphs.group_graph import quotient
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.registry import register


def _bisect(G, nodes: np.ndarray, parts: np.ndarray, out: np.ndarray, seed: int, max_iter: int) -> None:
    if len(parts) == 1 or len(nodes) <= 1:
        out[nodes] = parts[0]
        return
    k1 = len(parts) // 2
    cut = min(max(int(round(len(nodes) * k1 / len(parts))), 1), len(nodes) - 1)
    a, b = nodes[:cut], nodes[cut:]
    sub = G.subgraph(nodes.tolist())
    if sub.number_of_edges():
        sa, sb = kernighan_lin_bisection(
            sub, partition=(set(a.tolist()), set(b.tolist())), max_iter=max_iter, weight="weight", seed=seed
        )
        a, b = np.sort(np.fromiter(sa, dtype=np.int64)), np.sort(np.fromiter(sb, dtype=np.int64))
    _bisect(G, a, parts[:k1], out, seed, max_iter)
    _bisect(G, b, parts[k1:], out, seed, max_iter)


@register("kernighan_lin")
def kernighan_lin(graph: OpGraph, cluster, *, seed: int = 0, max_iter: int = 10) -> np.ndarray:
    """Recursive Kernighan–Lin bisection into one part per GPU."""
    gpus = gpu_devices(cluster)
    groups = colocation_groups(graph)
    q = quotient(graph, groups, np.ones(graph.num_ops))  # KL weighs edges only
    G = nx.Graph()
    G.add_nodes_from(range(q.num_nodes))
    src = np.repeat(np.arange(q.num_nodes), np.diff(q.xadj))
    keep = src < q.adjncy
    G.add_weighted_edges_from(zip(src[keep].tolist(), q.adjncy[keep].tolist(), q.eweights[keep].tolist()))
    out = np.zeros(q.num_nodes, dtype=np.int64)
    _bisect(G, np.arange(q.num_nodes), np.arange(len(gpus)), out, seed, max_iter)
    return gpus[out[groups]].astype(np.int32)
