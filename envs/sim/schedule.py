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

``eager`` (the default for scoring PyTorch placements) models the module
:func:`placer.apply` builds, as eager PyTorch runs it: one host thread issues the
ops in the plan's issue order to in-order GPU streams (staging each tensor sent
to a GPU through pinned memory), runs the host's ops itself, and waits for
copies to the host; ``loss.backward()`` then runs on autograd's threads, one
worker per GPU and the calling thread for the host, each serving its ready
tasks highest sequence number first, simulated in time order; a gradient copied
between a GPU and the host blocks its thread. :mod:`envs.sim.eager` has the rules.

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

This module holds the pure-Python reference of dataflow (an explicit task DAG and
``heapq``) and :func:`schedule_reference`, which runs either model
(:mod:`envs.sim.eager` holds eager's);
:mod:`envs.sim.kernel` computes identical schedules with a compiled kernel and is
what the simulator uses.
"""

from __future__ import annotations

import heapq

import numpy as np

from envs.sim.cost import HostCosts, default_issue_times
from envs.sim.eager import eager_reference
from envs.sim.tasks import ACT, GRAD, Schedule, collect_schedule, transfer_keys
from graphs.ir import OpGraph

__all__ = ["ACT", "GRAD", "EXECUTORS", "Schedule", "transfer_keys", "schedule_reference"]

#: The executor models: ``"eager"`` (PyTorch, the default) and ``"dataflow"`` (TensorFlow).
EXECUTORS = ("eager", "dataflow")


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
    host_costs: HostCosts | None = None,
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
    device (:func:`envs.sim.cost.issue_times`); it replaces ``launch_s``, which
    otherwise costs each op with a kernel on a non-host device its forward issue
    (and its backward nothing). ``host_costs`` (eager): the host's staging copies and
    contention (:func:`envs.sim.cost.host_costs`; default none).
    """
    if executor == "eager":
        D = latency_s.shape[0]
        is_host = np.zeros(D, dtype=bool) if host is None else np.asarray(host, dtype=bool)
        if issue is None:
            issue = default_issue_times(fwd_t, is_host, np.zeros(D) if launch_s is None else launch_s)
        return eager_reference(
            graph,
            op_devices,
            fwd_t,
            bwd_t,
            latency_s,
            bandwidth_bytes_per_s,
            update_s,
            np.arange(graph.num_ops) if order is None else order,
            is_host,
            issue,
            segments,
            np.ones(graph.num_ops, dtype=bool) if grad is None else np.asarray(grad, dtype=bool),
            host_costs,
        )
    if executor != "dataflow":
        raise ValueError(f"executor must be one of {EXECUTORS}, not {executor!r}")
    return _dataflow_reference(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, grad)


def _dataflow_reference(
    graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, grad=None
) -> Schedule:
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

    return collect_schedule(op_devices, keys, start, end, act_id, grad_id, update_s, grad)
