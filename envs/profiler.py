"""The profiler: per-op forward/backward seconds and link speeds, measured on real devices.

:func:`profile_program` walks the exported graph once with concrete values (a
``torch.fx.Interpreter`` on the CPU) and, at every op, times that op alone on
each requested torch device: its forward (inputs already on the device, autograd
recording as in training), then its backward (``torch.autograd.grad`` of the
op's outputs with respect to its inputs that need gradients, after an untimed
forward). Each time is the median of ``repeats`` runs after ``warmup`` runs, CUDA
timed with events and bracketed by synchronisation, the CPU with
``time.perf_counter``. :func:`time_link` times copies of a few sizes between two
devices and :func:`fit_link` fits ``time = latency_s + bytes / bandwidth``.

The result is a ``placer-profile/1`` document tied to the graph hash::

    {"format": "placer-profile/1", "graph_hash": "...", "ops": [names...],
     "devices": {"cpu": {"kind": "cpu", "fwd_s": [...], "bwd_s": [...]},
                 "cuda:0": {"kind": "gpu", ...}},
     "links": [{"src": "cpu", "dst": "cuda:0", "latency_s": ..,
                "bandwidth_bytes_per_s": .., "sizes_bytes": [..], "times_s": [..]}]}

(``null`` marks an op that could not run on that device.) The simulator takes it
in two ways: :func:`apply_profile` fills ``graph.profile[kind]`` (the content hash
leaves ``profile`` out, so placements made before profiling stay valid), and
:func:`calibrate_cluster` replaces link latency/bandwidth with the measured ones
and, given the graph, fits each device kind's launch overhead and compute rate
for ops the profile does not cover. :func:`with_profile` does both for a
``--profile`` command-line option.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from graphs import OpGraph, PlacerError, schema
from graphs.io import read_json, write_text_atomic

FORMAT = "placer-profile/1"
DEFAULT_TRANSFER_SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)


def _same_device_link() -> Any:
    from envs.cluster import Link

    return Link(bandwidth_bytes_per_s=1e18, latency_s=0.0)  # a no-op .to(): nothing moves


def device_kind(device: str) -> str:
    """``"cuda:0"`` -> ``"gpu"``, ``"cpu"`` -> ``"cpu"`` (the cluster's device kinds)."""
    return "gpu" if device.startswith("cuda") else "cpu"


# --------------------------------------------------------------------- timing
def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(run: Callable[[Any], Any], setup: Callable[[], Any], device: Any, *, warmup: int = 1, repeats: int = 5) -> float:
    """Median seconds of ``run(setup())`` on ``device``; ``setup`` is not timed."""
    import torch

    times = []
    for k in range(warmup + repeats):
        state = setup()
        if device.type == "cuda":
            with torch.cuda.device(device):  # events record on this device's current stream
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                _sync(device)
                start.record()
                run(state)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            run(state)
            elapsed = time.perf_counter() - t0
        if k >= warmup:
            times.append(elapsed)
    return float(np.median(times))


def _op_timer(node: Any, args: tuple, kwargs: dict, device: Any, warmup: int, repeats: int) -> tuple[float, float]:
    """(forward s, backward s) of one fx node's call on ``device``."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    def fresh(grad: bool) -> tuple[tuple, dict, list]:
        leaves: list = []

        def move(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            x = t.detach().to(device, copy=True)  # a fresh copy per call: in-place ops cannot leak
            if grad and t.requires_grad and x.is_floating_point():
                x.requires_grad_(True)
                leaves.append(x)
                return x.clone()  # a non-leaf, so in-place ops are allowed on it
            return x

        a, kw = tree_map(move, (args, kwargs))
        return a, kw, leaves

    target = node.target
    with torch.enable_grad():
        fwd_s = time_call(lambda st: target(*st[0], **st[1]), lambda: fresh(True), device, warmup=warmup, repeats=repeats)

        def setup_bwd() -> tuple:
            a, kw, leaves = fresh(True)
            out = target(*a, **kw)
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
            return outs, leaves

        probe_outs, probe_leaves = setup_bwd()
        if not probe_outs or not probe_leaves:
            return fwd_s, 0.0  # nothing to differentiate: autograd runs nothing for this op

        def run_bwd(st: tuple) -> None:
            outs, leaves = st
            torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)

        bwd_s = time_call(run_bwd, setup_bwd, device, warmup=warmup, repeats=repeats)
    return fwd_s, bwd_s


def profile_program(ep: Any, devices: Sequence[str], *, warmup: int = 1, repeats: int = 5, transfer_sizes: Sequence[int] = DEFAULT_TRANSFER_SIZES, graph: OpGraph | None = None, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Profile every op of an ``ExportedProgram`` on each torch device in ``devices``.

    Returns the ``placer-profile/1`` document (see the module docstring).
    """
    import torch
    import torch.fx as fx

    from graphs.torch_capture import graph_from_program

    torch_devices = [torch.device(d) for d in devices]
    for d in torch_devices:
        if d.type == "cuda" and (not torch.cuda.is_available() or (d.index or 0) >= torch.cuda.device_count()):
            raise PlacerError(f"--devices: {d} is not available on this machine")
    graph = graph or graph_from_program(ep)
    gm = copy.deepcopy(ep.module())  # the reference run mutates buffers; keep the model's intact
    index = graph.index
    fwd = {str(d): np.full(graph.num_ops, np.nan) for d in torch_devices}
    bwd = {str(d): np.full(graph.num_ops, np.nan) for d in torch_devices}
    errors: dict[str, str] = {}
    done = [0]

    class _Timer(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            i = index.get(n.name) if n.op == "call_function" else None
            if i is not None:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                for d in torch_devices:
                    try:
                        fwd[str(d)][i], bwd[str(d)][i] = _op_timer(n, args, kwargs, d, warmup, repeats)
                    except Exception as e:  # an op this device cannot run: unknown (NaN), noted
                        errors.setdefault(f"{n.name}@{d}", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                done[0] += 1
                if progress:
                    progress(done[0], graph.num_ops)
            return result

    example = [p.meta["val"] for p in ep.graph.nodes if p.op == "placeholder" and p.name in set(ep.graph_signature.user_inputs)]
    inputs = _concrete_inputs(ep, example)
    with torch.enable_grad():
        _Timer(gm).run(*inputs)
    links = []
    for a in torch_devices:
        for b in torch_devices:
            if a != b:
                sizes, times = time_link(a, b, transfer_sizes, repeats=repeats)
                lat, bw = fit_link(sizes, times)
                links.append({"src": str(a), "dst": str(b), "latency_s": lat, "bandwidth_bytes_per_s": bw, "sizes_bytes": list(sizes), "times_s": times})

    def col(a: np.ndarray) -> list:
        return [None if np.isnan(x) else float(x) for x in a.tolist()]

    return {
        "format": FORMAT,
        "graph_hash": graph.content_hash,
        "graph_name": graph.name,
        "ops": list(graph.names),
        "devices": {str(d): {"kind": device_kind(str(d)), "name": _device_name(d), "fwd_s": col(fwd[str(d)]), "bwd_s": col(bwd[str(d)])} for d in torch_devices},
        "links": links,
        "settings": {"warmup": warmup, "repeats": repeats},
        "errors": errors,
        "host": platform.node(),
        "torch": torch.__version__,
    }


def _concrete_inputs(ep: Any, example: list) -> list:
    """Inputs for the reference run: the captured example inputs if kept, else random ones of their shapes."""
    import torch

    stored = getattr(ep, "example_inputs", None)
    if stored is not None and stored[0]:
        return list(stored[0])
    out = []
    for v in example:
        if v.is_floating_point():
            out.append(torch.randn(tuple(v.shape), dtype=v.dtype))
        else:
            out.append(torch.zeros(tuple(v.shape), dtype=v.dtype))
    return out


def _device_name(d: Any) -> str:
    import torch

    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    return platform.processor() or platform.machine()


def profile_model(model: Any, example_inputs: tuple, devices: Sequence[str], **options: Any) -> dict[str, Any]:
    """Export ``model`` (as :func:`graphs.capture` does) and :func:`profile_program` it."""
    from graphs.torch_capture import export_program

    return profile_program(export_program(model, example_inputs), devices, **options)


# ---------------------------------------------------------------------- links
def time_link(src: Any, dst: Any, sizes_bytes: Sequence[int] = DEFAULT_TRANSFER_SIZES, *, repeats: int = 5) -> tuple[list[int], list[float]]:
    """Median seconds to copy a float32 tensor of each size from ``src`` to ``dst``."""
    import torch

    src, dst = torch.device(src), torch.device(dst)
    times = []
    for n in sizes_bytes:
        x = torch.rand(max(1, int(n) // 4), device=src)
        buf = torch.empty_like(x, device=dst)

        def run(_: Any) -> None:
            buf.copy_(x)
            _sync(dst)
            _sync(src)

        timing_dev = dst if dst.type == "cuda" else src
        times.append(time_call(run, lambda: None, timing_dev, warmup=1, repeats=repeats))
    return [int(n) for n in sizes_bytes], times


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


# ---------------------------------------------------------------------- files
def save_profile(profile: Mapping[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, json.dumps(profile, indent=1))


def load_profile(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a ``placer-profile/1`` file; problems raise :class:`PlacerError` naming it."""
    path = os.fspath(path)
    doc = read_json(path)
    check_profile(doc, source=path)
    return doc


def check_profile(doc: Any, *, source: str = "profile") -> None:
    """Raise :class:`PlacerError` unless ``doc`` is a well-formed ``placer-profile/1`` document.

    Types are checked by :mod:`graphs.schema`: times are finite numbers >= 0 (or
    ``null``), link speeds finite with the cluster's floors (a bool or a string is
    never a number).
    """
    from envs.cluster import KINDS, MAX_DELAY_S, MIN_RATE

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlacerError(f"{source}: format is {doc.get('format') if isinstance(doc, dict) else None!r}, expected {FORMAT!r}")
    ops = doc.get("ops")
    if not isinstance(ops, list) or not isinstance(doc.get("devices"), dict) or not isinstance(doc.get("links", []), list):
        raise PlacerError(f"{source}: needs 'ops' (list), 'devices' (object) and 'links' (list)")
    schema.strings(ops, source, "ops")
    for key in ("graph_hash", "host"):
        if key in doc:
            schema.string(doc[key], source, key)
    for dev, entry in doc["devices"].items():
        where = f"devices[{dev!r}]"
        schema.obj(entry, source, where)
        if entry.get("kind") is not None and schema.string(entry["kind"], source, f"{where}.kind") not in KINDS:
            raise PlacerError(f"{source}: {where}.kind is {entry['kind']!r}, expected one of {', '.join(KINDS)}")
        for col in ("fwd_s", "bwd_s"):
            arr = entry.get(col)
            if not isinstance(arr, list) or len(arr) != len(ops):
                raise PlacerError(f"{source}: {where}.{col} must list one time per op ({len(ops)})")
            times = schema.column([np.nan if x is None else x for x in arr], source, f"{where}.{col}", whole=False, nan_ok=True)
            bad = ~np.isnan(times) & ((times < 0) | (times > MAX_DELAY_S))
            if bad.any():
                k = int(np.argmax(bad))
                raise PlacerError(f"{source}: {where}.{col} has a negative or non-numeric time ({where}.{col}[{k}] is {times[k]!r}; expected 0 to {MAX_DELAY_S:g} s)")
    for k, link in enumerate(doc.get("links", [])):
        where = f"links[{k}]"
        schema.obj(link, source, where)
        for end in ("src", "dst"):
            schema.string(link.get(end), source, f"{where}.{end}")
        if not all(isinstance(link.get(key), (int, float)) and not isinstance(link.get(key), bool) for key in ("latency_s", "bandwidth_bytes_per_s")):
            raise PlacerError(f"{source}: {where} needs non-negative latency_s and bandwidth_bytes_per_s")
        schema.number(link["latency_s"], source, f"{where}.latency_s", minimum=0.0, maximum=MAX_DELAY_S)
        schema.number(link["bandwidth_bytes_per_s"], source, f"{where}.bandwidth_bytes_per_s", minimum=MIN_RATE)


# ------------------------------------------------------------- calibration
def profile_columns(graph: OpGraph, profile: Mapping[str, Any], *, source: str = "profile") -> dict[str, dict[str, np.ndarray]]:
    """Device kind -> {"fwd_s", "bwd_s"} arrays aligned with ``graph`` (median over devices of a kind)."""
    if profile.get("graph_hash") and profile["graph_hash"] != graph.content_hash:
        raise PlacerError(f"{source}: profiled graph {profile['graph_hash']}, not this graph ({graph.name or 'graph'} {graph.content_hash})")
    pos = {name: k for k, name in enumerate(profile["ops"])}
    rows = np.array([pos.get(name, -1) for name in graph.names])
    if np.all(rows < 0) and graph.num_ops:
        raise PlacerError(f"{source}: names none of the graph's ops")
    by_kind: dict[str, dict[str, list[np.ndarray]]] = {}
    for dev, entry in profile["devices"].items():
        kind = entry.get("kind") or device_kind(dev)
        for col in ("fwd_s", "bwd_s"):
            vals = np.array([np.nan if x is None else x for x in entry[col]], dtype=np.float64)
            aligned = np.where(rows >= 0, vals[np.maximum(rows, 0)], np.nan) if len(vals) else np.full(graph.num_ops, np.nan)
            by_kind.setdefault(kind, {}).setdefault(col, []).append(aligned)
    out = {}
    for kind, cols in by_kind.items():
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
                out[kind] = {col: np.nanmedian(np.stack(arrs), axis=0) for col, arrs in cols.items()}
    return out


def apply_profile(graph: OpGraph, profile: Mapping[str, Any], *, source: str = "profile") -> OpGraph:
    """A copy of ``graph`` whose ``profile[kind]`` holds the measured per-op times.

    The content hash is unchanged (it leaves ``profile`` out), so placements made
    for ``graph`` remain valid for the result. Ops the profile lacks stay NaN
    (the cost model then falls back to its roofline estimate).
    """
    prof = {**graph.profile, **profile_columns(graph, profile, source=source)}
    meta = {**graph.meta, "profile": {"host": profile.get("host", ""), "devices": sorted(profile["devices"])}}
    return dataclasses.replace(graph, profile=prof, meta=meta)


def calibrate_cluster(cluster: Any, profile: Mapping[str, Any], *, graph: OpGraph | None = None, device_map: Mapping[str, str] | str | None = None) -> Any:
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
    time are estimated at this machine's speed.
    """
    from envs.cluster import Cluster, Link
    from envs.runtime import resolve_devices

    torch_of = {name: str(dev) for name, dev in resolve_devices(cluster.device_names, device_map).items()}
    profiled = profile.get("devices", {})
    kind_of = {
        dev.name: (profiled[torch_of[dev.name]].get("kind") or device_kind(torch_of[dev.name])) if torch_of[dev.name] in profiled else dev.kind
        for dev in cluster.devices
    }
    measured = {(lk["src"], lk["dst"]): Link(float(lk["bandwidth_bytes_per_s"]), float(lk["latency_s"])) for lk in profile.get("links", [])}
    by_kinds: dict[tuple[str, str], Link] = {}
    for (s, d), link in measured.items():
        by_kinds.setdefault((device_kind(s), device_kind(d)), link)
    links = {}
    for (a, b), link in cluster.links.items():
        if torch_of[a] == torch_of[b]:
            links[(a, b)] = _same_device_link()
        else:
            links[(a, b)] = measured.get((torch_of[a], torch_of[b])) or by_kinds.get((kind_of[a], kind_of[b])) or link
    devices = [dataclasses.replace(dev, kind=kind_of[dev.name]) for dev in cluster.devices]
    if graph is not None:
        from envs.cost import view_mask

        rates = _fit_rates(graph, profile_columns(graph, profile), ~view_mask(graph))
        devices = [dataclasses.replace(dev, **rates[dev.kind]) if dev.kind in rates else dev for dev in devices]
    return Cluster(name=f"{cluster.name}+profile", devices=devices, links=links, description=f"{cluster.description} (calibrated by profile from {profile.get('host', '?')})")


def _fit_rates(graph: OpGraph, cols: Mapping[str, Mapping[str, np.ndarray]], compute: np.ndarray) -> dict[str, dict[str, float]]:
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


def with_profile(graph: OpGraph, cluster: Any, profile: str | os.PathLike | Mapping[str, Any] | None, *, device_map: Mapping[str, str] | str | None = None) -> tuple[OpGraph, Any]:
    """``--profile`` in one call: the profiled graph and the calibrated cluster (both unchanged if None)."""
    if profile is None:
        return graph, cluster
    source = os.fspath(profile) if not isinstance(profile, Mapping) else "profile"
    doc = load_profile(profile) if not isinstance(profile, Mapping) else profile
    if isinstance(profile, Mapping):
        check_profile(doc)
    return apply_profile(graph, doc, source=source), calibrate_cluster(cluster, doc, graph=graph, device_map=device_map)


def add_profile_argument(parser: Any) -> None:
    """Add ``--profile PROFILE.json`` to an argparse parser (for simulate, compare, train)."""
    parser.add_argument("--profile", metavar="PROFILE.json", default=None, help="calibrate the simulator with a `placer profile` file (per-op times, link speeds)")
