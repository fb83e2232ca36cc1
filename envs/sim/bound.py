"""A lower bound on the simulated step time that no placement can beat.

The simulated step is ``backward_end + max_d update_d`` (see :mod:`envs.sim.schedule`),
so the bound is ``max(critical path, work bound) + update bound``. It holds for
both executor models: in ``eager`` too an op starts after its inputs exist (a
copy waits for its producer's stream or the host), a backward op after its own
forward and its consumers' backward, and a device runs one op at a time.

* critical path: forward then backward through the graph with every op at its
  fastest device for that pass and communication free;
* work bound (:mod:`envs.sim.work_bound`): devices run one op at a time, so for any weights ``λ`` on the
  simplex, ``backward_end >= max_d busy_d >= Σ_d λ_d busy_d >= Σ_i min_d λ_d w_id``
  with ``w_id`` the forward + backward time of op ``i`` on ``d``. Uniform ``λ``
  gives "total work over the number of devices"; the best ``λ`` matters when
  devices differ (a slow host CPU is worth little). Identical devices share a
  weight; with two kinds of device the best ``λ`` is found exactly, with more by
  exponentiated-gradient ascent (every iterate is a valid bound; the best is kept);
* update bound: the largest single parameter-owning op's best update time, the
  total parameter traffic spread over the aggregate memory bandwidth, and, where
  the GPUs cannot hold every parameter's state, the host's update of what must
  live there (with its op or as its home, :mod:`envs.sim.homes`);
* communicating path (:func:`communicating_path_s`): the critical path where each
  op may sit on any device but an edge between two devices pays its copy, each
  way (an op waits for its inputs' copies, a backward task for its consumers'
  gradients). It is above the critical path where an op's fastest device is not
  its neighbours' (a host op between GPU ops); on the zoo with identical GPUs the
  two agree to 0.01 ms.

* energetic (:mod:`envs.sim.energetic`): energetic reasoning over the step's
  tasks (each op's forward and backward at its fastest device, each with a head,
  the longest path before it, and a tail, the longest path after it). For a
  candidate ``backward_end`` ``T`` a task must run inside ``[head, T - tail]``, so
  it owes every window ``[t1, t2]`` a least overlap; if some window is owed more
  than the devices can do in it (``D`` x its length) no schedule ends by ``T``.
  The largest ``T`` proven impossible (bisection) is a bound. It is above the
  critical path and the work bound where the near-critical work is wider than the
  devices in places, and equal to them elsewhere.

The eager executor (:mod:`envs.sim.schedule`) adds a host-issue bound. One host
thread issues the forward pass, and one microbatch's ``backward()`` is called
after it: a GPU op costs the host its issue time (``launch_overhead_s`` unless
profiled), a host op its whole forward time, so the host's clock ``h_f`` when the
forward has been issued is at least ``Σ_i c_{i,p_i}`` with ``c_{id}`` that per-op
host cost. With one microbatch every backward task starts at or after ``h_f``, so

* host issue + backward path: ``Σ_i min_d c_id`` + the longest backward-only path;
* host issue + backward work: for any ``λ`` on the simplex, ``backward_end >= h_f +
  max_d B_d >= Σ_i min_d (c_id + λ_d b_id)``, maximised over ``λ`` by a linear
  program (:func:`scipy.optimize.linprog`, HiGHS; the bound is recomputed from
  the returned ``λ``, so solver tolerance cannot make it invalid);
* host issue + path: the issue order is topological, so no op's forward starts
  before the host has issued all its ancestors, ``Σ_{u ancestor of v} min_d c_ud``
  (:func:`ancestor_sums`), and no backward task of the last ``backward()`` starts
  before ``Σ_i min_d c_id``. These releases raise the tasks'
  heads, and the longest path with them is a bound (a join of many cheap ops
  waits for all of them to be issued, where the critical path waits for the
  slowest). The energetic bound then uses the same heads.

* blocks (:mod:`envs.sim.blocks`, only when asked for: ``blocks_s`` seconds of
  mixed-integer programs): the step cut at the tasks every other task precedes or
  follows, each block between two of them solved exactly for its placement,
  copies and (eager) the streams copies hold. It charges a branch its copies
  jointly with the placement, which the path bounds cannot: on Inception-v3
  (k80x4) 277 ms where the communicating path says 252.

A pipelined step of ``M`` microbatches may call ``backward()`` between forwards
(one-forward-one-backward), and an early microbatch's backward kernels then run
while the host issues later forwards. Only the last microbatch's backward is sure
to follow ``h_f`` (the last call comes after the last forward), so with ``M > 1``
the backward terms above count only its tasks (backward work: ``Σ_i min_d (c_id +
λ_d b_id [i in the last microbatch])``; backward path: in host issue + path), and
the bound holds for every in-flight window.

The same linear program gives the work bound its exact maximum for any number of
distinct devices. :func:`lower_bound` returns the best of the bounds valid for
the executor, as a :class:`LowerBound` (a float that also carries the name of
the winning bound, every part and the bound of the previous releases,
``previous``: critical path or work, plus updates).

The result is shrunk by a relative 1e-9 so that floating-point summation order
can never push it above a tight simulated time.
"""

from __future__ import annotations

import numpy as np

from envs.cluster import Cluster
from envs.sim import cost
from envs.sim.blocks import block_bound_s
from envs.sim.energetic import energetic_bound_s, task_windows
from envs.sim.work_bound import lp_work_bound_s, work_bound_s
from graphs.dag import critical_path, top_level
from graphs.ir import OpGraph
from graphs.ops import grad_mask

#: The relative amount every bound is shrunk by, so that floating-point summation order cannot push it above a
#: tight simulated time (here and in :func:`envs.sim.ranks.ranks_lower_bound`).
SLACK = 1e-9


def critical_path_s(graph: OpGraph, fwd_min: np.ndarray, bwd_min: np.ndarray) -> float:
    """Seconds of :func:`critical_path`."""
    return critical_path(graph, fwd_min, bwd_min)[0]


def communicating_path_s(
    graph: OpGraph, cluster: Cluster, fwd_s: np.ndarray, bwd_s: np.ndarray, grad: np.ndarray | None = None
) -> float:
    """The critical path where an edge between two devices costs its copy: a bound on every placement's step.

    ``F[v, d]``, a bound on when ``v``'s forward ends if ``v`` is on ``d``:
    ``fwd[v, d] + max over inputs u of min over d' (F[u, d'] + copy(u -> v, d' -> d))``,
    where a copy costs the link's latency plus the edge's bytes over its bandwidth
    (0 on one device): ``v`` waits for each input's copy, and each input's device is
    unknown, so each takes its best. ``B[v, d]``, the same for ``v``'s backward:
    ``bwd[v, d] + max(F[v, d], max over consumers w with a backward of
    min over d' (B[w, d'] + copy(w -> v, d' -> d)))`` (a gradient is sent back with the
    activation's bytes once the consumers' backward ran; on one device the
    consumers' backward runs first, in reverse issue order). The step is at least
    ``max_v min_d B[v, d]``. With one fastest device for every op it is the
    critical path; where ops are fastest on different devices (a host op next to
    GPU ops) it charges the copies the critical path ignores. Consumers outside
    autograd (``grad`` False: :func:`graphs.ops.grad_mask`) send no gradient and
    are skipped.
    """
    n, D = fwd_s.shape
    if n == 0:
        return 0.0
    lat, inv_bw = cost.copy_costs(cluster)
    in_ptr, in_src, in_eid = graph.in_csr
    out_ptr, out_dst, out_eid = graph.out_csr
    nbytes = graph.edge_bytes.astype(np.float64)
    F = np.zeros((n, D))
    for v in range(n):
        a, b = in_ptr[v], in_ptr[v + 1]
        ready = 0.0
        if b > a:  # [k, d', d] -> min over d' -> max over the inputs k
            arrive = F[in_src[a:b], :, None] + lat[None] + nbytes[in_eid[a:b], None, None] * inv_bw[None]
            ready = arrive.min(axis=1).max(axis=0)
        F[v] = fwd_s[v] + ready
    B = np.zeros((n, D))
    has_bwd = np.ones(n, dtype=bool) if grad is None else np.asarray(grad, dtype=bool)
    for v in range(n - 1, -1, -1):
        a, b = out_ptr[v], out_ptr[v + 1]
        ready = F[v]
        if b > a:
            w = out_dst[a:b]
            keep = has_bwd[w]
            if keep.any():  # gradients come back over d' -> d
                back = B[w[keep], :, None] + lat[None] + nbytes[out_eid[a:b][keep], None, None] * inv_bw[None]
                ready = np.maximum(ready, back.min(axis=1).max(axis=0))
        B[v] = bwd_s[v] + ready
    return float(max(B.min(axis=1).max(), F.min(axis=1).max()))


def update_bound_s(graph: OpGraph, cluster: Cluster) -> float:
    """No placement updates its parameters faster than this after the backward pass.

    The largest op's parameters on their fastest device; all of them spread over every device's memory bandwidth;
    and what the GPUs cannot hold: a placement that fits keeps each parameter's state (``4 x`` its bytes,
    :func:`envs.sim.cost.static_bytes`) on the device its op runs on or on its home (:mod:`envs.sim.homes`) for the
    whole step, so at least ``P - C / 4`` of the ``P`` parameter bytes live on host devices when the GPUs hold
    ``C`` bytes in all, and their Adam step runs there (spread over the hosts' bandwidth).
    """
    p = graph.param_bytes.astype(np.float64)
    if not np.any(p > 0):
        return 0.0
    per_op = cost.update_time_s(
        p[p > 0, None], cluster.launch_overhead_s[None, :], cluster.update_bw_bytes_per_s[None, :]
    )
    largest = float(per_op.min(axis=1).max())
    spread = float(cost.update_time_s(p.sum(), 0.0, cluster.update_bw_bytes_per_s.sum()))  # no launch: a bound
    return max(largest, spread, forced_host_update_s(graph, cluster))


def forced_host_update_s(graph: OpGraph, cluster: Cluster) -> float:
    """The host devices' Adam over the parameter bytes the GPUs cannot hold (:func:`update_bound_s`): ``P - C / 4``
    of the ``P`` bytes, spread over the hosts' update bandwidth; 0 where the GPUs hold them all."""
    p = graph.param_bytes.astype(np.float64)
    host = cluster.host
    if not np.any(p > 0) or not host.any():
        return 0.0
    state_per_byte = float(cost.static_bytes(graph).sum() - graph.buffer_bytes.sum()) / p.sum()
    on_hosts = p.sum() - float(cluster.memory_bytes[~host].sum()) / state_per_byte
    return float(cost.update_time_s(on_hosts, 0.0, cluster.update_bw_bytes_per_s[host].sum())) if on_hosts > 0 else 0.0


def ancestor_sums(graph: OpGraph, cost_s: np.ndarray, exact_ops: int = 12_000) -> np.ndarray:
    """Per op, ``cost_s`` summed over its ancestors (every op with a path to it, not itself).

    Exact (a bit set of ancestors per op) up to ``exact_ops`` ops; above that, the
    largest sum along one path into the op (a lower value, so still a valid
    head), to keep memory linear.
    """
    n = graph.num_ops
    c = np.asarray(cost_s, dtype=np.float64)
    if n > exact_ops:
        return top_level(graph, c)
    in_ptr, in_src, _ = (a.tolist() for a in graph.in_csr)
    out = np.zeros(n)
    anc: list[int] = [0] * n
    nbytes = (n + 7) // 8
    for v in range(n):
        bits = 0
        for u in in_src[in_ptr[v] : in_ptr[v + 1]]:
            bits |= anc[u] | (1 << u)
        anc[v] = bits
        if bits:
            mask = np.unpackbits(np.frombuffer(bits.to_bytes(nbytes, "little"), dtype=np.uint8), bitorder="little")[:n]
            out[v] = float(c[mask.astype(bool)].sum())
    return out


def host_issue_s(cluster: Cluster, fwd_s: np.ndarray, issue_fwd_s: np.ndarray) -> np.ndarray:
    """``[num_ops, D]`` host seconds to issue each op's forward on each device (eager executor).

    A host device's op runs on the host (``fwd_s``); another device's costs its
    issue time (``issue_fwd_s``, :func:`envs.sim.cost.issue_times`).
    """
    host = cluster.host
    return np.where(host[None, :], fwd_s, issue_fwd_s)


class LowerBound(float):
    """A bound in seconds (a float) that knows which bound it is.

    Attributes:
        name: the bound that gave the value (``"critical path"``, ``"communicating path"``, ``"work"``,
            ``"energetic"``, ``"host issue + backward path"``, ``"host issue + backward work"``,
            ``"host issue + path"``, ``"blocks"``).
        parts: every bound computed, name -> seconds (updates included).
        previous: the bound of earlier releases (critical path or work, plus updates).
        previous_name: its name.
    """

    name: str
    parts: dict[str, float]
    previous: float
    previous_name: str

    def __new__(
        cls, value: float, name: str, parts: dict[str, float], previous: float, previous_name: str
    ) -> "LowerBound":
        obj = super().__new__(cls, value)
        obj.name, obj.parts, obj.previous, obj.previous_name = name, dict(parts), float(previous), previous_name
        return obj

    def __reduce__(self):
        return (LowerBound, (float(self), self.name, self.parts, self.previous, self.previous_name))


def lower_bound_from_times(
    graph: OpGraph,
    cluster: Cluster,
    fwd_s: np.ndarray,
    bwd_s: np.ndarray,
    executor: str = "eager",
    issue_fwd_s: np.ndarray | None = None,
    *,
    microbatches: int = 1,
    blocks_s: float = 0.0,
    host_step: str = "after",
) -> LowerBound:
    """The bound from precomputed ``[num_ops, num_devices]`` op times, for ``executor`` (``"eager"`` or ``"dataflow"``).

    ``issue_fwd_s``: the host's issue seconds per op and device (default :func:`envs.sim.cost.issue_times` of
    ``graph``).
    ``microbatches``: ``M``, where ``graph`` is a pipelined step's ``M`` microbatch copies (op ``m * n + i``,
    :func:`envs.microbatch.microbatch_graph`). In ``eager`` only the last microbatch's backward is sure to
    follow the whole forward's issue: a one-forward-one-backward plan runs earlier microbatches' backward while
    the host issues later forwards. The bound holds for every in-flight window of ``M``.
    ``blocks_s``: seconds for the block bound's programs (:func:`envs.sim.blocks.block_bound_s`); 0 (default):
    the block bound is not computed.
    ``host_step``: "after" (default), every parameter stepped after the backward (the update bound is added to
    each bound); "backward", the plans whose homed parameters are stepped during it (:attr:`graphs.plan.Placement.
    host_step`), whose updates may overlap the backward: the larger of each bound and the update bound, and (one
    microbatch) the forward's bound plus the hosts' Adam over the parameter bytes the GPUs cannot hold
    (:func:`forced_host_update_s`; "forward + host update"): no gradient, so no host step, comes before the forward
    has ended.
    """
    if executor not in ("eager", "dataflow"):
        raise ValueError(f"executor must be 'eager' or 'dataflow', not {executor!r}")
    n = graph.num_ops
    if n % microbatches:
        raise ValueError(f"a graph of {microbatches} microbatch copies has a multiple of {microbatches} ops, not {n}")
    update = update_bound_s(graph, cluster)
    cp = critical_path_s(graph, fwd_s.min(axis=1) if n else fwd_s, bwd_s.min(axis=1) if n else bwd_s)
    work_old = work_bound_s(fwd_s + bwd_s)
    work = max(work_old, lp_work_bound_s(fwd_s + bwd_s)) if n and cluster.num_devices > 1 else work_old
    raw = {"critical path": cp, "work": work}
    grad = grad_mask(graph)
    if n and cluster.num_devices > 1:
        raw["communicating path"] = communicating_path_s(graph, cluster, fwd_s, bwd_s, grad)
    release = None
    if executor == "eager" and n:
        if issue_fwd_s is None:
            issue_fwd_s = cost.issue_times(graph, cluster, fwd_s)[0]
        issue = host_issue_s(cluster, fwd_s, issue_fwd_s)
        c = issue.min(axis=1)  # each op's cheapest host cost
        last = np.arange(n) >= n - n // microbatches  # the ops whose backward follows the whole forward's issue
        bwd_last = np.where(last[:, None], bwd_s, 0.0)
        if microbatches == 1:  # with several, the backward path from the last microbatch is in "host issue + path"
            raw["host issue + backward path"] = float(c.sum()) + critical_path_s(graph, np.zeros(n), bwd_s.min(axis=1))
        raw["host issue + backward work"] = max(
            lp_work_bound_s(bwd_last, issue), float(c.sum() + bwd_last.min(axis=1).sum() / cluster.num_devices)
        )
        release = np.concatenate([ancestor_sums(graph, c), np.where(last, float(c.sum()), 0.0)])
    if n:
        head, tail, p = task_windows(graph, fwd_s.min(axis=1), bwd_s.min(axis=1), grad, release)
        if release is not None:
            raw["host issue + path"] = float((head + p + tail).max())
        if cluster.num_devices > 1:  # last: it only bisects where it can beat every bound above
            raw["energetic"] = energetic_bound_s(head, tail, p, cluster.num_devices, max(raw.values()))
    if blocks_s > 0 and n and cluster.num_devices > 1:
        blocks = block_bound_s(graph, cluster, fwd_s, bwd_s, grad, executor, time_budget_s=blocks_s)
        if blocks is not None:
            raw["blocks"] = blocks
    overlap = host_step == "backward"
    forced = forced_host_update_s(graph, cluster) if overlap and n and microbatches == 1 else 0.0
    if forced > 0:  # no gradient, so no host step, before the forward has ended (in eager, been issued too)
        forward = critical_path_s(graph, fwd_s.min(axis=1), np.zeros(n))
        raw["forward + host update"] = max(forward, float(c.sum()) if release is not None else 0.0) + forced
    after = lambda v: (max(v, update) if overlap else v + update) * (1.0 - SLACK)  # noqa: E731
    parts = {k: after(v) for k, v in raw.items()}
    top = max(parts.values())
    name = next(k for k, v in parts.items() if v >= top * (1.0 - SLACK))  # a tie to rounding goes to the simpler bound
    prev_name = "critical path" if cp >= work_old else "work"
    previous = after(max(cp, work_old))
    return LowerBound(max(top, previous), name, parts, previous, prev_name)


def lower_bound(graph: OpGraph, cluster: Cluster, executor: str = "eager", *, blocks_s: float = 0.0) -> LowerBound:
    """Seconds: no placement of ``graph`` on ``cluster``, in any issue order, simulates faster under ``executor``.

    The best valid bound, a :class:`LowerBound` (a float with ``.name``,
    ``.parts`` and the earlier bound ``.previous``). ``blocks_s`` > 0 adds the
    block bound, its programs given that many seconds (:mod:`envs.sim.blocks`).

    >>> from graphs import OpGraph
    >>> from envs.cluster import Cluster
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[4e9, 4e9])
    >>> lb = lower_bound(g, Cluster.preset("k80x2"))
    >>> round(lb * 1e3, 3), lb.name  # a chain: 2 forward + 2 backward ops at 1.008 ms
    (6.048, 'critical path')
    """
    fwd, bwd = cost.op_times(graph, cluster)
    return lower_bound_from_times(graph, cluster, fwd, bwd, executor, blocks_s=blocks_s)
