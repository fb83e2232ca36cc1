"""The memory rule compiled: the peak sweep of :mod:`envs.sim.memory` and the out-of-memory check, exact.

:func:`over_capacity` decides OOM exactly without sweeping every device: a
device whose static bytes plus every allocation it will ever make fit its
capacity cannot run out, and only the others get the (sorted) sweep of
:func:`peak_live_bytes`. The optimizer step (torch's fused Adam, in place) adds
nothing beside the static state; a parameter's gradient is allocated at its owner's backward. Bytes are
integers, so the kernel and the reference agree bit for bit.
"""

from __future__ import annotations

import numpy as np

from envs.sim.compiled import njit
from envs.sim.kernel_checkpointing import block_ends, block_output_free, held_as_input
from envs.sim.kernel_homes import home_events


@njit(cache=True)
def release_time(u, out_ptr, out_dst, end):
    """When the forward last reads op ``u``'s output: its last consumer's forward end (its own without one)."""
    r = end[u]
    for k in range(out_ptr[u], out_ptr[u + 1]):
        if end[out_dst[k]] > r:
            r = end[out_dst[k]]
    return r


@njit(cache=True)
def peak_live_bytes(device_index, p, n, D, act_b, grad, keep, out_ptr, out_dst, tcount, tbytes, start, end, homes):
    """Peak live bytes on ``device_index`` (without static bytes): the sweep of :mod:`envs.sim.memory` (``kept``: saved
    for backward; ``homes``: ``(hm, hb, ring, ht, ck, rc, owner_hm, param_b, hg)``, the home copies of
    :mod:`envs.sim.kernel_homes` (made for the ops ``hm >= 0``, ``hb`` bytes each, their gradients ``hg``), the
    checkpointed blocks of :mod:`envs.sim.kernel_checkpointing`, and each op's parameters' home (``owner_hm``, -1
    with the op) and bytes, whose gradient the sweep allocates at the op's backward unless they live apart;
    ``keep``: ``(kept, n0, own, rptr, ridx)``, ``n0`` the ops of one microbatch copy, whose copies' first backward
    allocates it; ``own, rptr, ridx``: :func:`graphs.ops.backward_readers`, who frees a kept output)."""
    hm, hb, ht, ck, rc = homes[0], homes[1], homes[3], homes[4], homes[5]
    owner_hm, param_b = homes[6], homes[7]
    kept, n0, own, rptr, ridx = keep
    blocks = False
    for i in range(n):
        if ck[i] >= 0:
            blocks = True
            break
    last = block_ends(n, ck, end) if blocks else np.zeros(0)
    first = np.full(n0, np.inf)  # per op of copy 0: the first backward start among its copies
    for j in range(n):
        if start[2 * n - 1 - j] < first[j % n0]:
            first[j % n0] = start[2 * n - 1 - j]
    nD = n * D
    m = 0
    for i in range(n):
        if p[i] == device_index:
            m += 2 + (1 if owner_hm[i] < 0 else 0) + (3 if hm[i] >= 0 else 0)
            if ck[i] >= 0:  # its output again at the recompute
                m += 2
    for u in range(n):
        for d in range(D):
            if tcount[u * D + d] > 0 and (d == device_index or p[u] == device_index):
                m += 1
    at = np.empty(m)
    ab = np.empty(m, dtype=np.int64)
    ft = np.empty(m)
    fb = np.empty(m, dtype=np.int64)
    na = 0
    nf = 0
    for i in range(n):
        if p[i] == device_index:
            at[na] = start[i]
            ab[na] = act_b[i]
            na += 1
            at[na] = start[2 * n - 1 - i]
            ab[na] = act_b[i] if grad[i] else 0
            na += 1
            if owner_hm[i] < 0:  # its parameters' gradient, held to the step's end (memory.param_grad_bytes)
                at[na] = first[i % n0]
                ab[na] = param_b[i] if grad[i] else 0
                na += 1
            if kept[i] and ck[i] >= 0:  # a checkpointed block's (envs.sim.checkpointing)
                t_out, again, held_to = block_output_free(
                    i, n, ck, own, rptr, ridx, end, release_time(i, out_ptr, out_dst, end)
                )
                h_in = held_as_input(i, p[i], p, ck, out_ptr, out_dst, last)
                ft[nf] = t_out if t_out > h_in else h_in
                fb[nf] = act_b[i]
                nf += 1
                ft[nf] = end[2 * n - 1 - i]
                fb[nf] = act_b[i] if grad[i] else 0
                nf += 1
                if again:
                    at[na] = rc[2, i]
                    ab[na] = act_b[i]
                    na += 1
                    ft[nf] = held_to
                    fb[nf] = act_b[i]
                    nf += 1
            elif kept[i]:  # the output when the last backward that reads it ends; its gradient buffer at its own
                t_own = end[2 * n - 1 - i]
                t_out = t_own
                if not own[i] and rptr[i + 1] > rptr[i]:
                    t_out = -np.inf
                    for k in range(rptr[i], rptr[i + 1]):
                        if end[2 * n - 1 - ridx[k]] > t_out:
                            t_out = end[2 * n - 1 - ridx[k]]
                    if t_own < t_out:
                        t_out = t_own
                if blocks:  # held as a checkpointed block's input
                    h_in = held_as_input(i, p[i], p, ck, out_ptr, out_dst, last)
                    if h_in > t_out:
                        t_out = h_in
                ft[nf] = t_out
                fb[nf] = act_b[i]
                nf += 1
                ft[nf] = t_own
                fb[nf] = act_b[i] if grad[i] else 0
                nf += 1
            else:  # freed once its consumers have run forward; the gradient buffer at the end of its backward
                ft[nf] = release_time(i, out_ptr, out_dst, end)
                if blocks:
                    h_in = held_as_input(i, p[i], p, ck, out_ptr, out_dst, last)
                    if h_in > ft[nf]:
                        ft[nf] = h_in
                fb[nf] = act_b[i]
                nf += 1
                ft[nf] = end[2 * n - 1 - i]
                fb[nf] = act_b[i] if grad[i] else 0
                nf += 1
    for u in range(n):
        for d in range(D):
            slot = u * D + d
            if tcount[slot] > 0:
                if d == device_index:  # activation received here, freed when its gradient has left
                    at[na] = start[2 * n + slot]
                    ab[na] = tbytes[slot]
                    na += 1
                    ft[nf] = end[2 * n + nD + slot] if kept[u] else release_time(u, out_ptr, out_dst, end)
                    if blocks:
                        h_in = held_as_input(u, d, p, ck, out_ptr, out_dst, last)
                        if h_in > ft[nf]:
                            ft[nf] = h_in
                    fb[nf] = tbytes[slot]
                    nf += 1
                elif p[u] == device_index:  # gradient received here, freed when bwd u ends
                    at[na] = start[2 * n + nD + slot]
                    ab[na] = tbytes[slot] if grad[u] else 0
                    na += 1
                    ft[nf] = end[2 * n - 1 - u]
                    fb[nf] = tbytes[slot] if grad[u] else 0
                    nf += 1
    na, nf = home_events(device_index, p, n, hm, hb, homes[8], grad, ht, start, end, at, ab, ft, fb, na, nf)
    ao = np.argsort(at[:na])
    fo = np.argsort(ft[:nf])
    live = 0
    peak = 0
    j = 0
    for a in range(na):
        at_s = at[ao[a]]
        while j < nf and ft[fo[j]] <= at_s:
            live -= fb[fo[j]]
            j += 1
        live += ab[ao[a]]
        if live > peak:
            peak = live
    return peak


@njit(cache=True)
def over_capacity(p, n, D, bytes_of, cap, grad, keep, consumers, copies, start, end, want_over, ws, homes):
    """``(out of memory, worst)`` of a scheduled placement ``p`` (task times ``start``/``end``).

    ``bytes_of``: per op, ``(param_b, static_b, act_b, moved_b)`` (``moved_b``: the static bytes that live on the
    parameters' home); ``homes``: as for :func:`peak_live_bytes`; ``consumers``:
    ``(out_ptr, out_dst)``; ``copies``:
    ``(tcount, tbytes, gpend)`` of the schedule (each counted copy slot is marked -2 in ``gpend``); ``keep``:
    ``(kept, n0, own, rptr, ridx)`` (:func:`peak_live_bytes`). ``worst``: with
    ``want_over``, the largest peak / capacity over the devices that overflow (0 when it fits); without, the check
    stops at the first device that overflows. ``ws``: ``[D]`` workspaces ``(sb, ub)`` (static and upper-bound
    bytes).
    """
    param_b, static_b, act_b, moved_b = bytes_of
    hm, ck = homes[6], homes[4]  # where each op's parameters live (homes[0]: the ops their copies are made for)
    out_ptr, out_dst = consumers
    tcount, tbytes, gpend = copies
    sb, ub = ws
    for d in range(D):
        sb[d] = 0
        ub[d] = 0
    for i in range(n):
        d = p[i]
        ub[d] += 2 * act_b[i]
        if ck[i] >= 0:  # its output again at its block's recompute
            ub[d] += act_b[i]
        if homes[0][i] >= 0:  # copies made for it: for its forward, its backward and their gradient at most
            ub[d] += 2 * np.int64(homes[1][i]) + np.int64(homes[8][i])
        if hm[i] >= 0:  # the parameters' state on their home
            sb[d] += static_b[i] - moved_b[i]
            d = hm[i]
            sb[d] += moved_b[i]
        elif grad[i]:  # the gradient is allocated at the op's backward (peak_live_bytes)
            sb[d] += static_b[i] - np.int64(param_b[i])
            ub[d] += np.int64(param_b[i])
        else:
            sb[d] += static_b[i]
    # upper bound on live bytes: every allocation at once
    for u in range(n):
        for k in range(out_ptr[u], out_ptr[u + 1]):
            d = p[out_dst[k]]
            if d != p[u]:
                slot = u * D + d
                if tcount[slot] > 0 and gpend[slot] != -2:
                    gpend[slot] = -2  # counted
                    ub[d] += tbytes[slot]
                    ub[p[u]] += tbytes[slot]
    is_oom = False
    worst = 0.0
    for d in range(D):
        if sb[d] > cap[d] and not want_over:
            is_oom = True
            break
        live = sb[d]
        if sb[d] + ub[d] > cap[d]:
            swept = sb[d] + peak_live_bytes(
                d, p, n, D, act_b, grad, keep, out_ptr, out_dst, tcount, tbytes, start, end, homes
            )
            if swept > live:
                live = swept
        if live > cap[d]:
            is_oom = True
            if live / cap[d] > worst:
                worst = live / cap[d]
            if not want_over:
                break
    return is_oom, worst
