"""What the heuristics read off the graph and the cluster: op costs, memory, devices and links.

Every heuristic sees the graph through the numbers the simulator uses: per-op
forward + backward seconds per device (:func:`envs.sim.cost.op_times`), tensor
transfer times over the cluster's links, and a per-op memory estimate.
"""

from __future__ import annotations

import numpy as np

from envs.sim.cost import activation_bytes, op_times, static_bytes
from graphs import OpGraph, PlacerError


def step_costs_s(graph: OpGraph, cluster) -> np.ndarray:
    """Forward + backward seconds of each op on each device, shape [num_ops, D]."""
    fwd_s, bwd_s = op_times(graph, cluster)
    return np.asarray(fwd_s, dtype=np.float64) + np.asarray(bwd_s, dtype=np.float64)


def gpu_devices(cluster) -> np.ndarray:
    """Indices of the cluster's GPUs (all devices when it has none)."""
    gpus = list(cluster.gpu_indices())
    return np.asarray(gpus if gpus else range(cluster.num_devices), dtype=np.int64)


def candidate_devices(cluster, devices: str, graph: OpGraph | None = None) -> np.ndarray:
    """``"gpus"`` -> the GPUs (all devices when none); ``"all"`` -> every device; ``"auto"`` -> the GPUs when
    ``graph``'s training state fits their memory (:func:`fits_gpus`), else every device.

    ``"auto"`` is the searches' default: a model whose weights, gradients and optimizer state do not fit the
    GPUs must keep some of them on the host, and a search over the GPUs alone finds no placement that runs
    (measured on an H100 capped at 24 GiB: BENCHMARKS.md, "Offload").
    """
    if devices == "gpus":
        return gpu_devices(cluster)
    if devices == "all":
        return np.arange(cluster.num_devices, dtype=np.int64)
    if devices == "auto":
        if graph is None:
            raise PlacerError("devices='auto' needs the graph, to check whether it fits the GPUs")
        return gpu_devices(cluster) if fits_gpus(graph, cluster) else np.arange(cluster.num_devices, dtype=np.int64)
    raise PlacerError(f"devices must be 'auto', 'gpus' or 'all', got {devices!r}")


def fits_gpus(graph: OpGraph, cluster) -> bool:
    """Whether ``graph``'s footprint (:func:`op_memory_bytes`, summed) fits the GPUs' :func:`capacity_bytes` together.

    A cluster without GPUs "fits" (its searches use every device anyway).
    """
    gpus = list(cluster.gpu_indices())
    return not gpus or float(op_memory_bytes(graph).sum()) <= float(capacity_bytes(cluster)[gpus].sum())


def mean_link(cluster, devices: np.ndarray) -> tuple[float, float]:
    """Mean (seconds per byte, latency seconds) over distinct pairs of ``devices``."""
    if len(devices) < 2:
        return 0.0, 0.0
    bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)[np.ix_(devices, devices)]
    lat = np.asarray(cluster.latency_s, dtype=np.float64)[np.ix_(devices, devices)]
    off = ~np.eye(len(devices), dtype=bool)
    return float(np.mean(1.0 / bw[off])), float(np.mean(lat[off]))


# A cut edge moves the activation forward and its gradient backward.
COMM_DIRECTIONS = 2


def link_arrays(cluster, devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per byte, latency s) between candidate devices, both [C, C], 0 on the diagonal."""
    bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)[np.ix_(devices, devices)]
    lat = np.asarray(cluster.latency_s, dtype=np.float64)[np.ix_(devices, devices)].copy()
    with np.errstate(divide="ignore"):
        spb = np.where(np.isinf(bw), 0.0, 1.0 / bw)
    np.fill_diagonal(spb, 0.0)
    np.fill_diagonal(lat, 0.0)
    return COMM_DIRECTIONS * spb, COMM_DIRECTIONS * lat


def op_memory_bytes(graph: OpGraph) -> np.ndarray:
    """Bytes an op pins on its device over a training step (int64).

    Its parameters, their gradients, the optimizer state and its buffers
    (:func:`envs.sim.cost.static_bytes`) plus its output, kept for the backward pass
    (:func:`envs.sim.cost.activation_bytes`): the "permanent + activation" footprint
    Baechi's memory-aware algorithms account against a device's capacity (the
    optimizer step, torch's fused Adam, adds nothing to it). Summed over a device it
    bounds the simulator's peak from above, up to the transient gradient buffers and
    received tensors that :data:`MEMORY_HEADROOM` leaves room for.
    """
    return (static_bytes(graph) + activation_bytes(graph)).astype(np.int64)


#: Share of a device's memory the memory-aware heuristics fill with
#: :func:`op_memory_bytes`; the rest is for transient gradients and received copies.
MEMORY_HEADROOM = 0.9


def capacity_bytes(cluster) -> np.ndarray:
    """Per-device memory the memory-aware heuristics may fill."""
    return MEMORY_HEADROOM * np.asarray(cluster.memory_bytes, dtype=np.float64)
