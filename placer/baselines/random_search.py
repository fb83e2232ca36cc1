"""Random search: the best of ``n`` uniformly random placements, scored by the simulator.

Each co-location group gets a device drawn uniformly from the GPUs (``devices=
"gpus"``, default) or from every device (``"all"``); the ``n`` placements are
scored in batches with :meth:`envs.SimEnv.step_times`. Placements that fit in
memory beat those that do not; among those, the fastest wins. Deterministic for
a seed.
"""

from __future__ import annotations

import numpy as np

from graphs import OpGraph, PlacerError
from placer.baselines import register
from placer.baselines._common import candidate_devices, colocation_groups

BATCH = 64


@register("random_search")
def random_search(graph: OpGraph, cluster, *, seed: int = 0, n: int = 1000, devices: str = "gpus", env=None) -> np.ndarray:
    """Best of ``n`` random placements (``env``: a SimEnv to reuse, else one is built)."""
    import envs

    if n < 1:
        raise PlacerError(f"random_search: n must be >= 1, got {n}")
    env = env if env is not None else envs.SimEnv(graph, cluster)
    cand = candidate_devices(cluster, devices)
    groups = colocation_groups(graph)
    num_groups = int(groups.max()) + 1 if len(groups) else 0
    rng = np.random.default_rng(seed)
    best_key, best = (True, np.inf), None
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        idx = cand[rng.integers(0, len(cand), size=(k, num_groups))][:, groups].astype(np.int32)
        times, oom = env.step_times(idx)
        for j in range(k):
            key = (bool(oom[j]), float(times[j]))
            if key < best_key:
                best_key, best = key, idx[j]
    return best.astype(np.int32)
