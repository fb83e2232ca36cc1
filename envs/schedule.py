"""The simulated schedule of one training step, and the reference scheduler.

The step is a DAG of tasks, each on one resource (a device, or a directed link
``src -> dst``):

* ``fwd i`` on device ``p[i]``: after every input is there (the producer's
  ``fwd`` on the same device, or the activation transfer to ``p[i]``).
* ``act (u, d)``: the output of ``u`` copied once to each other device ``d``
  that holds a consumer of ``u`` (a tensor already sent is not sent again); it
  carries the largest edge from ``u`` to those consumers; after ``fwd u``.
* ``bwd i`` on ``p[i]``, after ``fwd i``, the ``bwd`` of its consumers on the
  same device and the gradient transfers from the other devices.
* ``grad (u, d)``: the gradient of ``u``'s output, summed on ``d`` over the
  consumers there, sent back over ``d -> p[u]`` once their ``bwd`` ran; same bytes
  as the activation.

Then ``optimizer.step()`` runs after the whole backward (it is called after
``loss.backward()`` returns): every device updates its parameters in parallel.

Scheduling policy (list scheduling): every resource runs one task at a time and
serves tasks first come, first served by the time they became ready; ties go to
the lower task id (forward ops in topological order, then backward ops in reverse
topological order, then transfers). Equivalently, tasks are taken from one heap
ordered by ``(ready time, task id)`` and each starts at ``max(ready time, its
resource's free time)``.

Devices run concurrently, as in a dataflow executor (the paper's TensorFlow
setting, Placeto's and Baechi's simulators). Eager PyTorch comes close to this
when kernels outlast their launch: one Python thread issues every op
asynchronously to its device's stream, and a cross-device copy waits only for
its producer. Launch overhead is charged inside each op's time.

This module holds the pure-Python reference implementation (explicit task DAG,
``heapq``); :mod:`envs.kernel` computes the identical schedule with a compiled
kernel and is what the simulator uses.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from graphs.ir import OpGraph

ACT, GRAD = 0, 1


@dataclass
class Schedule:
    """Start and end times of every task of one simulated step.

    Attributes:
        place: device index per op.
        fwd_start_s, fwd_end_s, bwd_start_s, bwd_end_s: per op.
        xfer_kind: ``ACT`` (0) or ``GRAD`` (1) per transfer.
        xfer_op: the op whose output (or its gradient) is carried.
        xfer_src, xfer_dst: device indices of the link used.
        xfer_bytes: bytes carried.
        xfer_start_s, xfer_end_s: per transfer.
        backward_end_s: when the last forward/backward task or transfer ends.
        update_s: optimizer-step seconds per device (runs after ``backward_end_s``).
    """

    place: np.ndarray
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


def transfer_keys(graph: OpGraph, place: np.ndarray, num_devices: int) -> dict[tuple[int, int], int]:
    """``(u, d) -> bytes`` of every activation transfer: one per source op and remote device."""
    keys: dict[tuple[int, int], int] = {}
    for u, v, b in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        d = int(place[v])
        if int(place[u]) != d:
            keys[(u, d)] = max(keys.get((u, d), 0), b)
    return keys


def schedule_reference(
    graph: OpGraph,
    place: np.ndarray,
    fwd_t: np.ndarray,
    bwd_t: np.ndarray,
    latency_s: np.ndarray,
    bandwidth_bytes_per_s: np.ndarray,
    update_s: np.ndarray,
) -> Schedule:
    """Schedule one step in plain Python (slow; the specification the kernel is tested against)."""
    n, D = graph.num_ops, latency_s.shape[0]
    place = np.asarray(place, dtype=np.int64)
    p = place.tolist()
    keys = transfer_keys(graph, place, D)
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

    items = sorted(keys.items())
    kinds, ops, srcs, dsts, nbytes, xs, xe = [], [], [], [], [], [], []
    for kind, make in ((ACT, act_id), (GRAD, grad_id)):
        for (u, d), b in items:
            t = make(u, d)
            kinds.append(kind)
            ops.append(u)
            srcs.append(p[u] if kind == ACT else d)
            dsts.append(d if kind == ACT else p[u])
            nbytes.append(b)
            xs.append(start[t])
            xe.append(end[t])
    f = lambda seq: np.asarray(seq, dtype=np.float64)  # noqa: E731
    return Schedule(
        place=place.astype(np.int32),
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
