"""The graph the schedulers run: a step's microbatch copies, with every shared parameter read as an edge.

:func:`schedule_graph` is what :class:`~envs.sim.simulator.SimEnv` schedules
(``SimEnv.sim_graph``) and what the policies and module searches read, so that
a placement that splits a parameter's readers over devices pays for the copy
and its gradient, as in the module :func:`placer.apply` builds.
"""

from __future__ import annotations

import numpy as np

from envs.microbatch import microbatch_graph
from graphs.ir import OpGraph
from graphs.ops import param_reads
from graphs.plan import check_microbatches

#: ``OpGraph.meta`` key set on :func:`schedule_graph`'s output: its parameter reads are edges already.
PARAM_EDGES_META = "param_edges"


def schedule_graph(graph: OpGraph, microbatches: int = 1) -> OpGraph:
    """The graph the schedulers run: :func:`envs.microbatch.microbatch_graph`, plus parameter reads as edges.

    A parameter (or buffer) read by ops on several devices is copied by
    :func:`placer.apply` from its owner's device to each other device before its
    first reader there, and its gradient flows back (:func:`graphs.ops.param_reads`).
    The schedulers charge exactly that for an edge ``owner -> reader`` carrying the
    tensor's bytes: a copy ``(owner, d)`` once per device ``d``, made before the
    first consumer on ``d`` in issue order, kept (in memory) until its gradient
    has been sent back, and a gradient copy back. In each microbatch copy (every
    microbatch's forward makes its own copies) the edge carries the whole tensor.

    Documented simplifications of modelling the tensor as the owner's output: a
    reader waits for the owner's forward (its first reader, which in a recurrent
    layer or a tied embedding runs before the others anyway), the owner's backward
    waits for the gradient copies, and where the owner's output also goes to the
    reader's device, one copy carries the larger of the two (a reader that reads
    both gets an edge of their sum). A graph that already has these edges
    (``meta[PARAM_EDGES_META]``: this function's output) gets none added again.
    """
    sim = microbatch_graph(graph, microbatches)
    if graph.meta.get(PARAM_EDGES_META):
        return sim
    src, dst, nbytes = param_reads(graph)
    if not len(src):
        return sim
    # on the graph's own edges (the microbatch copies repeat them): a pair that is already an edge (the reader
    # also reads the owner's output, so it needs both) adds the tensor's bytes to it; the others are new edges
    n, E = graph.num_ops, graph.num_edges
    key = graph.edge_src.astype(np.int64) * n + graph.edge_dst
    by_key = np.argsort(key, kind="stable")
    want = src * n + dst
    at = np.minimum(np.searchsorted(key[by_key], want), max(E - 1, 0))
    hit = (key[by_key[at]] == want) if E else np.zeros(len(want), dtype=bool)
    add = np.zeros(E, dtype=np.int64)
    np.add.at(add, by_key[at[hit]], nbytes[hit])
    M = check_microbatches(microbatches)
    shift = (np.arange(M, dtype=np.int64) * n)[:, None]
    new_src, new_dst = (src[~hit][None, :] + shift).reshape(-1), (dst[~hit][None, :] + shift).reshape(-1)
    return OpGraph(
        names=sim.names,
        op_types=sim.op_types,
        out_shapes=sim.out_shapes,
        out_dtypes=sim.out_dtypes,
        out_bytes=sim.out_bytes,
        param_bytes=sim.param_bytes,
        buffer_bytes=sim.buffer_bytes,
        flops=sim.flops,
        module_paths=sim.module_paths,
        params=sim.params,
        edge_src=np.concatenate([sim.edge_src, new_src]),
        edge_dst=np.concatenate([sim.edge_dst, new_dst]),
        edge_bytes=np.concatenate([sim.edge_bytes + np.tile(add, M), np.tile(nbytes[~hit], M)]),
        name=sim.name,
        meta={**sim.meta, PARAM_EDGES_META: True},
    )
