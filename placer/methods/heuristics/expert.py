"""The human expert's placement, as the ColocRL paper describes practice.

Recurrent models (an op type or a module path mentions lstm/gru/rnn, or a
layer holds gated cells unrolled over time, see :func:`_recurrent_mask`): each
recurrent layer goes on its own GPU, layer ``d`` of the encoder and of the decoder
sharing GPU ``d`` (the GNMT layout); the attention layer gets the next GPU and the
softmax/output layer (everything after the last recurrent op that is not
attention) the one after that (the next one when there is no attention),
wrapping round when GPUs run out. Embeddings go
on the GPU of the first layer they feed, as in GNMT, unless their table would
take more than a quarter of that GPU's memory: then on the CPU, as engineers do
with huge vocabularies. Any other op follows the producer of its largest input.

Feed-forward models: the ops are cut into layers by module path (the path up to
its first numbered component, ``layer1.0`` or ``transformer.h.3``; else its first
component, ``Mixed_5b``) and the layers, in order, into contiguous blocks, one
per GPU, balanced by time and kept within each GPU's memory where possible;
top-level ops outside any module follow their producers. Graphs without module
paths fall back to blocks of ops.

>>> _layer_key("transformer.h.3.attn.c_attn"), _layer_key("Mixed_5b.branch1x1"), _layer_key("")
('transformer.h.3', 'Mixed_5b', '')
"""

from __future__ import annotations

import re

import numpy as np

from graphs import OpGraph
from graphs.ops import base_op_name
from placer.methods.heuristics.costs import capacity_bytes, gpu_devices, op_memory_bytes, step_costs_s
from placer.methods.heuristics.groups import colocation_groups, linear_partition, snap_to_groups
from placer.methods.registry import register

_RECURRENT = re.compile(r"lstm|gru|rnn", re.IGNORECASE)
_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_EMBEDDING = re.compile(r"embed", re.IGNORECASE)
EMBEDDING_ON_CPU_FRACTION = 0.25  # table bigger than this share of a GPU -> CPU


def _layer_key(path: str) -> str:
    parts = path.split(".") if path else []
    for k, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: k + 1])
    return parts[0] if parts else ""


def _recurrent_mask(graph: OpGraph) -> tuple[np.ndarray, list[str]]:
    """Ops in recurrent layers, and each op's layer key.

    A layer is recurrent when an op type or its path names lstm/gru/rnn, or when
    it holds gated cells (at least two sigmoids and a tanh: LSTM/GRU cells
    unrolled over time steps).
    """
    keys = [_layer_key(p) or graph.names[i] for i, p in enumerate(graph.module_paths)]
    named = np.array(
        [bool(_RECURRENT.search(t) or _RECURRENT.search(p)) for t, p in zip(graph.op_types, graph.module_paths)]
    )
    sig: dict[str, int] = {}
    tanh: dict[str, int] = {}
    for k, t in zip(keys, graph.op_types):
        base = base_op_name(t)
        if base in ("sigmoid", "sigmoid_"):
            sig[k] = sig.get(k, 0) + 1
        elif base in ("tanh", "tanh_"):
            tanh[k] = tanh.get(k, 0) + 1
    gated = {k for k in sig if sig[k] >= 2 and tanh.get(k, 0) >= 1}
    rec = named | np.array([k in gated for k in keys], dtype=bool)
    return rec & np.array([bool(graph.module_paths[i]) or named[i] for i in range(graph.num_ops)]), keys


def follow_producers(graph: OpGraph, op_devices: np.ndarray, default: int) -> np.ndarray:
    """Unplaced ops take the device of their largest input's producer, else of a consumer."""
    in_ptr, in_src, in_eid = graph.in_csr
    for i in range(graph.num_ops):
        if op_devices[i] < 0:
            a, b = in_ptr[i], in_ptr[i + 1]
            if b > a:
                op_devices[i] = op_devices[in_src[a:b][np.argmax(graph.edge_bytes[in_eid[a:b]])]]
    out_ptr, out_dst, _ = graph.out_csr
    for i in range(graph.num_ops - 1, -1, -1):  # sources with no placed producer
        if op_devices[i] < 0:
            succ = out_dst[out_ptr[i] : out_ptr[i + 1]]
            placed = succ[op_devices[succ] >= 0]
            op_devices[i] = op_devices[placed[0]] if len(placed) else default
    return op_devices


def _recurrent(graph: OpGraph, cluster, is_rec: np.ndarray, keys: list[str]) -> np.ndarray:
    gpus = gpu_devices(cluster)
    n = graph.num_ops
    op_devices = np.full(n, -1, dtype=np.int64)
    depth_of_unit: dict[str, int] = {}
    count_by_top: dict[str, int] = {}
    for i in np.flatnonzero(is_rec).tolist():
        unit = keys[i]
        if unit not in depth_of_unit:
            top = unit.split(".")[0] if "." in unit else ""
            depth_of_unit[unit] = count_by_top.get(top, 0)
            count_by_top[top] = depth_of_unit[unit] + 1
        op_devices[i] = gpus[depth_of_unit[unit] % len(gpus)]
    nxt = max(depth_of_unit.values()) + 1
    is_attn = np.array([bool(_ATTENTION.search(p)) for p in graph.module_paths]) & ~is_rec
    if is_attn.any():
        op_devices[is_attn] = gpus[nxt % len(gpus)]
        nxt += 1
    last_rec = int(np.flatnonzero(is_rec).max())
    tail = (np.arange(n) > last_rec) & ~is_rec & ~is_attn
    op_devices[tail] = gpus[nxt % len(gpus)]
    # Embeddings: with the first layer they feed, or on the CPU when huge.
    emb = np.array(
        [bool(_EMBEDDING.search(t) or _EMBEDDING.search(p)) for t, p in zip(graph.op_types, graph.module_paths)]
    )
    emb &= ~is_rec
    cpu = cluster.host_indices()
    table_bytes = float(graph.param_bytes[emb].sum()) if emb.any() else 0.0
    huge = bool(cpu) and table_bytes > EMBEDDING_ON_CPU_FRACTION * float(capacity_bytes(cluster)[gpus[0]])
    op_devices[emb] = cpu[0] if huge else gpus[0]
    return follow_producers(graph, op_devices, int(gpus[0]))


def _feed_forward(graph: OpGraph, cluster) -> np.ndarray:
    gpus = gpu_devices(cluster)
    cost = step_costs_s(graph, cluster)[:, gpus].mean(axis=1)
    keys = [_layer_key(p) for p in graph.module_paths]
    if not any(keys):  # no module structure: every op is its own layer
        keys = list(graph.names)
    inside = np.array([bool(k) for k in keys])  # top-level glue ops follow their producers
    unit_of: dict[str, int] = {}
    unit = np.array([unit_of.setdefault(k, len(unit_of)) if k else -1 for k in keys], dtype=np.int64)
    ucost = np.bincount(unit[inside], weights=cost[inside], minlength=len(unit_of))
    umem = np.bincount(unit[inside], weights=op_memory_bytes(graph)[inside].astype(np.float64), minlength=len(unit_of))
    block = linear_partition(ucost, len(gpus), capacity_bytes(cluster)[gpus], umem)
    op_devices = np.full(graph.num_ops, -1, dtype=np.int64)
    op_devices[inside] = gpus[block[unit[inside]]]
    return follow_producers(graph, op_devices, int(gpus[0]))


@register("expert")
def expert(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """Expert placement: layer-per-GPU for recurrent models, layer blocks otherwise."""
    del seed
    is_rec, keys = _recurrent_mask(graph)
    op_devices = _recurrent(graph, cluster, is_rec, keys) if is_rec.any() else _feed_forward(graph, cluster)
    return snap_to_groups(op_devices, colocation_groups(graph)).astype(np.int32)
