"""This machine's ranks, measured into a cluster for the simulator of ranks (``placer profile SOURCE --ranks N``).

N processes start with torch's launcher (:func:`~envs.real.distributed.launch.launch`),
one thread each, the gloo backend; every rank measures at the same time as the others
(so the cores they share are shared while they measure):

* its compute: a matmul's FLOP rate, a copy's memory bandwidth and a tiny op's cost
  (the roofline's three numbers, :mod:`envs.sim.cost`), then a training step of
  SOURCE's model on this rank, on the whole batch and on one of 8 microbatches of it;
  the three (the median over the ranks, which share the machine's cores) are fitted per
  rank so that the roofline's step of the model's graph is that rank's step measured,
  at both sizes: the work's time scale and the cost per op (:func:`calibrate`);
* each pair of ranks, one pair at a time: a ping-pong of a few message sizes over
  gloo's point-to-point sends; ``latency + bytes / bandwidth`` fitted to the one-way
  times by least squares (:func:`fit_link`);
* then SOURCE's model as a real pipeline across the N ranks, what a plan runs
  (:func:`calibration_plans`: its ops cut into N contiguous runs of equal roofline
  work, GPipe over 1 microbatch and over :data:`MICRO`), its actions timed on each rank
  (:class:`~envs.real.distributed.trace.ActionRecorder`). Each rank's forward and
  backward seconds at the two microbatch sizes are fitted by the roofline of the ops
  it ran: the work's time scale and the cost per op (:func:`fit_pipeline`), one pair
  for all ranks. This replaces the one-process fit above: the same stage runs slower
  inside torch's pipeline runtime, beside the other ranks, than a whole model stepped
  alone (``BENCHMARKS.md``, "Where the simulator of ranks is wrong"). Then each rank's
  cost per action beyond its ops (torch's runtime between actions, posting sends and
  receives: ``action_overhead_s``) is fitted so that the simulator of ranks, with those
  rates, gives the two pipelines' measured steps (:func:`fit_action_overhead`), after the
  optimizer step's own bandwidth is fitted to the optimizer steps they measured
  (:func:`fit_update_bandwidth`: the compute fit slows the microbenchmarks' bandwidth with their
  FLOP rate, and Adam's streaming passes do not slow with it). Where the
  pipeline cannot run (a model whose stages would pass non-tensors), the one-process
  fit stays, and the raw numbers say why;
* on each rank whose stage of that pipeline receives activations (every rank but the
  first), that stage's backward on one microbatch, whole and split into its input and
  weight parts as torch's zero-bubble schedules run it (:func:`split_backward_s`): the
  median ratio over the ranks is every device's ``split_backward_factor``.

:func:`ranks_cluster` turns the ranks' numbers into a placer-cluster/1 cluster of
devices ``cpu:0 .. cpu:N-1`` (rank ``r`` is ``cpu:r``), each with 1/N of this machine's
memory, that ``train``, ``compare``, ``place`` and :class:`envs.sim.ranks.RankSim` take.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from envs.cluster import Cluster
from envs.devices import Device, Link
from envs.real.distributed.rank_plan import RankPlan, compile_plan
from envs.real.distributed.worker import gather_to_first
from envs.real.pipeline import split_batch
from envs.real.profiler.fit import fit_link as fit_sizes
from envs.real.timing import adam
from envs.real.worker import build_model
from envs.sim.cost import op_times, update_bandwidth, update_times_s
from graphs import PlacerError
from graphs.export import one_process_world
from graphs.plan import Placement

#: Message sizes of the ping-pong, in bytes: from latency-bound to bandwidth-bound.
SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 23)


@dataclass
class RankProbe:
    """What every rank measures: SOURCE's model, ``repeats`` timings of each kind (medians kept)."""

    source: str
    source_dir: str
    repeats: int = 5
    warmup: int = 1
    timeout_s: float = 600.0
    plans: tuple[dict[str, Any], ...] = ()  # RankPlan.to_dict() of the calibration pipelines (calibration_plans)
    micro: int = 0  # the microbatches of the second step (microbatch_program's M; 0: the largest <= MICRO that split)
    looped: dict[str, Any] | None = None  # RankPlan.to_dict() of the looped pipeline (looped_calibration_plan)


def median_s(fn: Any, repeats: int, warmup: int = 1) -> float:
    """The median wall time of ``fn()`` over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compute_rates(repeats: int) -> dict[str, float]:
    """This thread's matmul FLOP rate, copy bandwidth and the cost of a tiny op."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    mm_s = median_s(lambda: torch.mm(a, b), repeats)
    big = torch.empty(1 << 23)  # 32 MiB: past the caches
    out = torch.empty_like(big)
    copy_s = median_s(lambda: out.copy_(big), repeats)
    tiny = torch.zeros(1)
    op_s = median_s(lambda: [torch.add(tiny, 1.0) for _ in range(1000)], repeats) / 1000
    return {
        "flops_per_s": 2 * 512**3 / mm_s,
        "mem_bw_bytes_per_s": 2 * big.numel() * big.element_size() / copy_s,
        "launch_overhead_s": op_s,
    }


#: The microbatches of the second calibration step: the batch cut this many ways (fewer where it is smaller).
MICRO = 8


def model_step_s(source: str, source_dir: str, repeats: int, warmup: int, micro: int = 0) -> dict[str, Any]:
    """Training steps (forward, backward, Adam) of SOURCE's model on this rank, median seconds: ``step_s`` on the
    whole batch, ``micro_step_s`` on one of ``microbatches`` parts of it (the first; ``micro`` of them where given,
    else :data:`MICRO`, fewer where the batch is smaller; absent where it cannot be split). Each rank times the
    model alone, as one process runs it (:func:`graphs.export.one_process_world`)."""
    with one_process_world():
        return _model_step_s(source, source_dir, repeats, warmup, micro)


def _model_step_s(source: str, source_dir: str, repeats: int, warmup: int, micro: int) -> dict[str, Any]:
    model, inputs = build_model(source, search_dir=source_dir)
    optimizer = adam(model.parameters(), lr=1e-3)

    def step(batch: tuple) -> None:
        optimizer.zero_grad()
        loss = model(*batch)
        loss = loss if loss.dim() == 0 else loss.float().mean()
        loss.backward()
        optimizer.step()

    out: dict[str, Any] = {"step_s": median_s(lambda: step(inputs), repeats, warmup)}
    for k in range(micro or MICRO, 1, -1):
        try:
            part = split_batch(inputs, k)[0]
        except PlacerError:
            continue  # a batch of fewer than k
        out.update(microbatches=k, micro_step_s=median_s(lambda: step(part), repeats, warmup))
        break
    return out


#: The fewest round trips timed per message size (and untimed first): a round trip costs 0.1-5 ms, and the link's
#: latency is fitted from the small messages, whose median over 5 trips once came out 25x the usual (1.9 ms).
PING_PONGS, PING_PONG_WARMUP = 30, 5


def ping_pong(peer: int, leader: bool, repeats: int) -> dict[int, float]:
    """One-way seconds per message size of :data:`SIZES` between this rank and ``peer`` (half the median round
    trip of at least :data:`PING_PONGS`)."""
    out = {}
    for nbytes in SIZES:
        buf = torch.zeros(nbytes // 4)

        def round_trip() -> None:
            if leader:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)

        out[nbytes] = median_s(round_trip, max(repeats, PING_PONGS), PING_PONG_WARMUP) / 2
    return out


def fit_link(one_way_s: Mapping[int, float]) -> tuple[float, float]:
    """``(latency_s, bandwidth_bytes_per_s)`` of ``t = latency + bytes / bandwidth`` fitted to ``{bytes: t}``, each
    size's relative error weighing alike (:func:`envs.real.profiler.fit.fit_link`): an unweighted fit let the large
    messages decide, and one slow large message made the latency 0.6 ms where a 1 KB message took 36 us.

    >>> fit_link({1000: 1e-4 + 1000 / 1e9, 10**6: 1e-4 + 10**6 / 1e9})
    (0.0001, 1000000000.0)
    """
    sizes = sorted(one_way_s)
    latency_s, bandwidth = fit_sizes(sizes, [one_way_s[s] for s in sizes])
    return round(latency_s, 12), round(bandwidth, 3)


def calibrate(
    graph: Any, rates: Mapping[str, float], step_s: float, micro: tuple[int, float] | None = None
) -> dict[str, float]:
    """``rates`` fitted so the roofline's step of ``graph`` on them (every op's forward and backward, then Adam)
    takes ``step_s``: the microbenchmarks give the shape, the model the level.

    With ``micro`` = ``(M, seconds)``, the step of one of M microbatches measured too, two numbers are fitted,
    one per step: the time of the roofline's work (compute and memory, which shrink with the microbatch) and the
    cost per op (which does not: the eager executor's dispatch, autograd's nodes), so that both steps come out as
    measured. A microbatched plan runs M of those small steps' ops per stage; one factor fitted on the whole
    batch alone makes them too cheap. Without ``micro``, or where the two steps do not give a positive work and
    per-op cost, one factor scales all three rates.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a"], [], flops=[3e9])
    >>> calibrate(g, {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e12, "launch_overhead_s": 0.0}, 18.0)["flops_per_s"]
    500000000.0
    >>> r = calibrate(g, {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e12, "launch_overhead_s": 0.0}, 10.0, (3, 4.0))
    >>> round(r["flops_per_s"] / 1e9, 6), round(r["launch_overhead_s"], 6)
    (1.0, 0.333333)
    """
    one = _device("cpu:0", rates, 1e12)
    cluster = Cluster(name="probe", devices=[one], links={})

    def roofline_s(microbatches: int, level: Cluster) -> tuple[float, float]:
        fwd, bwd = op_times(graph, level, microbatches)
        return float(fwd.sum() + bwd.sum()), float(update_times_s(np.array([graph.total_param_bytes]), level)[0])

    ops, update_s = roofline_s(1, cluster)
    simulated_s = ops + update_s
    scale = step_s / simulated_s if simulated_s > 0 else 1.0
    fitted = {
        "flops_per_s": rates["flops_per_s"] / scale,
        "mem_bw_bytes_per_s": rates["mem_bw_bytes_per_s"] / scale,
        "launch_overhead_s": rates["launch_overhead_s"] * scale,
    }
    if micro is None:
        return fitted
    # the roofline's work without the per-op cost, whole and of one microbatch; the per-op cost counts the ops once
    every_op, M = np.arange(graph.num_ops), int(micro[0])
    whole, per_op = _roofline_parts(graph, rates, every_op, 1)
    part = _roofline_parts(graph, rates, every_op, M)[0] / M
    bare = Cluster(name="probe", devices=[_device("cpu:0", {**rates, "launch_overhead_s": 0.0}, 1e12)], links={})
    update_s = float(update_times_s(np.array([graph.total_param_bytes]), bare)[0])  # Adam's, without its launch
    work = whole - part
    if work <= 0 or per_op <= 0:
        return fitted
    time_scale = (step_s - float(micro[1])) / work  # measured seconds per second of the roofline's work
    overhead_s = (step_s - time_scale * (whole + update_s)) / per_op
    if time_scale <= 0 or overhead_s < 0:
        return fitted
    return {
        "flops_per_s": rates["flops_per_s"] / time_scale,
        "mem_bw_bytes_per_s": rates["mem_bw_bytes_per_s"] / time_scale,
        "launch_overhead_s": overhead_s,
    }


def _roofline_parts(graph: Any, rates: Mapping[str, float], ops: np.ndarray, microbatches: int) -> tuple[float, float]:
    """``(work, launches)`` of ``ops`` run on ``microbatches`` microbatches, forward and backward: the roofline's
    seconds without the per-op cost at ``rates``, and the number of op launches (each costs the per-op cost)."""
    bare = Cluster(name="probe", devices=[_device("cpu:0", {**rates, "launch_overhead_s": 0.0}, 1e12)], links={})
    unit_rates = {"flops_per_s": 1e300, "mem_bw_bytes_per_s": 1e300, "launch_overhead_s": 1.0}
    unit = Cluster(name="probe", devices=[_device("cpu:0", unit_rates, 1e12)], links={})
    fwd, bwd = op_times(graph, bare, microbatches)
    ufwd, ubwd = op_times(graph, unit, microbatches)
    M = float(microbatches)
    return M * float(fwd[ops].sum() + bwd[ops].sum()), M * float(ufwd[ops].sum() + ubwd[ops].sum())


def fit_pipeline(
    graph: Any, rates: Mapping[str, float], samples: Sequence[tuple[Sequence[int], int, float]]
) -> dict[str, float] | None:
    """``rates`` fitted to pipeline compute: each sample ``(ops, M, seconds)`` is one rank's forward and backward
    seconds per step running ``ops`` over M microbatches. Least squares with both numbers >= 0 (scipy's ``nnls``):
    ``seconds = scale * work + per_op * launches`` (:func:`_roofline_parts`); the rates are the microbenchmarks'
    over ``scale``, the per-op cost ``per_op``. Where that fit gives no positive scale (a small model, whose steps
    are mostly per-op cost, measured on a busy machine: the microbatched step came out more than M times the whole
    one), one factor scales the microbenchmarks' three rates together, fitted to the same samples, as
    :func:`calibrate` does with one step. None only where no sample took time.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], flops=[2e9, 6e9])
    >>> base = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.0}
    >>> # measured: twice the roofline's time, plus 1 ms of per-op cost per op and microbatch in the forward and 2 ms
    >>> # in the backward (the roofline's backward is twice the forward, its per-op cost too)
    >>> samples = [([0], 1, 2 * 6.0 + 0.003), ([1], 1, 2 * 18.0 + 0.003), ([0], 4, 2 * 6.0 + 0.012)]
    >>> r = fit_pipeline(g, base, samples)
    >>> round(r["flops_per_s"] / 1e9, 6), round(r["launch_overhead_s"] * 1e3, 6)
    (0.5, 1.0)
    >>> # the run over 8 microbatches 10x the whole one: the per-op cost alone is the fit, so one factor c scales
    >>> # all three rates (the FLOP rate over c, about (6 * 6 + 6 * 60) / (6 * 6 + 6 * 6); the per-op cost times c)
    >>> base = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.001}
    >>> r = fit_pipeline(g, base, [([0], 1, 6.0), ([0], 8, 60.0)])
    >>> round(1e9 / r["flops_per_s"], 3), round(r["flops_per_s"] * r["launch_overhead_s"] / 1e6, 6)
    (5.495, 1.0)
    """
    from scipy.optimize import nnls

    rows, seconds = [], []
    for ops, microbatches, measured_s in samples:
        rows.append(_roofline_parts(graph, rates, np.asarray(ops, dtype=np.int64), int(microbatches)))
        seconds.append(float(measured_s))
    if not rows:
        return None
    parts, measured = np.array(rows, dtype=np.float64), np.array(seconds, dtype=np.float64)
    (scale, per_op), _ = nnls(parts, measured)
    if not scale > 0:
        # one factor c for all three rates: seconds = c * (work + per-op cost * launches), least squares
        whole = parts[:, 0] + float(rates["launch_overhead_s"]) * parts[:, 1]
        factor = float(whole @ measured) / float(whole @ whole) if float(whole @ whole) > 0 else 0.0
        if not factor > 0:
            return None
        scale, per_op = factor, float(rates["launch_overhead_s"]) * factor
    return {
        "flops_per_s": float(rates["flops_per_s"] / scale),
        "mem_bw_bytes_per_s": float(rates["mem_bw_bytes_per_s"] / scale),
        "launch_overhead_s": float(per_op),
    }


def with_device_fields(cluster: Cluster, **fields: float) -> Cluster:
    """``cluster`` with ``fields`` (:class:`~envs.devices.Device` attributes) set alike on every device."""
    devices = [dataclasses.replace(d, **fields) for d in cluster.devices]
    return Cluster(name=cluster.name, devices=devices, links=cluster.links, description=cluster.description)


def with_action_overhead(cluster: Cluster, seconds: float) -> Cluster:
    """``cluster`` with every device's ``action_overhead_s`` set to ``seconds``."""
    return with_device_fields(cluster, action_overhead_s=float(seconds))


def split_factor(parts: Sequence[Mapping[str, Any]]) -> float:
    """Every device's ``split_backward_factor``: the median over the ranks that measured one of their stage's split
    backward over its whole one (:func:`stage_split_backward`); 1 where none did.

    >>> split_factor([{"split_backward": None}, {"split_backward": {"whole_s": 0.010, "split_s": 0.012}}])
    1.2
    """
    ratios = [
        p["split_backward"]["split_s"] / p["split_backward"]["whole_s"]
        for p in parts
        if isinstance(p.get("split_backward"), Mapping) and p["split_backward"].get("whole_s", 0) > 0
    ]
    return round(float(statistics.median(ratios)), 6) if ratios else 1.0


def fit_update_bandwidth(
    graph: Any, parts: Sequence[Mapping[str, Any]], split: np.ndarray, launch_overhead_s: float
) -> float:
    """Every device's ``update_bw_bytes_per_s``: the bandwidth under which :func:`envs.sim.cost.update_time_s` gives
    the optimizer steps the calibration pipelines measured (each rank's ``optimizer_s`` over the parameter bytes of
    its ops in ``split``), fitted over all of them at once (the bytes moved over the seconds past each step's
    launch). 0 (the device's ``mem_bw_bytes_per_s``) where no rank with parameters measured one.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], param_bytes=[0, 1_000_000])
    >>> runs = [{"phases": {"optimizer_s": 0.0035}}, {"phases": {"optimizer_s": 0.0035}}]
    >>> # rank 1: Adam's 7 passes over 1 MB in 3.5 ms, less 0.5 ms of launch: 7 MB in 3 ms
    >>> parts = [{"rank": 0, "pipelines": runs}, {"rank": 1, "pipelines": runs}]
    >>> round(fit_update_bandwidth(g, parts, np.array([0, 1]), 0.0005) / 1e9, 6)
    2.333333
    """
    param_bytes, busy_s = 0.0, 0.0  # over every measured step: the bytes updated, the seconds past each launch
    for p in parts:
        nbytes = float(graph.param_bytes[np.asarray(split) == int(p["rank"])].astype(np.float64).sum())
        if not nbytes > 0:
            continue
        for run in p.get("pipelines", []):
            seconds = run.get("phases", {}).get("optimizer_s")
            if seconds is not None and float(seconds) > launch_overhead_s:
                param_bytes += nbytes
                busy_s += float(seconds) - launch_overhead_s
    if not busy_s > 0:
        return 0.0
    bandwidth = update_bandwidth(busy_s + launch_overhead_s, param_bytes, launch_overhead_s)  # the one formula
    return bandwidth if bandwidth >= 1.0 else 0.0


def fit_action_overhead(graph: Any, cluster: Cluster, split: np.ndarray, runs: Sequence[tuple[int, float]]) -> float:
    """Seconds per pipeline action, the same on every rank, that make the simulator of ranks give each run's
    measured step: ``runs`` are ``(M, measured step seconds)`` of ``split`` (each op's rank) on ``cluster``.
    Least squares on the simulated step's slope in the overhead (two Gauss-Newton steps; the step is piecewise
    linear in it), never below 0.

    >>> from graphs import OpGraph
    >>> from envs.devices import Device, Link
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], flops=[1e9, 1e9])
    >>> devs = [Device(f"cpu:{r}", "cpu", 1e12, 1e9, 1e15, 0.0) for r in range(2)]
    >>> c = Cluster("toy", devs, {("cpu:0", "cpu:1"): Link(1e15, 0.0), ("cpu:1", "cpu:0"): Link(1e15, 0.0)})
    >>> # 0.5 s per action: M = 1, 6 s of compute and 2 overheads on the critical path; M = 2, 4.5 s and 4
    >>> round(fit_action_overhead(g, c, np.array([0, 1]), [(1, 6.0 + 2 * 0.5), (2, 4.5 + 4 * 0.5)]), 6)
    0.5
    """
    from envs.sim.ranks import RankSim

    def step_s(M: int, seconds: float) -> float:
        return float(RankSim(graph, with_action_overhead(cluster, seconds), microbatches=M).simulate(split).step_time_s)

    seconds, delta = 0.0, 1e-4
    for _ in range(2):
        num = den = 0.0
        for M, real_s in runs:
            base = step_s(M, seconds)
            slope = (step_s(M, seconds + delta) - base) / delta
            if np.isfinite(base) and np.isfinite(slope):
                num += slope * (float(real_s) - base)
                den += slope * slope
        if den <= 0:
            return 0.0
        seconds = max(0.0, seconds + num / den)
    return seconds


def calibration_plans(
    graph: Any, num_ranks: int, microbatch_program: Any | None, micro: int
) -> tuple[np.ndarray, list[RankPlan]]:
    """The pipelines the profile runs (module doc): ``(each op's rank, the plans)``. ``graph``'s ops in node order
    are cut into ``num_ranks`` runs of about equal roofline work (forward and backward FLOPs, one per rank
    ``cpu:r``), run with GPipe over 1 microbatch and, with ``microbatch_program`` (the graph of the program exported
    at one of ``micro`` microbatches), over ``micro``.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 8), ("b", "c", 8), ("c", "d", 8)], flops=[1, 1, 2, 0])
    >>> calibration_plans(g, 2, None, 8)[0].tolist()
    [0, 0, 1, 1]
    """
    op_ranks = work_runs(graph, num_ranks)
    devices = [f"cpu:{r}" for r in range(num_ranks)]
    used = sorted(set(op_ranks.tolist()))
    if len(used) < num_ranks:
        raise PlacerError(f"--ranks {num_ranks}: the model's ops cannot be cut into {num_ranks} runs of work")
    out = []
    for M, program in ((1, None), (micro, microbatch_program)):
        if M > 1 and program is None:
            continue
        placement = Placement.from_indices(graph, devices, op_ranks, method="profile", microbatches=M)
        out.append(compile_plan(graph, placement, program=program, nproc_per_node=num_ranks))
    return op_ranks, out


def work_runs(graph: Any, runs: int) -> np.ndarray:
    """Each op's run when ``graph``'s ops, in node order, are cut into ``runs`` runs of about equal roofline work
    (forward and backward FLOPs; every op some): an op goes to the run its work's middle falls in.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 8), ("b", "c", 8), ("c", "d", 8)], flops=[1, 1, 2, 0])
    >>> work_runs(g, 2).tolist(), work_runs(g, 4).tolist()
    ([0, 0, 1, 1], [0, 1, 2, 3])
    """
    work = graph.flops.astype(np.float64) * 3.0 + 1.0
    middle = (np.cumsum(work) - work / 2) / work.sum()
    return np.minimum((middle * runs).astype(np.int64), runs - 1)


#: The schedule of the looped calibration pipeline (:func:`looped_calibration_plan`).
LOOPED_SCHEDULE = "interleaved_1f1b"


def looped_calibration_plan(
    graph: Any, num_ranks: int, microbatch_program: Any | None, micro: int
) -> tuple[np.ndarray, RankPlan] | None:
    """The looped pipeline the profile also runs, to fit the ranks' hand-off (:func:`fit_handoff`): ``graph``'s ops
    cut into ``2 * num_ranks`` runs of about equal work (:func:`work_runs`), run ``s`` on rank ``s mod num_ranks``,
    under :data:`LOOPED_SCHEDULE` over ``micro`` microbatches (``microbatch_program``: the graph of one of them):
    ``(each op's rank, the plan)``, or None where the model cannot be cut so or the schedule does not fit.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 8), ("b", "c", 8), ("c", "d", 8)], flops=[1] * 4)
    >>> split, plan = looped_calibration_plan(g, 2, g, 4)
    >>> split.tolist(), plan.stage_ranks, plan.schedule
    ([0, 1, 0, 1], [0, 1, 0, 1], 'interleaved_1f1b')
    >>> looped_calibration_plan(g, 2, None, 1) is None  # one microbatch: nothing to interleave
    True
    """
    if microbatch_program is None or micro < 2:
        return None
    runs = work_runs(graph, 2 * num_ranks)
    if len(set(runs.tolist())) < 2 * num_ranks:
        return None
    op_ranks = runs % num_ranks
    devices = [f"cpu:{r}" for r in range(num_ranks)]
    placement = Placement.from_indices(
        graph, devices, op_ranks, method="profile", microbatches=micro, schedule=LOOPED_SCHEDULE
    )
    try:
        plan = compile_plan(graph, placement, program=microbatch_program, nproc_per_node=num_ranks)
    except PlacerError:
        return None
    return (op_ranks, plan) if len(plan.stages) == 2 * num_ranks else None


#: The largest hand-off :func:`fit_handoff` gives, in seconds (a scheduler tick is 1-10 ms).
MAX_HANDOFF_S = 0.05


def fit_handoff(graph: Any, cluster: Cluster, split: np.ndarray, microbatches: int, measured_s: float) -> float:
    """Seconds each message's arrival waits beyond its link (every device's ``handoff_s``, the same on every rank)
    that make the simulator of ranks give the looped calibration pipeline's measured step: ``split`` (each op's rank)
    under :data:`LOOPED_SCHEDULE` over ``microbatches``, on ``cluster``. Bisection (a later arrival never makes the
    simulated step shorter); 0 where the simulator is as slow already, at most :data:`MAX_HANDOFF_S`.

    >>> from graphs import OpGraph
    >>> from envs.devices import Device, Link
    >>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 8), ("b", "c", 8), ("c", "d", 8)], flops=[1e9] * 4)
    >>> devs = [Device(f"cpu:{r}", "cpu", 1e12, 1e9, 1e15, 0.0) for r in range(2)]
    >>> c = Cluster("toy", devs, {("cpu:0", "cpu:1"): Link(1e15, 0.0), ("cpu:1", "cpu:0"): Link(1e15, 0.0)})
    >>> split = np.array([0, 1, 0, 1])
    >>> base = handoff_step_s(g, c, split, 2)
    >>> h = fit_handoff(g, c, split, 2, base + 0.05)  # measured 50 ms slower than simulated
    >>> h > 0, round(handoff_step_s(g, with_device_fields(c, handoff_s=h), split, 2) - base, 6)
    (True, 0.05)
    >>> fit_handoff(g, c, split, 2, base - 0.1)  # measured faster than simulated: none
    0.0
    """
    cluster = with_device_fields(cluster, handoff_s=0.0)
    if not handoff_step_s(graph, cluster, split, microbatches) < measured_s:
        return 0.0
    lo, hi = 0.0, MAX_HANDOFF_S
    if handoff_step_s(graph, with_device_fields(cluster, handoff_s=hi), split, microbatches) <= measured_s:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if handoff_step_s(graph, with_device_fields(cluster, handoff_s=mid), split, microbatches) < measured_s:
            lo = mid
        else:
            hi = mid
    return hi


def handoff_step_s(graph: Any, cluster: Cluster, split: np.ndarray, microbatches: int) -> float:
    """The simulated step of the looped calibration pipeline (:func:`fit_handoff`)."""
    from envs.sim.ranks import RankSim

    sim = RankSim(graph, cluster, microbatches=microbatches, schedule=LOOPED_SCHEDULE)
    return float(sim.simulate(np.asarray(split)).step_time_s)


def _device(name: str, rates: Mapping[str, float], memory_bytes: float) -> Device:
    r = rates
    return Device(name, "cpu", memory_bytes, r["flops_per_s"], r["mem_bw_bytes_per_s"], r["launch_overhead_s"])


@record
def probe_rank(job: RankProbe) -> dict[str, Any] | None:
    """The entry point of every process: its rates and model step, and its pairs' ping-pongs; rank 0 returns all."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=job.timeout_s))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        dist.barrier()
        part: dict[str, Any] = {"rank": rank, "rates": compute_rates(job.repeats)}
        part.update(model_step_s(job.source, job.source_dir, job.repeats, job.warmup, job.micro))
        part["links"] = {}
        for a in range(world):
            for b in range(a + 1, world):
                dist.barrier()  # one pair at a time: the others wait
                if rank in (a, b):
                    times = ping_pong(b if rank == a else a, rank == a, job.repeats)
                    if rank == a:
                        part["links"][f"{a},{b}"] = times
        part["pipelines"] = [pipeline_phases(job, RankPlan.from_dict(plan), rank) for plan in job.plans]
        if job.looped is not None:
            part["looped"] = pipeline_phases(job, RankPlan.from_dict(job.looped), rank)
        if job.plans:  # on the microbatch the last calibration pipeline runs (a zero-bubble schedule's size)
            part["split_backward"] = stage_split_backward(job, RankPlan.from_dict(job.plans[-1]), rank)
        parts = gather_to_first(part)
        return {"parts": parts} if rank == 0 else None
    finally:
        dist.destroy_process_group()


def pipeline_phases(job: RankProbe, plan: RankPlan, rank: int) -> dict[str, Any]:
    """This rank's phases in ``plan`` run for real (medians over ``job.repeats`` steps), or why it could not run.

    A plan that cannot run raises the same :class:`PlacerError` on every rank before any collective (the stages'
    cut and shapes are computed alike everywhere), so every rank records it and the ranks stay in step.
    """
    from envs.real.distributed.runtime import RankSchedule
    from envs.real.distributed.worker import PROGRAMS, train_steps

    try:
        with one_process_world():  # the model is one process's (graphs.export.one_process_world)
            model, inputs = build_model(job.source, search_dir=job.source_dir)
        program = PROGRAMS.get(job.source, job.source_dir, model, inputs, plan)[0]  # a plan of the same M: one export
        schedule = RankSchedule(plan, program, inputs, rank)
    except PlacerError as e:
        return {"microbatches": plan.microbatches, "error": str(e)}
    try:
        part = train_steps(schedule, inputs, lr=1e-3, warmup=job.warmup + 1, steps=job.repeats, timeout_s=job.timeout_s)
    finally:
        PROGRAMS.release()  # this pipeline's weights are not kept beside the next one's
    return {"microbatches": plan.microbatches, "phases": part["phases"]}


def split_backward_s(stage: Any, inputs: Sequence[Any], repeats: int) -> dict[str, float]:
    """``{"whole_s", "split_s"}``: medians over ``repeats`` of ``stage``'s backward (a stage module cut for a split
    backward, :func:`~envs.real.distributed.stage_modules.stage_programs`) on ``inputs`` (what it receives), run
    whole (autograd's backward) and as torch's zero-bubble schedules run it: its input part
    (``stage_backward_input``), then its weight part (``stage_backward_weight``, the graph kept as
    :func:`~envs.real.distributed.runtime.mend_split_backward` keeps it). Each forward runs untimed before."""
    from torch.distributed.pipelining._backward import (  # noqa: PLC2701 (what torch's schedules call)
        stage_backward_input,
        stage_backward_weight,
    )

    from envs.real.distributed.stage_modules import takes_gradient

    params = list(stage.parameters())
    received = [t.detach().requires_grad_(takes_gradient(t)) if isinstance(t, torch.Tensor) else t for t in inputs]

    def outputs() -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        out = stage(*received)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        kept = [t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = None if isinstance(out, torch.Tensor) and out.dim() == 0 else [torch.ones_like(t) for t in kept]
        return kept, grads

    def whole() -> float:
        outs, grads = outputs()
        start = time.perf_counter()
        torch.autograd.backward(outs, grads)
        return time.perf_counter() - start

    def split() -> float:
        outs, grads = outputs()
        start = time.perf_counter()
        _, groups = stage_backward_input(outs, grads, received, iter(params))
        stage_backward_weight(iter(params), groups, retain_graph=True)
        return time.perf_counter() - start

    whole(), split()  # warm
    times = {"whole_s": [], "split_s": []}
    for _ in range(max(1, repeats)):  # interleaved: the host's drift falls on both alike
        times["whole_s"].append(whole())
        times["split_s"].append(split())
    for p in params:
        p.grad = None
    return {k: statistics.median(v) for k, v in times.items()}


def stage_split_backward(job: RankProbe, plan: RankPlan, rank: int) -> dict[str, Any] | None:
    """This rank's stage of ``plan`` (one stage per rank) timed by :func:`split_backward_s` on the first microbatch's
    values it receives, made by running the stages before it here (no process group); None on the first rank
    (its stage receives no activations: torch runs its backward whole), or why it could not."""
    from envs.real.distributed.stage_modules import stage_programs
    from envs.real.distributed.worker import PROGRAMS

    if rank == 0:
        return None
    try:
        with one_process_world():
            model, inputs = build_model(job.source, search_dir=job.source_dir)
        program = PROGRAMS.get(job.source, job.source_dir, model, inputs, plan)[0]  # the last pipeline's export
        modules = stage_programs(program.module(), [s.ops for s in plan.stages], split_backward=True)
        values = tuple(split_batch(tuple(inputs), plan.microbatches)[0])
        with torch.no_grad():
            for module in modules[:rank]:
                out = module(*values)
                values = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        return split_backward_s(modules[rank], values, job.repeats)
    except Exception as e:  # a measurement that could not run: the factor stays 1, the raw numbers say why
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]}


def _micro(part: Mapping[str, Any]) -> tuple[int, float] | None:
    """A rank's microbatch step, ``(M, seconds)``, where it measured one."""
    return (int(part["microbatches"]), float(part["micro_step_s"])) if "micro_step_s" in part else None


def pipeline_samples(parts: Sequence[Mapping[str, Any]], split: np.ndarray) -> list[tuple]:
    """``(ops, M, forward + backward seconds)`` of every rank in every calibration pipeline (``split``: each op's
    rank in them); empty where one of them did not run."""
    samples = []
    for p in parts:
        ops = np.flatnonzero(np.asarray(split) == p["rank"])
        for run in p.get("pipelines", []):
            if "phases" not in run:
                return []
            samples.append((ops, int(run["microbatches"]), run["phases"]["forward_s"] + run["phases"]["backward_s"]))
    return samples


def ranks_cluster(
    graph: Any,
    parts: Sequence[Mapping[str, Any]],
    name: str = "ranks",
    split: np.ndarray | None = None,
    looped: np.ndarray | None = None,
) -> Cluster:
    """The cluster of the ranks' measurements (module doc): rank ``r`` is device ``cpu:r``; ``split``: each op's
    rank in the calibration pipelines the parts ran (None: none ran); ``looped``: each op's rank in the looped
    pipeline they ran (``part["looped"]``, which says its microbatches; None: none ran)."""
    world = len(parts)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world
    # the ranks share one machine's cores: the median of their microbenchmarks is the roofline's shape, and each
    # rank's own step of the model its level, or (where the pipelines ran) all ranks' pipeline compute
    shape = {k: statistics.median(p["rates"][k] for p in parts) for k in parts[0]["rates"]}
    fitted = fit_pipeline(graph, shape, pipeline_samples(parts, split)) if split is not None else None
    if fitted is not None:
        devices = [_device(f"cpu:{p['rank']}", fitted, memory) for p in parts]
    else:
        devices = [_device(f"cpu:{p['rank']}", calibrate(graph, shape, p["step_s"], _micro(p)), memory) for p in parts]
    links: dict[tuple[str, str], Link] = {}
    for part in parts:
        for pair, times in part["links"].items():
            a, b = (f"cpu:{r}" for r in pair.split(","))
            latency_s, bandwidth = fit_link({int(k): float(v) for k, v in times.items()})
            links[(a, b)] = links[(b, a)] = Link(bandwidth, latency_s)
    how = "pipeline compute" if fitted is not None else "one-process steps"
    description = f"{world} gloo ranks of this machine, one thread each, fitted to {how} (placer profile --ranks)"
    cluster = Cluster(name=name, devices=devices, links=links, description=description)
    if fitted is None:
        return cluster
    # the optimizer step's own bandwidth first: the action overhead is fitted to whole steps, which end with it
    cluster = with_device_fields(
        cluster, update_bw_bytes_per_s=fit_update_bandwidth(graph, parts, split, cluster.devices[0].launch_overhead_s)
    )
    factor = min(max(split_factor(parts), 0.1), 100.0)  # within the cluster file's bounds
    cluster = with_device_fields(cluster, split_backward_factor=factor)
    return fit_waits(graph, cluster, np.asarray(split), *pipeline_steps(parts, looped))


def pipeline_steps(
    parts: Sequence[Mapping[str, Any]], looped: np.ndarray | None = None
) -> tuple[list[tuple[int, float]], tuple[np.ndarray, int, float] | None]:
    """What :func:`fit_waits` fits to, from the ranks' parts: ``(M, the job's step)`` of each calibration pipeline
    (each rank's median step, the slowest rank's), and ``(looped, M, the job's step)`` of the looped one where every
    rank ran it (``looped``: each op's rank in it; None where it did not run).

    >>> run = lambda M, s: {"microbatches": M, "phases": {"step_s": s}}
    >>> parts = [{"pipelines": [run(1, 2.0), run(8, 3.0)], "looped": run(8, 4.0)},
    ...          {"pipelines": [run(1, 2.5), run(8, 2.0)], "looped": {"error": "no"}}]
    >>> pipeline_steps(parts, np.array([0, 1, 0, 1]))
    ([(1, 2.5), (8, 3.0)], None)
    """
    runs: dict[int, float] = {}
    for p in parts:
        for run in p["pipelines"]:
            M = int(run["microbatches"])
            runs[M] = max(runs.get(M, 0.0), float(run["phases"]["step_s"]))
    looped_runs = [p.get("looped") for p in parts]
    if looped is None or not all(isinstance(r, Mapping) and "phases" in r for r in looped_runs):
        return sorted(runs.items()), None
    step_s = max(float(r["phases"]["step_s"]) for r in looped_runs)
    return sorted(runs.items()), (looped, int(looped_runs[0]["microbatches"]), step_s)


def fit_waits(
    graph: Any,
    cluster: Cluster,
    split: np.ndarray,
    runs: Sequence[tuple[int, float]],
    looped: tuple[np.ndarray, int, float] | None = None,
) -> Cluster:
    """``cluster`` with the runtime's costs the simulator of ranks charges beside compute fitted to the calibration
    pipelines' measured steps: the cost per action (:func:`fit_action_overhead`, ``runs``: ``(M, step seconds)`` of
    ``split``, one stage per rank) and, where the looped pipeline ran (``looped``: ``(each op's rank, M, its
    measured step)``), each message's hand-off (:func:`fit_handoff`), then the cost per action again with it (the
    one-stage pipelines' messages wait too), then the hand-off again. Whatever hand-off ``cluster`` had is
    fitted anew."""
    cluster = with_device_fields(cluster, handoff_s=0.0)
    cluster = with_action_overhead(cluster, fit_action_overhead(graph, cluster, split, runs))
    if looped is None:
        return cluster
    looped_split, looped_m, measured_s = looped
    handoff_s = fit_handoff(graph, cluster, looped_split, looped_m, measured_s)
    if handoff_s > 0:
        cluster = with_device_fields(cluster, handoff_s=handoff_s)
        cluster = with_action_overhead(cluster, fit_action_overhead(graph, cluster, split, runs))
        handoff_s = fit_handoff(graph, cluster, looped_split, looped_m, measured_s)
    return with_device_fields(cluster, handoff_s=handoff_s)


def profile_ranks(source: str, num_ranks: int, *, repeats: int = 5, warmup: int = 1, timeout_s: float = 600.0):
    """Measure ``num_ranks`` ranks of this machine on ``source``'s model: ``(cluster, the ranks' raw numbers)``."""
    from envs.real.distributed.launch import launch
    from graphs.torch_capture import capture

    if num_ranks < 2:
        raise PlacerError(f"--ranks {num_ranks}: at least 2 (a rank alone sends nothing)")
    model, inputs = build_model(source, search_dir=os.getcwd())
    graph = capture(model, inputs)
    micro, program = microbatch_program(model, inputs, graph)
    split, plans = calibration_plans(graph, num_ranks, program, micro)
    looped = looped_calibration_plan(graph, num_ranks, program, micro)
    job = RankProbe(
        source=source,
        source_dir=os.getcwd(),
        repeats=repeats,
        warmup=warmup,
        timeout_s=timeout_s,
        plans=tuple(p.to_dict() for p in plans),
        micro=micro,
        looped=looped[1].to_dict() if looped is not None else None,
    )
    out = launch(probe_rank, (job,), nproc_per_node=num_ranks)
    parts = out[0]["parts"]
    return ranks_cluster(graph, parts, split=split, looped=looped[0] if looped is not None else None), parts


def microbatch_program(model: Any, inputs: tuple, graph: Any = None) -> tuple[int, Any | None]:
    """``(M, graph of the program exported at one of M microbatches)``: the largest M <= :data:`MICRO` the batch
    splits into (``(1, None)`` where it splits into none) whose program has ``graph``'s ops (the whole batch's, when
    given): a microbatch of one sample may export other ops (torch specialises a dimension of size 1), and a plan
    cut from such a program is refused, so fewer microbatches are taken instead."""
    from graphs.torch_capture import export_program, graph_from_program

    def same_ops(program: Any) -> bool:
        return graph is None or (program.names == graph.names and program.op_types == graph.op_types)

    for k in range(MICRO, 1, -1):
        try:
            parts = split_batch(tuple(inputs), k)
        except PlacerError:
            continue
        program = graph_from_program(export_program(model, parts[0]))
        # uneven parts: the last is the smallest (8 cut 7 ways is 2, 1, 1...), and must have the same ops too
        uneven = [getattr(t, "shape", None) for t in parts[-1]] != [getattr(t, "shape", None) for t in parts[0]]
        smallest = parts[-1] if graph is not None and uneven else None
        if same_ops(program) and (smallest is None or same_ops(graph_from_program(export_program(model, smallest)))):
            return k, program
    return 1, None


__all__ = [
    "RankProbe",
    "SIZES",
    "calibrate",
    "calibration_plans",
    "handoff_step_s",
    "looped_calibration_plan",
    "fit_action_overhead",
    "fit_handoff",
    "fit_waits",
    "pipeline_steps",
    "fit_link",
    "fit_update_bandwidth",
    "fit_pipeline",
    "microbatch_program",
    "pipeline_phases",
    "pipeline_samples",
    "probe_rank",
    "profile_ranks",
    "ranks_cluster",
    "split_backward_s",
    "split_factor",
    "stage_split_backward",
    "with_action_overhead",
    "with_device_fields",
    "work_runs",
]
