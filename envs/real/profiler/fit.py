"""A profile taken in by the simulator: per-op times onto the graph, measured rates onto the cluster.

:func:`apply_profile` fills ``graph.profile[kind]`` (the content hash leaves
``profile`` out, so placements made before profiling stay valid);
:func:`calibrate_cluster` replaces link latency and bandwidth with the measured ones
and, given the graph, fits each device kind's launch overhead and compute rate for
ops the profile does not cover, and its memory bandwidth to the measured optimizer
step where there is one. :func:`with_profile` does both for a ``--profile``
command-line option; :func:`fit_link` fits a link's latency and bandwidth to
timed copies.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.cluster import Cluster, Device, Link
from envs.real.placing import resolve_devices
from envs.real.profiler.file import check_profile, device_kind, load_profile
from envs.sim.cost import update_bandwidth
from envs.sim.order_trust import ORDER_MARGIN_META, margin_of
from envs.sim.simulator import MODEL_VERSION, SimEnv
from graphs import OpGraph, PlacerError
from graphs.hash_seed import hash_seed_hint
from graphs.ir import PROFILE_COLUMNS
from graphs.ops import free_mask


def _same_device_link() -> Any:
    return Link(bandwidth_bytes_per_s=1e18, latency_s=0.0)  # a no-op .to(): nothing moves


def fit_link(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``time = latency_s + bytes / bandwidth`` (relative errors weigh equally).

    >>> lat, bw = fit_link([1e3, 1e6, 1e7], [1e-5 + 1e3 / 1e10, 1e-5 + 1e6 / 1e10, 1e-5 + 1e7 / 1e10])
    >>> round(lat * 1e6, 3), round(bw / 1e9, 3)
    (10.0, 10.0)
    """
    x, y = np.asarray(sizes_bytes, dtype=np.float64), np.asarray(times_s, dtype=np.float64)
    if len(x) < 2 or np.any(y <= 0):
        raise PlacerError("link fit: need at least two sizes with positive times")
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency_s, per_byte_s), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    if per_byte_s <= 0:  # copies too small to see the bandwidth: use the largest one
        per_byte_s = max(y[-1] - max(latency_s, 0.0), 1e-15) / x[-1]
    return float(max(latency_s, 0.0)), float(1.0 / per_byte_s)


def profile_columns(
    graph: OpGraph, profile: Mapping[str, Any], *, source: str = "profile"
) -> dict[str, dict[str, np.ndarray]]:
    """Device kind -> {"fwd_s", "bwd_s"[, "issue_fwd_s", "issue_bwd_s"]} arrays aligned with ``graph`` (median over
    devices of a kind)."""
    if profile.get("graph_hash") and profile["graph_hash"] != graph.content_hash:
        raise PlacerError(
            f"{source}: profiled graph {profile['graph_hash']}, not this graph ({graph.name or 'graph'} "
            f"{graph.content_hash}){hash_seed_hint()}"
        )
    pos = {name: k for k, name in enumerate(profile["ops"])}
    rows = np.array([pos.get(name, -1) for name in graph.names])
    if np.all(rows < 0) and graph.num_ops:
        raise PlacerError(f"{source}: names none of the graph's ops")
    by_kind: dict[str, dict[str, list[np.ndarray]]] = {}
    for torch_device, entry in profile["devices"].items():
        kind = entry.get("kind") or device_kind(torch_device)
        for col in PROFILE_COLUMNS:
            if col not in entry:  # the optional columns (the issue times, the microbatch's)
                continue
            vals = np.array([np.nan if x is None else x for x in entry[col]], dtype=np.float64)
            aligned = (
                np.where(rows >= 0, vals[np.maximum(rows, 0)], np.nan) if len(vals) else np.full(graph.num_ops, np.nan)
            )
            by_kind.setdefault(kind, {}).setdefault(col, []).append(aligned)
    out = {}
    for kind, cols in by_kind.items():
        with np.errstate(all="ignore"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
                out[kind] = {col: np.nanmedian(np.stack(arrs), axis=0) for col, arrs in cols.items()}
    return out


def apply_profile(graph: OpGraph, profile: Mapping[str, Any], *, source: str = "profile") -> OpGraph:
    """A copy of ``graph`` whose ``profile[kind]`` holds the measured per-op times.

    The content hash is unchanged (it leaves ``profile`` out), so placements made
    for ``graph`` remain valid for the result. Ops the profile lacks stay NaN
    (the cost model then falls back to its roofline estimate). A profile's
    ``order_trust`` record measured with this simulator model puts its margin on
    ``meta`` (:mod:`envs.sim.order_trust`), which the planner then keeps to.
    """
    prof = {**graph.profile, **profile_columns(graph, profile, source=source)}
    meta = {**graph.meta, "profile": {"host": profile.get("host", ""), "devices": sorted(profile["devices"])}}
    if (
        profile.get("order_trust") is not None
    ):  # orders run for real: the planner's margin (this simulator model's only)
        margin = margin_of(profile["order_trust"], MODEL_VERSION, source=f"{source}: order_trust")
        if margin is not None:
            meta[ORDER_MARGIN_META] = margin
    return dataclasses.replace(graph, profile=prof, meta=meta)


def calibrate_cluster(
    cluster: Any,
    profile: Mapping[str, Any],
    *,
    graph: OpGraph | None = None,
    device_map: Mapping[str, str] | str | None = None,
) -> Any:
    """A copy of ``cluster`` calibrated to the profiled machine.

    Each logical device is mapped to its torch device (``device_map``, default
    ``gpu:i -> cuda:i``); where the profile measured that torch device, the
    logical device takes its kind (``gpu:0`` run on ``cpu`` *is* a CPU, and the
    graph's CPU profile applies to it). Each link ``a -> b`` takes the measured
    link between their torch devices, else one measured between devices of the
    same kinds (``cpu -> gpu`` from ``cpu -> cuda:0``), else keeps its value; two
    logical devices on one torch device exchange tensors for free (``.to`` is a
    no-op). With ``graph``, each kind's ``launch_overhead_s`` becomes the 10th
    percentile of its measured non-view forward times and ``flops_per_s`` the rate
    fitted on the ops doing nine tenths of the FLOPs, so ops without a profiled
    time are estimated at this machine's speed; where the profile measured the
    optimizer step (``update_s``), ``mem_bw_bytes_per_s`` is fitted so that
    :func:`envs.sim.cost.update_times_s` of all the parameters gives that step plus the
    step's measured ``overhead_s`` (:func:`_fit_update`). A host device takes the
    staging copy and contention its torch device's entry measured (:func:`host_fields`).
    """
    torch_of = {
        name: str(torch_device) for name, torch_device in resolve_devices(cluster.device_names, device_map).items()
    }
    profiled = profile.get("devices", {})
    kind_of = {
        device.name: (profiled[torch_of[device.name]].get("kind") or device_kind(torch_of[device.name]))
        if torch_of[device.name] in profiled
        else device.kind
        for device in cluster.devices
    }
    measured = {
        (lk["src"], lk["dst"]): Link(float(lk["bandwidth_bytes_per_s"]), float(lk["latency_s"]))
        for lk in profile.get("links", [])
    }
    by_kinds: dict[tuple[str, str], Link] = {}
    for (s, d), link in measured.items():
        by_kinds.setdefault((device_kind(s), device_kind(d)), link)
    links = {}
    for (a, b), link in cluster.links.items():
        if torch_of[a] == torch_of[b]:
            links[(a, b)] = _same_device_link()
        else:
            links[(a, b)] = measured.get((torch_of[a], torch_of[b])) or by_kinds.get((kind_of[a], kind_of[b])) or link
    devices = [dataclasses.replace(device, kind=kind_of[device.name]) for device in cluster.devices]
    if graph is not None:
        rates = _fit_rates(graph, profile_columns(graph, profile), ~free_mask(graph))
        _fit_update(rates, profiled)
        devices = [
            dataclasses.replace(device, **rates[device.kind]) if device.kind in rates else device for device in devices
        ]
    devices = [
        dataclasses.replace(device, **host_fields(profiled.get(torch_of[device.name], {})))
        if device.kind == "cpu"
        else device
        for device in devices
    ]
    return Cluster(
        name=f"{cluster.name}+profile",
        devices=devices,
        links=links,
        description=f"{cluster.description} (calibrated by profile from {profile.get('host', '?')})",
    )


def host_fields(entry: Mapping[str, Any]) -> dict[str, float]:
    """The :class:`envs.cluster.Device` host fields a profiled host device's entry measured (its ``staging``,
    ``contention`` and ``step_call``, :mod:`envs.real.profiler.host`); none for an entry without them. A call's
    fixed cost is its ``step_call_s`` (at least 0).

    >>> host_fields(
    ...     {"staging": {"latency_s": 2e-6, "bandwidth_bytes_per_s": 5e9}, "contention": {"op": 0.3, "issue": 0.1},
    ...      "step_call": {"call_s": 25e-6}},
    ... )  # doctest: +NORMALIZE_WHITESPACE
    {'stage_latency_s': 2e-06, 'stage_bandwidth_bytes_per_s': 5000000000.0,
     'contention_op': 0.3, 'contention_issue': 0.1, 'step_call_s': 2.5e-05}
    """
    out: dict[str, float] = {}
    stage, contention, call = entry.get("staging"), entry.get("contention"), entry.get("step_call")
    if isinstance(stage, Mapping):
        out.update(
            stage_latency_s=float(stage["latency_s"]), stage_bandwidth_bytes_per_s=float(stage["bandwidth_bytes_per_s"])
        )
    if isinstance(contention, Mapping):
        out.update(
            contention_op=min(float(contention["op"]), 100.0), contention_issue=min(float(contention["issue"]), 100.0)
        )
    if isinstance(call, Mapping):
        out["step_call_s"] = max(float(call["call_s"]), 0.0)
    return out


def _fit_rates(
    graph: OpGraph, cols: Mapping[str, Mapping[str, np.ndarray]], compute: np.ndarray
) -> dict[str, dict[str, float]]:
    out = {}
    for kind, c in cols.items():
        fwd = c.get("fwd_s")
        ok = compute & ~np.isnan(fwd) if fwd is not None else np.zeros(graph.num_ops, bool)
        if not ok.any():
            continue
        launch_s = float(np.percentile(fwd[ok], 10))
        rates: dict[str, float] = {"launch_overhead_s": launch_s}
        flops = graph.flops[ok]
        if flops.sum() > 0:
            order = np.argsort(-flops)
            top = order[: int(np.searchsorted(np.cumsum(flops[order]), 0.9 * flops.sum())) + 1]
            busy_s = np.maximum(fwd[ok][top] - launch_s, 1e-9).sum()
            rates["flops_per_s"] = float(flops[top].sum() / busy_s)
        out[kind] = rates
    return out


def _fit_update(rates: dict[str, dict[str, float]], devices: Mapping[str, Any]) -> None:
    """Per kind, the memory bandwidth that makes the modelled optimizer step the measured one.

    The measured step outside the graph's ops (``overhead_s``: zero_grad, the loss,
    autograd's start) is charged with it: like the update, it runs once per step
    after (or around) the ops. Median over the kind's devices that measured one.
    """
    by_kind: dict[str, list[float]] = {}
    for torch_device, entry in devices.items():
        upd, nbytes = entry.get("update_s"), entry.get("update_bytes")
        if not isinstance(upd, (int, float)) or not isinstance(nbytes, (int, float)) or upd <= 0 or nbytes <= 0:
            continue
        extra = entry.get("overhead_s")
        total = float(upd) + (float(extra) if isinstance(extra, (int, float)) and extra > 0 else 0.0)
        kind = entry.get("kind") or device_kind(torch_device)
        launch = rates.get(kind, {}).get("launch_overhead_s", 0.0)
        by_kind.setdefault(kind, []).append(update_bandwidth(total, float(nbytes), launch))
    for kind, bws in by_kind.items():
        rates.setdefault(kind, {})["mem_bw_bytes_per_s"] = float(np.median(bws))


def with_profile(
    graph: OpGraph,
    cluster: Any,
    profile: str | os.PathLike | Mapping[str, Any] | None,
    *,
    device_map: Mapping[str, str] | str | None = None,
    ranks: bool = False,
) -> tuple[OpGraph, Any]:
    """``--profile`` in one call: the profiled graph and the calibrated cluster (both unchanged if None).

    ``ranks`` (plans across processes, ``--ranks``): each of the cluster's devices is a process of its own, and the
    cluster is ``placer profile --ranks``'s measure of them (their rates, the links between them, the runtime's cost
    per action), which a one-process profile cannot calibrate (its devices would share one torch device, and their
    links be free). Only the per-op times go on the graph; the cluster is returned as it is. Across processes the
    profiled op times are what the roofline misses: a dense layer on a small batch, bound neither by the FLOP rate
    nor by the bandwidth that a model's whole steps fit (``BENCHMARKS.md``, "Per-op times across processes").
    """
    if profile is None:
        return graph, cluster
    source = os.fspath(profile) if not isinstance(profile, Mapping) else "profile"
    doc = load_profile(profile) if not isinstance(profile, Mapping) else profile
    if isinstance(profile, Mapping):
        check_profile(doc)
    graph_out = apply_profile(graph, doc, source=source)
    if ranks:
        return graph_out, cluster
    return graph_out, calibrate_cluster(cluster, doc, graph=graph, device_map=device_map)


def cluster_with_profile(cluster: Cluster, profile: Any, *, graph: Any = None, device_map: Any = None) -> Cluster:
    """``cluster.with_profile(profile)``: a copy calibrated by a ``placer profile`` file or document.

    Links take the measured latency and bandwidth; given ``graph``, each device
    kind's launch overhead and compute rate are fitted to the profiled op times
    (:func:`calibrate_cluster`). The per-op times themselves go on the graph:
    :func:`apply_profile`.
    """
    if isinstance(profile, (str, os.PathLike)):
        doc = load_profile(profile)
    else:
        check_profile(profile)
        doc = profile
    return calibrate_cluster(cluster, doc, graph=graph, device_map=device_map)


def fit_issue_scale(
    profile: dict[str, Any], graph: OpGraph, *, low: float = 0.25, high: float = 4.0, rtol: float = 1e-3
) -> dict[str, Any]:
    """``profile`` with the issue times of each device profiled in context scaled to match its measured clean step.

    The eager simulator's step with every op on the device (:func:`all_on_device_step_s`)
    should be the clean step the profile timed (``step_s``). Where it is not, the
    issue times are what is off: probes cost the host more than taking their
    measured cost off removes (on small kernels, where the issue is the step). So
    the issue columns are scaled by the factor in ``[low, high]`` that makes the
    two equal (bisection; the step grows with the factor), kept as ``issue_scale``
    beside ``issue_fit`` (the measured step, the simulated one before and after).
    Devices without issue columns are left as they are. Changes ``profile`` in place.
    """
    for torch_device, entry in profile["devices"].items():
        target = entry.get("step_s")
        if (
            entry.get("method") != "context"
            or "issue_fwd_s" not in entry
            or not isinstance(target, (int, float))
            or target <= 0
        ):
            continue
        step = lambda scale: all_on_device_step_s(graph, profile, torch_device, issue_scale=scale)  # noqa: E731
        before = step(1.0)
        scale = 1.0
        if abs(before - target) > rtol * target:
            lo, hi = (low, 1.0) if before > target else (1.0, high)
            for _ in range(40):  # in log space: a factor of 16 to 1e-3 in about 14 halvings
                scale = float(np.sqrt(lo * hi))
                if step(scale) > target:
                    hi = scale
                else:
                    lo = scale
                if hi / lo < 1 + rtol / 4:
                    break
        after = step(scale)
        for col in ("issue_fwd_s", "issue_bwd_s"):
            entry[col] = [None if x is None else float(x) * scale for x in entry[col]]
        entry["issue_scale"] = scale
        entry["issue_fit"] = {"step_s": float(target), "simulated_before_s": before, "simulated_after_s": after}
    return profile


def all_on_device_step_s(graph: OpGraph, profile: Mapping[str, Any], device: str, *, issue_scale: float = 1.0) -> float:
    """The eager simulator's step with every op of ``graph`` on ``device``, calibrated by its entry in ``profile``
    (the issue times scaled by ``issue_scale``)."""
    entry = dict(profile["devices"][device])
    for col in ("issue_fwd_s", "issue_bwd_s"):
        if col in entry:
            entry[col] = [None if x is None else float(x) * issue_scale for x in entry[col]]
    one = {**profile, "devices": {device: entry}, "links": []}
    kind = entry.get("kind") or device_kind(device)
    cluster = Cluster("fit", [Device("d:0", kind, 1e15, 1e12, 1e12, 0.0)], {})
    cluster = calibrate_cluster(cluster, one, graph=graph, device_map={"d:0": device})
    return float(
        SimEnv(apply_profile(graph, one), cluster)
        .simulate(np.zeros(graph.num_ops, dtype=np.int64))
        .extra["sim_step_time_s"]
    )
