"""The eager executor model (simulator model 4), written out in plain Python: the reference the kernel is tested
against.

It models the module :func:`placer.apply` builds, as eager PyTorch runs it. One
host thread runs the FX graph node by node in an issue ``order`` (a topological
order; default node order); ``loss.backward()`` runs in autograd's engine, with
one worker thread per GPU and the calling (host) thread for the host's work.
"Host" devices are those of kind ``cpu`` (all of them run on the one host thread,
clock ``h``); every other device is one in-order GPU stream (free time
``free[d]``); links are in-order too.

**Forward**, one pass over ``order`` from ``h = 0``. Before op ``i``, for each
in-edge ``u -> i`` (in ``graph.in_csr`` order) with ``p[u] != p[i]`` whose copy
``(u, p[i])`` was not made yet, the copy is made (``dur = latency + bytes /
bandwidth`` of the link ``a = p[u] -> b = p[i]``, ``L`` its free time):

* GPU -> GPU (peer copy, ``non_blocking``: a two-way stream barrier, as
  ``copy_`` does): ``start = max(h, free[a], free[b], L)``; ``free[a] = free[b] =
  L = end``; the host does not wait;
* GPU -> host (``.to("cpu")``, synchronous): ``start = max(h, free[a], L)``;
  ``free[a] = L = end``; the host waits: ``h = end``;
* host -> GPU: the host thread first copies the tensor into a dense pinned
  buffer (:func:`envs.real.placing.staged`), ``h += stage(a, bytes)`` (the host
  device's ``stage_latency_s + bytes * stage_s_per_byte``, :func:`envs.sim.cost.host_costs`;
  0 unless measured), then the asynchronous copy: ``start = max(h, free[b], L)``;
  ``free[b] = L = end``; ``h`` unchanged;
* host -> host (another ``cpu`` device): ``start = max(h, L)``; ``h = L = end``.

Then op ``i`` runs. On a GPU the host pays the issue cost ``issue_f[i, d]``
(:func:`envs.sim.cost.issue_times`), ``h += issue``, and the kernel is enqueued:
``start = max(h, free[d])``, ``free[d] = end`` (a kernel waiting for a copy holds
back every later kernel on that stream). On the host: ``start = max(h,
free[d])``, ``h = free[d] = end``. Every op and every copy gets autograd's
*sequence number* in the order the host makes them (the copy before its first
consumer): the backward's priority.

**Backward** (one ``backward()`` call made at host time ``h_f``), simulated in
time order over autograd's threads: each GPU ``d``'s worker and the calling
thread (every host device's work). Each thread has a ready queue that serves the
highest sequence number first, as autograd's does. The tasks:

* ``bwd j`` (``j`` with a backward), on ``p[j]``'s thread, ready once every
  consumer of ``j`` on the same device that has a backward was issued and every
  gradient copied back to ``j`` has arrived. On a GPU the worker issues it
  (``issue_b[j, d]`` seconds of the thread) and the kernel starts at ``max(issue
  end, free[d])``; the thread is then free (dependents on the same device are
  ready at the issue end: the stream keeps them in order). On the host the thread
  runs it (``bwd_t`` seconds).
* ``grad (u, e)`` (``u`` with a backward, ``e`` a remote device holding consumers
  of ``u`` that have one), ready once they were issued (peer and host -> host
  copies: once their kernels ended):

  - GPU ``e`` -> host: autograd copies the gradient back with a blocking
    ``.to()`` (its memory is not pinned) on ``e``'s worker: ``start = max(t,
    free[e], L)``; the worker and ``e``'s stream wait until ``end``;
  - host ``e`` -> GPU: a blocking ``.to()`` on the calling thread from pageable
    memory: the host stages it (``stage(e, bytes)`` from ``t``), then ``start =
    max(staged, free[gpu], L)``; the thread and the GPU's stream wait until ``end``;
  - GPU -> GPU and host -> host: on no thread, ``start = max(ready, L)``.

* Contention: a host op run while GPU workers are busy takes ``contention_op``
  times its overlap with their busy time longer; a GPU issue made while the host
  runs an op takes ``contention_issue`` times its overlap with that op longer
  (:func:`envs.sim.cost.host_costs`; 0 unless measured).

Dispatch: the thread that can start a task earliest goes next (``max(its clock,
the earliest ready time in its queue)``; ties: the lowest thread index, the GPUs'
in device order, then the calling thread); it takes the highest sequence number
among its tasks ready by then. So a worker never waits for a task whose gradient
is not in while an older one is ready, and a blocking gradient copy happens where
autograd issues it: right after the last consumer on its device. ``backward()``
returns when every task of the call has been dispatched and its thread is free.
Ops without a backward (:func:`graphs.ops.grad_mask`) run nothing and are sent no
gradient: their "backward" is the instant their last consumer's ended (when their
output may be freed), as is a copy of gradients no consumer sends. Without
profiled issue times, staging and contention, on one GPU or with no gradient
crossing devices, this is model 3's schedule; the last simulator model's passes
(each device's tasks in strict reverse issue order) differ where a task waits for
a gradient from another device.

A pipelined step (:mod:`envs.microbatch`) is a host program of several calls
(``segments``): forward segments issue their ops as above from the current host
time; a backward segment is one ``backward()`` call made at the current host time.
"""

from __future__ import annotations

import heapq

import numpy as np

from envs.sim.cost import HostCosts, no_host_costs
from envs.sim.tasks import Schedule, collect_schedule, transfer_keys
from graphs.ir import OpGraph


class _EagerRun:
    """The eager model's state while the host program runs: task times, streams, links, sequence numbers."""

    def __init__(
        self, graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, host, issue, grad, hc: HostCosts
    ) -> None:
        n, D = graph.num_ops, latency_s.shape[0]
        self.n, self.D = n, D
        self.p = np.asarray(op_devices, dtype=np.int64).tolist()
        self.is_host = [bool(x) for x in np.asarray(host).tolist()]
        self.keys = transfer_keys(graph, np.asarray(op_devices, dtype=np.int64), D)
        self.fwd_t, self.bwd_t, self.issue, self.grad, self.hc = fwd_t, bwd_t, issue, grad, hc
        self.latency_s, self.bandwidth = latency_s, bandwidth_bytes_per_s
        self.in_ptr, self.in_src, _ = graph.in_csr
        self.consumers: list[list[int]] = [[] for _ in range(n)]
        for u, v in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
            self.consumers[u].append(v)
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.free = [0.0] * D  # GPU streams (host devices: when their last op ended)
        self.link: dict[tuple[int, int], float] = {}
        self.seq: dict[int, int] = {}  # backward task id -> autograd sequence number
        self.counter = 0

    # task ids (envs.sim.tasks)
    def act_id(self, u: int, d: int) -> int:
        return 2 * self.n + u * self.D + d

    def grad_id(self, u: int, d: int) -> int:
        return 2 * self.n + self.n * self.D + u * self.D + d

    def bwd_id(self, i: int) -> int:
        return 2 * self.n - 1 - i

    def copy_s(self, a: int, b: int, u: int) -> float:
        return float(self.latency_s[a, b] + float(self.keys[(u, b)]) / self.bandwidth[a, b])

    def stage_s(self, a: int, u: int, b: int) -> float:
        """Host seconds copying ``u``'s tensor (bound for ``b``) into a pinned buffer on host device ``a``."""
        return float(self.hc.stage_latency_s[a] + float(self.keys[(u, b)]) * self.hc.stage_s_per_byte[a])

    # ---------------------------------------------------------------- forward
    def _copy_in(self, u: int, b: int, h: float) -> float:
        """The copy of ``u``'s output to device ``b`` before its first consumer there; returns the host clock."""
        a, free, is_host = self.p[u], self.free, self.is_host
        self.seq[self.grad_id(u, b)] = self.counter
        self.counter += 1
        if is_host[a] and not is_host[b]:  # staged into pinned memory on the host thread first
            h += self.stage_s(a, u, b)
        lk = self.link.get((a, b), 0.0)
        if is_host[a] and is_host[b]:
            s = max(h, lk)
            e = s + self.copy_s(a, b, u)
            h = e
        elif is_host[a]:  # pinned host -> GPU, non_blocking
            s = max(h, free[b], lk)
            e = s + self.copy_s(a, b, u)
            free[b] = e
        elif is_host[b]:  # GPU -> host: the host waits
            s = max(h, free[a], lk)
            e = s + self.copy_s(a, b, u)
            free[a] = e
            h = e
        else:  # peer copy: both streams wait for each other
            s = max(h, free[a], free[b], lk)
            e = s + self.copy_s(a, b, u)
            free[a] = free[b] = e
        self.link[(a, b)] = e
        self.start[self.act_id(u, b)], self.end[self.act_id(u, b)] = s, e
        return h

    def forward(self, ops: list[int], h: float) -> float:
        """Issue the forwards of ``ops`` from host clock ``h``; returns the host clock after."""
        p, free = self.p, self.free
        for i in ops:
            b = p[i]
            for k in range(int(self.in_ptr[i]), int(self.in_ptr[i + 1])):
                u = int(self.in_src[k])
                if p[u] != b and self.act_id(u, b) not in self.start:
                    h = self._copy_in(u, b, h)
            self.seq[self.bwd_id(i)] = self.counter
            self.counter += 1
            t = float(self.fwd_t[i, b])
            if self.is_host[b]:
                s = max(h, free[b])
                e = s + t
                h = free[b] = e
            else:
                h += float(self.issue[0][i, b])  # the host issues the kernel
                s = max(h, free[b])
                e = s + t
                free[b] = e
            self.start[i], self.end[i] = s, e
        return h

    # --------------------------------------------------------------- backward
    def backward(self, ops: list[int], h_f: float) -> float:
        """One ``backward()`` call over ``ops`` from host clock ``h_f``; returns when it does (every task
        dispatched)."""
        call = _BackwardCall(self, ops, h_f)
        call.run()
        self._silent(ops, h_f)
        return max(call.clock)

    def _silent(self, ops: list[int], h_f: float) -> None:
        """Times of what runs nothing: backwards of ops without one, and gradient copies no consumer sends (reverse
        order)."""
        p, end = self.p, self.end
        for j in reversed(ops):
            by_dev: dict[int, float] = {}
            for v in self.consumers[j]:
                if p[v] != p[j]:
                    by_dev[p[v]] = max(by_dev.get(p[v], 0.0), end[self.bwd_id(v)])
            for e_dev, r in by_dev.items():
                if self.grad_id(j, e_dev) not in end:
                    self.start[self.grad_id(j, e_dev)] = end[self.grad_id(j, e_dev)] = r
            if not self.grad[j]:
                self.start[self.bwd_id(j)] = end[self.bwd_id(j)] = max(
                    [h_f] + [end[self.bwd_id(v)] for v in self.consumers[j]]
                )


class _BackwardCall:
    """One ``backward()`` call, simulated in time order: a ready queue per thread (threads ``0..D-1``: the GPU
    workers, ``D``: the calling thread), served highest sequence number first."""

    def __init__(self, run: _EagerRun, ops: list[int], h_f: float) -> None:
        self.r, self.h_f = run, h_f
        D, p, grad = run.D, run.p, run.grad
        self.clock = [h_f] * (D + 1)
        self.future: list[list[tuple[float, int]]] = [[] for _ in range(D + 1)]  # (ready, task id)
        self.avail: list[list[tuple[int, int]]] = [[] for _ in range(D + 1)]  # (-sequence number, task id)
        self.pend: dict[int, int] = {}
        self.ready: dict[int, float] = {}
        self.host_op = (0, -np.inf)  # (device, end) of the op the calling thread runs
        for j in ops:
            if grad[j]:
                self.pend[run.bwd_id(j)] = sum(1 for v in run.consumers[j] if p[v] == p[j] and grad[v])
        for j in ops:
            if not grad[j]:
                continue
            for e_dev in sorted({p[v] for v in run.consumers[j] if p[v] != p[j] and grad[v]}):
                self.pend[run.grad_id(j, e_dev)] = sum(1 for v in run.consumers[j] if p[v] == e_dev and grad[v])
                self.pend[run.bwd_id(j)] += 1
        for t, k in self.pend.items():
            self.ready[t] = h_f
        for j in ops:
            if grad[j] and self.pend[run.bwd_id(j)] == 0:
                self._queue(run.bwd_id(j))

    def thread(self, task: int) -> int:
        """The thread that runs ``task`` (a gradient copy runs on the thread of the device its gradient comes from)."""
        r = self.r
        d = r.p[r.n * 2 - 1 - task] if task < 2 * r.n else self._slot(task)[1]
        return r.D if r.is_host[d] else d

    def _slot(self, task: int) -> tuple[int, int]:
        r = self.r
        slot = task - 2 * r.n - r.n * r.D
        return slot // r.D, slot % r.D

    def _blocking(self, task: int) -> bool:
        """A gradient copy between a GPU and the host (on a thread); other copies run on no thread."""
        u, e_dev = self._slot(task)
        return self.r.is_host[e_dev] != self.r.is_host[self.r.p[u]]

    def _queue(self, task: int) -> None:
        heapq.heappush(self.future[self.thread(task)], (self.ready[task], task))

    def run(self) -> None:
        while True:
            best, when = -1, np.inf
            for th in range(len(self.clock)):
                if self.avail[th]:
                    t = self.clock[th]
                elif self.future[th]:
                    t = max(self.clock[th], self.future[th][0][0])
                else:
                    continue
                if t < when:
                    best, when = th, t
            if best < 0:
                return
            fut, av = self.future[best], self.avail[best]
            while fut and fut[0][0] <= when:
                _, task = heapq.heappop(fut)
                heapq.heappush(av, (-self.r.seq[task], task))
            _, task = heapq.heappop(av)
            self._dispatch(best, task, when)

    def _dispatch(self, th: int, task: int, t: float) -> None:
        r = self.r
        if task >= 2 * r.n:  # a blocking gradient copy
            end = self._blocking_copy(th, task, t)
            self._arrived(task, end)
            return
        j = 2 * r.n - 1 - task
        d = r.p[j]
        hc = r.hc
        if r.is_host[d]:
            run_s = float(r.bwd_t[j, d])
            busy = sum(max(0.0, min(t + run_s, self.clock[w]) - t) for w in range(r.D))  # GPU workers beside it
            e = t + run_s + float(hc.contention_op[d]) * busy
            self.clock[th] = e
            self.host_op = (d, e)
            r.start[task], r.end[task] = t, e
            self._issued(j, e, e)
            return
        issue = float(r.issue[1][j, d])
        hd, he = self.host_op
        done = t + issue + float(hc.contention_issue[hd]) * max(0.0, min(t + issue, he) - t)
        self.clock[th] = done
        s = max(done, r.free[d])
        e = s + float(r.bwd_t[j, d])
        r.free[d] = e
        r.start[task], r.end[task] = s, e
        self._issued(j, done, e)

    def _blocking_copy(self, th: int, task: int, t: float) -> float:
        r = self.r
        u, e_dev = self._slot(task)
        d = r.p[u]
        lk = r.link.get((e_dev, d), 0.0)
        dur = float(r.latency_s[e_dev, d] + float(r.keys[(u, e_dev)]) / r.bandwidth[e_dev, d])
        if r.is_host[d]:  # GPU e -> host, on e's worker: the stream drains first
            s = max(t, r.free[e_dev], lk)
            gpu = e_dev
        else:  # host -> GPU d, on the calling thread, staged from pageable memory
            s = max(t + r.stage_s(e_dev, u, e_dev), r.free[d], lk)
            gpu = d
        e = s + dur
        r.link[(e_dev, d)] = r.free[gpu] = self.clock[th] = e
        r.start[task], r.end[task] = s, e
        return e

    def _issued(self, v: int, done: float, kernel_end: float) -> None:
        """``bwd v`` was issued at ``done`` (its kernel ends at ``kernel_end``): what it makes ready."""
        r = self.r
        for k in range(int(r.in_ptr[v]), int(r.in_ptr[v + 1])):
            u = int(r.in_src[k])
            if not r.grad[u]:
                continue
            if r.p[u] == r.p[v]:
                self._dep_done(r.bwd_id(u), done)
                continue
            g = r.grad_id(u, r.p[v])
            if self._dep_done(g, done if self._blocking(g) else kernel_end) and not self._blocking(g):
                self._off_thread_copy(g)

    def _dep_done(self, task: int, at: float) -> bool:
        """One dependency of ``task`` done at ``at``; True (and ``task`` queued, if on a thread) once it has none
        left."""
        self.ready[task] = max(self.ready[task], at)
        self.pend[task] -= 1
        if self.pend[task]:
            return False
        if task < 2 * self.r.n or self._blocking(task):
            self._queue(task)
        return True

    def _off_thread_copy(self, task: int) -> None:
        r = self.r
        u, e_dev = self._slot(task)
        d = r.p[u]
        s = max(self.ready[task], r.link.get((e_dev, d), 0.0))
        e = s + float(r.latency_s[e_dev, d] + float(r.keys[(u, e_dev)]) / r.bandwidth[e_dev, d])
        r.link[(e_dev, d)] = e
        r.start[task], r.end[task] = s, e
        self._arrived(task, e)

    def _arrived(self, task: int, at: float) -> None:
        """A gradient copy ended at ``at``: its op's backward has one dependency less."""
        u, _ = self._slot(task)
        self._dep_done(self.r.bwd_id(u), at)


def eager_reference(
    graph: OpGraph,
    op_devices,
    fwd_t,
    bwd_t,
    latency_s,
    bandwidth_bytes_per_s,
    update_s,
    order,
    host,
    issue,
    segments=None,
    grad=None,
    host_costs: HostCosts | None = None,
) -> Schedule:
    """The eager schedule of the module docstring, step by step.

    ``segments`` (``[S, 3]`` rows ``(kind, lo, hi)``, :func:`envs.microbatch.issue_segments`)
    is the host thread's program over positions of ``order``: kind 0 issues the
    forwards of ``order[lo:hi]``, kind 1 makes one ``backward()`` call over them.
    Default: one forward over everything, then one backward. ``grad``: which ops
    have a backward (default all). ``host_costs``: :func:`envs.sim.cost.host_costs`
    (default none: no staging, no contention).
    """
    n, D = graph.num_ops, latency_s.shape[0]
    grad = np.ones(n, dtype=bool) if grad is None else np.asarray(grad, dtype=bool)
    hc = no_host_costs(D) if host_costs is None else host_costs
    run = _EagerRun(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, host, issue, grad.tolist(), hc)
    order = [int(i) for i in np.asarray(order).tolist()]
    program = (
        [(0, 0, n), (1, 0, n)] if segments is None else [tuple(int(v) for v in row) for row in np.asarray(segments)]
    )
    h = 0.0  # the host thread's clock
    for kind, lo, hi in program:
        h = (run.forward if kind == 0 else run.backward)(order[lo:hi], h)
    return collect_schedule(
        np.asarray(op_devices, dtype=np.int64), run.keys, run.start, run.end, run.act_id, run.grad_id, update_s, grad
    )
