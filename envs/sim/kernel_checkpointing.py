"""Checkpointed blocks compiled: the recompute of :mod:`envs.sim.checkpointing`, same times, and its bytes.

Per placement, ``ck[i]`` is op ``i``'s block (the index of the block's first op, -1
for none) and ``rc`` a ``[3, n]`` array: per op of a block, the host seconds
issuing its forward again on its device (0 on the host), its forward's seconds,
and the start of its recompute kernel (-1 until its block is recomputed; a block
``b`` is done once ``rc[2, b] >= 0``). Links' and streams' free times are those of
the other kernels. An op of a block whose parameters live on the host
(``hm[i] >= 0``) has them copied in again right before it is recomputed,
outside the window (:func:`envs.sim.kernel_homes.copy_in`).
"""

from __future__ import annotations

import numpy as np

from envs.sim.compiled import njit
from envs.sim.kernel_homes import copy_in


@njit(cache=True)
def prepare(p, n, ck, rc, fwd_t, issue_f, host):
    """Fill ``rc`` for placement ``p``; returns whether any op is checkpointed."""
    any_block = False
    for i in range(n):
        if ck[i] >= 0:
            any_block = True
            d = p[i]
            rc[0, i] = 0.0 if host[d] else issue_f[i, d]
            rc[1, i] = fwd_t[i, d]
            rc[2, i] = -1.0
    return any_block


@njit(cache=True)
def recompute(j, d, now, order, lo, hi, ck, rc, host, free, hm, hb, lat, bw, ht, D):
    """``bwd j`` picked at ``now`` by device ``d``'s thread: its block's forward again first, if not done yet;
    returns the thread's time after (:class:`envs.sim.checkpointing.Recompute`)."""
    b = ck[j]
    if b < 0 or rc[2, b] >= 0.0:
        return now
    t = now
    for pos in range(lo, hi):
        i = order[pos]
        if ck[i] != b:
            continue
        if host[d]:
            s = t
            t = s + rc[1, i]
            free[d] = t
        else:
            fetched = copy_in(i, d, 1, t, hm, hb, lat, bw, ht, free, D) if hm[i] >= 0 else 0.0
            t += rc[0, i]
            s = t if t > free[d] else free[d]
            if fetched > s:
                s = fetched
            free[d] = s + rc[1, i]
        rc[2, i] = s
    return t


@njit(cache=True)
def block_ends(n, ck, end):
    """Per block (indexed by its first op), the end of its last backward (-inf elsewhere)."""
    last = np.full(n, -np.inf)
    for i in range(n):
        if ck[i] >= 0 and end[2 * n - 1 - i] > last[ck[i]]:
            last[ck[i]] = end[2 * n - 1 - i]
    return last


@njit(cache=True)
def held_as_input(u, d, p, ck, out_ptr, out_dst, last):
    """Until when the output of ``u`` on device ``d`` (its own or a received copy) is held as a checkpointed block's
    input: the latest end of the blocks of its consumers on ``d`` (0 for none)."""
    t = 0.0
    for k in range(out_ptr[u], out_ptr[u + 1]):
        v = out_dst[k]
        if p[v] == d and ck[v] >= 0 and ck[v] != ck[u] and last[ck[v]] > t:
            t = last[ck[v]]
    return t


@njit(cache=True)
def block_output_free(i, n, ck, own, rptr, ridx, end, release):
    """A kept output of checkpointed op ``i``: ``(forward free, recomputed, held to)`` (the module doc of
    :mod:`envs.sim.checkpointing`)."""
    b = ck[i]
    t_fwd = release
    inner = -np.inf
    for k in range(rptr[i], rptr[i + 1]):
        v = ridx[k]
        e = end[2 * n - 1 - v]
        if ck[v] != b:
            if e > t_fwd:
                t_fwd = e
        elif e > inner:
            inner = e
    t_own = end[2 * n - 1 - i]
    if own[i] or rptr[i + 1] == rptr[i]:
        return t_fwd, True, t_own
    if inner > -np.inf:
        return t_fwd, True, inner if inner < t_own else t_own
    return t_fwd, False, 0.0
