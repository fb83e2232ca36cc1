"""A lower bound on the simulated step time that no placement can beat.

The simulated step is ``backward_end + max_d update_d`` (see :mod:`envs.schedule`),
so the bound is ``max(critical path, work bound) + update bound``:

* critical path: forward then backward through the graph with every op at its
  fastest device for that pass and communication free;
* work bound: devices run one op at a time, so for any weights ``λ`` on the
  simplex, ``backward_end >= max_d busy_d >= Σ_d λ_d busy_d >= Σ_i min_d λ_d w_id``
  with ``w_id`` the forward + backward time of op ``i`` on ``d``. Uniform ``λ``
  gives "total work over the number of devices"; we also climb ``λ`` by
  exponentiated-gradient ascent (every iterate is a valid bound; the best is kept),
  which matters when devices differ (a slow host CPU is worth little);
* update bound: the largest single parameter-owning op's best update time, and
  the total parameter traffic spread over the aggregate memory bandwidth.

The result is shrunk by a relative 1e-9 so that floating-point summation order
can never push it above a tight simulated time.
"""

from __future__ import annotations

import numpy as np

from envs import cost
from envs.cluster import Cluster
from graphs.ir import OpGraph

_SLACK = 1e-9


def critical_path_s(graph: OpGraph, fwd_min: np.ndarray, bwd_min: np.ndarray) -> float:
    """Longest forward-then-backward path with per-op times ``fwd_min``/``bwd_min``."""
    n = graph.num_ops
    if n == 0:
        return 0.0
    in_ptr, in_src, _ = graph.in_csr
    out_ptr, out_dst, _ = graph.out_csr
    f = fwd_min.tolist()
    b = bwd_min.tolist()
    src = in_src.tolist()
    dst = out_dst.tolist()
    ip = in_ptr.tolist()
    op = out_ptr.tolist()
    ef = [0.0] * n
    for v in range(n):
        ready = 0.0
        for k in range(ip[v], ip[v + 1]):
            if ef[src[k]] > ready:
                ready = ef[src[k]]
        ef[v] = ready + f[v]
    eb = [0.0] * n
    for u in range(n - 1, -1, -1):
        ready = ef[u]
        for k in range(op[u], op[u + 1]):
            if eb[dst[k]] > ready:
                ready = eb[dst[k]]
        eb[u] = ready + b[u]
    return max(eb)


def work_bound_s(work: np.ndarray, iterations: int = 200) -> float:
    """``max over λ in the simplex of Σ_i min_d λ_d work[i, d]`` (approximately; always valid)."""
    n, D = work.shape
    if n == 0:
        return 0.0
    lam = np.full(D, 1.0 / D)
    best = float(np.min(work * lam, axis=1).sum())
    scale = max(float(np.sum(work.min(axis=1))), 1e-300)
    step = 1.0
    for _ in range(iterations):
        weighted = work * lam
        arg = np.argmin(weighted, axis=1)
        value = float(weighted[np.arange(n), arg].sum())
        best = max(best, value)
        grad = np.bincount(arg, weights=work[np.arange(n), arg], minlength=D) / scale
        lam = lam * np.exp(step * (grad - grad.max()))
        lam /= lam.sum()
        step *= 0.98
    return best


def update_bound_s(graph: OpGraph, cluster: Cluster) -> float:
    """No placement updates its parameters faster than this after the backward pass."""
    p = graph.param_bytes.astype(np.float64)
    if not np.any(p > 0):
        return 0.0
    traffic = cost.UPDATE_TRAFFIC_MULTIPLIER
    per_op = cluster.launch_overhead_s[None, :] + traffic * p[p > 0, None] / cluster.mem_bw_bytes_per_s[None, :]
    largest = float(per_op.min(axis=1).max())
    spread = float(traffic * p.sum() / cluster.mem_bw_bytes_per_s.sum())
    return max(largest, spread)


def lower_bound_from_times(graph: OpGraph, cluster: Cluster, fwd_s: np.ndarray, bwd_s: np.ndarray) -> float:
    """The bound from precomputed ``[num_ops, num_devices]`` op times."""
    cp = critical_path_s(graph, fwd_s.min(axis=1) if graph.num_ops else fwd_s, bwd_s.min(axis=1) if graph.num_ops else bwd_s)
    work = work_bound_s(fwd_s + bwd_s)
    return (max(cp, work) + update_bound_s(graph, cluster)) * (1.0 - _SLACK)


def lower_bound(graph: OpGraph, cluster: Cluster) -> float:
    """Seconds: no placement of ``graph`` on ``cluster`` simulates faster.

    >>> from graphs import OpGraph
    >>> from envs.cluster import Cluster
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[4e9, 4e9])
    >>> lb = lower_bound(g, Cluster.preset("k80x2"))
    >>> round(lb * 1e3, 3)  # a chain: 2 forward + 2 backward ops at 1.008 ms
    6.048
    """
    fwd, bwd = cost.op_times(graph, cluster)
    return lower_bound_from_times(graph, cluster, fwd, bwd)
