"""Energetic reasoning over the step's tasks: a bound where the work near the critical path is wider than the devices.

Each op's forward and backward is a task at its fastest device, with a head (the
longest path of tasks before it) and a tail (the longest after it,
:func:`task_windows`). For a candidate ``backward_end`` ``T`` a task must run
inside ``[head, T - tail]``, so it owes every window ``[t1, t2]`` a least
overlap; if some window is owed more than the devices can do in it (``D`` x its
length) no schedule ends by ``T``. :func:`energetic_bound_s` bisects for the
largest ``T`` proven impossible. Part of :mod:`envs.sim.bound`; the block bound
(:mod:`envs.sim.blocks`) cuts the same tasks.
"""

from __future__ import annotations

import numpy as np

from graphs.ir import OpGraph


def task_windows(
    graph: OpGraph, fwd: np.ndarray, bwd: np.ndarray, grad: np.ndarray | None = None, release: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(head, tail, duration)`` of the step's ``2 n`` tasks: each op's forward, then each op's backward.

    ``fwd``, ``bwd``: per-op seconds (``[n]``, each op at its fastest device); a
    head is the longest path of tasks that must end before the task starts, a
    tail the longest that must start after it ends (both without the task). The
    edges are the simulator's: ``fwd u -> fwd v`` for an edge ``u -> v``;
    ``fwd v -> bwd v``; ``bwd w -> bwd u`` for an edge ``u -> w`` where ``w`` is
    in autograd (``grad``, default every op). Ops outside autograd get no
    backward time. ``release`` (``[2 n]``, default 0): a time before which each
    task cannot start whatever its predecessors (the eager host's issue); heads
    start from it and carry it to the task's successors.
    """
    n = graph.num_ops
    grad_b = np.ones(n, dtype=bool) if grad is None else np.asarray(grad, dtype=bool)
    pf = np.asarray(fwd, dtype=np.float64)
    pb = np.where(grad_b, np.asarray(bwd, dtype=np.float64), 0.0)
    in_ptr, in_src, _ = (a.tolist() for a in graph.in_csr)
    out_ptr, out_dst, _ = (a.tolist() for a in graph.out_csr)
    f, b, g = pf.tolist(), pb.tolist(), grad_b.tolist()
    rel = [0.0] * (2 * n) if release is None else np.asarray(release, dtype=np.float64).tolist()
    hf, hb, tf, tb = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for v in range(n):  # forward heads, in topological order
        hf[v] = max((hf[u] + f[u] for u in in_src[in_ptr[v] : in_ptr[v + 1]]), default=rel[v])
        hf[v] = max(hf[v], rel[v])
    for v in range(n - 1, -1, -1):  # backward heads: after the op's own forward and its consumers' backward
        hb[v] = max([hf[v] + f[v], rel[n + v]] + [hb[w] + b[w] for w in out_dst[out_ptr[v] : out_ptr[v + 1]] if g[w]])
    for v in range(n):  # backward tails: an op's backward comes before its inputs' backward
        if g[v]:
            tb[v] = max((b[u] + tb[u] for u in in_src[in_ptr[v] : in_ptr[v + 1]]), default=0.0)
    for v in range(n - 1, -1, -1):  # forward tails: its own backward, or its consumers' forward
        tf[v] = max([b[v] + tb[v]] + [f[w] + tf[w] for w in out_dst[out_ptr[v] : out_ptr[v + 1]]])
    return np.array(hf + hb), np.array(tf + tb), np.concatenate([pf, pb])


def _overloaded(T: float, head: np.ndarray, tail: np.ndarray, p: np.ndarray, capacity: float, windows: int) -> bool:
    """Whether some window ``[t1, t2]`` is owed more work than ``capacity`` devices do in it, if every task ends by
    ``T``.

    A task with release ``r = head``, deadline ``d = T - tail`` and duration ``p``
    overlaps ``[t1, t2]`` by at least ``max(0, min(t2 - t1, p, r + p - t1, t2 - d + p))``
    (left-shifted or right-shifted as far as it can go). Windows open at a task's
    release or latest start and close at an earliest end or deadline (the points
    where the owed work changes slope); past ``windows`` of each, an even spread of
    their quantiles is checked (any window checked is a valid test).
    """
    earliest_end = head + p
    latest_start = T - tail - p
    opens = np.unique(np.concatenate([head, latest_start]))
    closes = np.unique(np.concatenate([earliest_end, T - tail]))
    if len(opens) > windows:
        opens = np.quantile(opens, np.linspace(0.0, 1.0, windows))
    if len(closes) > windows:
        closes = np.quantile(closes, np.linspace(0.0, 1.0, windows))
    slack = 1e-12 * T
    for t1 in opens:
        t2 = closes[closes > t1]
        if not len(t2):
            continue
        length = t2 - t1
        owed = np.minimum(
            np.minimum(length[:, None], p[None, :]),
            np.minimum(earliest_end[None, :] - t1, t2[:, None] - latest_start[None, :]),
        )
        if np.any(np.maximum(owed, 0.0).sum(axis=1) > capacity * length + slack):
            return True
    return False


def energetic_bound_s(
    head: np.ndarray,
    tail: np.ndarray,
    p: np.ndarray,
    capacity: float,
    lo: float = 0.0,
    *,
    windows: int | None = None,
    rel_tol: float = 1e-4,
) -> float:
    """The largest ``T >= lo`` that energetic reasoning proves no schedule of the tasks on ``capacity`` devices ends by.

    ``head``, ``tail``, ``p``: per task (:func:`task_windows`); ``lo``: a value
    already known to be a bound (the result is never below it); ``windows``: the
    opening and closing points tried (default: 128, fewer past 12,000 tasks, so
    that one test costs at most about 2e8 operations). Bisection
    between ``lo`` and the serial time ``sum(p)`` (every task on one device, which
    passes the test) to a relative ``rel_tol``; every ``T`` it returns was shown
    impossible, so the result is a bound whatever the tolerance.
    """
    keep = p > 0
    head, tail, p = head[keep], tail[keep], p[keep]
    if not len(p):
        return lo
    given = lo
    if windows is None:
        windows = int(np.clip(np.sqrt(2e8 / len(p)), 32, 128))
    lo = max(lo, float((head + p + tail).max()))  # the critical path: below it every window test is moot
    hi = max(float(p.sum()), lo)
    if not _overloaded(lo * (1 + rel_tol), head, tail, p, capacity, windows):
        return given  # nothing proven beyond what was known
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if _overloaded(mid, head, tail, p, capacity, windows):
            lo = mid
        else:
            hi = mid
    return lo
