"""Single device: every op on one device, the "it fits on one GPU" baseline.

With ``device`` (a logical name such as ``"gpu:0"``) everything goes there.
Without it, the baseline simulates "everything on d" for every device ``d`` and
picks the fastest one that fits in memory by the simulator's memory model; if
none fits, the device with the most memory (the simulator will then report the
placement as ``oom``).

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

from graphs import OpGraph, PlacerError
from placer.baselines import register


@register("single")
def single(graph: OpGraph, cluster, *, seed: int = 0, device: str | int | None = None) -> np.ndarray:
    """All ops on ``device`` (name or index), or on the fastest device that fits."""
    del seed  # deterministic
    n, D = graph.num_ops, cluster.num_devices
    if isinstance(device, int) and not isinstance(device, bool):
        if not 0 <= device < D:
            raise PlacerError(f"single: device index {device} out of range for cluster {cluster.name} ({D} devices)")
        return np.full(n, device, dtype=np.int32)
    if device is not None:
        if device not in cluster.device_names:
            raise PlacerError(f"single: cluster {cluster.name} has no device {device!r} (has {', '.join(cluster.device_names)})")
        return np.full(n, cluster.device_names.index(device), dtype=np.int32)
    from envs import SimEnv

    env = SimEnv(graph, cluster)
    candidates = np.repeat(np.arange(D, dtype=np.int32)[:, None], n, axis=1)
    times, oom = env.step_times(candidates)
    if np.all(oom):
        best = int(np.argmax(cluster.memory_bytes))
    else:
        best = int(np.argmin(np.where(oom, np.inf, times)))
    return np.full(n, best, dtype=np.int32)
