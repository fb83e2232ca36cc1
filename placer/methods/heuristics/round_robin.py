"""Round robin: co-location groups dealt over the GPUs in topological order.

The naive heuristic: group ``k`` (numbered by its first op) goes to GPU
``k mod num_gpus``. It balances op counts, ignores costs, communication and
memory, and so shows what placement without a model of the machine gives.

>>> from graphs import OpGraph
>>> import numpy as np
>>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)])
>>> class C: num_devices = 3; gpu_indices = staticmethod(lambda: [1, 2])
>>> round_robin(g, C()).tolist()
[1, 2, 1]
"""

from __future__ import annotations

import numpy as np

from graphs import OpGraph
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.registry import register


@register("round_robin")
def round_robin(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """Group ``k`` in topological order -> GPU ``k mod num_gpus``."""
    del seed
    gpus = gpu_devices(cluster)
    return gpus[colocation_groups(graph) % len(gpus)].astype(np.int32)
