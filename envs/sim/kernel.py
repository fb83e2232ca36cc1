"""The compiled simulator kernel: the schedules of :mod:`envs.sim.schedule`, fast.

Both executor models, with the same tasks, task ids and tie-breaks as
:func:`envs.sim.schedule.schedule_reference`, but with no task graph built.
``dataflow`` (:func:`_schedule`) walks the op graph's CSR arrays and keeps one
4-ary heap ordered by ``(ready time, task id)`` plus the best newly ready task
outside it. ``eager`` (:func:`envs.sim.kernel_eager.eager_schedule`) is one pass over the
issue order for the forward and, per ``backward()`` call, autograd's threads in
time order with two heaps per thread (:mod:`envs.sim.kernel_eager`).
Task ids (``n`` ops, ``D`` devices): ``fwd i = i``,
``bwd i = 2n-1-i``, ``act (u, d) = 2n + u*D + d``, ``grad (u, d) = 2n + nD + u*D + d``.
Resources: device ``d`` is ``d``; link ``a -> b`` is ``D + a*D + b``.

The batch entry point also decides OOM exactly: a device whose static bytes
plus every allocation it will ever make fit its capacity cannot run out, and
only the others get the (sorted) memory sweep of :mod:`envs.sim.memory`.

Compiled with numba when it is installed (one core, no parallelism); otherwise
the same functions run as plain Python (correct, ~100× slower).
"""

from __future__ import annotations

import numpy as np

from envs.cluster import Cluster
from envs.sim import cost
from envs.sim.compiled import HAVE_NUMBA, heap_offer, heap_pop, heap_push, njit  # noqa: F401  (HAVE_NUMBA: re-exported)
from envs.sim.kernel_eager import eager_schedule
from envs.sim.schedule import ACT, GRAD, Schedule
from graphs.ir import OpGraph
from graphs.ops import saved_mask

# The optimizer step's time: envs.sim.cost's one formula, compiled.
_update_time_s = njit(cache=True)(cost.update_time_s)


@njit(cache=True)
def _schedule(
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
    """Schedule one placement; fills ``start``/``end`` (by task id) and ``tcount``/``tbytes``.

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
            t = ct
            ct = -1
        else:
            r = h[0]
            t = int(h[1])
            size = heap_pop(h, size)
        if t < n:
            i = t
            res = p[i]
            dur = fwd_t[i, res]
        elif t < 2 * n:
            i = 2 * n - 1 - t
            res = p[i]
            dur = bwd_t[i, res]
        elif t < 2 * n + nD:
            slot = t - 2 * n
            i = slot // D
            d = slot - i * D
            res = D + p[i] * D + d
            dur = lat[p[i], d] + tbytes[slot] / bw[p[i], d]
        else:
            slot = t - 2 * n - nD
            i = slot // D
            d = slot - i * D
            res = D + d * D + p[i]
            dur = lat[d, p[i]] + tbytes[slot] / bw[d, p[i]]
        s = r if r > free[res] else free[res]
        e = s + dur
        free[res] = e
        start[t] = s
        end[t] = e
        if e > t_end:
            t_end = e
        if t < n:  # forward done: local consumers, transfers out, own backward
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
        elif t < 2 * n:  # backward done: producers here, gradient transfers out
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
        elif t < 2 * n + nD:  # activation arrived on d
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


@njit(cache=True)
def _reset(p, n, D, out_ptr, out_dst, tcount, tbytes, free):
    for u in range(n):
        for k in range(out_ptr[u], out_ptr[u + 1]):
            slot = u * D + p[out_dst[k]]
            tcount[slot] = 0
            tbytes[slot] = 0
    for r in range(free.shape[0]):
        free[r] = 0.0


@njit(cache=True)
def _release(u, out_ptr, out_dst, end):
    """When the forward last reads op ``u``'s output: its last consumer's forward end (its own without one)."""
    r = end[u]
    for k in range(out_ptr[u], out_ptr[u + 1]):
        if end[out_dst[k]] > r:
            r = end[out_dst[k]]
    return r


@njit(cache=True)
def _peak(dev, p, n, D, act_b, grad, kept, out_ptr, out_dst, tcount, tbytes, start, end):
    """Peak live bytes on ``dev`` (without static bytes): the sweep of envs.sim.memory (``kept``: saved for
    backward)."""
    nD = n * D
    m = 0
    for i in range(n):
        if p[i] == dev:
            m += 2
    for u in range(n):
        for d in range(D):
            if tcount[u * D + d] > 0 and (d == dev or p[u] == dev):
                m += 1
    at = np.empty(m)
    ab = np.empty(m, dtype=np.int64)
    ft = np.empty(m)
    fb = np.empty(m, dtype=np.int64)
    na = 0
    nf = 0
    for i in range(n):
        if p[i] == dev:
            at[na] = start[i]
            ab[na] = act_b[i]
            na += 1
            at[na] = start[2 * n - 1 - i]
            ab[na] = act_b[i] if grad[i] else 0
            na += 1
            if kept[i]:
                ft[nf] = end[2 * n - 1 - i]
                fb[nf] = 2 * act_b[i] if grad[i] else act_b[i]
                nf += 1
            else:  # freed once its consumers have run forward; the gradient buffer at the end of its backward
                ft[nf] = _release(i, out_ptr, out_dst, end)
                fb[nf] = act_b[i]
                nf += 1
                ft[nf] = end[2 * n - 1 - i]
                fb[nf] = act_b[i] if grad[i] else 0
                nf += 1
    for u in range(n):
        for d in range(D):
            slot = u * D + d
            if tcount[slot] > 0:
                if d == dev:  # activation received here, freed when its gradient has left
                    at[na] = start[2 * n + slot]
                    ab[na] = tbytes[slot]
                    na += 1
                    ft[nf] = end[2 * n + nD + slot] if kept[u] else _release(u, out_ptr, out_dst, end)
                    fb[nf] = tbytes[slot]
                    nf += 1
                elif p[u] == dev:  # gradient received here, freed when bwd u ends
                    at[na] = start[2 * n + nD + slot]
                    ab[na] = tbytes[slot] if grad[u] else 0
                    na += 1
                    ft[nf] = end[2 * n - 1 - u]
                    fb[nf] = tbytes[slot] if grad[u] else 0
                    nf += 1
    ao = np.argsort(at[:na])
    fo = np.argsort(ft[:nf])
    live = 0
    peak = 0
    j = 0
    for a in range(na):
        t = at[ao[a]]
        while j < nf and ft[fo[j]] <= t:
            live -= fb[fo[j]]
            j += 1
        live += ab[ao[a]]
        if live > peak:
            peak = live
    return peak


@njit(cache=True)
def _batch(
    P,
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
    static_b,
    act_b,
    param_b,
    cap,
    launch,
    membw,
    times,
    oom,
    eager,
    orders,
    host,
    issue_f,
    issue_b,
    segs,
    nseg,
    grad,
    hc,
    want_over,
    over,
    kept,
):
    """Step time and OOM flag of every row of ``P``.

    ``eager``: use :func:`eager_schedule` with issue order ``orders[k]`` (or ``orders[0]``
    for every row when ``orders`` has one row) and host program
    ``segs[k, :nseg[k]]`` (or row 0's for every row); else :func:`_schedule`.
    ``want_over``: fill ``over[k]``, for an OOM row, with the largest peak over
    capacity among the devices that overflow; otherwise the check stops at the
    first overflowing device.
    """
    nD = n * D
    pend_f = np.zeros(n, dtype=np.int64)
    ready_f = np.zeros(n)
    pend_b = np.zeros(n, dtype=np.int64)
    ready_b = np.zeros(n)
    tcount = np.zeros(nD, dtype=np.int64)
    tbytes = np.zeros(nD, dtype=np.int64)
    gpend = np.zeros(nD, dtype=np.int64)
    gready = np.zeros(nD)
    free = np.zeros(D + D * D)
    ntask = 2 * n + 2 * nD
    seq = np.zeros(ntask, dtype=np.int64)
    pend = np.zeros(ntask, dtype=np.int64)
    ready = np.zeros(ntask)
    fut = np.empty(2 * ntask)
    avl = np.empty(2 * ntask)
    h = np.empty(2 * ntask)
    start = np.zeros(ntask)
    end = np.zeros(ntask)
    pb = np.zeros(D)
    sb = np.zeros(D, dtype=np.int64)
    ub = np.zeros(D, dtype=np.int64)
    mx = np.zeros(D, dtype=np.int64)  # each device's largest parameter (op)
    for k in range(P.shape[0]):
        p = P[k]
        if eager:
            order = orders[k] if orders.shape[0] > 1 else orders[0]
            q = k if segs.shape[0] > 1 else 0
            t_end = eager_schedule(
                p,
                order,
                segs[q, : nseg[q]],
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
            )
        else:
            t_end = _schedule(
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
            )
        any_host = False
        for d in range(D):
            pb[d] = 0.0
            sb[d] = 0
            ub[d] = 0
            mx[d] = 0
        for i in range(n):
            d = p[i]
            pb[d] += param_b[i]
            sb[d] += static_b[i]
            ub[d] += 2 * act_b[i]
            if param_b[i] > 0:
                if host[d]:
                    any_host = True
                if np.int64(param_b[i]) > mx[d]:
                    mx[d] = np.int64(param_b[i])
        upd = 0.0
        for d in range(D):
            if pb[d] > 0:
                u_s = _update_time_s(pb[d], launch[d], membw[d])
                if u_s > upd:
                    upd = u_s
        times[k] = t_end + upd
        # upper bound on live bytes: every allocation at once
        for u in range(n):
            for e in range(out_ptr[u], out_ptr[u + 1]):
                d = p[out_dst[e]]
                if d != p[u]:
                    slot = u * D + d
                    if tcount[slot] > 0 and gpend[slot] != -2:
                        gpend[slot] = -2  # counted
                        ub[d] += tbytes[slot]
                        ub[p[u]] += tbytes[slot]
        is_oom = False
        worst = 0.0  # with want_over: the largest peak / capacity over the devices that may overflow
        for d in range(D):
            if sb[d] > cap[d] and not want_over:
                is_oom = True
                break
            # at the optimizer step, its temporaries (envs.sim.cost.update_transient_bytes)
            live = sb[d] + (2 * mx[d] if any_host else np.int64(pb[d]))
            if sb[d] + ub[d] > cap[d]:
                swept = sb[d] + _peak(d, p, n, D, act_b, grad, kept, out_ptr, out_dst, tcount, tbytes, start, end)
                if swept > live:
                    live = swept
            if live > cap[d]:
                is_oom = True
                if live / cap[d] > worst:
                    worst = live / cap[d]
                if not want_over:
                    break
        oom[k] = is_oom
        over[k] = worst
        _reset(p, n, D, out_ptr, out_dst, tcount, tbytes, free)


class KernelData:
    """Per-(graph, cluster) arrays in the layout the kernel wants.

    Built from plain data: the graph and cluster, the ``[num_ops, num_devices]``
    op times and the per-op byte counts of :mod:`envs.sim.cost`, the executor
    model (``"eager"`` or ``"dataflow"``) and, for eager, the host program
    ``segments`` over issue positions (:func:`envs.microbatch.issue_segments`).
    """

    def __init__(
        self,
        g: OpGraph,
        c: Cluster,
        fwd_s: np.ndarray,
        bwd_s: np.ndarray,
        static_bytes: np.ndarray,
        act_bytes: np.ndarray,
        executor: str,
        segments: np.ndarray | None = None,
        grad: np.ndarray | None = None,
        issue: tuple[np.ndarray, np.ndarray] | None = None,
        host_costs: cost.HostCosts | None = None,
        kept: np.ndarray | None = None,
    ) -> None:
        self.n, self.D = g.num_ops, c.num_devices
        # which ops have a backward (graphs.ops.grad_mask); default all
        self.grad = np.ones(self.n, dtype=np.bool_) if grad is None else np.ascontiguousarray(grad, dtype=np.bool_)
        # which outputs autograd keeps for backward (graphs.ops.saved_mask); the others are freed after their consumers
        self.kept = np.ascontiguousarray(saved_mask(g) if kept is None else kept, dtype=np.bool_)
        # the host thread's program (eager): one forward then one backward, unless given
        self.segs = np.ascontiguousarray(
            [[0, 0, self.n], [1, 0, self.n]] if segments is None else segments, dtype=np.int64
        ).reshape(-1, 3)
        self.cluster = c
        out_ptr, out_dst, out_eid = g.out_csr
        in_ptr, in_src, _ = g.in_csr
        self.out_ptr = out_ptr.astype(np.int64)
        self.out_dst = out_dst.astype(np.int64)
        self.out_eb = g.edge_bytes[out_eid].astype(np.int64)
        self.in_ptr = in_ptr.astype(np.int64)
        self.in_src = in_src.astype(np.int64)
        self.fwd_t = np.ascontiguousarray(fwd_s)
        self.bwd_t = np.ascontiguousarray(bwd_s)
        self.lat = np.ascontiguousarray(c.latency_s, dtype=np.float64)
        self.bw = np.ascontiguousarray(c.bandwidth_bytes_per_s, dtype=np.float64)
        self.static_b = np.asarray(static_bytes).astype(np.int64)
        self.act_b = np.asarray(act_bytes).astype(np.int64)
        self.param_b = g.param_bytes.astype(np.float64)
        self.cap = c.memory_bytes.astype(np.float64)
        self.launch = c.launch_overhead_s.astype(np.float64)
        self.membw = c.mem_bw_bytes_per_s.astype(np.float64)
        self.host = np.asarray([k == "cpu" for k in c.kinds], dtype=np.bool_)
        # host seconds issuing each op's forward / backward on each device (envs.sim.cost.issue_times)
        if issue is None:
            issue = cost.issue_times(g, c, self.fwd_t)
        self.issue_f = np.ascontiguousarray(issue[0], dtype=np.float64)
        self.issue_b = np.ascontiguousarray(issue[1], dtype=np.float64)
        # the host's staging copies and contention (envs.sim.cost.host_costs), as one [4, D] array
        self.hc = np.ascontiguousarray(
            np.stack(cost.host_costs(c) if host_costs is None else host_costs), dtype=np.float64
        )
        self.eager = executor == "eager"
        self.node_order = np.arange(self.n, dtype=np.int64)[None, :]

    def update_s(self, op_devices: np.ndarray) -> np.ndarray:
        """Optimizer-step seconds per device under ``op_devices`` (:func:`envs.sim.cost.update_times_s`)."""
        return cost.update_times_s(np.bincount(op_devices, weights=self.param_b, minlength=self.D), self.cluster)

    def _orders(self, order: np.ndarray | None) -> np.ndarray:
        if order is None:
            return self.node_order
        return np.ascontiguousarray(np.atleast_2d(order), dtype=np.int64)

    def _programs(self, programs: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        """Host programs as a padded ``[R, S, 3]`` array and their lengths (default: this data's own, shared)."""
        if programs is None:
            return self.segs[None], np.array([len(self.segs)], dtype=np.int64)
        S = max(len(s) for s in programs)
        out = np.zeros((len(programs), S, 3), dtype=np.int64)
        for k, s in enumerate(programs):
            out[k, : len(s)] = s
        return out, np.array([len(s) for s in programs], dtype=np.int64)

    def run_batch(
        self,
        P: np.ndarray,
        order: np.ndarray | None = None,
        programs: list[np.ndarray] | None = None,
        over: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``order``: None (node order), one issue order for every row, or one per row.

        ``programs``: one host program per row (eager; default this data's own for every row).
        ``over``: an array to fill with each OOM row's worst peak / capacity (0 for the others).
        """
        P = np.ascontiguousarray(P, dtype=np.int64)
        K = P.shape[0]
        times = np.empty(K)
        oom = np.zeros(K, dtype=np.bool_)
        segs, nseg = self._programs(programs)
        _batch(
            P,
            self.n,
            self.D,
            self.out_ptr,
            self.out_dst,
            self.out_eb,
            self.in_ptr,
            self.in_src,
            self.fwd_t,
            self.bwd_t,
            self.lat,
            self.bw,
            self.static_b,
            self.act_b,
            self.param_b,
            self.cap,
            self.launch,
            self.membw,
            times,
            oom,
            self.eager,
            self._orders(order),
            self.host,
            self.issue_f,
            self.issue_b,
            segs,
            nseg,
            self.grad,
            self.hc,
            over is not None,
            over if over is not None else np.zeros(K),
            self.kept,
        )
        return times, oom

    def schedule(
        self, op_devices: np.ndarray, order: np.ndarray | None = None, program: np.ndarray | None = None
    ) -> Schedule:
        n, D = self.n, self.D
        nD = n * D
        p = np.ascontiguousarray(op_devices, dtype=np.int64)
        ntask = 2 * n + 2 * nD
        start = np.zeros(ntask)
        end = np.zeros(ntask)
        tcount = np.zeros(nD, dtype=np.int64)
        tbytes = np.zeros(nD, dtype=np.int64)
        if self.eager:
            t_end = eager_schedule(
                p,
                self._orders(order)[0],
                self.segs if program is None else np.ascontiguousarray(program, dtype=np.int64),
                n,
                D,
                self.out_ptr,
                self.out_dst,
                self.out_eb,
                self.in_ptr,
                self.in_src,
                self.fwd_t,
                self.bwd_t,
                self.lat,
                self.bw,
                self.host,
                self.issue_f,
                self.issue_b,
                self.grad,
                self.hc,
                tcount,
                tbytes,
                np.zeros(nD, dtype=np.int64),
                np.zeros(nD),
                np.zeros(ntask, dtype=np.int64),
                np.zeros(ntask, dtype=np.int64),
                np.zeros(ntask),
                np.empty(2 * ntask),
                np.empty(2 * ntask),
                np.zeros(D + D * D),
                start,
                end,
            )
        else:
            t_end = _schedule(
                p,
                n,
                D,
                self.out_ptr,
                self.out_dst,
                self.out_eb,
                self.in_ptr,
                self.in_src,
                self.fwd_t,
                self.bwd_t,
                self.lat,
                self.bw,
                np.zeros(n, dtype=np.int64),
                np.zeros(n),
                np.zeros(n, dtype=np.int64),
                np.zeros(n),
                tcount,
                tbytes,
                np.zeros(nD, dtype=np.int64),
                np.zeros(nD),
                np.zeros(D + D * D),
                np.empty(2 * ntask),
                start,
                end,
            )
        slots = np.flatnonzero(tcount > 0)
        u, d = slots // D, slots % D
        both = lambda a, b: np.concatenate([a, b])  # noqa: E731
        bwd_ids = 2 * n - 1 - np.arange(n)
        return Schedule(
            op_devices=p.astype(np.int32),
            fwd_start_s=start[:n].copy(),
            fwd_end_s=end[:n].copy(),
            bwd_start_s=start[bwd_ids],
            bwd_end_s=end[bwd_ids],
            xfer_kind=both(np.full(len(slots), ACT, dtype=np.int8), np.full(len(slots), GRAD, dtype=np.int8)),
            xfer_op=both(u, u),
            xfer_src=both(p[u], d),
            xfer_dst=both(d, p[u]),
            xfer_bytes=both(tbytes[slots], np.where(self.grad[u], tbytes[slots], 0)),
            xfer_start_s=both(start[2 * n + slots], start[2 * n + nD + slots]),
            xfer_end_s=both(end[2 * n + slots], end[2 * n + nD + slots]),
            backward_end_s=float(t_end),
            update_s=self.update_s(p),
        )
