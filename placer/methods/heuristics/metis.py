"""METIS k-way partitioning of the op graph (``pymetis``, the real METIS library).

The graph is made undirected and contracted by co-location groups; vertex weights
are forward + backward seconds (mean over the GPUs), edge weights the bytes of
the tensors between the two groups; both scaled to integers. METIS splits it into
one part per GPU with balanced weight and a minimum edge cut. Parts are balanced
for compute, not memory (METIS knows nothing of capacity), and may depend on each
other both ways: that is allowed, the simulator schedules ops, not stages.
"""

from __future__ import annotations

import numpy as np

from graphs import OpGraph
from graphs.group_graph import quotient
from placer.methods.heuristics.costs import gpu_devices, step_costs_s
from placer.methods.heuristics.groups import colocation_groups, to_int_weights
from placer.methods.registry import register, require


@register("metis")
def metis(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """One METIS part per GPU (k-way, minimum cut, balanced compute)."""
    pymetis = require("pymetis", "metis")
    gpus = gpu_devices(cluster)
    if len(gpus) == 1 or graph.num_ops == 0:
        return np.full(graph.num_ops, gpus[0], dtype=np.int32)
    groups = colocation_groups(graph)
    q = quotient(graph, groups, step_costs_s(graph, cluster)[:, gpus].mean(axis=1))
    if q.num_nodes <= len(gpus):
        return gpus[np.arange(q.num_nodes)[groups] % len(gpus)].astype(np.int32)
    opts = pymetis.Options(seed=int(seed))
    _, parts = pymetis.part_graph(
        len(gpus),
        xadj=q.xadj.tolist(),
        adjncy=q.adjncy.tolist(),
        vweights=to_int_weights(q.vweights).tolist(),
        eweights=to_int_weights(q.eweights).tolist() if len(q.eweights) else None,
        options=opts,
    )
    return gpus[np.asarray(parts, dtype=np.int64)[groups]].astype(np.int32)
