"""The cost model: op times per device, transfer times, update time, memory footprints.

Forward time of op ``i`` on device ``d``:

* the graph's profile for ``d``'s kind (``graph.profile["gpu"]["fwd_s"][i]``) when
  it is there and not NaN;
* otherwise the roofline estimate ``launch_overhead_s + max(flops / flops_per_s,
  bytes_touched / mem_bw_bytes_per_s)``, where ``bytes_touched`` is the bytes of
  every input edge, the op's owned parameters and buffers, and its outputs.

Backward time: the profiled ``bwd_s``, else ``BACKWARD_MULTIPLIER`` × forward
(the profiled forward where there is one): the input's gradient and the weight's, each about a forward. An op whose
weights are all frozen (:func:`graphs.ops.frozen_weight_mask`: ``requires_grad=False``, a LoRA base layer) computes
the input's alone: ``BACKWARD_MULTIPLIER - 1`` × forward. A model's own autograd.Function kept whole
(:mod:`graphs.custom_functions`) runs its forward again in its backward: one forward more.

With M > 1 microbatches (:mod:`envs.microbatch`, and the pipelines across processes)
an op's times are those of one microbatch: the roofline's FLOPs, inputs and outputs
scale by ``1/M`` while its parameters are still read whole, and a profiled time
(measured on the whole batch) scales as the op's roofline does, not by ``1/M``: a
dense layer on a small batch reads its whole weight whatever M is. Where the profile
also timed the op on one of K microbatches (``placer profile --microbatches K``:
the ``micro_*`` columns), the op's time is ``a + b / M`` through the two measured
sizes (:func:`between_sizes`; beyond K at one of K's rate where a microbatch ran faster per sample than the
whole batch), the roofline left out. Every microbatch
after the first also adds its weight gradients into the accumulated ones (autograd's
``grad += new``): its backward moves ``ACCUMULATE_TRAFFIC_MULTIPLIER`` × the op's
parameter bytes more, ``(M - 1) / M`` of that per microbatch on average.
Without a profile, view ops (``aten.view``, ``aten.t``, ``getitem``... see
:mod:`graphs.ops`, the one definition) and shape queries (``sym_size``) cost nothing; they never allocate: in eager
PyTorch a view only makes a new tensor header over the same storage, launches no kernel, and its backward is another
view. Transfers cost ``latency_s + bytes / bandwidth_bytes_per_s`` of the link.

>>> from graphs import OpGraph
>>> from envs.cluster import Cluster
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4000)], flops=[4e9, 0.0],
...                        op_types=["aten.mm.default", "aten.view.default"])
>>> fwd, bwd = op_times(g, Cluster.preset("k80x2"))
>>> round(float(fwd[0, 1]) * 1e3, 3), float(fwd[1, 1]), round(float(bwd[0, 1] / fwd[0, 1]), 6)
(1.008, 0.0, 2.0)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from envs.cluster import Cluster
from graphs.custom_functions import KEPT_OP_TYPE
from graphs.ir import OpGraph
from graphs.ops import free_mask, frozen_weight_mask

#: Backward ≈ 2 × forward: it computes the gradient w.r.t. the inputs (dgrad) and
#: w.r.t. the weights (wgrad), each about as costly as the forward op (the usual
#: rule of thumb that a training step is ~3× the forward pass).
BACKWARD_MULTIPLIER = 2.0

#: Bytes the backward of one microbatch moves per parameter byte to add its weight gradient into those of the
#: microbatches before it (autograd's ``grad += new``: reads both, writes one); the first microbatch's is kept as is.
ACCUMULATE_TRAFFIC_MULTIPLIER = 3.0

#: Adam keeps two moments per parameter (exp_avg, exp_avg_sq).
OPTIMIZER_STATE_MULTIPLIER = 2

#: Bytes an Adam step moves per parameter byte: reads param, grad, exp_avg and
#: exp_avg_sq, writes param, exp_avg and exp_avg_sq (7 passes over memory).
UPDATE_TRAFFIC_MULTIPLIER = 7.0


def bytes_touched(graph: OpGraph) -> np.ndarray:
    """Bytes each op reads and writes: input edges + owned params/buffers + outputs."""
    inputs = np.bincount(graph.edge_dst, weights=graph.edge_bytes.astype(np.float64), minlength=graph.num_ops)
    return inputs + graph.param_bytes + graph.buffer_bytes + graph.out_bytes


def op_times(graph: OpGraph, cluster: Cluster, microbatches: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every op on every device, each ``[num_ops, num_devices]``.

    ``microbatches`` M > 1: the times of one op on one microbatch, ``1/M`` of the
    batch (:mod:`envs.microbatch`): FLOPs, inputs and outputs scaled by ``1/M``,
    the parameters and buffers still read whole; a profiled time scaled as the op's
    roofline scales from the whole batch to one microbatch, or, where the profile
    timed one of K microbatches too, on the line through both sizes
    (:func:`between_sizes`); each backward charged the accumulation of its weight
    gradients (the module doc).
    """
    n, D = graph.num_ops, cluster.num_devices
    M = float(microbatches)
    fwd = roofline_s(graph, cluster, microbatches)
    # how a whole-batch time shrinks to one microbatch's: the roofline's ratio (1/M where the roofline has no time)
    whole = fwd if microbatches == 1 else roofline_s(graph, cluster, 1)
    shrink = np.divide(fwd, whole, out=np.full_like(fwd, 1.0 / M), where=whole > 0)
    fwd[free_mask(graph)] = 0.0
    # the input's gradient and the weight's; a frozen weight's is not computed
    multiplier = np.where(frozen_weight_mask(graph), BACKWARD_MULTIPLIER - 1.0, BACKWARD_MULTIPLIER)
    if KEPT_OP_TYPE in graph.op_types:  # a function kept whole: its forward again, then its backward
        multiplier = multiplier + (np.asarray(graph.op_types) == KEPT_OP_TYPE)
    bwd = multiplier[:, None] * fwd
    for d, kind in enumerate(cluster.kinds):
        prof = graph.profile.get(kind)
        if not prof:
            continue
        timed = {col: prof.get(col) for col in ("fwd_s", "bwd_s")}
        for col, out in (("fwd_s", fwd), ("bwd_s", bwd)):
            if timed[col] is None:
                continue
            have = ~np.isnan(timed[col])
            out[have, d] = timed[col][have] * shrink[have, d]
            micro, k = prof.get(f"micro_{col}"), prof.get("micro_m")
            if microbatches > 1 and micro is not None and k is not None:  # timed on one of K microbatches too
                line = have & ~np.isnan(micro) & ~np.isnan(k) & (k > 1)
                fixed = float(cluster.launch_overhead_s[d])
                out[line, d] = between_sizes(timed[col][line], micro[line], k[line], M, fixed)
            if col == "fwd_s":  # a backward not timed: twice the forward (as timed)
                untimed = have & (np.isnan(timed["bwd_s"]) if timed["bwd_s"] is not None else True)
                bwd[untimed, d] = multiplier[untimed] * fwd[untimed, d]
    if microbatches > 1:
        accumulate = ACCUMULATE_TRAFFIC_MULTIPLIER * graph.param_bytes.astype(np.float64)
        bwd += (M - 1) / M * accumulate[:, None] / cluster.mem_bw_bytes_per_s[None, :]
    assert fwd.shape == (n, D)
    return fwd, bwd


def between_sizes(
    whole_s: np.ndarray, micro_s: np.ndarray, k: np.ndarray, microbatches: float, fixed_s: float = 0.0
) -> np.ndarray:
    """An op's seconds on one of M microbatches from its seconds on the whole batch and on one of K: ``a + b / M``
    through both (``b / M``: the part that scales with the batch; ``a``: what every microbatch pays, such as reading
    a weight), ``b`` kept >= 0 (a microbatch timed slower than the whole batch costs its own time at every M > 1).

    Where a microbatch runs faster per sample than the whole batch (its data stays in cache: ``K x micro < whole``)
    the line's ``a`` is negative. It is kept between the two sizes (``M <= K``, where it passes through both); beyond
    K the op still pays ``fixed_s`` (the device's launch overhead, at most ``micro``) on every microbatch and the rest
    runs at the rate measured on one of K: ``fixed + (micro - fixed) x K / M``. The line, continued, would fall
    towards nothing.

    >>> float(between_sizes(np.array([8.0]), np.array([2.0]), np.array([4.0]), 2)[0])  # all of it scales
    4.0
    >>> float(between_sizes(np.array([8.0]), np.array([5.0]), np.array([4.0]), 8)[0])  # a = 4, b = 4
    4.5
    >>> [float(between_sizes(np.array([8.0]), np.array([1.5]), np.array([4.0]), m, 0.5)[0]) for m in (4, 8)]  # a < 0
    [1.5, 1.0]
    """
    M = float(microbatches)
    b = np.maximum(whole_s - micro_s, 0.0) / (1.0 - 1.0 / k)
    a = micro_s - b / k
    fixed = np.minimum(float(fixed_s), micro_s)
    at_k_rate = fixed + (micro_s - fixed) * k / M
    return np.where((a >= 0.0) | (M <= k), a + b / M, at_k_rate)


def roofline_s(graph: OpGraph, cluster: Cluster, microbatches: int = 1) -> np.ndarray:
    """``[num_ops, num_devices]`` roofline seconds of each op's forward on one of M microbatches (no profile; views
    included): ``launch_overhead_s + max(flops / M / flops_per_s, bytes / mem_bw_bytes_per_s)``, the bytes
    touched with inputs and outputs scaled by ``1/M`` and the parameters and buffers read whole."""
    M = float(microbatches)
    compute_s = graph.flops[:, None] / M / cluster.flops_per_s[None, :]
    weights = (graph.param_bytes + graph.buffer_bytes).astype(np.float64)
    touched = (bytes_touched(graph) - weights) / M + weights
    memory_s = touched[:, None] / cluster.mem_bw_bytes_per_s[None, :]
    return np.maximum(compute_s, memory_s) + cluster.launch_overhead_s[None, :]


def default_issue_times(fwd_s: np.ndarray, host: np.ndarray, launch_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`issue_times` without a profile: ``launch_s[d]`` for an op with a kernel on a non-host device, else 0;
    nothing for a backward."""
    fwd_s = np.asarray(fwd_s, dtype=np.float64)
    issue_f = np.where(
        (fwd_s > 0) & ~np.asarray(host, dtype=bool)[None, :], np.asarray(launch_s, dtype=np.float64)[None, :], 0.0
    )
    return issue_f, np.zeros_like(issue_f)


def issue_times(graph: OpGraph, cluster: Cluster, fwd_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host seconds issuing each op on each device under the eager executor, ``([n, D] forward, [n, D] backward)``.

    A host (``cpu``) device runs its ops on the issuing thread: their time is in
    ``fwd_s``/``bwd_s``, so their issue time is 0. On another device, by default,
    an op with a kernel costs the host the device's ``launch_overhead_s`` (a view
    nothing) and its backward costs its autograd worker nothing. Where the graph's
    profile for the device's kind measured issue times in context
    (``issue_fwd_s``/``issue_bwd_s``, :func:`envs.real.profiler.profile_device_in_context`:
    the FX node's Python, the dispatch and the launch; the worker's time per
    autograd node), those replace the defaults, views included. ``fwd_s`` is the
    ``[n, D]`` forward time (:func:`op_times`), which says which ops launch a
    kernel; issue times are per call, so a microbatch's copy costs the same.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 0.0])
    >>> c = Cluster.preset("k80x2")
    >>> f, b = issue_times(g, c, np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    >>> (f * 1e6).round(1).tolist(), float(b.sum())
    ([[0.0, 8.0, 8.0], [0.0, 0.0, 0.0]], 0.0)
    """
    host = cluster.host
    issue_f, issue_b = default_issue_times(fwd_s, host, cluster.launch_overhead_s)
    for d, kind in enumerate(cluster.kinds):
        prof = graph.profile.get(kind)
        if host[d] or not prof:
            continue
        for out, col in ((issue_f, "issue_fwd_s"), (issue_b, "issue_bwd_s")):
            measured = prof.get(col)
            if measured is not None:
                have = ~np.isnan(measured)
                out[have, d] = measured[have]
    return issue_f, issue_b


class HostCosts(NamedTuple):
    """What the host pays beside its ops under the eager executor, per device (``[D]`` each; 0 off the host).

    * ``stage_latency_s``, ``stage_s_per_byte``: the copy of a tensor into a dense pinned
      buffer that :func:`placer.apply` makes on the host thread before each host -> GPU
      copy (:func:`envs.real.placing.staged`): ``latency + bytes * s_per_byte`` seconds
      of the host device the tensor leaves;
    * ``contention_op``: a host op runs ``1 + contention_op`` times slower for the time
      a GPU's autograd worker thread is busy beside it;
    * ``contention_issue``: a GPU's autograd worker issues ``1 + contention_issue`` times
      slower for the time the host thread runs one of this device's ops.
    """

    stage_latency_s: np.ndarray
    stage_s_per_byte: np.ndarray
    contention_op: np.ndarray
    contention_issue: np.ndarray


def host_costs(cluster: Cluster) -> HostCosts:
    """The :class:`HostCosts` of ``cluster``'s host (``cpu``) devices (their ``stage_*`` and ``contention_*`` fields).

    >>> host_costs(Cluster.preset("h200x1")).stage_s_per_byte.tolist()  # the presets measured none
    [0.0, 0.0]
    """
    host = cluster.host
    col = lambda attr: np.array([float(getattr(d, attr)) for d in cluster.devices]) * host  # noqa: E731
    per_byte = (
        np.array(
            [
                0.0 if d.stage_bandwidth_bytes_per_s == np.inf else 1.0 / d.stage_bandwidth_bytes_per_s
                for d in cluster.devices
            ]
        )
        * host
    )
    return HostCosts(col("stage_latency_s"), per_byte, col("contention_op"), col("contention_issue"))


def no_host_costs(num_devices: int) -> HostCosts:
    """:class:`HostCosts` of a host that pays nothing beside its ops (the model before simulator model 4)."""
    z = np.zeros(num_devices)
    return HostCosts(z, z.copy(), z.copy(), z.copy())


def transfer_time_s(nbytes: float, src_dev: int | str, dst_dev: int | str, cluster: Cluster) -> float:
    """Seconds to copy ``nbytes`` from ``src_dev`` to ``dst_dev`` (index or name); 0 on one device.

    >>> transfer_time_s(1e9, "gpu:0", "gpu:1", Cluster.preset("k80x2"))
    0.10001
    """
    a = cluster.index(src_dev) if isinstance(src_dev, str) else int(src_dev)
    b = cluster.index(dst_dev) if isinstance(dst_dev, str) else int(dst_dev)
    if a == b:
        return 0.0
    return float(cluster.latency_s[a, b] + nbytes / cluster.bandwidth_bytes_per_s[a, b])


def copy_costs(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(latency [D, D], 1 / bandwidth [D, D])`` with zeros on the diagonal: copying ``b`` bytes from ``d`` to
    ``d'`` costs ``latency[d, d'] + b * inverse[d, d']`` (:func:`transfer_time_s`), 0 on one device."""
    lat = np.array(cluster.latency_s, dtype=np.float64)
    inv_bw = 1.0 / np.array(cluster.bandwidth_bytes_per_s, dtype=np.float64)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(inv_bw, 0.0)
    return lat, inv_bw


def update_times_s(param_bytes_per_device: np.ndarray, cluster: Cluster) -> np.ndarray:
    """Optimizer-step seconds per device holding ``param_bytes_per_device`` (Adam, fused).

    One fused/multi-tensor launch plus ``UPDATE_TRAFFIC_MULTIPLIER`` passes over
    the parameter bytes at the device's update bandwidth (``Cluster.update_bw_bytes_per_s``: its memory bandwidth
    unless one was measured for the update); 0 on a device without parameters.

    >>> from envs.cluster import Device
    >>> plain = Device("cpu:0", "cpu", 1e9, 1e9, 7e9, 0.0)  # 7 passes over 1 GB at 7 GB/s: 1 s
    >>> measured = Device("cpu:1", "cpu", 1e9, 1e9, 7e9, 0.0, update_bw_bytes_per_s=14e9)  # its own: 0.5 s
    >>> [update_times_s(np.array([1e9]), Cluster("c", [d], {})).tolist() for d in (plain, measured)]
    [[1.0], [0.5]]
    """
    p = np.asarray(param_bytes_per_device, dtype=np.float64)
    return np.where(p > 0, update_time_s(p, cluster.launch_overhead_s, cluster.update_bw_bytes_per_s), 0.0)


def update_time_s(param_bytes, launch_overhead_s, mem_bw_bytes_per_s):
    """Seconds of one optimizer step over ``param_bytes`` of parameters: the one formula.

    One fused (multi-tensor) launch plus ``UPDATE_TRAFFIC_MULTIPLIER`` passes over
    the bytes at memory bandwidth. Plain arithmetic, so it takes scalars or
    broadcasting arrays and compiles unchanged in :mod:`envs.sim.kernel` (numba), and
    :mod:`envs.sim.bound` uses it for its update bound.
    """
    return launch_overhead_s + UPDATE_TRAFFIC_MULTIPLIER * param_bytes / mem_bw_bytes_per_s


def update_bandwidth(update_s: float, param_bytes: float, launch_overhead_s: float) -> float:
    """The ``mem_bw_bytes_per_s`` under which :func:`update_times_s` of ``param_bytes`` is ``update_s``.

    How a profile's measured optimizer step (``update_s`` in a ``placer-profile/1``
    device entry) reaches the cost model: the calibrated device's memory bandwidth
    is fitted to it (the update is one memory-bound pass; on a CPU its per-tensor
    dispatch is folded into the rate).

    >>> from envs.cluster import Device
    >>> bw = update_bandwidth(2e-3, 1e6, 1e-5)
    >>> d = Device("cpu:0", "cpu", 1e9, 1e9, bw, 1e-5)
    >>> round(float(update_times_s(np.array([1e6]), Cluster("c", [d], {}))[0]) * 1e3, 6)
    2.0
    """
    busy_s = max(float(update_s) - float(launch_overhead_s), 1e-12)
    return UPDATE_TRAFFIC_MULTIPLIER * max(float(param_bytes), 1.0) / busy_s


def static_bytes(graph: OpGraph) -> np.ndarray:
    """Memory an op pins on its device for the whole step: params, grads, Adam state, buffers."""
    mult = int(2 + OPTIMIZER_STATE_MULTIPLIER)  # the param itself, its grad, the optimizer state
    return graph.param_bytes.astype(np.int64) * mult + graph.buffer_bytes


def activation_bytes(graph: OpGraph) -> np.ndarray:
    """Bytes of the output each op keeps for backward (0 for views, which alias, and shape queries)."""
    return np.where(free_mask(graph), 0, graph.out_bytes).astype(np.int64)
