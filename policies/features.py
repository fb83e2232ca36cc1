"""Per-op (or per-group) input features for the placement policies.

Follows Mirhoseini et al. (2017): an op-type id for a learned embedding, the
output shapes (up to 5 outputs x 5 dims, padded with -1), and the adjacency as
topological indices of up to 20 neighbours. We add log-scaled FLOPs, output,
parameter and edge bytes, which the paper's simulator-free setting did not need
but which make a small network learn the cost structure much faster.

>>> from graphs.synthetic import random_dag
>>> f = featurize(random_dag(30, seed=0))
>>> f.type_ids.shape, f.dense.shape[0]
((30,), 30)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs import OpGraph

MAX_OUTPUTS = 5
MAX_DIMS = 5
MAX_NEIGHBOURS = 20  # 10 predecessors + 10 successors
SHAPE_WIDTH = MAX_OUTPUTS * MAX_DIMS


@dataclass
class OpFeatures:
    """Feature columns of the items to place, in topological order.

    Attributes:
        type_ids: op-type vocabulary id per item (int64), for an embedding.
        vocab: the vocabulary (op type names), ``vocab[type_ids[i]]``.
        dense: float32 ``[num_items, dense_dim]``: shapes (log-scaled, -1 = padding),
            neighbour offsets, and standardised log FLOPs/bytes columns.
    """

    type_ids: np.ndarray
    vocab: list[str]
    dense: np.ndarray

    @property
    def num_items(self) -> int:
        return len(self.type_ids)

    @property
    def dense_dim(self) -> int:
        return self.dense.shape[1]


def shape_features(graph: OpGraph) -> np.ndarray:
    """Output shapes, ``[num_ops, 25]``: ``log2(1 + dim)`` per dim, -1 where absent."""
    out = np.full((graph.num_ops, SHAPE_WIDTH), -1.0, dtype=np.float32)
    for i, shapes in enumerate(graph.out_shapes):
        for j, shape in enumerate(shapes[:MAX_OUTPUTS]):
            dims = [float(d) for d in list(shape)[:MAX_DIMS]]
            if dims:
                out[i, j * MAX_DIMS : j * MAX_DIMS + len(dims)] = np.log2(1.0 + np.maximum(dims, 0.0))
    return out


def adjacency_features(graph: OpGraph, max_neighbours: int = MAX_NEIGHBOURS) -> np.ndarray:
    """Neighbour positions, ``[num_ops, max_neighbours]``.

    The first half lists predecessors, the second successors (the paper's "±" for
    in/out), each as the neighbour's topological index relative to the op, scaled
    to ``sign * log2(1 + |offset|)`` so nearby and far neighbours are distinguishable;
    0 where there is no neighbour.
    """
    n = graph.num_ops
    half = max_neighbours // 2
    out = np.zeros((n, 2 * half), dtype=np.float32)
    for col0, (indptr, nbr, _) in ((0, graph.in_csr), (half, graph.out_csr)):
        counts = np.diff(indptr)
        for i in np.flatnonzero(counts):
            ns = nbr[indptr[i] : indptr[i] + half].astype(np.float64)
            off = ns - i
            out[i, col0 : col0 + len(ns)] = np.sign(off) * np.log2(1.0 + np.abs(off))
    return out


def _standardise(cols: np.ndarray) -> np.ndarray:
    mean = cols.mean(axis=0, keepdims=True)
    std = cols.std(axis=0, keepdims=True)
    return ((cols - mean) / np.where(std > 1e-9, std, 1.0)).astype(np.float32)


def cost_features(graph: OpGraph) -> np.ndarray:
    """Standardised log columns: FLOPs, out/param/buffer bytes, in/out edge bytes, degrees, position."""
    n = graph.num_ops
    in_bytes = np.zeros(n)
    out_edge_bytes = np.zeros(n)
    if graph.num_edges:
        np.add.at(in_bytes, graph.edge_dst, graph.edge_bytes)
        np.add.at(out_edge_bytes, graph.edge_src, graph.edge_bytes)
    cols = np.stack(
        [
            np.log1p(graph.flops),
            np.log1p(graph.out_bytes.astype(np.float64)),
            np.log1p(graph.param_bytes.astype(np.float64)),
            np.log1p(graph.buffer_bytes.astype(np.float64)),
            np.log1p(in_bytes),
            np.log1p(out_edge_bytes),
            np.log1p(np.diff(graph.in_csr[0]).astype(np.float64)),
            np.log1p(np.diff(graph.out_csr[0]).astype(np.float64)),
            np.arange(n) / max(n - 1, 1),
        ],
        axis=1,
    )
    return _standardise(cols) if n else cols.astype(np.float32)


def featurize(graph: OpGraph) -> OpFeatures:
    """All features of ``graph``'s ops (or of a group-level graph's groups)."""
    vocab = sorted(set(graph.op_types))
    lookup = {t: k for k, t in enumerate(vocab)}
    type_ids = np.asarray([lookup[t] for t in graph.op_types], dtype=np.int64)
    dense = np.concatenate([shape_features(graph), adjacency_features(graph), cost_features(graph)], axis=1)
    return OpFeatures(type_ids=type_ids, vocab=vocab, dense=dense.astype(np.float32))


def group_features(
    graph: OpGraph, op_group: np.ndarray, num_groups: int, type_ids: np.ndarray, vocab_size: int
) -> np.ndarray:
    """HDP group embedding: op-type counts, summed output sizes, group adjacency.

    Returns float32 ``[num_groups, vocab_size + 3 + num_groups]``: per group the
    fraction of its ops of each type, log summed output bytes / FLOPs / op count,
    and a row of the (log-scaled, row-normalised) bytes sent to every other group.
    ``op_group`` may also be a batch of groupings ``[K, num_ops]``; the result is
    then ``[K, num_groups, ...]``, row ``k`` being that of grouping ``k`` alone.
    """
    g = np.asarray(op_group, dtype=np.int64)
    if g.ndim == 1:
        return group_features(graph, g[None], num_groups, type_ids, vocab_size)[0]
    k, n = g.shape
    gc = num_groups
    # every (grouping, group) pair is one bin: flat index k * G + group
    flat = g + (np.arange(k, dtype=np.int64) * gc)[:, None]  # [K, N]
    types = np.broadcast_to(np.asarray(type_ids, dtype=np.int64), (k, n))
    counts = np.bincount((flat * vocab_size + types).ravel(), minlength=k * gc * vocab_size).reshape(k, gc, vocab_size)
    counts = counts.astype(np.float64)
    size = counts.sum(axis=2, keepdims=True)
    out_bytes = np.bincount(flat.ravel(), weights=np.tile(graph.out_bytes.astype(np.float64), k), minlength=k * gc)
    flops = np.bincount(flat.ravel(), weights=np.tile(np.asarray(graph.flops, dtype=np.float64), k), minlength=k * gc)
    adj = np.zeros((k, gc, gc))
    if graph.num_edges:
        src, dst = flat[:, graph.edge_src], g[:, graph.edge_dst]  # [K, E]
        w = np.tile(graph.edge_bytes.astype(np.float64), k)
        adj = np.bincount((src * gc + dst).ravel(), weights=w, minlength=k * gc * gc).reshape(k, gc, gc)
        adj[:, np.arange(gc), np.arange(gc)] = 0.0
    adj = np.log1p(adj)
    adj = adj / np.maximum(adj.max(axis=2, keepdims=True), 1e-9)
    scalars = np.stack([np.log1p(out_bytes), np.log1p(flops), np.log1p(size.ravel())], axis=1).reshape(k, gc, 3)
    scalars = scalars / np.maximum(scalars.max(axis=1, keepdims=True), 1e-9)
    return np.concatenate([counts / np.maximum(size, 1.0), scalars, adj], axis=2).astype(np.float32)
