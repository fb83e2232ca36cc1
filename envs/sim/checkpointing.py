"""Activation checkpointing per block under the eager executor (the reference).

A plan may name blocks, module paths whose ops keep no activation for the backward
(:attr:`graphs.plan.Placement.checkpoint`; per op, the block's first op index, -1
for none: :func:`graphs.plan.checkpoint_blocks`). :mod:`envs.real.checkpointing`
runs each block's ops under :func:`torch.utils.checkpoint.checkpoint`
(non-reentrant), and the simulator charges what that runtime does:

* **forward**: unchanged (the same ops, issued in the same order).
* **recompute**: when autograd's thread for the block's device picks the first
  backward of any of the block's ops (at ``now``), it runs the block's forward
  again before that backward: for each op ``i`` of the block, in issue order, on a
  GPU ``d`` the thread issues it (``t += issue_f[i, d]``) and its kernel queues on
  the stream (``start = max(t, free[d])``, ``free[d] = start + fwd[i, d]``); on
  the host the thread runs it (``start = t``, ``t += fwd[i, d]``). The backward is
  then issued from ``t``. A block runs its forward again once per step.
* **homes**: an op of a block whose parameters live on the host (:mod:`envs.sim.homes`)
  has its copy made again in the recompute, right before the thread issues the op
  (at ``t``), on the side stream outside its window of two: ``start = max(t,
  L[c, d])``, and the recomputed kernel starts no earlier than its end. It is
  live until the op's backward ends, and that backward makes no copy of its own.
* **memory**: a block op's output that autograd keeps (:func:`graphs.ops.saved_mask`)
  is held in the forward only as long as something outside the block needs it:
  until its last forward consumer has run, or until the last backward outside the
  block that reads it has ended. The recomputed output is live from the start of
  its recompute kernel until the last backward inside the block that reads it (its
  own, or its readers', :func:`graphs.ops.backward_readers`) has ended. The
  block's inputs (outputs of ops outside it, or copies received onto its device)
  stay live until the block's last backward has ended: the checkpoint holds them
  to run the forward again. Outputs nothing keeps, recomputed and dropped within
  the recompute, are not charged.

A block's ops must all run on one device, issued one after the other (no other op between them in the issue order),
under the eager executor with one microbatch: anything else is a
:class:`graphs.PlacerError` naming the block. :mod:`envs.sim.kernel_checkpointing`
computes the same times and bytes compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphs.errors import PlacerError

if TYPE_CHECKING:
    from envs.sim.eager import EagerRun
    from envs.sim.simulator import SimEnv


def checkpoint_of(env: "SimEnv", placement: Any) -> np.ndarray | None:
    """Per op, the block ``placement`` checkpoints it in (-1: none), or None when it names none."""
    if not getattr(placement, "checkpoint", None):
        return None
    return placement.checkpoint_blocks(env.graph)


def checkpoint_rows(
    env: "SimEnv",
    op_devices: np.ndarray,
    blocks: Any,
    order: np.ndarray | None = None,
    *,
    where_possible: bool = False,
) -> np.ndarray | None:
    """``blocks`` (``[n]`` for every row, or ``[K, n]``) as ``[1 or K, n]`` int64 rows, checked against the
    placements ``op_devices`` (``[K, n]``) and their issue ``order`` (None: node order; one ``[n]`` for every row,
    or ``[K, n]``); None where nothing is checkpointed. ``where_possible``: a block that a row splits across devices
    or interleaves with another op is not checkpointed in that row (``[K, n]`` rows), rather than an error (a
    search's rows: :func:`possible_blocks`)."""
    if blocks is None:
        return None
    ck = np.atleast_2d(np.asarray(blocks, dtype=np.int64))
    n = env.num_ops
    if ck.ndim != 2 or ck.shape[1] != n or len(ck) not in (1, len(op_devices)):
        raise PlacerError(f"checkpoint: expected [{n}] or [K, {n}] block indices, got {np.shape(blocks)}")
    if not (ck >= 0).any():
        return None
    if env.microbatches > 1 or env.executor != "eager":
        raise PlacerError("checkpoint: blocks are simulated with one microbatch, eager")
    bad = (ck >= n) | ((ck >= 0) & (ck > np.arange(n)))
    bad |= (ck >= 0) & (np.take_along_axis(ck, np.clip(ck, 0, n - 1), axis=1) != ck)
    if bad.any():
        raise PlacerError("checkpoint: a block index must be the index of the block's first op")
    if where_possible:
        ck = np.stack(
            [
                possible_blocks(
                    env,
                    op_devices[k],
                    ck[k if len(ck) > 1 else 0],
                    None if order is None else order[k] if order.ndim == 2 else order,
                )
                for k in range(len(op_devices))
            ]
        )
        return ck if (ck >= 0).any() else None
    for k in range(len(op_devices)):
        row = ck[k if len(ck) > 1 else 0]
        _check_together(env, row, None if order is None else order[k] if order.ndim == 2 else order)
        inside = np.flatnonzero(row >= 0)
        p = np.asarray(op_devices[k])
        first = p[row[inside]]
        split = inside[p[inside] != first]
        if len(split):
            b = int(row[split[0]])
            raise PlacerError(
                f"checkpoint: the block of op {env.graph.names[b]!r} runs on more than one device "
                f"(op {env.graph.names[int(split[0])]!r} is elsewhere): a block runs on one device"
            )
    return ck


def possible_blocks(env: "SimEnv", op_devices: np.ndarray, row: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """``row`` (each op's block) less the blocks placement ``op_devices`` cannot checkpoint: split across devices, or
    another op issued among them in ``order``."""
    row = np.asarray(row, dtype=np.int64).copy()
    n = len(row)
    inside = np.flatnonzero(row >= 0)
    if not len(inside):
        return row
    p = np.asarray(op_devices, dtype=np.int64)
    bad = np.zeros(n, dtype=bool)
    bad[row[inside][p[inside] != p[row[inside]]]] = True
    bad |= _interleaved(row, order)[0]
    row[inside[bad[row[inside]]]] = -1
    return row


def _interleaved(row: np.ndarray, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per block id, whether another op is issued among its ops in ``order`` (None: node order), and the
    position of each block's first op."""
    n = len(row)
    inside = row >= 0
    pos = np.arange(n) if order is None else np.argsort(order)
    first = np.full(n, n)
    last = np.full(n, -1)
    np.minimum.at(first, row[inside], pos[inside])
    np.maximum.at(last, row[inside], pos[inside])
    count = np.bincount(row[inside], minlength=n)
    return (count > 0) & (last - first + 1 != count), first


def _check_together(env: "SimEnv", row: np.ndarray, order: np.ndarray | None) -> None:
    """Each block's ops are issued one after the other in ``order`` (what the runtime can wrap)."""
    spread, first = _interleaved(row, order)
    if spread.any():
        b = int(np.flatnonzero(spread)[0])
        at = np.arange(first[b], first[b] + int(np.sum(row == b)) + 1)
        ops = at if order is None else np.asarray(order)[at]
        other = int(next(i for i in ops if row[i] != b))
        raise PlacerError(
            f"checkpoint: the block of op {env.graph.names[b]!r} is not issued in one run (op "
            f"{env.graph.names[other]!r} comes between): a block's ops are issued one after the other"
        )


class Recompute:
    """The recompute of one eager step's checkpointed blocks while it is simulated (the module doc)."""

    def __init__(self, blocks: np.ndarray, fwd_t: np.ndarray, issue_f: np.ndarray) -> None:
        """``blocks``: per op, its block (-1: none)."""
        self.blocks = [int(b) for b in np.asarray(blocks).tolist()]
        self.fwd_t, self.issue_f = fwd_t, issue_f
        self.start: dict[int, float] = {}  # op -> the start of its recompute kernel
        self.done: set[int] = set()

    def before_backward(self, run: "EagerRun", j: int, d: int, now: float, ops: list[int]) -> float:
        """``bwd j`` picked at ``now`` by the thread of device ``d``: its block's forward again first, if not done
        yet (``ops``: the call's ops, in issue order); returns the thread's time after."""
        b = self.blocks[j]
        if b < 0 or b in self.done:
            return now
        self.done.add(b)
        t = now
        for i in ops:
            if self.blocks[i] != b:
                continue
            if run.is_host[d]:
                s = t
                t = run.free[d] = s + float(self.fwd_t[i, d])
            else:
                # its parameters copied from their home again first, outside the window (envs.sim.homes)
                fetched = run.homes.recompute_in(i, d, t, run.link) if run.homes else 0.0
                t += float(self.issue_f[i, d])
                s = max(t, run.free[d], fetched)
                run.free[d] = s + float(self.fwd_t[i, d])
            self.start[i] = s
        return t

    def start_s(self, n: int) -> np.ndarray:
        """Per op, the start of its recompute kernel (NaN for an op not recomputed)."""
        out = np.full(n, np.nan)
        for i, s in self.start.items():
            out[i] = s
        return out


def recompute_seconds(blocks: np.ndarray, op_devices: np.ndarray, fwd_t: np.ndarray) -> np.ndarray:
    """Per device, the seconds its recomputes run (each checkpointed op's forward once more)."""
    inside = np.flatnonzero(np.asarray(blocks) >= 0)
    p = np.asarray(op_devices, dtype=np.int64)
    return np.bincount(p[inside], weights=fwd_t[inside, p[inside]], minlength=fwd_t.shape[1])


def checkpoint_frees(
    blocks: np.ndarray,
    op_devices: np.ndarray,
    num_devices: int,
    out_free: np.ndarray,
    release: np.ndarray,
    bwd_end: np.ndarray,
    kept: np.ndarray,
    readers: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    consumers: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The memory rule of the module doc, on a schedule's per-op times.

    ``out_free``: when each output is freed without checkpointing; ``release``: when the forward last reads it
    (:func:`envs.sim.memory.release_times`). Returns ``(out_free, recomputed, held_to, holds)``: the outputs' new
    free times, which ops' outputs are allocated again at their recompute (and freed at ``held_to``), and
    ``[n, D]``: until when the output of ``u`` on device ``d`` (its own, or the copy received there) is held as a
    block's input (0: not one).
    """
    blocks = np.asarray(blocks, dtype=np.int64)
    p = np.asarray(op_devices, dtype=np.int64)
    n = len(blocks)
    out_free = out_free.copy()
    recomputed = np.zeros(n, dtype=bool)
    held_to = np.zeros(n)
    holds = np.zeros((n, num_devices))
    inside = np.flatnonzero(blocks >= 0)
    if not len(inside):
        return out_free, recomputed, held_to, holds
    last = np.full(n, -np.inf)
    np.maximum.at(last, blocks[inside], bwd_end[inside])
    if readers is None:
        own, rptr, ridx = np.ones(n, dtype=bool), np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    else:
        own, rptr, ridx = readers
    for i in inside.tolist():
        if not kept[i]:
            continue
        b = int(blocks[i])
        read = ridx[rptr[i] : rptr[i + 1]].tolist()
        outside = [bwd_end[v] for v in read if blocks[v] != b]
        inner = [bwd_end[v] for v in read if blocks[v] == b]
        out_free[i] = max([release[i], *outside])
        if own[i] or not read:
            recomputed[i], held_to[i] = True, bwd_end[i]
        elif inner:
            recomputed[i], held_to[i] = True, min(max(inner), bwd_end[i])
    out_ptr, out_dst = consumers
    for u in range(n):
        for v in out_dst[out_ptr[u] : out_ptr[u + 1]].tolist():
            if blocks[v] >= 0 and blocks[v] != blocks[u]:
                holds[u, p[v]] = max(holds[u, p[v]], last[blocks[v]])
    out_free = np.maximum(out_free, holds[np.arange(n), p])
    return out_free, recomputed, held_to, holds


__all__ = ["Recompute", "checkpoint_frees", "checkpoint_of", "checkpoint_rows", "recompute_seconds"]
