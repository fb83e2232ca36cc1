"""Scotch static mapping of the op graph onto the cluster (``pyscotch``, the real library).

The source graph is the op graph made undirected and contracted by co-location
groups, vertex weights = forward + backward seconds (mean over the GPUs), edge
weights = tensor bytes, both scaled to integers. The target architecture is the
cluster's GPUs as a weighted complete graph (Scotch ``cmpltw``), each terminal
weighted by its compute rate, so faster GPUs receive proportionally more work;
every GPU pair of the presets shares one link class, which is what a complete
graph expresses. Scotch's default mapping strategy runs in a context set to
deterministic mode with its random generator seeded from ``seed`` (without it,
Scotch's threads make results vary from run to run). Not memory-aware (Scotch knows load, not
capacity).
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

from graphs import OpGraph
from graphs.group_graph import quotient
from placer.methods.heuristics.costs import gpu_devices, step_costs_s
from placer.methods.heuristics.groups import colocation_groups, to_int_weights
from placer.methods.registry import register, require

# Scotch 7 context options (library.h): reproducible runs, and a seed we choose.
SCOTCH_OPTIONNUMDETERMINISTIC = 0
SCOTCH_OPTIONNUMRANDOMFIXEDSEED = 1


@register("scotch")
def scotch(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """Scotch mapping onto a compute-weighted complete graph of the GPUs."""
    with contextlib.redirect_stderr(io.StringIO()):  # it announces the library it loaded
        pyscotch = require("pyscotch", "scotch")
    gpus = gpu_devices(cluster)
    if len(gpus) == 1 or graph.num_ops == 0:
        return np.full(graph.num_ops, gpus[0], dtype=np.int32)
    groups = colocation_groups(graph)
    q = quotient(graph, groups, step_costs_s(graph, cluster)[:, gpus].mean(axis=1))
    if q.num_nodes <= len(gpus) or len(q.adjncy) == 0:
        return gpus[np.arange(q.num_nodes)[groups] % len(gpus)].astype(np.int32)
    speed = np.asarray(cluster.flops_per_s, dtype=np.float64)[gpus]
    with contextlib.redirect_stderr(io.StringIO()):  # it reports loading its shared library
        ctx, graph_s, arch = pyscotch.Context(), pyscotch.Graph(), pyscotch.Architecture()
        bound = None
        try:
            ctx.option_set(SCOTCH_OPTIONNUMDETERMINISTIC, 1)
            ctx.option_set(SCOTCH_OPTIONNUMRANDOMFIXEDSEED, 1)
            ctx.random_seed(int(seed))
            ctx.random_reset()
            graph_s.build(q.xadj, q.adjncy, velotab=to_int_weights(q.vweights), edlotab=to_int_weights(q.eweights))
            bound = ctx.bind_graph(graph_s)
            arch.complete_weighted(len(gpus), to_int_weights(speed, top=1000))
            parts = np.asarray(bound.map(arch), dtype=np.int64)
        finally:
            for obj in (bound, graph_s, arch, ctx):
                if obj is not None:
                    obj.close()
    return gpus[parts[groups]].astype(np.int32)
