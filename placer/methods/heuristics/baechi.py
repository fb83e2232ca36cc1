"""Baechi's memory-aware placers (Jeon et al., SoCC 2020): m-TOPO, m-ETF, m-SCT.

All three place on the GPUs and never put an op on a device whose resident
memory (:func:`~placer.methods.heuristics.costs.op_memory_bytes`) would exceed its
capacity while another device has room; only when no device can take an op is
it put where the most memory is left (the placement then fails, as in Baechi).

* **m-TOPO** walks the ops in topological order and fills one device after
  another, moving on when a device holds its equal share of the total memory.
* **m-ETF** is earliest-task-first list scheduling: repeatedly the (ready op,
  device) pair with the earliest start time, among devices with room.
* **m-SCT** solves the small-communication-time linear program of Hanen and
  Munier for "favourite child" edges with a real LP solver (HiGHS through
  :func:`scipy.optimize.linprog`), rounds it at 1/2, and list-schedules like
  m-ETF except that a favourite child goes right after its parent on the
  parent's device when that device has not started anything else.

Our graphs fold a parameter into the op that owns it, so a weight read by several
ops (a recurrent layer at every time step) has no variable node whose edges these
algorithms would see, as they do in a TensorFlow graph. m-ETF and m-SCT (and HEFT)
charge its copy to another device instead, once per device
(:class:`~placer.methods.heuristics.scheduling.ParamCopies`); ``param_copies=False`` ignores it.
Neither rule wins everywhere (on nmt-2/k80x4 m-SCT is 271.6 ms with the copies
charged and 261.4 without; on nmt-4, 401.3 against 477.8), so both are registered:
``m_etf_nocopy`` and ``m_sct_nocopy`` are the copy-blind rule.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from graphs import OpGraph, PlacerError
from graphs.dag import bottom_level
from placer.methods.heuristics.costs import (
    COMM_DIRECTIONS,
    capacity_bytes,
    gpu_devices,
    link_arrays,
    mean_link,
    op_memory_bytes,
    step_costs_s,
)
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.scheduling import ParamCopies
from placer.methods.registry import register


@register("m_topo")
def m_topo(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """m-TOPO: topological order, each GPU filled to an equal share of the memory."""
    del seed
    cand = gpu_devices(cluster)
    mem = op_memory_bytes(graph).astype(np.float64)
    cap = capacity_bytes(cluster)[cand]
    groups = colocation_groups(graph)
    gmem = np.bincount(groups, weights=mem, minlength=int(groups.max()) + 1 if len(groups) else 0)
    share = min(float(gmem.sum()) / len(cand), float(cap.max()))
    used = np.zeros(len(cand))
    group_dev = np.full(len(gmem), -1)
    k = 0
    for g in groups.tolist():  # ops in topological order; a group goes where its first op goes
        if group_dev[g] >= 0:
            continue
        need = gmem[g]
        while k < len(cand) - 1 and used[k] > 0 and (used[k] + need > min(share, cap[k]) * (1 + 1e-9)):
            k += 1
        d = k
        if used[d] + need > cap[d]:
            room = cap - used
            d = int(np.argmax(room)) if not np.any(room >= need) else int(np.flatnonzero(room >= need)[0])
        used[d] += need
        group_dev[g] = d
    return cand[group_dev[groups]].astype(np.int32)


def favourite_edges(graph: OpGraph, node_s: np.ndarray, edge_s: np.ndarray) -> np.ndarray:
    """Hanen–Munier SCT LP: True for edges whose relaxed x_ij rounds to 0 (favourite)."""
    n, m = graph.num_ops, graph.num_edges
    if m == 0:
        return np.zeros(0, dtype=bool)
    # variables: start s_0..s_{n-1}, x_0..x_{m-1}, makespan W
    nv = n + m + 1
    rows, cols, vals, rhs = [], [], [], []
    e = np.arange(m)
    # s_i + p_i + c_e x_e - s_j <= 0
    rows += [e, e, e]
    cols += [graph.edge_src.astype(np.int64), n + e, graph.edge_dst.astype(np.int64)]
    vals += [np.ones(m), edge_s, -np.ones(m)]
    rhs.append(-node_s[graph.edge_src])
    r = m
    for csr_src in (graph.edge_src, graph.edge_dst):  # at most one favourite child / parent
        deg = np.bincount(csr_src, minlength=n)
        owners = np.flatnonzero(deg >= 2)
        if len(owners):
            row_of = np.full(n, -1)
            row_of[owners] = r + np.arange(len(owners))
            sel = deg[csr_src] >= 2
            rows.append(row_of[csr_src[sel]])
            cols.append(n + e[sel])
            vals.append(-np.ones(int(sel.sum())))
            rhs.append(-(deg[owners] - 1).astype(np.float64))
            r += len(owners)
    sinks = np.flatnonzero(np.bincount(graph.edge_src, minlength=n) == 0)
    rows += [r + np.arange(len(sinks)), r + np.arange(len(sinks))]
    cols += [sinks, np.full(len(sinks), n + m)]
    vals += [np.ones(len(sinks)), -np.ones(len(sinks))]
    rhs.append(-node_s[sinks])
    r += len(sinks)
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv)).tocsr()
    c = np.zeros(nv)
    c[-1] = 1.0
    bounds = [(0, None)] * n + [(0, 1)] * m + [(0, None)]
    res = linprog(c, A_ub=A, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    if res.status != 0:
        raise PlacerError(f"m_sct: the favourite-child LP failed ({res.message})")
    return res.x[n : n + m] < 0.5


def _list_schedule(
    graph: OpGraph, cluster, favourite_parent: np.ndarray | None, param_copies: bool = True
) -> np.ndarray:
    """Memory-aware ETF over the GPUs; with ``favourite_parent``, the SCT rule first.

    ``param_copies``: charge a shared parameter's copy once per device (:class:`ParamCopies`).
    """
    cand = gpu_devices(cluster)
    nd = len(cand)
    cost = step_costs_s(graph, cluster)[:, cand]
    spb, lat = link_arrays(cluster, cand)
    mean_spb, mean_lat = mean_link(cluster, cand)
    rank = bottom_level(graph, cost.mean(axis=1), COMM_DIRECTIONS * (graph.edge_bytes * mean_spb + mean_lat))
    mem = op_memory_bytes(graph).astype(np.float64)
    cap = capacity_bytes(cluster)[cand]
    groups = colocation_groups(graph)
    group_cand = np.full(int(groups.max()) + 1 if len(groups) else 0, -1)
    used = np.zeros(nd)
    free_s = np.zeros(nd)
    last_op = np.full(nd, -1)
    finish = np.zeros(graph.num_ops)
    op_cand = np.full(graph.num_ops, -1, dtype=np.int64)
    in_ptr, in_src, in_eid = graph.in_csr
    out_ptr, out_dst, _ = graph.out_csr
    indeg = np.diff(in_ptr).astype(np.int64)
    ready = np.flatnonzero(indeg == 0).tolist()  # the ops whose inputs are all placed, in the order they became so
    data_ready = np.zeros((graph.num_ops, nd))  # when an op's inputs would be on each device
    copies = ParamCopies(graph, nd, param_copies)

    while ready:
        ops = np.asarray(ready, dtype=np.int64)
        start = np.maximum(data_ready[ops], free_s[None, :])
        if copies.reads:
            start += copies.delays(ops, op_cand, spb, lat)
        fits = used[None, :] + mem[ops][:, None] <= cap[None, :]
        allowed = fits.copy()
        forced = group_cand[groups[ops]]
        has = forced >= 0
        allowed[has] = False
        allowed[has, forced[has]] = True
        stuck = ~allowed.any(axis=1)
        if stuck.any():  # nowhere with room: the device with the most memory left
            allowed[stuck, int(np.argmax(cap - used))] = True
        start = np.where(allowed, start, np.inf)
        pick = None
        if favourite_parent is not None:
            fp = favourite_parent[ops]
            for r in np.flatnonzero(fp >= 0).tolist():
                d = op_cand[fp[r]]
                if last_op[d] == fp[r] and np.isfinite(start[r, d]):
                    if pick is None or start[r, d] < start[pick[0], pick[1]]:
                        pick = (r, int(d))
        if pick is None:
            best = start.min(axis=1)
            tmin = best.min()
            tied = np.flatnonzero(best <= tmin + 1e-15)
            r = int(tied[np.argmax(rank[ops[tied]])])
            pick = (r, int(np.argmin(start[r])))
        r, d = pick
        i = int(ops[r])
        st = float(start[r, d])
        finish[i] = st + cost[i, d]
        free_s[d] = finish[i]
        last_op[d] = i
        op_cand[i] = d
        used[d] += mem[i]
        group_cand[groups[i]] = d
        copies.placed(i, d)
        ready.remove(i)
        for j in out_dst[out_ptr[i] : out_ptr[i + 1]].tolist():
            indeg[j] -= 1
            if indeg[j] == 0:
                a, b = in_ptr[j], in_ptr[j + 1]
                p = in_src[a:b]
                nbytes = graph.edge_bytes[in_eid[a:b]].astype(np.float64)
                arrive = finish[p][:, None] + nbytes[:, None] * spb[op_cand[p]] + lat[op_cand[p]]
                data_ready[j] = arrive.max(axis=0)
                ready.append(j)
    return cand[op_cand].astype(np.int32)


@register("m_etf")
def m_etf(graph: OpGraph, cluster, *, seed: int = 0, param_copies: bool = True) -> np.ndarray:
    """m-ETF: earliest-start (op, GPU) pairs first, among GPUs with memory left.

    ``param_copies``: a shared parameter's copy to another device is charged once
    per device (:class:`~placer.methods.heuristics.scheduling.ParamCopies`); False ignores it.
    """
    del seed
    return _list_schedule(graph, cluster, None, param_copies)


@register("m_sct")
def m_sct(graph: OpGraph, cluster, *, seed: int = 0, param_copies: bool = True) -> np.ndarray:
    """m-SCT: favourite children from the SCT linear program, then memory-aware ETF (``param_copies`` as m_etf)."""
    del seed
    cand = gpu_devices(cluster)
    cost = step_costs_s(graph, cluster)[:, cand]
    mean_spb, mean_lat = mean_link(cluster, cand)
    edge_s = COMM_DIRECTIONS * (graph.edge_bytes * mean_spb + mean_lat)
    fav = favourite_edges(graph, cost.mean(axis=1), edge_s)
    favourite_parent = np.full(graph.num_ops, -1, dtype=np.int64)
    favourite_parent[graph.edge_dst[fav]] = graph.edge_src[fav]
    return _list_schedule(graph, cluster, favourite_parent, param_copies)


@register("m_etf_nocopy")
def m_etf_nocopy(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """m-ETF blind to shared-parameter copies (m_etf's rule before the heuristics' version 2)."""
    return m_etf(graph, cluster, seed=seed, param_copies=False)


@register("m_sct_nocopy")
def m_sct_nocopy(graph: OpGraph, cluster, *, seed: int = 0) -> np.ndarray:
    """m-SCT blind to shared-parameter copies (m_sct's rule before the heuristics' version 2)."""
    return m_sct(graph, cluster, seed=seed, param_copies=False)
