"""The eager executor model compiled: the host thread's issue of :mod:`envs.sim.eager`, same tasks, times, tie-breaks.

The forward (:func:`eager_forward`) is one pass over the issue order,
``O(n + edges)``: each op's inputs copied in before it, then the op issued to
its device's stream or run on the host. :func:`eager_schedule` runs a placement's
host program: forward segments, and ``backward()`` calls simulated by
:mod:`envs.sim.kernel_autograd`. Task ids are those of :mod:`envs.sim.tasks`.
"""

from __future__ import annotations

from envs.sim.compiled import njit
from envs.sim.kernel_autograd import eager_backward
from envs.sim.kernel_homes import home_copy, no_backward


@njit(cache=True)
def count_transfers(p, n, D, out_ptr, out_dst, out_eb, tcount, tbytes, gpend):
    """Fill ``tcount``/``tbytes`` (consumers of ``u`` on remote ``d``, largest edge) and zero ``gpend`` of every used
    slot."""
    for u in range(n):
        pu = p[u]
        for k in range(out_ptr[u], out_ptr[u + 1]):
            d = p[out_dst[k]]
            if d != pu:
                slot = u * D + d
                if tcount[slot] == 0:
                    gpend[slot] = 0
                tcount[slot] += 1
                if out_eb[k] > tbytes[slot]:
                    tbytes[slot] = out_eb[k]


@njit(cache=True)
def eager_forward(
    p,
    order,
    lo,
    hi,
    n,
    D,
    in_ptr,
    in_src,
    fwd_t,
    lat,
    bw,
    host,
    issue_f,
    hc,
    tbytes,
    gpend,
    seq,
    counter,
    free,
    start,
    end,
    h,
    t_end,
    homes,
):
    """Issue the forwards of ``order[lo:hi]`` from host time ``h``; returns ``(h, t_end, counter)``.

    ``seq[task]``: the autograd sequence number of each op's backward and each copy's gradient copy, from ``counter``.
    ``hc``: :class:`envs.sim.cost.HostCosts` as a ``[4, D]`` array (staging latency and seconds per byte, contention).
    ``homes``: ``(hm, hb, ring, ht, ck, rc)`` of :mod:`envs.sim.kernel_homes` and
    :mod:`envs.sim.kernel_checkpointing`.
    """
    hm, hb, ring, ht = homes[0], homes[1], homes[2], homes[3]
    nD = n * D
    stage_lat = hc[0]
    stage_spb = hc[1]
    for pos in range(lo, hi):
        i = order[pos]
        b = p[i]
        for k in range(in_ptr[i], in_ptr[i + 1]):
            u = in_src[k]
            a = p[u]
            if a == b:
                continue
            slot = u * D + b
            if gpend[slot] != 0:
                continue
            gpend[slot] = 1
            seq[2 * n + nD + slot] = counter
            counter += 1
            # the copy before its first consumer on b (kept inline: a call here costs the forward ~8%)
            if host[a] and not host[b]:  # staged into pinned memory on the host thread
                h += stage_lat[a] + tbytes[slot] * stage_spb[a]
            lk = D + a * D + b
            s = free[lk]
            if h > s:
                s = h
            if host[a] and host[b]:
                e = s + (lat[a, b] + tbytes[slot] / bw[a, b])
                h = e
            elif host[a]:
                if free[b] > s:
                    s = free[b]
                e = s + (lat[a, b] + tbytes[slot] / bw[a, b])
                free[b] = e
            elif host[b]:
                if free[a] > s:
                    s = free[a]
                e = s + (lat[a, b] + tbytes[slot] / bw[a, b])
                free[a] = e
                h = e
            else:
                if free[a] > s:
                    s = free[a]
                if free[b] > s:
                    s = free[b]
                e = s + (lat[a, b] + tbytes[slot] / bw[a, b])
                free[a] = e
                free[b] = e
            free[lk] = e
            start[2 * n + slot] = s
            end[2 * n + slot] = e
            if e > t_end:
                t_end = e
        if hm[i] >= 0:  # its parameters' copy from their home: the stream waits for it (envs.sim.homes)
            fetched = home_copy(i, b, 0, i, h, hm, hb, lat, bw, ring, ht, free, end, D)
            if fetched > free[b]:
                free[b] = fetched
        seq[2 * n - 1 - i] = counter
        counter += 1
        run_s = fwd_t[i, b]
        if host[b]:
            s = h if h > free[b] else free[b]
            e = s + run_s
            h = e
            free[b] = e
        else:
            h += issue_f[i, b]
            s = h if h > free[b] else free[b]
            e = s + run_s
            free[b] = e
        start[i] = s
        end[i] = e
        if e > t_end:
            t_end = e
    return h, t_end, counter


@njit(cache=True)
def eager_schedule(
    p,
    order,
    segs,
    n,
    D,
    out_ptr,
    out_dst,
    out_eb,
    in_ptr,
    in_src,
    fwd_t,
    bwd_t,
    lat,
    bw,
    host,
    issue_f,
    issue_b,
    grad,
    hc,
    tcount,
    tbytes,
    gpend,
    gready,
    seq,
    pend,
    ready,
    fut,
    avl,
    free,
    start,
    end,
    homes,
):
    """The eager schedule of one placement in issue ``order`` (see :mod:`envs.sim.eager`).

    ``segs`` (``[S, 3]``: kind, lo, hi) is the host thread's program over the
    positions of ``order``: kind 0 issues the forwards of ``order[lo:hi]``, kind
    1 is one ``backward()`` call over them (:func:`envs.sim.kernel_autograd.eager_backward`).
    ``gpend[slot]`` is 1 once the activation copy is made, 0 again once its
    gradient came back. ``homes``: ``(hm, hb, ring, ht, ck, rc)`` (:mod:`envs.sim.kernel_homes`,
    :mod:`envs.sim.kernel_checkpointing`). Returns the backward end.
    """
    count_transfers(p, n, D, out_ptr, out_dst, out_eb, tcount, tbytes, gpend)
    ring = homes[2]
    for r in range(ring.shape[0]):
        ring[r] = -1
    h = 0.0
    t_end = 0.0
    counter = 0
    for q in range(segs.shape[0]):
        if segs[q, 0] == 0:
            h, t_end, counter = eager_forward(
                p,
                order,
                segs[q, 1],
                segs[q, 2],
                n,
                D,
                in_ptr,
                in_src,
                fwd_t,
                lat,
                bw,
                host,
                issue_f,
                hc,
                tbytes,
                gpend,
                seq,
                counter,
                free,
                start,
                end,
                h,
                t_end,
                homes,
            )
        else:
            h, t_end = eager_backward(
                p,
                order,
                segs[q, 1],
                segs[q, 2],
                n,
                D,
                out_ptr,
                out_dst,
                in_ptr,
                in_src,
                bwd_t,
                lat,
                bw,
                host,
                issue_b,
                grad,
                hc,
                tbytes,
                gpend,
                gready,
                seq,
                pend,
                ready,
                fut,
                avl,
                free,
                start,
                end,
                h,
                t_end,
                homes,
            )
    no_backward(n, homes[0], grad, homes[3], end)
    return t_end
