"""The dataflow executor model compiled: the schedule of :mod:`envs.sim.dataflow`, with the same tasks and tie-breaks.

No task graph is built: :func:`dataflow_schedule` walks the op graph's CSR arrays
and keeps one 4-ary heap (:mod:`envs.sim.compiled`) ordered by ``(ready time,
task id)`` plus the best newly ready task outside it. Task ids are those of
:mod:`envs.sim.tasks`; resources: device ``d`` is ``d``, link ``a -> b`` is
``D + a*D + b``.
"""

from __future__ import annotations

from envs.sim.compiled import heap_offer, heap_pop, njit


@njit(cache=True)
def dataflow_schedule(
    p,
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
    pend_f,
    ready_f,
    pend_b,
    ready_b,
    tcount,
    tbytes,
    gpend,
    gready,
    free,
    h,
    start,
    end,
):
    """The dataflow schedule of one placement ``p``; fills ``start``/``end`` (by task id) and ``tcount``/``tbytes``.

    ``tcount[u*D+d]`` is the number of consumers of ``u`` on remote device ``d``
    (0: no transfer). Workspaces must come in zeroed (``tcount``, ``tbytes``,
    ``free``); everything else is initialised here. Returns the backward end.
    """
    nD = n * D
    for i in range(n):
        pend_f[i] = in_ptr[i + 1] - in_ptr[i]
        ready_f[i] = 0.0
        pend_b[i] = 1
        ready_b[i] = 0.0
    for u in range(n):
        pu = p[u]
        for k in range(out_ptr[u], out_ptr[u + 1]):
            d = p[out_dst[k]]
            if d == pu:
                pend_b[u] += 1
            else:
                slot = u * D + d
                if tcount[slot] == 0:
                    pend_b[u] += 1
                    gpend[slot] = 0
                tcount[slot] += 1
                if out_eb[k] > tbytes[slot]:
                    tbytes[slot] = out_eb[k]
    size = 0
    ck = 0.0
    ct = -1
    for i in range(n):
        if pend_f[i] == 0:
            size, ck, ct = heap_offer(h, size, ck, ct, 0.0, i)
    t_end = 0.0
    while size > 0 or ct >= 0:
        if ct >= 0 and (size == 0 or ck < h[0] or (ck == h[0] and ct < h[1])):
            r = ck
            task = ct
            ct = -1
        else:
            r = h[0]
            task = int(h[1])
            size = heap_pop(h, size)
        if task < n:
            i = task
            res = p[i]
            dur = fwd_t[i, res]
        elif task < 2 * n:
            i = 2 * n - 1 - task
            res = p[i]
            dur = bwd_t[i, res]
        elif task < 2 * n + nD:
            slot = task - 2 * n
            i = slot // D
            d = slot - i * D
            res = D + p[i] * D + d
            dur = lat[p[i], d] + tbytes[slot] / bw[p[i], d]
        else:
            slot = task - 2 * n - nD
            i = slot // D
            d = slot - i * D
            res = D + d * D + p[i]
            dur = lat[d, p[i]] + tbytes[slot] / bw[d, p[i]]
        s = r if r > free[res] else free[res]
        e = s + dur
        free[res] = e
        start[task] = s
        end[task] = e
        if e > t_end:
            t_end = e
        if task < n:  # forward done: local consumers, transfers out, own backward
            pi = p[i]
            for k in range(out_ptr[i], out_ptr[i + 1]):
                v = out_dst[k]
                d = p[v]
                if d == pi:
                    if e > ready_f[v]:
                        ready_f[v] = e
                    pend_f[v] -= 1
                    if pend_f[v] == 0:
                        size, ck, ct = heap_offer(h, size, ck, ct, ready_f[v], v)
                else:
                    slot = i * D + d
                    if gpend[slot] == 0:  # first consumer on d: send once
                        gpend[slot] = tcount[slot]  # consumers whose gradient it waits for
                        gready[slot] = 0.0
                        size, ck, ct = heap_offer(h, size, ck, ct, e, 2 * n + slot)
            if e > ready_b[i]:
                ready_b[i] = e
            pend_b[i] -= 1
            if pend_b[i] == 0:
                size, ck, ct = heap_offer(h, size, ck, ct, ready_b[i], 2 * n - 1 - i)
        elif task < 2 * n:  # backward done: producers here, gradient transfers out
            pi = p[i]
            for k in range(in_ptr[i], in_ptr[i + 1]):
                u = in_src[k]
                if p[u] == pi:
                    if e > ready_b[u]:
                        ready_b[u] = e
                    pend_b[u] -= 1
                    if pend_b[u] == 0:
                        size, ck, ct = heap_offer(h, size, ck, ct, ready_b[u], 2 * n - 1 - u)
                else:
                    slot = u * D + pi
                    if e > gready[slot]:
                        gready[slot] = e
                    gpend[slot] -= 1
                    if gpend[slot] == 0:
                        size, ck, ct = heap_offer(h, size, ck, ct, gready[slot], 2 * n + nD + slot)
        elif task < 2 * n + nD:  # activation arrived on d
            for k in range(out_ptr[i], out_ptr[i + 1]):
                v = out_dst[k]
                if p[v] == d:
                    if e > ready_f[v]:
                        ready_f[v] = e
                    pend_f[v] -= 1
                    if pend_f[v] == 0:
                        size, ck, ct = heap_offer(h, size, ck, ct, ready_f[v], v)
        else:  # gradient arrived back on p[i]
            if e > ready_b[i]:
                ready_b[i] = e
            pend_b[i] -= 1
            if pend_b[i] == 0:
                size, ck, ct = heap_offer(h, size, ck, ct, ready_b[i], 2 * n - 1 - i)
    return t_end
