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

**Backward**: each ``backward()`` call, made at the host time ``h_f`` it is
reached, runs on autograd's threads as :mod:`envs.sim.autograd` simulates it;
the host thread resumes when it returns.

A pipelined step (:mod:`envs.microbatch`) is a host program of several calls
(``segments``): forward segments issue their ops as above from the current host
time; a backward segment is one ``backward()`` call made at the current host time.
"""

from __future__ import annotations

import numpy as np

from envs.sim.autograd import BackwardCall
from envs.sim.checkpointing import Recompute
from envs.sim.cost import HostCosts, no_host_costs
from envs.sim.homes import HomeCopies
from envs.sim.tasks import Schedule, collect_schedule, transfer_keys
from graphs.ir import OpGraph


class EagerRun:
    """The eager model's state while the host program runs: task times, streams, links, sequence numbers."""

    def __init__(
        self,
        graph,
        op_devices,
        fwd_t,
        bwd_t,
        latency_s,
        bandwidth_bytes_per_s,
        host,
        issue,
        grad,
        hc: HostCosts,
        homes: HomeCopies | None = None,
        recompute: Recompute | None = None,
    ) -> None:
        n, D = graph.num_ops, latency_s.shape[0]
        self.n, self.D = n, D
        self.p = np.asarray(op_devices, dtype=np.int64).tolist()
        self.is_host = [bool(is_host) for is_host in np.asarray(host).tolist()]
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
        self.homes = homes  # parameters that live apart from their ops (envs.sim.homes), or None
        self.recompute = recompute  # checkpointed blocks (envs.sim.checkpointing), or None

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
    def copy_in(self, u: int, b: int, h: float) -> float:
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
                    h = self.copy_in(u, b, h)
            # its parameters' copy from their home, on the side stream (envs.sim.homes)
            fetched = self.homes.fetch_in(i, b, h, self.link, self.end) if self.homes else 0.0
            self.seq[self.bwd_id(i)] = self.counter
            self.counter += 1
            run_s = float(self.fwd_t[i, b])
            if self.is_host[b]:
                s = max(h, free[b])
                e = s + run_s
                h = free[b] = e
            else:
                h += float(self.issue[0][i, b])  # the host issues the kernel
                s = max(h, free[b], fetched)
                e = s + run_s
                free[b] = e
            self.start[i], self.end[i] = s, e
        return h

    # --------------------------------------------------------------- backward
    def backward(self, ops: list[int], h_f: float) -> float:
        """One ``backward()`` call over ``ops`` from host clock ``h_f`` (:class:`envs.sim.autograd.BackwardCall`);
        returns when it does (every task dispatched)."""
        return BackwardCall(self, ops, h_f).run()


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
    homes: HomeCopies | None = None,
    blocks: np.ndarray | None = None,
) -> Schedule:
    """The eager schedule of the module docstring, step by step.

    ``segments`` (``[S, 3]`` rows ``(kind, lo, hi)``, :func:`envs.microbatch.issue_segments`)
    is the host thread's program over positions of ``order``: kind 0 issues the
    forwards of ``order[lo:hi]``, kind 1 makes one ``backward()`` call over them.
    Default: one forward over everything, then one backward. ``grad``: which ops
    have a backward (default all). ``host_costs``: :func:`envs.sim.cost.host_costs`
    (default none: no staging, no contention). ``homes``: the step's parameter homes (:mod:`envs.sim.homes`).
    ``blocks``: per op, its checkpointed block, -1 for none (:mod:`envs.sim.checkpointing`; default none).
    """
    n, D = graph.num_ops, latency_s.shape[0]
    grad = np.ones(n, dtype=bool) if grad is None else np.asarray(grad, dtype=bool)
    hc = no_host_costs(D) if host_costs is None else host_costs
    recompute = None if blocks is None else Recompute(blocks, fwd_t, issue[0])
    run = EagerRun(
        graph,
        op_devices,
        fwd_t,
        bwd_t,
        latency_s,
        bandwidth_bytes_per_s,
        host,
        issue,
        grad.tolist(),
        hc,
        homes,
        recompute,
    )
    order = [int(i) for i in np.asarray(order).tolist()]
    program = (
        [(0, 0, n), (1, 0, n)] if segments is None else [tuple(int(v) for v in row) for row in np.asarray(segments)]
    )
    h = 0.0  # the host thread's clock
    for kind, lo, hi in program:
        h = (run.forward if kind == 0 else run.backward)(order[lo:hi], h)
    schedule = collect_schedule(
        np.asarray(op_devices, dtype=np.int64), run.keys, run.start, run.end, run.act_id, run.grad_id, update_s, grad
    )
    if homes is not None:
        schedule.homes = homes.times(schedule.fwd_end_s)
        schedule.backward_end_s = max(schedule.backward_end_s, homes.last_end_s())
    if recompute is not None:
        schedule.blocks = np.asarray(blocks, dtype=np.int64).copy()
        schedule.recompute_start_s = recompute.start_s(n)
    return schedule
