"""Parameter homes compiled: the copies of :mod:`envs.sim.homes`, same times, and their bytes in the memory check.

Per placement, ``hm[i]`` is the home device of the parameters copied for op ``i`` (-1 for none) and ``hb[i]`` their
bytes (:func:`envs.sim.homes.copy_rows`: an offloaded op's own, and those it reads through views), and ``ht`` a
``[7, n]`` array of each copy's times (rows: the copy for the forward, start and end; for the backward; the
gradient's copy home; row 6: 1 where the forward's copy is kept for the backward, 0 where it may be, -1 where no
copy is kept). ``ring`` (``[4 D]`` task ids, -1 for none) holds, per pass (forward 0, backward 1) and device, the
readers of the last two copies: a copy waits for the end of the one two before (the side stream's window); in the
backward, the forward's last two readers keep their copies (:func:`refetch`). Links' free times are
``free[D + a * D + b]``, as in the other kernels.
"""

from __future__ import annotations

import numpy as np

from envs.sim import cost
from envs.sim.compiled import njit

#: The optimizer step's time on one device: envs.sim.cost's one formula, compiled (the slowest device's is the step's).
update_time_s = njit(cache=True)(cost.update_time_s)


@njit(cache=True)
def home_copy(i, d, pass_, reader, at, hm, hb, lat, bw, ring, ht, free, end, D):
    """The copy of op ``i``'s parameters from their home to ``d`` for pass ``pass_`` (0: forward, 1: backward),
    issued at ``at`` for task ``reader``; returns its end."""
    r = 2 * (pass_ * D + d)
    if ring[r + 1] >= 0 and end[ring[r + 1]] > at:
        at = end[ring[r + 1]]
    ring[r + 1] = ring[r]
    ring[r] = reader
    return copy_in(i, d, pass_, at, hm, hb, lat, bw, ht, free, D)


@njit(cache=True)
def refetch(i, d, reader, at, hm, hb, lat, bw, ring, ht, free, end, D):
    """Op ``i``'s parameters again before its backward, picked at ``at`` (task ``reader``): a copy
    (:func:`home_copy`), or, for the forward's last two readers on ``d``, the forward's copy kept: none made (0
    returned, zero-length at ``at``), the side stream waiting for the reader two before all the same. ``ht[6, i]``
    is 0 before the step where plans keep copies, -1 where none is kept (a plan's ``home_copies`` "again"), and 1
    once this copy is kept."""
    f = 2 * d  # the forward's window on d: its last readers' task ids are their op indices
    if ht[6, i] < 0.0 or (ring[f] != i and ring[f + 1] != i):
        return home_copy(i, d, 1, reader, at, hm, hb, lat, bw, ring, ht, free, end, D)
    r = 2 * (D + d)
    lk = D + hm[i] * D + d
    if ring[r + 1] >= 0 and end[ring[r + 1]] > free[lk]:
        free[lk] = end[ring[r + 1]]
    ring[r + 1] = ring[r]
    ring[r] = reader
    ht[2, i] = at
    ht[3, i] = at
    ht[6, i] = 1.0
    return 0.0


@njit(cache=True)
def copy_in(i, d, pass_, at, hm, hb, lat, bw, ht, free, D):
    """The copy of op ``i``'s parameters from their home to ``d`` for pass ``pass_``, issued at ``at`` outside the
    window (for a checkpointed block's recompute, pass 1, :mod:`envs.sim.kernel_checkpointing`); returns its end."""
    c = hm[i]
    lk = D + c * D + d
    s = at if at > free[lk] else free[lk]
    e = s + (lat[c, d] + hb[i] / bw[c, d])
    free[lk] = e
    ht[2 * pass_, i] = s
    ht[2 * pass_ + 1, i] = e
    return e


@njit(cache=True)
def send_home(i, d, kernel_end, hm, hg, lat, bw, ht, free, D):
    """Op ``i``'s gradient (``hg[i]`` bytes) copied home once its backward kernel ends (on no thread); returns the
    copy's end. Frozen parameters' copies send none: zero-length at the kernel's end."""
    if hg[i] <= 0:
        ht[4, i] = kernel_end
        ht[5, i] = kernel_end
        return kernel_end
    c = hm[i]
    lk = D + d * D + c
    s = kernel_end if kernel_end > free[lk] else free[lk]
    e = s + (lat[d, c] + hg[i] / bw[d, c])
    free[lk] = e
    ht[4, i] = s
    ht[5, i] = e
    return e


@njit(cache=True)
def no_backward(n, hm, grad, ht, end):
    """An offloaded op without a backward: its second copy and gradient zero-length at its forward's end."""
    for i in range(n):
        if hm[i] >= 0 and not grad[i]:
            for r in range(2, 6):
                ht[r, i] = end[i]


@njit(cache=True)
def home_events(device_index, p, n, hm, hb, hg, grad, ht, start, end, at, ab, ft, fb, na, nf):
    """Append the home copies' allocations and frees on ``device_index`` (:func:`envs.sim.homes.home_memory_events`;
    ``hg``: the bytes of each copy's gradient) to the sweep's arrays; returns ``(na, nf)``."""
    for i in range(n):
        if hm[i] < 0 or p[i] != device_index:
            continue
        b = int(hb[i])
        kept = ht[6, i] > 0.0  # the forward's copy, to the backward's end: none made again
        r = b if grad[i] and not kept else 0  # the copy for the backward
        g = int(hg[i]) if grad[i] else 0  # the gradient (none for frozen parameters)
        at[na] = ht[0, i]
        ab[na] = b
        at[na + 1] = ht[2, i]
        ab[na + 1] = r
        at[na + 2] = start[2 * n - 1 - i]
        ab[na + 2] = g
        na += 3
        ft[nf] = end[2 * n - 1 - i] if kept else end[i]
        fb[nf] = b
        ft[nf + 1] = end[2 * n - 1 - i]
        fb[nf + 1] = r
        ft[nf + 2] = ht[5, i]
        fb[nf + 2] = g
        nf += 3
    return na, nf


@njit(cache=True)
def host_step_chain(n, hm, hmc, ht, pair_o, pair_r, param_b, call, update_bw, done, t_end):
    """The offloaded ops' parameters stepped during the backward (:func:`envs.sim.homes.host_steps`): ``done[o]``
    set to when op ``o``'s last gradient copy home ends (-1 for an op not stepped so), then the worker's batches in
    that order (ties: op order): each takes every op complete when it starts, one call per home (its fixed cost
    ``call[home]`` once, then each op's passes); returns when ``backward()`` does, the later of ``t_end`` and the
    last step's end."""
    for i in range(n):
        done[i] = -1.0
    for j in range(pair_o.shape[0]):
        o = pair_o[j]
        r = pair_r[j]
        if hm[o] >= 0 and param_b[o] > 0 and hmc[r] >= 0 and ht[5, r] > done[o]:  # frozen: no step
            done[o] = ht[5, r]
    called = np.full(call.shape[0], -1.0)  # per home: the start of the batch whose call has begun there
    t = 0.0
    taken = -1.0
    for o in np.argsort(done, kind="mergesort"):
        if done[o] < 0:
            continue
        if done[o] > taken:  # not complete when the worker took its batch: the next batch, from when it is
            taken = done[o] if done[o] > t else t
            t = taken
        c = hm[o]
        fixed = 0.0
        if called[c] != taken:
            called[c] = taken
            fixed = call[c]
        t += fixed + update_time_s(param_b[o], 0.0, update_bw[c])
    return t if t > t_end else t_end
