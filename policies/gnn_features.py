"""What the graph-network policy (:mod:`policies.gnn`) reads: node, edge, device and pair features of a graph on a
cluster.

Every feature is size-independent and does not depend on the order of the ops
(the module docstring of :mod:`policies.gnn` describes each); :func:`feature_spec`
is the layout a pretrained policy file records and is checked against on load.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from envs.sim.cost import activation_bytes, op_times, static_bytes
from graphs import OpGraph
from graphs.dag import levels
from graphs.ops import base_op_name
from policies.features import cost_features, shape_features

#: Version of the feature definitions of this module; a pretrained policy records it (its sidecar's "features").
FEATURE_VERSION = "gnn-features/2"  # 2: parameters read by several ops are edges (envs.sim.sim_graph.schedule_graph)
TYPE_BUCKETS = 64
TYPE_DIM = 16
NODE_DIM = 25 + 8 + 9  # shapes, standardised cost columns (policies.features), cluster-relative columns
EDGE_DIM = 2
DEVICE_DIM = 12
PAIR_DIM = 2


def feature_spec() -> dict[str, Any]:
    """The feature layout a checkpoint was trained with (recorded in its sidecar, checked on load)."""
    return {
        "version": FEATURE_VERSION,
        "type_buckets": TYPE_BUCKETS,
        "node_dim": NODE_DIM,
        "edge_dim": EDGE_DIM,
        "device_dim": DEVICE_DIM,
        "pair_dim": PAIR_DIM,
    }


def op_type_bucket(op_type: str) -> int:
    """A stable bucket for an op type: crc32 of its base name (``aten.mm.default`` -> ``mm``).

    >>> op_type_bucket("aten.mm.default") == op_type_bucket("aten.mm.out")
    True
    """
    return zlib.crc32(base_op_name(op_type).encode()) % TYPE_BUCKETS


def _log10(x: Any) -> np.ndarray:
    return np.log10(np.maximum(np.asarray(x, dtype=np.float64), 1e-30))


def graph_inputs(graph: OpGraph, cluster: Any) -> dict[str, np.ndarray]:
    """Every input array of the network for ``graph`` on ``cluster`` (numpy, float32/int64)."""
    n, d = graph.num_ops, cluster.num_devices
    fwd, bwd = op_times(graph, cluster)
    op_time_s = fwd + bwd  # [N, D]
    tmin = op_time_s.min(axis=1)
    total_t = max(float(tmin.sum()), 1e-12)
    mem = (static_bytes(graph) + activation_bytes(graph)).astype(np.float64)
    total_mem = max(float(mem.sum()), 1.0)
    top, bottom = levels(graph, tmin)
    cp = max(float(np.max(top + bottom)) if n else 0.0, 1e-12)
    bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)
    off = ~np.eye(d, dtype=bool)
    mean_bw = float(np.mean(bw[off])) if d > 1 else 1e12
    mean_lat = float(np.mean(np.asarray(cluster.latency_s)[off])) if d > 1 else 0.0
    gpu_mem = max(
        (m for m, k in zip(cluster.memory_bytes, cluster.kinds) if k == "gpu"),
        default=float(np.max(cluster.memory_bytes)),
    )
    send_s = mean_lat + graph.out_bytes.astype(np.float64) / mean_bw
    rel = np.stack(
        [
            np.log(np.maximum(tmin / total_t * n, 1e-9)) / 5.0,  # compute share vs the mean op
            np.log(np.maximum(mem / total_mem * n, 1e-9)) / 5.0,  # memory share vs the mean op
            top / cp,
            (top + tmin) / cp,
            (cp - bottom - top) / cp,  # start, end, slack on the critical path
            np.clip(np.log10(np.maximum(send_s, 1e-12) / np.maximum(tmin, 1e-9)), -4, 4) / 4.0,
            np.full(n, np.clip(_log10(total_mem / gpu_mem), -3, 3) / 3.0),
            np.full(n, np.log10(max(n, 1)) / 5.0),
            np.full(n, np.clip(_log10(total_t / cp), 0, 4) / 4.0),  # parallelism of the graph
        ],
        axis=1,
    )
    cost = cost_features(graph)[:, :8] if n else np.zeros((0, 8))  # column 8 is the op's index: order-dependent
    node = np.concatenate([shape_features(graph) / 10.0, cost, rel], axis=1)
    type_ids = np.fromiter((op_type_bucket(s) for s in graph.op_types), dtype=np.int64, count=n)

    mean_t = total_t / max(n, 1)
    eb = graph.edge_bytes.astype(np.float64)
    edge = np.stack(
        [np.log1p(eb) / 20.0, np.clip(np.log10((mean_lat + eb / mean_bw) / mean_t + 1e-9), -4, 4) / 4.0], axis=1
    )

    kinds = list(cluster.kinds)
    rank = np.zeros(d)
    count = np.ones(d)
    for kind in set(kinds):
        of_kind = [i for i, k in enumerate(kinds) if k == kind]
        rank[of_kind] = np.arange(len(of_kind)) / max(len(of_kind) - 1, 1) if len(of_kind) > 1 else 0.5
        count[of_kind] = len(of_kind)
    bw_in = np.where(off, bw, np.nan)
    device_rows = np.stack(
        [
            np.array([k == "gpu" for k in kinds], dtype=np.float64),
            np.array([k == "cpu" for k in kinds], dtype=np.float64),
            _log10(cluster.flops_per_s) - 12.0,
            _log10(cluster.mem_bw_bytes_per_s) - 11.0,
            _log10(cluster.memory_bytes) - 10.0,
            _log10(cluster.launch_overhead_s) + 5.0,
            (np.nanmean(_log10(bw_in), axis=1) - 10.0) if d > 1 else np.zeros(d),
            (np.nanmean(np.where(off, _log10(np.asarray(cluster.latency_s) + 1e-9), np.nan), axis=1) + 5.0)
            if d > 1
            else np.zeros(d),
            rank,
            np.log2(count) / 3.0,
            np.clip(_log10(total_mem / np.asarray(cluster.memory_bytes, dtype=np.float64)), -3, 3) / 3.0,
            np.clip(_log10(op_time_s.sum(axis=0) / total_t), 0, 4) / 2.0,  # slowdown of the whole graph on this device
        ],
        axis=1,
    )
    pos = (top + 0.5 * tmin) / cp
    pair = np.stack(
        [
            np.clip(np.log(np.maximum(op_time_s, 1e-30) / np.maximum(tmin, 1e-30)[:, None]), 0, 10) / 2.0,
            pos[:, None] - rank[None, :],
        ],
        axis=2,
    )
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    return {
        "node": f32(node),
        "type_ids": type_ids,
        "edge_src": graph.edge_src.astype(np.int64),
        "edge_dst": graph.edge_dst.astype(np.int64),
        "edge": f32(edge),
        "device": f32(device_rows),
        "pair": f32(pair),
    }
