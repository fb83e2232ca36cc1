"""The dataflow executor model (TensorFlow's, the paper's setting), in plain Python: the reference the kernel is
tested against.

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

The tasks and their ids are those of :mod:`envs.sim.tasks`;
:func:`envs.sim.kernel_dataflow.dataflow_schedule` computes the same schedule compiled.
"""

from __future__ import annotations

import heapq

import numpy as np

from envs.sim.tasks import Schedule, collect_schedule, transfer_keys
from graphs.ir import OpGraph


def dataflow_reference(
    graph: OpGraph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, grad=None
) -> Schedule:
    """The dataflow schedule of the module docstring, from an explicit task graph and ``heapq`` (``grad``: which ops
    have a backward, default all; the others' gradient copies carry no bytes)."""
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

    succs: dict[int, list[int]] = {task: [] for task in deps}
    pending = {task: len(ds) for task, ds in deps.items()}
    for task, ds in deps.items():
        for s in ds:
            succs[s].append(task)
    ready = {task: 0.0 for task in deps}
    heap = [(0.0, task) for task, k in pending.items() if k == 0]
    heapq.heapify(heap)
    free: dict[int, float] = {}
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    while heap:
        r, task = heapq.heappop(heap)
        s = max(r, free.get(resource[task], 0.0))
        e = s + duration[task]
        free[resource[task]] = e
        start[task], end[task] = s, e
        for succ in succs[task]:
            ready[succ] = max(ready[succ], e)
            pending[succ] -= 1
            if pending[succ] == 0:
                heapq.heappush(heap, (ready[succ], succ))
    assert len(end) == len(deps), "task graph has a cycle"

    return collect_schedule(op_devices, keys, start, end, act_id, grad_id, update_s, grad)
