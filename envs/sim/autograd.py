"""Autograd's backward under the eager executor model, in plain Python: the reference the kernel is tested against.

One ``backward()`` call, made at host time ``h_f`` (:mod:`envs.sim.eager`), simulated in
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

The host's issue of the forward, which gives every op and copy its sequence
number, is :mod:`envs.sim.eager`; :mod:`envs.sim.kernel_autograd` computes the
same schedule compiled.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from envs.sim.eager import EagerRun


class BackwardCall:
    """One ``backward()`` call, simulated in time order: a ready queue per thread (threads ``0..D-1``: the GPU
    workers, ``D``: the calling thread), served highest sequence number first."""

    def __init__(self, run: "EagerRun", ops: list[int], h_f: float) -> None:
        self.r, self.ops, self.h_f = run, ops, h_f
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
        for task in self.pend:
            self.ready[task] = h_f
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

    def run(self) -> float:
        """Dispatch every task of the call, then time what runs nothing; returns when ``backward()`` does (and the
        gradients sent home have arrived, :mod:`envs.sim.homes`)."""
        self._dispatch_all()
        self._silent()
        return max(max(self.clock), self.r.homes.last_end_s() if self.r.homes else 0.0)

    def _dispatch_all(self) -> None:
        while True:
            best, when = -1, np.inf
            for th in range(len(self.clock)):
                if self.avail[th]:
                    task = self.clock[th]
                elif self.future[th]:
                    task = max(self.clock[th], self.future[th][0][0])
                else:
                    continue
                if task < when:
                    best, when = th, task
            if best < 0:
                return
            fut, av = self.future[best], self.avail[best]
            while fut and fut[0][0] <= when:
                _, task = heapq.heappop(fut)
                heapq.heappush(av, (-self.r.seq[task], task))
            _, task = heapq.heappop(av)
            self._dispatch(best, task, when)

    def _dispatch(self, th: int, task: int, now: float) -> None:
        r = self.r
        if task >= 2 * r.n:  # a blocking gradient copy
            end = self._blocking_copy(th, task, now)
            self._arrived(task, end)
            return
        j = 2 * r.n - 1 - task
        d = r.p[j]
        hc = r.hc
        if r.recompute:  # its checkpointed block's forward again first (envs.sim.checkpointing)
            now = r.recompute.before_backward(r, j, d, now, self.ops)
        if r.is_host[d]:
            run_s = float(r.bwd_t[j, d])
            busy = sum(max(0.0, min(now + run_s, self.clock[w]) - now) for w in range(r.D))  # GPU workers beside it
            e = now + run_s + float(hc.contention_op[d]) * busy
            self.clock[th] = e
            self.host_op = (d, e)
            r.start[task], r.end[task] = now, e
            self._issued(j, e, e)
            return
        issue = float(r.issue[1][j, d])
        hd, he = self.host_op
        done = now + issue + float(hc.contention_issue[hd]) * max(0.0, min(now + issue, he) - now)
        self.clock[th] = done
        # its parameters copied again from their home first (envs.sim.homes)
        # (an op of a checkpointed block: made in its recompute)
        again = r.homes and not (r.recompute and r.recompute.blocks[j] >= 0)
        fetched = r.homes.refetch_in(j, d, now, r.link, lambda u: r.end[r.bwd_id(u)]) if again else 0.0
        s = max(done, r.free[d], fetched)
        e = s + float(r.bwd_t[j, d])
        r.free[d] = e
        r.start[task], r.end[task] = s, e
        if r.homes:
            r.homes.send_home(j, d, e, r.link)
        self._issued(j, done, e)

    def _blocking_copy(self, th: int, task: int, now: float) -> float:
        r = self.r
        u, e_dev = self._slot(task)
        d = r.p[u]
        lk = r.link.get((e_dev, d), 0.0)
        dur = float(r.latency_s[e_dev, d] + float(r.keys[(u, e_dev)]) / r.bandwidth[e_dev, d])
        if r.is_host[d]:  # GPU e -> host, on e's worker: the stream drains first
            s = max(now, r.free[e_dev], lk)
            gpu = e_dev
        else:  # host -> GPU d, on the calling thread, staged from pageable memory
            s = max(now + r.stage_s(e_dev, u, e_dev), r.free[d], lk)
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

    def _silent(self) -> None:
        """Times of what runs nothing: backwards of ops without one, and gradient copies no consumer sends (reverse
        order)."""
        r, h_f = self.r, self.h_f
        p, end = r.p, r.end
        for j in reversed(self.ops):
            by_dev: dict[int, float] = {}
            for v in r.consumers[j]:
                if p[v] != p[j]:
                    by_dev[p[v]] = max(by_dev.get(p[v], 0.0), end[r.bwd_id(v)])
            for e_dev, last_s in by_dev.items():
                if r.grad_id(j, e_dev) not in end:
                    r.start[r.grad_id(j, e_dev)] = end[r.grad_id(j, e_dev)] = last_s
            if not r.grad[j]:
                r.start[r.bwd_id(j)] = end[r.bwd_id(j)] = max([h_f] + [end[r.bwd_id(v)] for v in r.consumers[j]])
