"""HEFT: Heterogeneous Earliest Finish Time list scheduling (Topcuoglu et al., TPDS 2002).

Ops are ranked by their upward rank (mean cost over the devices plus the largest
mean-communication-plus-rank over their successors) and, in decreasing rank,
each goes to the device where it would finish earliest, using insertion: an op
may fill an idle gap between ops already scheduled on a device.

Costs are an op's forward + backward seconds on each device; an edge that crosses
devices costs its activation forward and its gradient backward. Departures from
the paper, both documented: ops of one co-location group share the device of the
first one scheduled, and (``memory_check=True``, the default) a device whose
resident memory would exceed its capacity is not a candidate. Plain HEFT is not
memory-aware; pass ``memory_check=False`` for it.

Insertion: an op of 2 s, ready at 0.5 s, fits in the gap between busy [0, 1] and [5, 6]:

>>> earliest_slot([0.0, 5.0], [1.0, 6.0], 0.5, 2.0)
(1.0, 1)
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from graphs import OpGraph
from graphs.dag import bottom_level
from placer.methods.heuristics.costs import (
    COMM_DIRECTIONS,
    candidate_devices,
    capacity_bytes,
    link_arrays,
    mean_link,
    op_memory_bytes,
    step_costs_s,
)
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.scheduling import ParamCopies
from placer.methods.registry import register


def earliest_slot(starts: list[float], ends: list[float], ready_s: float, dur_s: float) -> tuple[float, int]:
    """Earliest start >= ready_s of a ``dur_s`` gap in sorted busy intervals, and its insert position."""
    k = bisect_right(ends, ready_s)
    start_s = ready_s
    for j in range(k, len(starts)):
        if starts[j] - start_s >= dur_s:
            return start_s, j
        start_s = max(start_s, ends[j])
    return start_s, len(starts)


@register("heft")
def heft(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    devices: str = "all",
    memory_check: bool = True,
    param_copies: bool = True,
) -> np.ndarray:
    """HEFT placement. ``devices``: "all" (the paper: every processor) or "gpus".

    ``param_copies``: a shared parameter's copy to another device is charged once
    per device (:class:`~placer.methods.heuristics.scheduling.ParamCopies`); False ignores it.
    """
    del seed  # deterministic
    cand = candidate_devices(cluster, devices)
    cost = step_costs_s(graph, cluster)[:, cand]
    spb, lat = link_arrays(cluster, cand)
    mean_spb, mean_lat = mean_link(cluster, cand)
    edge_mean_s = COMM_DIRECTIONS * (graph.edge_bytes * mean_spb + mean_lat)
    rank = bottom_level(graph, cost.mean(axis=1), edge_mean_s)
    order = np.lexsort((np.arange(graph.num_ops), -rank))

    mem = op_memory_bytes(graph).astype(np.float64)
    cap = capacity_bytes(cluster)[cand]
    used = np.zeros(len(cand))
    groups = colocation_groups(graph)
    group_cand = np.full(int(groups.max()) + 1 if len(groups) else 0, -1)
    starts: list[list[float]] = [[] for _ in cand]
    ends: list[list[float]] = [[] for _ in cand]
    finish = np.zeros(graph.num_ops)
    op_cand = np.full(graph.num_ops, -1, dtype=np.int64)
    indptr, src, eid = graph.in_csr
    copies = ParamCopies(graph, len(cand), param_copies)

    for i in order.tolist():
        a, b = indptr[i], indptr[i + 1]
        preds, nbytes = src[a:b], graph.edge_bytes[eid[a:b]].astype(np.float64)
        if len(preds):
            pd = op_cand[preds]
            arrive = finish[preds][:, None] + nbytes[:, None] * spb[pd] + lat[pd]
            ready = arrive.max(axis=0)
        else:
            ready = np.zeros(len(cand))
        ready = ready + copies.delay(i, op_cand, spb, lat)
        g = groups[i]
        if group_cand[g] >= 0:
            options = [int(group_cand[g])]
        else:
            fits = used + mem[i] <= cap if memory_check else np.ones(len(cand), bool)
            options = np.flatnonzero(fits).tolist() or [int(np.argmax(cap - used))]
        best = None
        for d in options:
            st, pos = earliest_slot(starts[d], ends[d], float(ready[d]), float(cost[i, d]))
            ft = st + float(cost[i, d])
            if best is None or ft < best[0] - 1e-15:
                best = (ft, d, st, pos)
        ft, d, st, pos = best
        starts[d].insert(pos, st)
        ends[d].insert(pos, ft)
        finish[i], op_cand[i] = ft, d
        used[d] += mem[i]
        group_cand[g] = d
        copies.placed(i, d)
    return cand[op_cand].astype(np.int32)


@register("heft_nocopy")
def heft_nocopy(
    graph: OpGraph, cluster, *, seed: int = 0, devices: str = "all", memory_check: bool = True
) -> np.ndarray:
    """HEFT blind to shared-parameter copies (heft's rule before the heuristics' version 2; neither wins everywhere)."""
    return heft(graph, cluster, seed=seed, devices=devices, memory_check=memory_check, param_copies=False)
