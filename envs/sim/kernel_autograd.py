"""Autograd's backward compiled: one ``backward()`` call of :mod:`envs.sim.autograd`, same tasks, times, tie-breaks.

The call is simulated in time order over autograd's threads (thread ``d`` is GPU
``d``'s worker, thread ``D`` the calling thread), with two heaps per thread in one
flat array each (:mod:`envs.sim.compiled`): tasks whose dependencies are done,
by ``(ready time, task id)``, and tasks ready by the thread's clock, by
``(-sequence number, task id)``; ``O((n + edges) log n)``. Task ids are those of
:mod:`envs.sim.tasks`.
"""

from __future__ import annotations

import numpy as np

from envs.sim.compiled import heap_pop, heap_push, njit
from envs.sim.kernel_checkpointing import recompute
from envs.sim.kernel_homes import refetch, send_home


@njit(cache=True)
def _thread_of(task, n, D, p, host):
    """The thread that runs ``task``: its op's device's (a gradient copy: the device its gradient comes from)."""
    if task < 2 * n:
        d = p[2 * n - 1 - task]
    else:
        d = (task - 2 * n - n * D) % D
    return D if host[d] else d


@njit(cache=True)
def _blocking(task, n, D, p, host):
    slot = task - 2 * n - n * D
    return host[slot % D] != host[p[slot // D]]


@njit(cache=True)
def _setup(p, order, lo, hi, n, D, out_ptr, out_dst, host, grad, pend, ready, h_f, cap):
    """The call's tasks: ``pend`` (dependencies left; -1: a gradient copy that is not a task) and ``ready`` of each,
    and ``cap[th]`` the tasks each thread will queue (blocking copies and backwards)."""
    nD = n * D
    for th in range(D + 1):
        cap[th] = 0
    for pos in range(lo, hi):
        j = order[pos]
        for k in range(out_ptr[j], out_ptr[j + 1]):
            pend[2 * n + nD + j * D + p[out_dst[k]]] = -1
    for pos in range(lo, hi):
        j = order[pos]
        if not grad[j]:
            continue
        d = p[j]
        b = 2 * n - 1 - j
        pend[b] = 0
        ready[b] = h_f
        cap[D if host[d] else d] += 1
        for k in range(out_ptr[j], out_ptr[j + 1]):
            v = out_dst[k]
            if not grad[v]:
                continue
            if p[v] == d:
                pend[b] += 1
                continue
            g = 2 * n + nD + j * D + p[v]
            if pend[g] < 0:
                pend[g] = 0
                ready[g] = h_f
                pend[b] += 1
                if host[p[v]] != host[d]:
                    cap[D if host[p[v]] else p[v]] += 1
            pend[g] += 1


@njit(cache=True)
def _enqueue(task, r, th, q):
    """Task ``task`` of thread ``th`` has no dependency left from time ``r``: to the thread's waiting heap, or, if its
    clock has passed ``r`` already, straight to its ready heap (where the next dispatch would move it: the same).

    ``q``: the call's queues, ``(fut, avl, base, nf, na, clock, seq)`` (heap storage, each thread's offset into it,
    the sizes of its waiting and ready heaps, its clock; every task's sequence number).
    """
    fut, avl, base, nf, na, clock, seq = q
    if r <= clock[th]:
        na[th] = heap_push(avl[base[th] :], na[th], -float(seq[task]), task)
    else:
        nf[th] = heap_push(fut[base[th] :], nf[th], r, task)


@njit(cache=True)
def _dep_done(task, at, pend, ready, n, D, p, host, q):
    """One dependency of ``task`` done at ``at``; True once it has none left (a task on a thread is then queued)."""
    if at > ready[task]:
        ready[task] = at
    pend[task] -= 1
    if pend[task] != 0:
        return False
    if task < 2 * n or _blocking(task, n, D, p, host):
        _enqueue(task, ready[task], _thread_of(task, n, D, p, host), q)
    return True


@njit(cache=True)
def _next(q):
    """``(thread, time)`` of the next dispatch: the thread that can start a task earliest (ties: the lowest); -1 if
    none."""
    fut, avl, base, nf, na, clock, seq = q
    best = -1
    when = np.inf
    for th in range(clock.shape[0]):
        if na[th] > 0:
            start_s = clock[th]
        elif nf[th] > 0:
            start_s = fut[base[th]]
            if clock[th] > start_s:
                start_s = clock[th]
        else:
            continue
        if start_s < when:
            best = th
            when = start_s
    return best, when


@njit(cache=True)
def _take(th, when, q):
    """The task thread ``th`` runs at ``when``: the highest sequence number among those ready by then."""
    fut, avl, base, nf, na, clock, seq = q
    fb = fut[base[th] :]
    ab = avl[base[th] :]
    while nf[th] > 0 and fb[0] <= when:
        task = int(fb[1])
        nf[th] = heap_pop(fb, nf[th])
        na[th] = heap_push(ab, na[th], -float(seq[task]), task)
    task = int(ab[1])
    na[th] = heap_pop(ab, na[th])
    return task


@njit(cache=True)
def _copy_back(task, now, n, D, p, host, hc, tbytes, lat, bw, free, start, end):
    """A blocking gradient copy between a GPU and the host, picked at ``now`` by its thread; returns its end."""
    slot = task - 2 * n - n * D
    u = slot // D
    ed = slot - u * D
    d = p[u]
    lk = D + ed * D + d
    if host[d]:  # GPU ed -> host, on ed's worker, once its stream has drained
        s = now
        g = ed
    else:  # host ed -> GPU d, on the calling thread, staged from pageable memory first
        s = now + (hc[0, ed] + tbytes[slot] * hc[1, ed])
        g = d
    if free[g] > s:
        s = free[g]
    if free[lk] > s:
        s = free[lk]
    e = s + (lat[ed, d] + tbytes[slot] / bw[ed, d])
    free[lk] = e
    free[g] = e
    start[task] = s
    end[task] = e
    return e


@njit(cache=True)
def _run(j, now, D, p, host, hc, issue_b, bwd_t, free, clock, hd, he):
    """``bwd j`` picked at ``now`` by its thread: ``(thread done, start, end, host op's device, its end)``.

    A host op runs on the calling thread, slowed where GPU workers are busy beside it; a GPU's worker issues its
    kernel, slowed where the host runs an op (``(hd, he)``), and the kernel queues on the stream.
    """
    d = p[j]
    if host[d]:
        run_s = bwd_t[j, d]
        busy = 0.0
        for w in range(D):
            o = clock[w] if clock[w] < now + run_s else now + run_s
            if o - now > 0.0:
                busy += o - now
        e = now + run_s + hc[2, d] * busy
        return e, now, e, d, e
    iss = issue_b[j, d]
    o = he if he < now + iss else now + iss
    done = now + iss + hc[3, hd] * (o - now if o - now > 0.0 else 0.0)
    s = done if done > free[d] else free[d]
    e = s + bwd_t[j, d]
    free[d] = e
    return done, s, e, hd, he


@njit(cache=True)
def _released(
    j, done, e, n, D, p, host, in_ptr, in_src, grad, lat, bw, tbytes, gpend, pend, ready, free, start, end, q, t_end
):
    """What ``bwd j`` (issued at ``done``, its kernel ending at ``e``) makes ready: its producers' backwards on its
    device, the gradient copies to the others (a peer or host -> host copy runs at once, on no thread). Returns
    t_end."""
    d = p[j]
    for k in range(in_ptr[j], in_ptr[j + 1]):
        u = in_src[k]
        if not grad[u]:
            continue
        bu = 2 * n - 1 - u
        if p[u] == d:
            _dep_done(bu, done, pend, ready, n, D, p, host, q)
            continue
        slot = u * D + d
        g = 2 * n + n * D + slot
        blocking = host[d] != host[p[u]]
        if not _dep_done(g, done if blocking else e, pend, ready, n, D, p, host, q) or blocking:
            continue
        lk = D + d * D + p[u]
        gs = ready[g] if ready[g] > free[lk] else free[lk]
        ge = gs + (lat[d, p[u]] + tbytes[slot] / bw[d, p[u]])
        free[lk] = ge
        start[g] = gs
        end[g] = ge
        if ge > t_end:
            t_end = ge
        gpend[slot] = 0
        _dep_done(bu, ge, pend, ready, n, D, p, host, q)
    return t_end


@njit(cache=True)
def eager_backward(
    p,
    order,
    lo,
    hi,
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
):
    """One ``backward()`` call over ``order[lo:hi]`` made at host time ``h``; returns ``(h, t_end)`` (see
    :mod:`envs.sim.eager`).

    ``hc``: :class:`envs.sim.cost.HostCosts` as a ``[4, D]`` array; ``fut``/``avl``: heap storage (``2 * ntask`` floats
    each); ``pend``/``ready``: per task id; ``homes``: ``(hm, hb, ring, ht, ck, rc, ..., hg)``
    (:mod:`envs.sim.kernel_homes`, :mod:`envs.sim.kernel_checkpointing`; ``hg``: the bytes of each copy's gradient
    sent home).
    """
    hm, hb, ring, ht, ck, rc, hg = homes[0], homes[1], homes[2], homes[3], homes[4], homes[5], homes[8]
    sent = 0.0  # the last gradient copy home: backward() returns after it
    h_f = h
    NT = D + 1
    cap = np.zeros(NT, dtype=np.int64)
    _setup(p, order, lo, hi, n, D, out_ptr, out_dst, host, grad, pend, ready, h_f, cap)
    base = np.zeros(NT, dtype=np.int64)
    for th in range(1, NT):
        base[th] = base[th - 1] + 2 * cap[th - 1]
    clock = np.full(NT, h_f)
    q = (fut, avl, base, np.zeros(NT, dtype=np.int64), np.zeros(NT, dtype=np.int64), clock, seq)
    for pos in range(lo, hi):
        b = 2 * n - 1 - order[pos]
        if grad[order[pos]] and pend[b] == 0:
            _enqueue(b, ready[b], _thread_of(b, n, D, p, host), q)
    hd = 0
    he = -np.inf
    while True:
        th, now = _next(q)
        if th < 0:
            break
        task = _take(th, now, q)
        if task >= 2 * n:  # a blocking gradient copy between a GPU and the host
            e = _copy_back(task, now, n, D, p, host, hc, tbytes, lat, bw, free, start, end)
            clock[th] = e
            if e > t_end:
                t_end = e
            slot = task - 2 * n - n * D
            gpend[slot] = 0
            _dep_done(2 * n - 1 - slot // D, e, pend, ready, n, D, p, host, q)
            continue
        j = 2 * n - 1 - task
        if ck[j] >= 0:  # its checkpointed block's forward again first (envs.sim.checkpointing)
            now = recompute(j, p[j], now, order, lo, hi, ck, rc, host, free, hm, hb, lat, bw, ht, D)
        # its parameters copied again from their home first (envs.sim.homes; in a checkpointed block, its recompute did)
        if hm[j] >= 0 and ck[j] < 0:
            fetched = refetch(j, p[j], task, now, hm, hb, lat, bw, ring, ht, free, end, D)
            if fetched > free[p[j]]:
                free[p[j]] = fetched
        done, s, e, hd, he = _run(j, now, D, p, host, hc, issue_b, bwd_t, free, clock, hd, he)
        clock[th] = done
        start[task] = s
        end[task] = e
        if e > t_end:
            t_end = e
        if hm[j] >= 0:
            ge = send_home(j, p[j], e, hm, hg, lat, bw, ht, free, D)
            if ge > sent:
                sent = ge
            if ge > t_end:
                t_end = ge
        t_end = _released(
            j,
            done,
            e,
            n,
            D,
            p,
            host,
            in_ptr,
            in_src,
            grad,
            lat,
            bw,
            tbytes,
            gpend,
            pend,
            ready,
            free,
            start,
            end,
            q,
            t_end,
        )
    t_end = silent_tasks(p, order, lo, hi, n, D, out_ptr, out_dst, grad, pend, gpend, gready, start, end, h_f, t_end)
    return max(h_f, clock.max(), sent), t_end


@njit(cache=True)
def silent_tasks(p, order, lo, hi, n, D, out_ptr, out_dst, grad, pend, gpend, gready, start, end, h_f, t_end):
    """Times of what runs nothing, in reverse order: backwards of ops without one, and copies of gradients no consumer
    sends."""
    nD = n * D
    for pos in range(hi - 1, lo - 1, -1):
        j = order[pos]
        d = p[j]
        s = h_f
        for k in range(out_ptr[j], out_ptr[j + 1]):
            v = out_dst[k]
            ev = end[2 * n - 1 - v]
            if ev > s:
                s = ev
            if p[v] != d:
                slot = j * D + p[v]
                if gpend[slot] == 1:  # not sent (yet): the latest consumer there
                    gpend[slot] = 2
                    gready[slot] = 0.0
                if gpend[slot] == 2 and ev > gready[slot]:
                    gready[slot] = ev
        for k in range(out_ptr[j], out_ptr[j + 1]):
            if p[out_dst[k]] != d:
                slot = j * D + p[out_dst[k]]
                if gpend[slot] == 2:
                    gpend[slot] = 0
                    start[2 * n + nD + slot] = gready[slot]
                    end[2 * n + nD + slot] = gready[slot]
        if not grad[j]:
            start[2 * n - 1 - j] = s
            end[2 * n - 1 - j] = s
            if s > t_end:
                t_end = s
    return t_end
