"""Contracting an op graph by a grouping: the group DAG, the partitioners' quotient, and cut bytes.

Helpers of :mod:`graphs.grouping`; every step is a numpy sort or scatter, so a
100,000-op graph is grouped in well under a second. Two contractions, for two
readers:

* :func:`build_group_graph`: the group DAG a policy or a scheduler places, whose
  edge ``A -> B`` carries each distinct tensor of ``A`` that ``B`` reads once
  (what placing ``A`` and ``B`` apart transfers);
* :func:`quotient`: the undirected weighted graph the partitioners (METIS, Scotch,
  Kernighan-Lin) cut, whose edge between two groups sums every op edge between them.

Both reduce rows by key with :func:`_reduce_by_key`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from graphs.errors import PlacerError
from graphs.ir import OpGraph


class CutTable(NamedTuple):
    """Tensor transfers that a placement may cut, one row per (producer, consumer unit).

    ``tensor``: id of the tensor (its producing op); ``src``/``dst``: the units
    (ops or groups) that produce and consume it; ``nbytes``: its size.
    """

    tensor: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray


def cut_bytes_batched(table: CutTable, unit_devices: np.ndarray) -> np.ndarray:
    """Sum over (tensor, device) pairs, device != producer's, of the tensor's bytes.

    ``unit_devices`` is ``[..., U]`` device indices of the table's units; the result
    has shape ``assign.shape[:-1]`` (a 0-d array for one placement).
    Where a tensor's rows to one device differ in size, the largest counts.
    """
    a = np.asarray(unit_devices)
    batch_shape = a.shape[:-1]
    k_rows = int(np.prod(batch_shape, dtype=np.int64))
    a = a.reshape(k_rows, a.shape[-1]).astype(np.int64)
    out = np.zeros(k_rows, dtype=np.int64)
    if len(table.tensor) == 0 or k_rows == 0:
        return out.reshape(batch_shape)
    if a.min() < 0:
        raise PlacerError("cut_bytes: device indices must be >= 0")
    src_dev, dst_dev = a[:, table.src], a[:, table.dst]
    row, e = np.nonzero(src_dev != dst_dev)
    if len(row):
        num_dev = int(a.max()) + 1
        num_tensors = int(table.tensor.max()) + 1
        key = (row * num_tensors + table.tensor[e]) * num_dev + dst_dev[row, e]
        order = np.argsort(key, kind="stable")
        key, nbytes = key[order], table.nbytes[e[order]]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        np.add.at(out, key[starts] // (num_tensors * num_dev), np.maximum.reduceat(nbytes, starts))
    return out.reshape(batch_shape)


def _reduce_by_key(key: np.ndarray, values: np.ndarray, ufunc: np.ufunc) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(distinct keys ascending, ufunc of the values of each key, the stable sort order of key)``.

    >>> k, v, _ = _reduce_by_key(np.array([3, 1, 3]), np.array([5, 2, 7]), np.add)
    >>> k.tolist(), v.tolist()
    ([1, 3], [2, 12])
    """
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    reduced = ufunc.reduceat(values[order], starts) if len(starts) else np.zeros(0, dtype=np.asarray(values).dtype)
    return key[starts], reduced, order


def cut_bytes(graph: OpGraph, op_devices: Any) -> np.ndarray:
    """Cut bytes of an op placement (``[num_ops]`` -> scalar, ``[K, num_ops]`` -> ``[K]``), int64.

    Each op's tensor counts once for every device other than its own that runs
    one of its consumers.

    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("a", "c", 8)])
    >>> int(cut_bytes(g, [0, 1, 1])), int(cut_bytes(g, [0, 1, 2])), cut_bytes(g, [[0, 0, 0], [1, 0, 0]]).tolist()
    (8, 16, [0, 8])
    """
    a = np.asarray(op_devices)
    if a.ndim == 0 or a.shape[-1] != graph.num_ops:
        raise PlacerError(f"cut_bytes: expected {graph.num_ops} op devices in the last axis, got shape {a.shape}")
    table = CutTable(
        graph.edge_src.astype(np.int64),
        graph.edge_src.astype(np.int64),
        graph.edge_dst.astype(np.int64),
        graph.edge_bytes,
    )
    return cut_bytes_batched(table, a)


def build_group_graph(
    graph: OpGraph, op_group: np.ndarray, num_groups: int, *, meta: dict[str, Any]
) -> tuple[OpGraph, CutTable]:
    """The group DAG (see :class:`graphs.grouping.Grouping`) and its cut table.

    ``op_group`` must number groups topologically (every edge from a lower or
    equal group id to a higher or equal one).
    """
    n, G = graph.num_ops, num_groups
    src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
    gs, gd = op_group[src], op_group[dst]
    cross = np.flatnonzero(gs != gd)
    # Distinct (producer op, consumer group) pairs, each with its largest edge.
    key, t_bytes, _ = _reduce_by_key(src[cross] * max(G, 1) + gd[cross], graph.edge_bytes[cross], np.maximum)
    t_bytes = t_bytes.astype(np.int64, copy=False)
    t_op, t_dst = key // max(G, 1), key % max(G, 1)
    t_src = op_group[t_op]
    # Group edges: bytes summed over those distinct tensors.
    gkey, e_bytes, _ = _reduce_by_key(t_src * max(G, 1) + t_dst, t_bytes, np.add)
    e_bytes = e_bytes.astype(np.int64, copy=False)
    e_src, e_dst = gkey // max(G, 1), gkey % max(G, 1)

    # Tensors leaving each group: largest cross edge per producer, plus graph outputs.
    leaving = np.zeros(n, dtype=np.int64)
    np.maximum.at(leaving, t_op, t_bytes)
    sink = np.ones(n, dtype=bool)
    sink[src] = False
    leaving[sink] = graph.out_bytes[sink]
    leaves = (leaving > 0) | sink

    members = np.argsort(op_group, kind="stable")
    bounds = np.searchsorted(op_group[members], np.arange(G + 1))
    groups = [members[bounds[g] : bounds[g + 1]].tolist() for g in range(G)]
    shapes = [list(chain.from_iterable(graph.out_shapes[i] for i in m if leaves[i])) for m in groups]
    dtypes = [list(chain.from_iterable(graph.out_dtypes[i] for i in m if leaves[i])) for m in groups]
    profile = {
        kind: {col: np.bincount(op_group, weights=arr, minlength=G) for col, arr in cols.items()}
        for kind, cols in graph.profile.items()
    }
    meta = dict(meta)
    meta.update(
        source_hash=graph.content_hash,
        source_name=graph.name,
        member_ops=np.diff(bounds).tolist(),
        member_out_bytes=_sum_int(op_group, graph.out_bytes, G).tolist(),
    )
    group_graph = OpGraph(
        names=[f"g{g}" for g in range(G)],
        op_types=_dominant_types(graph, op_group, G),
        out_shapes=shapes,
        out_dtypes=dtypes,
        out_bytes=_sum_int(op_group, leaving, G),
        param_bytes=_sum_int(op_group, graph.param_bytes, G),
        buffer_bytes=_sum_int(op_group, graph.buffer_bytes, G),
        flops=np.bincount(op_group, weights=graph.flops, minlength=G),
        module_paths=[_common_path({graph.module_paths[i] for i in m}) for m in groups],
        params=[list(dict.fromkeys(chain.from_iterable(graph.params[i] for i in m))) for m in groups],
        edge_src=e_src,
        edge_dst=e_dst,
        edge_bytes=e_bytes,
        profile=profile,
        name=f"{graph.name or 'graph'}/groups",
        meta=meta,
    )
    return group_graph, CutTable(np.unique(t_op, return_inverse=True)[1].reshape(-1), t_src, t_dst, t_bytes)


@dataclass
class Quotient:
    """A graph contracted by a grouping, undirected and weighted, as CSR (the partitioners' input)."""

    num_nodes: int
    xadj: np.ndarray
    adjncy: np.ndarray
    eweights: np.ndarray
    vweights: np.ndarray


def quotient(graph: OpGraph, op_group: np.ndarray, op_weight: np.ndarray) -> Quotient:
    """Undirected group graph: vertex weight = summed op weight, edge weight = summed bytes of every op edge between.

    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("a", "c", 8), ("b", "c", 4)])
    >>> q = quotient(g, np.array([0, 1, 1]), np.ones(3))
    >>> q.num_nodes, q.xadj.tolist(), q.adjncy.tolist(), q.eweights.tolist(), q.vweights.tolist()
    (2, [0, 1, 2], [1, 0], [16.0, 16.0], [1.0, 2.0])
    """
    ng = int(op_group.max()) + 1 if len(op_group) else 0
    vw = np.bincount(op_group, weights=op_weight, minlength=ng)
    a, b = op_group[graph.edge_src], op_group[graph.edge_dst]
    keep = a != b
    a, b, w = a[keep], b[keep], graph.edge_bytes[keep].astype(np.float64)
    uniq, wsum, _ = _reduce_by_key(np.minimum(a, b) * ng + np.maximum(a, b), w, np.add)
    u, v = uniq // ng, uniq % ng
    src = np.concatenate([u, v])
    dst = np.concatenate([v, u])
    ew = np.concatenate([wsum, wsum])
    order = np.lexsort((dst, src))
    src, dst, ew = src[order], dst[order], ew[order]
    xadj = np.zeros(ng + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=ng), out=xadj[1:])
    return Quotient(ng, xadj, dst.astype(np.int64), ew, vw)


def _sum_int(op_group: np.ndarray, values: np.ndarray, G: int) -> np.ndarray:
    """Exact int64 per-group sums (bincount would go through float64)."""
    out = np.zeros(G, dtype=np.int64)
    np.add.at(out, op_group, values)
    return out


def _dominant_types(graph: OpGraph, op_group: np.ndarray, G: int) -> list[str]:
    """Per group, the op type with the most FLOPs among members (ties: most members, then first seen)."""
    ids = {t: i for i, t in enumerate(dict.fromkeys(graph.op_types))}
    tid = np.array(list(map(ids.__getitem__, graph.op_types)), dtype=np.int64)
    names = list(ids)
    key = op_group * max(len(ids), 1) + tid
    uniq, inv = np.unique(key, return_inverse=True)
    flops = np.bincount(inv.reshape(-1), weights=graph.flops)
    count = np.bincount(inv.reshape(-1))
    grp = uniq // max(len(ids), 1)
    order = np.lexsort((uniq % max(len(ids), 1), -count, -flops, grp))
    first = order[np.r_[True, grp[order][1:] != grp[order][:-1]]] if len(order) else order
    return [names[int(t)] for t in (uniq[first] % max(len(ids), 1))]


def _common_path(paths: set[str]) -> str:
    """Longest common dotted prefix: {"enc.l0.fc", "enc.l1"} -> "enc"."""
    if len(paths) == 1:
        return next(iter(paths))
    return ".".join(os.path.commonprefix([p.split(".") if p else [] for p in paths]))
