"""Groups and splits for the heuristics: co-location groups, snapping a placement to them, linear partitions."""

from __future__ import annotations

import numpy as np

from graphs import OpGraph
from graphs.grouping import colocate, vote


def colocation_groups(graph: OpGraph) -> np.ndarray:
    """Co-location group id per op (:func:`graphs.grouping.colocate`: dense 0..G-1, numbered by first op), int64."""
    return colocate(graph).astype(np.int64)


def snap_to_groups(op_devices: np.ndarray, groups: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Give every op of a group the device holding most of the group's ``weight`` (:func:`graphs.grouping.vote`)."""
    op_devices = np.asarray(op_devices, dtype=np.int64)
    if len(op_devices) == 0 or groups.max() + 1 == len(groups):
        return op_devices.astype(np.int32)
    w = None if weight is None else np.asarray(weight, dtype=np.float64) + 1e-12
    return vote(groups, op_devices, int(groups.max()) + 1, int(op_devices.max()) + 1, w)[groups].astype(np.int32)


def to_int_weights(w: np.ndarray, top: int = 10_000, floor: int = 1) -> np.ndarray:
    """Scale non-negative weights to integers in ``[floor, top]`` (partitioners want ints)."""
    w = np.asarray(w, dtype=np.float64)
    if len(w) == 0:
        return w.astype(np.int64)
    m = float(w.max())
    if m <= 0:
        return np.full(len(w), max(floor, 1), dtype=np.int64)
    return np.maximum(np.rint(w / m * top), floor).astype(np.int64)


def linear_partition(
    costs: np.ndarray, parts: int, capacity: np.ndarray | None = None, sizes: np.ndarray | None = None
) -> np.ndarray:
    """Split a sequence into ``parts`` contiguous blocks minimising the largest block cost.

    Binary search on the bottleneck with a greedy feasibility check (exact up to
    float tolerance). With ``capacity``/``sizes``, block ``k`` may also hold at
    most ``capacity[k]`` of summed ``sizes`` when that is possible at all.

    >>> linear_partition(np.array([1., 1., 1., 1.]), 2).tolist()
    [0, 0, 1, 1]
    """
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if n == 0 or parts <= 1:
        return np.zeros(n, dtype=np.int64)
    sizes = np.zeros(n) if sizes is None else np.asarray(sizes, dtype=np.float64)
    cap = np.full(parts, np.inf) if capacity is None else np.asarray(capacity, dtype=np.float64)

    def greedy(limit: float) -> np.ndarray | None:
        out = np.empty(n, dtype=np.int64)
        k, load, mem = 0, 0.0, 0.0
        for i in range(n):
            c, s = costs[i], sizes[i]
            if (load + c > limit or mem + s > cap[k]) and load + mem > 0 and k < parts - 1:
                k, load, mem = k + 1, 0.0, 0.0
            load += c
            mem += s
            out[i] = k
            if load > limit * (1 + 1e-9) + 1e-15:
                return None
        return out

    lo, hi = float(costs.max()), float(costs.sum())
    best = greedy(hi)
    for _ in range(60):
        if hi - lo <= 1e-9 * max(hi, 1e-30):
            break
        mid = 0.5 * (lo + hi)
        got = greedy(mid)
        if got is not None and _fits(got, sizes, cap):
            best, hi = got, mid
        else:
            lo = mid
    if best is None or not _fits(best, sizes, cap):
        best = greedy(float(costs.sum())) if best is None else best
    return best


def _fits(assign: np.ndarray, sizes: np.ndarray, cap: np.ndarray) -> bool:
    used = np.bincount(assign, weights=sizes, minlength=len(cap))
    return bool(np.all(used <= cap))
