"""Shared pieces of the heuristic baselines: costs, memory, groups, linear splits.

Every baseline sees the graph through the same numbers the simulator uses:
per-op forward + backward seconds per device (:func:`envs.cost.op_times`), tensor
transfer times over the cluster's links, and a per-op memory estimate.
"""

from __future__ import annotations

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.grouping import colocate, vote


class BaselineUnavailable(PlacerError):
    """A baseline cannot run here; ``status`` says why ("not installed", "needs a model")."""

    def __init__(self, message: str, status: str = "not installed") -> None:
        super().__init__(message)
        self.status = status


def require(module: str, method: str, extra: str = "partition"):
    """Import an optional library or raise :class:`BaselineUnavailable`."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise BaselineUnavailable(
            f"{method}: needs the {module!r} package (pip install 'placer[{extra}]')", "not installed"
        ) from None


# --------------------------------------------------------------------- costs
def step_costs_s(graph: OpGraph, cluster) -> np.ndarray:
    """Forward + backward seconds of each op on each device, shape [num_ops, D]."""
    from envs.cost import op_times

    fwd_s, bwd_s = op_times(graph, cluster)
    return np.asarray(fwd_s, dtype=np.float64) + np.asarray(bwd_s, dtype=np.float64)


def gpu_devices(cluster) -> np.ndarray:
    """Indices of the cluster's GPUs (all devices when it has none)."""
    gpus = list(cluster.gpu_indices())
    return np.asarray(gpus if gpus else range(cluster.num_devices), dtype=np.int64)


def mean_link(cluster, devices: np.ndarray) -> tuple[float, float]:
    """Mean (seconds per byte, latency seconds) over distinct pairs of ``devices``."""
    if len(devices) < 2:
        return 0.0, 0.0
    bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)[np.ix_(devices, devices)]
    lat = np.asarray(cluster.latency_s, dtype=np.float64)[np.ix_(devices, devices)]
    off = ~np.eye(len(devices), dtype=bool)
    return float(np.mean(1.0 / bw[off])), float(np.mean(lat[off]))


# -------------------------------------------------------------------- memory
def op_memory_bytes(graph: OpGraph) -> np.ndarray:
    """Bytes an op pins on its device over a training step (int64).

    Its parameters, their gradients, the optimizer state and its buffers
    (:func:`envs.cost.static_bytes`) plus its output, kept for the backward pass
    (:func:`envs.cost.activation_bytes`): the "permanent + activation" footprint
    Baechi's memory-aware algorithms account against a device's capacity. Summed
    over a device it bounds the simulator's peak from above, up to the transient
    gradient buffers and received tensors that :data:`MEMORY_HEADROOM` leaves room for.
    """
    from envs.cost import activation_bytes, static_bytes

    return (static_bytes(graph) + activation_bytes(graph)).astype(np.int64)


#: Share of a device's memory the memory-aware baselines fill with
#: :func:`op_memory_bytes`; the rest is for transient gradients and received copies.
MEMORY_HEADROOM = 0.9


def capacity_bytes(cluster) -> np.ndarray:
    """Per-device memory the memory-aware baselines may fill."""
    return MEMORY_HEADROOM * np.asarray(cluster.memory_bytes, dtype=np.float64)


# -------------------------------------------------------------------- groups
def colocation_groups(graph: OpGraph) -> np.ndarray:
    """Co-location group id per op (:func:`graphs.grouping.colocate`: dense 0..G-1, numbered by first op), int64."""
    return colocate(graph).astype(np.int64)


def snap_to_groups(idx: np.ndarray, groups: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Give every op of a group the device holding most of the group's ``weight`` (:func:`graphs.grouping.vote`)."""
    idx = np.asarray(idx, dtype=np.int64)
    if len(idx) == 0 or groups.max() + 1 == len(groups):
        return idx.astype(np.int32)
    w = None if weight is None else np.asarray(weight, dtype=np.float64) + 1e-12
    return vote(groups, idx, int(groups.max()) + 1, int(idx.max()) + 1, w)[groups].astype(np.int32)


def to_int_weights(w: np.ndarray, top: int = 10_000, floor: int = 1) -> np.ndarray:
    """Scale non-negative weights to integers in ``[floor, top]`` (partitioners want ints)."""
    w = np.asarray(w, dtype=np.float64)
    if len(w) == 0:
        return w.astype(np.int64)
    m = float(w.max())
    if m <= 0:
        return np.full(len(w), max(floor, 1), dtype=np.int64)
    return np.maximum(np.rint(w / m * top), floor).astype(np.int64)


# ---------------------------------------------------------- linear partition
def linear_partition(costs: np.ndarray, parts: int, capacity: np.ndarray | None = None, sizes: np.ndarray | None = None) -> np.ndarray:
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


# ------------------------------------------------------------ list schedules
# A cut edge moves the activation forward and its gradient backward.
COMM_DIRECTIONS = 2


def candidate_devices(cluster, devices: str) -> np.ndarray:
    """``"gpus"`` -> the GPUs (all devices when none); ``"all"`` -> every device."""
    if devices == "gpus":
        return gpu_devices(cluster)
    if devices == "all":
        return np.arange(cluster.num_devices, dtype=np.int64)
    raise PlacerError(f"devices must be 'gpus' or 'all', got {devices!r}")


def scored_keys(env, idx: np.ndarray, batch: int = 64) -> list[tuple[bool, float]]:
    """(out of memory, step time) of each row of ``idx`` on ``env``, simulated ``batch`` rows at a time.

    Smaller is better: a placement that fits beats one that does not, then the faster wins.
    """
    out: list[tuple[bool, float]] = []
    for s in range(0, len(idx), batch):
        t, oom = env.step_times(idx[s:s + batch])
        out += [(bool(o), float(x) if np.isfinite(x) else float("inf")) for o, x in zip(oom, t)]
    return out


def link_arrays(cluster, devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per byte, latency s) between candidate devices, both [C, C], 0 on the diagonal."""
    bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)[np.ix_(devices, devices)]
    lat = np.asarray(cluster.latency_s, dtype=np.float64)[np.ix_(devices, devices)].copy()
    with np.errstate(divide="ignore"):
        spb = np.where(np.isinf(bw), 0.0, 1.0 / bw)
    np.fill_diagonal(spb, 0.0)
    np.fill_diagonal(lat, 0.0)
    return COMM_DIRECTIONS * spb, COMM_DIRECTIONS * lat


class ParamCopies:
    """What a list scheduler charges for reading a shared parameter on another device.

    :func:`placer.apply` keeps a parameter read by several ops on its owner's
    device and gives every other device that reads it one copy, whose gradient
    is sent back (:func:`graphs.ops.param_reads`). A TensorFlow graph, which the
    list schedulers were written for, has the same reads as edges from a variable
    op, and its runtime also sends a tensor once per device. So a reader on a
    device that has no copy yet starts later by the copy's forward and backward
    transfer time over the owner's link (as a cut edge is charged, both
    directions); once one reader is placed there, later ones read that copy free.
    ``enabled=False``, or a graph without shared parameters, charges nothing.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], param_bytes=[100, 0, 0])
    >>> g.params = [["w"], [], ["w"]]
    >>> pc = ParamCopies(g, 2)
    >>> spb, lat = np.array([[0.0, 0.01], [0.01, 0.0]]), np.zeros((2, 2))
    >>> dev = np.array([0, 1, -1])
    >>> pc.delay(2, dev, spb, lat).tolist()  # c reads a's weights: free on device 0, a copy of 100 bytes to 1
    [0.0, 1.0]
    >>> pc.placed(2, 1); pc.delay(2, dev, spb, lat).tolist()
    [0.0, 0.0]
    """

    def __init__(self, graph: OpGraph, num_devices: int, enabled: bool = True) -> None:
        if not isinstance(enabled, (bool, np.bool_)):
            raise PlacerError(f"--option param_copies={enabled!r}: expected true or false")
        self.num_devices = num_devices
        self.reads: dict[int, list[tuple[int, float]]] = {}
        self.have: dict[int, np.ndarray] = {}  # owner -> candidate devices that already hold a copy
        if enabled:
            from graphs.ops import param_reads

            owner, reader, nbytes = param_reads(graph)
            for o, r, b in zip(owner.tolist(), reader.tolist(), nbytes.tolist()):
                self.reads.setdefault(r, []).append((o, float(b)))

    def delay(self, op: int, dev: np.ndarray, spb: np.ndarray, lat: np.ndarray) -> np.ndarray | float:
        """Seconds added to ``op``'s start on each candidate device (0.0 when it reads nothing shared).

        ``dev``: the candidate index of every op placed so far (-1 if not yet);
        ``spb``/``lat``: :func:`link_arrays` (both directions already). A parameter
        whose owner is not placed yet charges nothing.
        """
        reads = self.reads.get(op)
        if not reads:
            return 0.0
        extra = np.zeros(self.num_devices)
        for o, nbytes in reads:
            home = int(dev[o])
            if home >= 0:  # the cost is 0 on the owner's own device (no link to itself)
                cost = nbytes * spb[home] + lat[home]
                have = self.have.get(o)
                extra += cost if have is None else np.where(have, 0.0, cost)
        return extra

    def placed(self, op: int, d: int) -> None:
        """``op`` went to candidate ``d``: the parameters it reads are on ``d`` from now on."""
        for o, _ in self.reads.get(op, ()):
            self.have.setdefault(o, np.zeros(self.num_devices, dtype=bool))[d] = True
