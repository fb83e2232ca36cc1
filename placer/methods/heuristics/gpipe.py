"""GPipe-style pipeline split: contiguous blocks balanced by time over the GPUs.

torchgpipe's ``balance_by_time`` profiles each layer of an ``nn.Sequential`` and
cuts the sequence into as many contiguous partitions as there are devices so that
the slowest partition is as fast as possible. Here the sequence is the graph's
ops in topological order and a layer's time is the op's forward + backward
seconds on the GPU; the cut minimising the largest block is exact (binary search
on the bottleneck). Co-location groups split by a cut go where most of their
time is. Like the original it ignores memory and communication.
"""

from __future__ import annotations

import numpy as np

from graphs import OpGraph
from placer.methods.heuristics.costs import gpu_devices, step_costs_s
from placer.methods.heuristics.groups import colocation_groups, linear_partition, snap_to_groups
from placer.methods.registry import register


@register("gpipe")
def gpipe(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """Contiguous blocks of ops in topological order, one per GPU, balanced by time."""
    del seed
    gpus = gpu_devices(cluster)
    cost = step_costs_s(graph, cluster)[:, gpus]
    block = linear_partition(cost.mean(axis=1), len(gpus))
    block = snap_to_groups(block, colocation_groups(graph), cost.mean(axis=1))
    return gpus[block].astype(np.int32)
