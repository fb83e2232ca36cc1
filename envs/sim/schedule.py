"""The simulated schedule of one training step, and the reference schedulers.

Two executor models share one set of tasks (so the memory sweep, OOM check,
traces and Results read any schedule the same way):

* ``fwd i`` on device ``p[i]``;
* ``act (u, d)``: the output of ``u`` copied once to each other device ``d``
  that holds a consumer of ``u`` (a tensor already sent is not sent again); it
  carries the largest edge from ``u`` to those consumers;
* ``bwd i`` on ``p[i]``;
* ``grad (u, d)``: the gradient of ``u``'s output, summed on ``d`` over the
  consumers there, sent back over ``d -> p[u]`` once their ``bwd`` ran; same bytes
  as the activation.

Then ``optimizer.step()`` runs after ``loss.backward()`` returns. Both models
charge it after the whole backward, every device updating its parameters in
parallel: ``step = backward end + max_d update_d``. (In eager PyTorch a GPU's
foreach-Adam kernels could start as soon as its own stream has drained; the
conservative rule keeps one definition for both models and keeps
:mod:`envs.sim.bound` a valid bound.)

``eager`` (the default for scoring PyTorch placements) models exactly the
module :func:`placer.apply` builds: one Python thread runs the FX graph node by
node in an issue order ``order`` (a topological order; default node order), and
``loss.backward()`` runs in autograd's engine. "Host" devices are those of kind
``cpu`` (all of them run on the one host thread, clock ``h``); every other
device is one in-order GPU stream (free time ``free[d]``); links are in-order
too. Forward, one pass over ``order``, with ``h = 0``: before op ``i``, for each
in-edge ``u -> i`` (in ``graph.in_csr`` order) with ``p[u] != p[i]`` whose copy
``(u, p[i])`` was not made yet, the copy is made (``dur = latency + bytes /
bandwidth`` of the link ``a = p[u] -> b = p[i]``, ``L`` its free time):

* GPU -> GPU (peer copy, ``non_blocking``: a two-way stream barrier, as
  ``copy_`` does): ``start = max(h, free[a], free[b], L)``; ``free[a] = free[b] =
  L = end``; the host does not wait;
* GPU -> host (``.to("cpu")``, synchronous): ``start = max(h, free[a], L)``;
  ``free[a] = L = end``; the host waits: ``h = end``;
* host -> GPU (pinned, ``non_blocking``): ``start = max(h, free[b], L)``;
  ``free[b] = L = end``; ``h`` unchanged;
* host -> host (another ``cpu`` device): ``start = max(h, L)``; ``h = L = end``.

Then op ``i`` runs. On a GPU the host pays the issue cost ``issue_f[i, d]``
(:func:`envs.cost.issue_times`: by default ``launch_overhead_s[d]`` for ops with
nonzero time, views launch nothing; a profile in context measures it per op, the
FX node's Python included), ``h += issue``, and the kernel is enqueued: ``start =
max(h, free[d])``, ``free[d] = end`` (so a kernel waiting for a copy holds back every
later kernel on that stream). On the host: ``start = max(h, free[d])``, ``h =
free[d] = end`` (nothing else is issued meanwhile).

Backward starts when the forward has been issued, at host time ``h_f``.
Autograd runs one worker per GPU plus the calling thread for all host work;
its ready queues prefer the highest sequence number, so (issue being faster
than execution) every GPU, and the host, executes its backward tasks in
reverse issue order, one at a time. One pass over reversed ``order``: for op
``j``, first its incoming gradient copies (for each remote device ``e`` holding
consumers of ``j``: ``start = max(max bwd end of j's consumers on e, link e ->
p[j] free)``, the link is busy until ``end``), then ``bwd j``: ``start =
max(h_f, queue free, its gradient copies' ends)``, where the queue is
``free[p[j]]`` for a GPU and one host queue shared by every ``cpu`` device
(same-device consumers ran earlier on the same in-order queue). A GPU's tasks
are issued by its autograd worker thread, one after another from ``h_f``, each
once its gradient copies are in and costing ``issue_b[j, d]`` (default 0;
measured per op in context): ``w[d] = max(w[d], copies' ends) + issue_b[j, d]``
and the task starts no earlier than ``w[d]``. A gradient copy between a GPU and
the host is synchronous (autograd copies a gradient back with a blocking
``.to()``; its memory is not pinned): it starts once the GPU's stream has
drained and the thread issuing it is free (the GPU's worker for GPU -> host, the
calling thread for host -> GPU), and that thread and the GPU's stream wait until
it ends. The forward's
free times carry over, so a stream finishes its forward work first. No heap:
``O(n + edges)`` per placement.

Ops without a backward (:func:`graphs.ops.grad_mask`: in a capture, integer and
boolean ops and tables built from buffers alone) are not part of autograd's graph:
no gradient is sent back to them and they run nothing; their "backward" is the
instant their last consumer's ended (when their output may be freed), on no queue,
so a host op of that kind never makes ``backward()`` wait.

A pipelined step (:mod:`envs.microbatch`) is a host program of several calls
(``segments``, :func:`envs.microbatch.issue_segments`): forward segments issue
their ops as above from the current host time; a backward segment is one
``backward()`` call made at the current host time ``h_f``, scheduled as above
over its ops, and returning when the calling thread has run its last host task.
One forward over every op then one backward is the unpipelined step.

``dataflow`` (the paper's TensorFlow setting, Placeto's and Baechi's
simulators) ignores the issue order: a task is ready when its inputs are (the
producer's ``fwd`` or the activation copy for ``fwd``; ``fwd i``, the same-device
consumers' ``bwd`` and the gradient copies for ``bwd i``; ``fwd u`` for ``act
(u, d)``; the consumers' ``bwd`` on ``d`` for ``grad (u, d)``), every resource
(device or directed link) runs one task at a time and serves tasks first come,
first served by the time they became ready; ties go to the lower task id
(forward ops in topological order, then backward ops in reverse topological
order, then transfers). Equivalently, tasks are taken from one heap ordered by
``(ready time, task id)`` and each starts at ``max(ready time, its resource's
free time)``. Devices, ``cpu:0`` included, run concurrently and later ready
work overtakes a task that waits for a copy. Launch overhead is charged inside
each op's time only.

This module holds the pure-Python reference implementations (explicit task
DAG and ``heapq`` for dataflow; the two passes above for eager);
:mod:`envs.sim.kernel` computes identical schedules with a compiled kernel and is
what the simulator uses.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from envs.cost import default_issue_times
from graphs.ir import OpGraph

ACT, GRAD = 0, 1

#: The executor models: ``"eager"`` (PyTorch, the default) and ``"dataflow"`` (TensorFlow).
EXECUTORS = ("eager", "dataflow")


@dataclass
class Schedule:
    """Start and end times of every task of one simulated step.

    Attributes:
        op_devices: device index per op.
        fwd_start_s, fwd_end_s, bwd_start_s, bwd_end_s: per op.
        xfer_kind: ``ACT`` (0) or ``GRAD`` (1) per transfer.
        xfer_op: the op whose output (or its gradient) is carried.
        xfer_src, xfer_dst: device indices of the link used.
        xfer_bytes: bytes carried.
        xfer_start_s, xfer_end_s: per transfer.
        backward_end_s: when the last forward/backward task or transfer ends.
        update_s: optimizer-step seconds per device (runs after ``backward_end_s``).
    """

    op_devices: np.ndarray
    fwd_start_s: np.ndarray
    fwd_end_s: np.ndarray
    bwd_start_s: np.ndarray
    bwd_end_s: np.ndarray
    xfer_kind: np.ndarray
    xfer_op: np.ndarray
    xfer_src: np.ndarray
    xfer_dst: np.ndarray
    xfer_bytes: np.ndarray
    xfer_start_s: np.ndarray
    xfer_end_s: np.ndarray
    backward_end_s: float
    update_s: np.ndarray

    @property
    def step_time_s(self) -> float:
        return float(self.backward_end_s + (self.update_s.max() if len(self.update_s) else 0.0))


def transfer_keys(graph: OpGraph, op_devices: np.ndarray, num_devices: int) -> dict[tuple[int, int], int]:
    """``(u, d) -> bytes`` of every activation transfer: one per source op and remote device."""
    keys: dict[tuple[int, int], int] = {}
    for u, v, b in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        d = int(op_devices[v])
        if int(op_devices[u]) != d:
            keys[(u, d)] = max(keys.get((u, d), 0), b)
    return keys


def schedule_reference(
    graph: OpGraph,
    op_devices: np.ndarray,
    fwd_t: np.ndarray,
    bwd_t: np.ndarray,
    latency_s: np.ndarray,
    bandwidth_bytes_per_s: np.ndarray,
    update_s: np.ndarray,
    *,
    executor: str = "dataflow",
    order: np.ndarray | None = None,
    host: np.ndarray | None = None,
    launch_s: np.ndarray | None = None,
    segments: np.ndarray | None = None,
    grad: np.ndarray | None = None,
    issue: tuple[np.ndarray, np.ndarray] | None = None,
) -> Schedule:
    """Schedule one step in plain Python (slow; the specification the kernel is tested against).

    ``executor="eager"`` also takes the issue ``order`` (default node order),
    ``host`` (True per ``cpu`` device), ``launch_s`` (host dispatch seconds
    per device) and ``segments``, the host thread's forward and backward calls
    (:func:`envs.microbatch.issue_segments`; default one of each); ``"dataflow"``
    ignores them. ``grad`` (default all True) says which ops have a backward
    (:func:`graphs.ops.grad_mask`): under eager the others run none and are sent
    no gradient; under both, no gradient bytes are counted for them. ``issue``
    (eager): ``([n, D] forward, [n, D] backward)`` host issue seconds per op and
    device (:func:`envs.cost.issue_times`); it replaces ``launch_s``, which
    otherwise costs each op with a kernel on a non-host device its forward issue
    (and its backward nothing).
    """
    if executor == "eager":
        D = latency_s.shape[0]
        is_host = np.zeros(D, dtype=bool) if host is None else np.asarray(host, dtype=bool)
        if issue is None:
            issue = default_issue_times(fwd_t, is_host, np.zeros(D) if launch_s is None else launch_s)
        return _eager_reference(
            graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s,
            np.arange(graph.num_ops) if order is None else order,
            is_host, issue, segments,
            np.ones(graph.num_ops, dtype=bool) if grad is None else np.asarray(grad, dtype=bool),
        )
    if executor != "dataflow":
        raise ValueError(f"executor must be one of {EXECUTORS}, not {executor!r}")
    return _dataflow_reference(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, grad)


def _dataflow_reference(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, grad=None) -> Schedule:
    n, D = graph.num_ops, latency_s.shape[0]
    op_devices = np.asarray(op_devices, dtype=np.int64)
    p = op_devices.tolist()
    keys = transfer_keys(graph, op_devices, D)
    act_id = lambda u, d: 2 * n + u * D + d  # noqa: E731
    grad_id = lambda u, d: 2 * n + n * D + u * D + d  # noqa: E731
    fwd_id = lambda i: i  # noqa: E731
    bwd_id = lambda i: 2 * n - 1 - i  # noqa: E731

    resource: dict[int, int] = {}
    duration: dict[int, float] = {}
    deps: dict[int, list[int]] = {}
    for i in range(n):
        resource[fwd_id(i)] = p[i]
        duration[fwd_id(i)] = float(fwd_t[i, p[i]])
        deps[fwd_id(i)] = []
        resource[bwd_id(i)] = p[i]
        duration[bwd_id(i)] = float(bwd_t[i, p[i]])
        deps[bwd_id(i)] = [fwd_id(i)]
    for (u, d), b in keys.items():
        a, g = act_id(u, d), grad_id(u, d)
        resource[a] = D + p[u] * D + d
        duration[a] = float(latency_s[p[u], d] + float(b) / bandwidth_bytes_per_s[p[u], d])
        deps[a] = [fwd_id(u)]
        resource[g] = D + d * D + p[u]
        duration[g] = float(latency_s[d, p[u]] + float(b) / bandwidth_bytes_per_s[d, p[u]])
        deps[g] = []
        deps[bwd_id(u)].append(g)
    for u, v in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
        if p[u] == p[v]:
            deps[fwd_id(v)].append(fwd_id(u))
            deps[bwd_id(u)].append(bwd_id(v))
        else:
            deps[fwd_id(v)].append(act_id(u, p[v]))
            deps[grad_id(u, p[v])].append(bwd_id(v))

    succs: dict[int, list[int]] = {t: [] for t in deps}
    pending = {t: len(ds) for t, ds in deps.items()}
    for t, ds in deps.items():
        for s in ds:
            succs[s].append(t)
    ready = {t: 0.0 for t in deps}
    heap = [(0.0, t) for t, k in pending.items() if k == 0]
    heapq.heapify(heap)
    free: dict[int, float] = {}
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    while heap:
        r, t = heapq.heappop(heap)
        s = max(r, free.get(resource[t], 0.0))
        e = s + duration[t]
        free[resource[t]] = e
        start[t], end[t] = s, e
        for x in succs[t]:
            ready[x] = max(ready[x], e)
            pending[x] -= 1
            if pending[x] == 0:
                heapq.heappush(heap, (ready[x], x))
    assert len(end) == len(deps), "task graph has a cycle"

    return _collect(op_devices, keys, start, end, act_id, grad_id, update_s, grad)


def _collect(op_devices, keys, start, end, act_id, grad_id, update_s, grad=None) -> Schedule:
    """The Schedule of task start/end times keyed by task id."""
    n = len(op_devices)
    p = op_devices.tolist()
    fwd_id = lambda i: i  # noqa: E731
    bwd_id = lambda i: 2 * n - 1 - i  # noqa: E731
    items = sorted(keys.items())
    kinds, ops, srcs, dsts, nbytes, xs, xe = [], [], [], [], [], [], []
    for kind, make in ((ACT, act_id), (GRAD, grad_id)):
        for (u, d), b in items:
            t = make(u, d)
            kinds.append(kind)
            ops.append(u)
            srcs.append(p[u] if kind == ACT else d)
            dsts.append(d if kind == ACT else p[u])
            nbytes.append(0 if kind == GRAD and grad is not None and not grad[u] else b)
            xs.append(start[t])
            xe.append(end[t])
    f = lambda seq: np.asarray(seq, dtype=np.float64)  # noqa: E731
    return Schedule(
        op_devices=op_devices.astype(np.int32),
        fwd_start_s=f([start[fwd_id(i)] for i in range(n)]),
        fwd_end_s=f([end[fwd_id(i)] for i in range(n)]),
        bwd_start_s=f([start[bwd_id(i)] for i in range(n)]),
        bwd_end_s=f([end[bwd_id(i)] for i in range(n)]),
        xfer_kind=np.asarray(kinds, dtype=np.int8),
        xfer_op=np.asarray(ops, dtype=np.int64),
        xfer_src=np.asarray(srcs, dtype=np.int64),
        xfer_dst=np.asarray(dsts, dtype=np.int64),
        xfer_bytes=np.asarray(nbytes, dtype=np.int64),
        xfer_start_s=f(xs),
        xfer_end_s=f(xe),
        backward_end_s=max(end.values(), default=0.0),
        update_s=np.asarray(update_s, dtype=np.float64),
    )


class _EagerRun:
    """The eager model's state while the host program runs: task times, stream and link clocks."""

    def __init__(self, graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, host, issue, grad) -> None:
        n, D = graph.num_ops, latency_s.shape[0]
        self.n, self.D = n, D
        self.p = np.asarray(op_devices, dtype=np.int64).tolist()
        self.is_host = [bool(x) for x in np.asarray(host).tolist()]
        self.keys = transfer_keys(graph, np.asarray(op_devices, dtype=np.int64), D)
        self.fwd_t, self.bwd_t, self.issue, self.grad = fwd_t, bwd_t, issue, grad
        self.latency_s, self.bandwidth = latency_s, bandwidth_bytes_per_s
        self.in_ptr, self.in_src, _ = graph.in_csr
        self.consumers: list[list[int]] = [[] for _ in range(n)]
        for u, v in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
            self.consumers[u].append(v)
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.free = [0.0] * D  # GPU streams (host devices: when their last op ended)
        self.link: dict[tuple[int, int], float] = {}

    # task ids, as _collect reads them
    def act_id(self, u: int, d: int) -> int:
        return 2 * self.n + u * self.D + d

    def grad_id(self, u: int, d: int) -> int:
        return 2 * self.n + self.n * self.D + u * self.D + d

    def bwd_id(self, i: int) -> int:
        return 2 * self.n - 1 - i

    def copy_s(self, a: int, b: int, u: int) -> float:
        return float(self.latency_s[a, b] + float(self.keys[(u, b)]) / self.bandwidth[a, b])

    def _copy_in(self, u: int, b: int, h: float) -> float:
        """The copy of ``u``'s output to device ``b`` before its first consumer there; returns the host clock."""
        a, free, is_host = self.p[u], self.free, self.is_host
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

    def backward(self, ops: list[int], h_f: float) -> float:
        """One ``backward()`` call over ``ops`` from host clock ``h_f``; returns when the calling thread is done."""
        self.host_queue = h_f  # the calling thread runs every host backward task
        self.worker = [h_f] * self.D  # each device's autograd worker: when it has issued its tasks so far
        p, end = self.p, self.end
        for j in reversed(ops):
            d = p[j]
            ready: dict[int, float] = {}
            for v in self.consumers[j]:
                if p[v] != d:
                    ready[p[v]] = max(ready.get(p[v], 0.0), end[self.bwd_id(v)])
            if self.grad is not None and not self.grad[j]:  # no backward, nothing sent back
                for e_dev, r in ready.items():
                    self.start[self.grad_id(j, e_dev)] = end[self.grad_id(j, e_dev)] = r
                self.start[self.bwd_id(j)] = end[self.bwd_id(j)] = max([h_f] + [end[self.bwd_id(v)] for v in self.consumers[j]])
                continue
            grads = self._gradients_in(j, d, ready)
            queue = self.host_queue if self.is_host[d] else self.free[d]
            s = max(h_f, queue, grads)
            if not self.is_host[d]:  # the worker issues the task once its gradients are in
                self.worker[d] = max(self.worker[d], grads) + float(self.issue[1][j, d])
                s = max(s, self.worker[d])
            e = s + float(self.bwd_t[j, d])
            if self.is_host[d]:
                self.host_queue = e
            else:
                self.free[d] = e
            self.start[self.bwd_id(j)], end[self.bwd_id(j)] = s, e
        return self.host_queue

    def _gradients_in(self, j: int, d: int, ready: dict[int, float]) -> float:
        """The gradient copies of ``j``'s output back to its device ``d``; returns when the last is in."""
        is_host, free = self.is_host, self.free
        grads = 0.0
        for e_dev in ready:  # in the order of the consumers, as the kernel
            lk = self.link.get((e_dev, d), 0.0)
            s = max(ready[e_dev], lk)
            blocking = is_host[e_dev] != is_host[d]  # GPU <-> host: not pinned, so synchronous
            if blocking:  # the GPU's stream drains first, and the issuing thread waits for the copy
                gpu = e_dev if is_host[d] else d
                s = max(s, free[gpu], self.worker[e_dev] if is_host[d] else self.host_queue)
            e = s + float(self.latency_s[e_dev, d] + float(self.keys[(j, e_dev)]) / self.bandwidth[e_dev, d])
            self.link[(e_dev, d)] = e
            if blocking:
                if is_host[d]:
                    self.worker[e_dev] = free[e_dev] = e
                else:
                    self.host_queue = free[d] = e
            self.start[self.grad_id(j, e_dev)], self.end[self.grad_id(j, e_dev)] = s, e
            grads = max(grads, e)
        return grads


def _eager_reference(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, order, host, issue, segments=None,
                     grad=None) -> Schedule:
    """The eager model of the module docstring, written out step by step.

    ``segments`` (``[S, 3]`` rows ``(kind, lo, hi)``, :func:`envs.microbatch.issue_segments`)
    is the host thread's program over positions of ``order``: kind 0 issues the
    forwards of ``order[lo:hi]``, kind 1 makes one ``backward()`` call over them,
    which returns when the calling thread has run its last host task. Default:
    one forward over everything, then one backward. ``grad``: which ops have a
    backward (default all); one without runs nothing and is sent no gradient, its
    "backward" being the instant its last consumer's ended.
    """
    n = graph.num_ops
    run = _EagerRun(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, host, issue, grad)
    order = [int(i) for i in np.asarray(order).tolist()]
    program = [(0, 0, n), (1, 0, n)] if segments is None else [tuple(int(v) for v in row) for row in np.asarray(segments)]
    h = 0.0  # the host thread's clock
    for kind, lo, hi in program:
        h = (run.forward if kind == 0 else run.backward)(order[lo:hi], h)
    return _collect(np.asarray(op_devices, dtype=np.int64), run.keys, run.start, run.end, run.act_id, run.grad_id, update_s, grad)
