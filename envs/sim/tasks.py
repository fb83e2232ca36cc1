"""The tasks of one simulated training step, shared by both executor models and the compiled kernel.

Tasks (``n`` ops, ``D`` devices): ``fwd i`` and ``bwd i`` per op, ``act (u, d)`` per
activation copy of ``u``'s output to a remote device ``d`` and ``grad (u, d)`` per
gradient copied back (see :mod:`envs.sim.schedule`). Task ids, which every scheduler
uses and :func:`collect_schedule` reads: ``fwd i = i``, ``bwd i = 2n-1-i``,
``act (u, d) = 2n + u*D + d``, ``grad (u, d) = 2n + nD + u*D + d``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envs.sim.homes import HomeTimes, HostSteps, no_home_times, no_host_steps
from graphs.ir import OpGraph

ACT, GRAD = 0, 1


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
        backward_end_s: when ``backward()`` returns: the last forward/backward task or transfer ends, and the
            steps taken during the backward (``host_steps``).
        update_s: optimizer-step seconds per device (runs after ``backward_end_s``), over the parameters not
            stepped during the backward.
        homes: the copies of parameters that live apart from their ops (:mod:`envs.sim.homes`).
        blocks: per op, its checkpointed block (-1: none; empty: no block, :mod:`envs.sim.checkpointing`).
        recompute_start_s: per op, the start of its kernel in its block's recompute (NaN: not recomputed; empty:
            no block).
        host_steps: the offloaded ops' parameters stepped during the backward (a plan's ``host_step``
            ``"backward"``, :func:`envs.sim.homes.host_steps`; empty: none).
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
    homes: HomeTimes = field(default_factory=no_home_times)
    blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    recompute_start_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    host_steps: HostSteps = field(default_factory=no_host_steps)
    host_step_wait_s: float = 0.0  # how long backward() waits for those steps after autograd's last task

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


def collect_schedule(op_devices, keys, start, end, act_id, grad_id, update_s, grad=None) -> Schedule:
    """The Schedule of task start/end times keyed by task id."""
    n = len(op_devices)
    p = op_devices.tolist()
    fwd_id = lambda i: i  # noqa: E731
    bwd_id = lambda i: 2 * n - 1 - i  # noqa: E731
    items = sorted(keys.items())
    kinds, ops, srcs, dsts, nbytes, xs, xe = [], [], [], [], [], [], []
    for kind, make in ((ACT, act_id), (GRAD, grad_id)):
        for (u, d), b in items:
            task = make(u, d)
            kinds.append(kind)
            ops.append(u)
            srcs.append(p[u] if kind == ACT else d)
            dsts.append(d if kind == ACT else p[u])
            nbytes.append(0 if kind == GRAD and grad is not None and not grad[u] else b)
            xs.append(start[task])
            xe.append(end[task])
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
