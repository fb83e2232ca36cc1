"""Peak memory per device over a simulated step (a timeline sweep).

What a device holds (documented simplifications):

* static, for the whole step: parameters, Adam's two moments and buffers of the
  ops placed on it (:func:`envs.sim.cost.static_bytes` less the gradients). A
  parameter counts on the device of the op that owns it (its first consumer).
* a parameter's gradient from the start of its owner's backward to the end of the
  step: the measured step sets gradients to None before the forward
  (:func:`envs.real.timing.train_step`), so they take no room while the
  activations pile up. (Counted for the whole step, as before, the simulated
  peaks of three plans on an H200 at 24 GiB were 14-20 % over the measured
  ``max_memory_allocated``.) An offloaded op's gradient counts on its home for the
  whole step; with microbatches, from the first backward of any of its copies.
* the output of every op, from the start of its forward: when autograd keeps it
  for backward (:func:`graphs.ops.saved_mask`), until the end of its own backward
  where that reads it, else until the last backward that reads it has ended
  (its consumers' that save their inputs, :func:`graphs.ops.backward_readers`);
  when nothing keeps it, until the last of its consumers' forwards has ended;
  views alias their input and take nothing;
* during an op's backward, the gradient of its output (same bytes), freed when
  the backward ends (the transient buffer); an op without a backward
  (:func:`graphs.ops.grad_mask`) has none, and its output is freed when its last
  consumer's backward has ended;
* a tensor received from another device, from the start of its transfer until
  its gradient has been sent back (it is saved for the consumers' backward, and
  its gradient is accumulated in a buffer of the same size);
* a gradient received from another device, from the start of that transfer
  until the backward of the op that produced the tensor ends;
* an offloaded op's parameters, copied from their home for its forward and again
  for its backward, and its parameters' gradient until it has been sent home
  (:func:`envs.sim.homes.home_memory_events`); their static bytes count on their
  home (:func:`envs.sim.homes.param_devices`);
* a checkpointed block's outputs held in the forward only as long as something
  outside the block needs them, computed again at the block's recompute, and the
  block's inputs held until its last backward (:mod:`envs.sim.checkpointing`);
* nothing for the optimizer step beyond the static state: the measurements build
  torch's fused Adam (:func:`envs.real.timing.adam`), which updates in place. (The
  default path with a parameter on the host, the single-tensor one, holds two
  temporaries the size of a parameter: on an H200 at 24 GiB one plan peaked at
  19.03 GiB with it and at 15.96 GiB with the fused step.)

Frees at a time come before allocations at the same time. Bytes are integers,
so the sweep is exact and any two implementations agree bit for bit.
"""

from __future__ import annotations

import numpy as np

from envs.sim.checkpointing import checkpoint_frees
from envs.sim.homes import home_memory_events
from envs.sim.schedule import ACT, Schedule

#: Bumped whenever a change to these rules changes simulated peaks, and so which placements fit (keys of caches of
#: simulated results, beside ``envs.sim.simulator.MODEL_VERSION`` for step times). 2: gradients from their op's
#: backward on, saved outputs freed by the last backward that reads them, no optimizer temporaries (fused Adam).
MEMORY_VERSION = 2


def release_times(schedule: Schedule, out_ptr: np.ndarray, out_dst: np.ndarray) -> np.ndarray:
    """Per op: when the forward last reads its output (its last consumer's forward end; its own without a consumer)."""
    rel = schedule.fwd_end_s.astype(np.float64).copy()
    if len(out_dst):
        src = np.repeat(np.arange(len(rel)), np.diff(out_ptr))
        np.maximum.at(rel, src, schedule.fwd_end_s[out_dst])
    return rel


def memory_events(
    schedule: Schedule,
    act_bytes: np.ndarray,
    num_devices: int,
    grad: np.ndarray | None = None,
    kept: np.ndarray | None = None,
    consumers: tuple[np.ndarray, np.ndarray] | None = None,
    param_grad: np.ndarray | None = None,
    microbatches: int = 1,
    readers: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
):
    """(device, time, bytes) of every allocation and every free, as two triples of arrays.

    ``grad``: which ops have a backward (default all); the others get no gradient buffer.
    ``kept``: which outputs autograd keeps for backward (default all); the others (and their copies on other
    devices) are freed once ``consumers`` (``(out_ptr, out_dst)``, the graph's consumer lists) have run forward.
    ``param_grad``: per op, its parameters' gradient bytes, allocated on its device when its backward starts and
    held to the step's end (:func:`param_grad_bytes`; default none); with ``microbatches`` copies of each op (the
    ops of copy ``m`` at ``m * n // M`` on), when the first backward of any of its copies starts. ``readers``
    (:func:`graphs.ops.backward_readers`): a kept output that its own backward does not read is freed when the last
    backward that reads it ends (default: at its own backward's end).
    """
    s = schedule
    p = s.op_devices.astype(np.int64)
    n = len(p)
    is_act = s.xfer_kind == ACT
    act_k = np.flatnonzero(is_act)
    grad_k = np.flatnonzero(~is_act)
    # the received copy of (u on d) is freed when the gradient grad(u, d) has left d
    act_key = s.xfer_op[act_k] * num_devices + s.xfer_dst[act_k]
    grad_key = s.xfer_op[grad_k] * num_devices + s.xfer_src[grad_k]
    order = np.argsort(grad_key, kind="stable")
    match = order[np.searchsorted(grad_key[order], act_key)] if len(act_key) else np.zeros(0, dtype=np.int64)
    act_free = s.xfer_end_s[grad_k][match]
    a = act_bytes.astype(np.int64)
    g = a if grad is None else np.where(grad, a, 0)  # the gradient buffer of each op's output
    alloc_dev = np.concatenate([p, p, s.xfer_dst[act_k], s.xfer_dst[grad_k]])
    alloc_t = np.concatenate([s.fwd_start_s, s.bwd_start_s, s.xfer_start_s[act_k], s.xfer_start_s[grad_k]])
    alloc_b = np.concatenate([a, g, s.xfer_bytes[act_k], s.xfer_bytes[grad_k]])
    if kept is None:
        out_free = s.bwd_end_s
    else:
        rel = release_times(s, *consumers)
        out_free = np.where(kept, s.bwd_end_s if readers is None else held_until(s, *readers), rel)
        act_free = np.where(kept[s.xfer_op[act_k]], act_free, rel[s.xfer_op[act_k]])
    if len(s.blocks) and (s.blocks >= 0).any():  # checkpointed blocks (envs.sim.checkpointing)
        if kept is None or consumers is None:
            raise ValueError("memory_events: checkpointed blocks need kept and consumers")
        out_free, rec, held_to, holds = checkpoint_frees(
            s.blocks, p, num_devices, out_free, rel, s.bwd_end_s, kept, readers, consumers
        )
        act_free = np.maximum(act_free, holds[s.xfer_op[act_k], s.xfer_dst[act_k]])
        r = np.flatnonzero(rec)
        alloc_dev, alloc_t = np.concatenate([alloc_dev, p[r]]), np.concatenate([alloc_t, s.recompute_start_s[r]])
        alloc_b = np.concatenate([alloc_b, a[r]])
        again = (p[r], held_to[r], a[r])
    else:
        again = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
    free_dev = np.concatenate([p, p, s.xfer_dst[act_k], s.xfer_dst[grad_k]])
    free_t = np.concatenate([out_free, s.bwd_end_s, act_free, s.bwd_end_s[s.xfer_op[grad_k]] if n else np.zeros(0)])
    free_b = np.concatenate([a, g, s.xfer_bytes[act_k], s.xfer_bytes[grad_k]])
    free_dev, free_t, free_b = (np.concatenate(x) for x in zip((free_dev, free_t, free_b), again))
    if len(s.homes.op):
        (hd, ht, hb), (fd, ft, fb) = home_memory_events(
            s.homes, p, s.fwd_end_s, s.bwd_start_s, s.bwd_end_s, np.ones(n, dtype=bool) if grad is None else grad
        )
        alloc_dev, alloc_t, alloc_b = (np.concatenate(x) for x in ((alloc_dev, hd), (alloc_t, ht), (alloc_b, hb)))
        free_dev, free_t, free_b = (np.concatenate(x) for x in ((free_dev, fd), (free_t, ft), (free_b, fb)))
    if param_grad is not None:  # never freed within the step
        first = np.tile(s.bwd_start_s.reshape(microbatches, -1).min(axis=0), microbatches)
        alloc_dev, alloc_t = np.concatenate([alloc_dev, p]), np.concatenate([alloc_t, first])
        alloc_b = np.concatenate([alloc_b, np.asarray(param_grad, dtype=np.int64)])
    return (alloc_dev, alloc_t, alloc_b), (free_dev, free_t, free_b)


def held_until(schedule: Schedule, own: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Per op, when its kept output is freed: its own backward's end where ``own`` or nothing else reads it, else
    the last end among its readers' backwards ``idx[ptr[u]:ptr[u + 1]]`` (no later than its own)."""
    end = schedule.bwd_end_s
    src = np.repeat(np.arange(len(end)), np.diff(ptr))
    last = np.full(len(end), -np.inf)
    np.maximum.at(last, src, end[idx])
    return np.where(own | (np.diff(ptr) == 0), end, np.minimum(last, end))


def param_grad_bytes(param_bytes: np.ndarray, grad: np.ndarray, homed_ops: np.ndarray) -> np.ndarray:
    """Per op, the gradient bytes of its parameters that the sweep allocates at its backward's start: its
    ``param_bytes`` where it has a backward (``grad``), 0 for the offloaded ops (``homed_ops``: their gradient counts
    on the home for the whole step).

    >>> param_grad_bytes(np.array([8, 4, 4]), np.array([True, False, True]), np.array([2])).tolist()
    [8, 0, 0]
    """
    out = np.where(np.asarray(grad, dtype=bool), np.asarray(param_bytes, dtype=np.int64), 0)
    out[np.asarray(homed_ops, dtype=np.int64)] = 0
    return out


def sweep_peak(alloc_t: np.ndarray, alloc_b: np.ndarray, free_t: np.ndarray, free_b: np.ndarray) -> tuple[int, float]:
    """Peak of ``sum(allocs up to t) - sum(frees up to t)`` and the time it is reached."""
    if len(alloc_t) == 0:
        return 0, 0.0
    ao = np.argsort(alloc_t, kind="stable")
    fo = np.argsort(free_t, kind="stable")
    at, ab = alloc_t[ao], alloc_b[ao]
    ft, fb = free_t[fo], free_b[fo]
    cum_alloc = np.cumsum(ab)
    cum_free = np.concatenate([[0], np.cumsum(fb)])
    freed = cum_free[np.searchsorted(ft, at, side="right")]
    live = cum_alloc - freed
    k = int(np.argmax(live))
    return max(int(live[k]), 0), float(at[k])


def peak_bytes(
    schedule: Schedule,
    act_bytes: np.ndarray,
    static_per_device: np.ndarray,
    num_devices: int,
    grad: np.ndarray | None = None,
    kept: np.ndarray | None = None,
    consumers: tuple[np.ndarray, np.ndarray] | None = None,
    param_grad: np.ndarray | None = None,
    microbatches: int = 1,
    readers: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Peak bytes per device (static + the sweep) and the time of each peak (``grad``, ``kept``, ``param_grad``,
    ``readers``: see :func:`memory_events`; ``static_per_device`` must leave out the ``param_grad`` bytes)."""
    (ad, at, ab), (fd, ft, fb) = memory_events(
        schedule, act_bytes, num_devices, grad, kept, consumers, param_grad, microbatches, readers
    )
    peaks = np.asarray(static_per_device, dtype=np.int64).copy()
    when = np.zeros(num_devices)
    for d in range(num_devices):
        pk, at_s = sweep_peak(at[ad == d], ab[ad == d], ft[fd == d], fb[fd == d])
        peaks[d] += pk
        when[d] = at_s
    return peaks, when
