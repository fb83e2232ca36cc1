"""Single device: every op on one device, the "it fits on one GPU" heuristic.

With ``device`` (a logical name such as ``"gpu:0"``, or ``"cpu:0"`` to ask for
the host) everything goes there. Without it, the heuristic simulates "everything
on d" for every GPU ``d`` and picks the fastest one that fits in memory by the
simulator's memory model; if no GPU holds the model, the GPU with the most
memory, which the simulator then reports as ``oom``: a model that does not fit
one GPU does not silently fall back to the CPU. ``cpu=True`` lets the host
compete too (a cluster without GPUs always does).

>>> from graphs import OpGraph
>>> from envs import Cluster
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 1e9])
>>> single(g, Cluster.preset("k80x2")).tolist()
[1, 1]
>>> single(g, Cluster.preset("k80x2"), device="cpu:0").tolist()
[0, 0]
"""

from __future__ import annotations

import numpy as np

from envs import SimEnv
from graphs import OpGraph, PlacerError
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.registry import register


@register("single")
def single(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    device: str | int | None = None,
    cpu: bool = False,
    env: SimEnv | None = None,
) -> np.ndarray:
    """All ops on ``device`` (name or index), or on the fastest GPU (any device with ``cpu``) that fits (simulated in
    ``env``)."""
    del seed  # deterministic
    n, D = graph.num_ops, cluster.num_devices
    if isinstance(device, int) and not isinstance(device, bool):
        if not 0 <= device < D:
            raise PlacerError(f"single: device index {device} out of range for cluster {cluster.name} ({D} devices)")
        return np.full(n, device, dtype=np.int32)
    if device is not None:
        if device not in cluster.device_names:
            raise PlacerError(
                f"single: cluster {cluster.name} has no device {device!r} (has {', '.join(cluster.device_names)})"
            )
        return np.full(n, cluster.device_names.index(device), dtype=np.int32)

    devices = np.arange(D, dtype=np.int32) if cpu else gpu_devices(cluster).astype(np.int32)
    env = env if env is not None else SimEnv(graph, cluster)
    step_time_s, oom = env.step_times(np.repeat(devices[:, None], n, axis=1))
    if np.all(oom):
        best = int(devices[np.argmax(np.asarray(cluster.memory_bytes)[devices])])
    else:
        best = int(devices[np.argmin(np.where(oom, np.inf, step_time_s))])
    return np.full(n, best, dtype=np.int32)
