"""The profile of a whole program: every op on each device, and the links between the devices.

:func:`profile_program` times the CPU and CUDA devices in context
(:mod:`envs.real.profiler.probe`, :mod:`envs.real.profiler.device`) and any other
device op by op; :func:`time_link` times copies between two devices for
:func:`envs.real.profiler.fit.fit_link`. The result is a ``placer-profile/1``
document (:mod:`envs.real.profiler.file`).
"""

from __future__ import annotations

import copy
import platform
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from envs.real.allocator import steady_malloc, thread_cache_off
from envs.real.profiler.device import profile_device_in_context
from envs.real.profiler.file import FORMAT, device_kind
from envs.real.profiler.fit import fit_issue_scale, fit_link
from envs.real.profiler.host import time_contention, time_staging, time_step_call
from envs.real.profiler.op_timing import op_timer, sync_device, time_call
from envs.real.profiler.probe import concrete_inputs, profile_in_context
from graphs import OpGraph, PlacerError
from graphs.torch_capture import check_runnable, export_program, graph_from_program

DEFAULT_TRANSFER_SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _in_context(
    ep: Any, graph: OpGraph, devices: list[Any], warmup: int, repeats: int, errors: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """The CPU and CUDA devices profiled inside real training steps; a device whose run fails is left out (noted)."""
    context: dict[str, dict[str, Any]] = {}
    for d in devices:
        if d.type in ("cpu", "cuda"):
            try:
                if d.type == "cpu":
                    context[str(d)] = profile_in_context(ep, graph, str(d), warmup=max(warmup, 1), repeats=repeats)
                else:
                    context[str(d)] = profile_device_in_context(
                        ep, graph, str(d), warmup=max(warmup, 1), repeats=repeats
                    )
            except Exception as e:  # time it op by op instead
                errors[f"in-context@{d}"] = _error(e)
    return context


def _isolated(
    ep: Any,
    graph: OpGraph,
    devices: list[Any],
    warmup: int,
    repeats: int,
    errors: dict[str, str],
    progress: Callable[[int, int], None] | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Forward and backward seconds of every op alone on each of ``devices``: one walk of the graph with concrete
    values. No devices (all profiled in context): no walk, and no copy of the model."""
    if not devices:
        if progress:
            progress(graph.num_ops, graph.num_ops)
        return {}, {}
    with warnings.catch_warnings():  # copying a GraphModule builds pytree's deprecated LeafSpec inside torch itself
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)
        gm = copy.deepcopy(ep.module())  # the reference run mutates buffers; keep the model's intact
    index = graph.index
    fwd = {str(d): np.full(graph.num_ops, np.nan) for d in devices}
    bwd = {str(d): np.full(graph.num_ops, np.nan) for d in devices}
    done = [0]

    class _Timer(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            i = index.get(n.name) if n.op == "call_function" else None
            if i is not None:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                for d in devices:
                    try:
                        fwd[str(d)][i], bwd[str(d)][i] = op_timer(n, args, kwargs, d, warmup, repeats)
                    except Exception as e:  # an op this device cannot run: unknown (NaN), noted
                        errors.setdefault(f"{n.name}@{d}", _error(e))
                done[0] += 1
                if progress:
                    progress(done[0], graph.num_ops)
            return result

    example = [
        p.meta["val"] for p in ep.graph.nodes if p.op == "placeholder" and p.name in set(ep.graph_signature.user_inputs)
    ]
    inputs = concrete_inputs(ep, example)
    with torch.enable_grad():
        _Timer(gm).run(*inputs)
    return fwd, bwd


def _links(devices: list[Any], transfer_sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Timed copies between every ordered pair of devices, with the fitted latency and bandwidth."""
    links = []
    for a in devices:
        for b in devices:
            if a != b:
                sizes, times = time_link(a, b, transfer_sizes, repeats=repeats)
                lat, bw = fit_link(sizes, times)
                links.append(
                    {
                        "src": str(a),
                        "dst": str(b),
                        "latency_s": lat,
                        "bandwidth_bytes_per_s": bw,
                        "sizes_bytes": list(sizes),
                        "times_s": times,
                    }
                )
    return links


def profile_program(
    ep: Any,
    devices: Sequence[str],
    *,
    warmup: int = 1,
    repeats: int = 5,
    transfer_sizes: Sequence[int] = DEFAULT_TRANSFER_SIZES,
    graph: OpGraph | None = None,
    progress: Callable[[int, int], None] | None = None,
    method: str = "context",
) -> dict[str, Any]:
    """Profile every op of an ``ExportedProgram`` on each torch device in ``devices``.

    ``method="context"`` (default) times the CPU and CUDA devices inside real
    training steps (:func:`profile_in_context`, :func:`profile_device_in_context`)
    and any other device op by op; ``"isolated"`` times every device op by op. A
    device whose in-context run fails is timed op by op (the failure is noted in
    ``errors``). Returns the ``placer-profile/1``
    document (see the module docstring). The host's malloc is kept steady first, as in every measurement of
    placer (:mod:`envs.real.allocator`), so the ops are timed as the placements they price run.
    """
    steady_malloc()
    torch_devices = [torch.device(d) for d in devices]
    for d in torch_devices:
        if d.type == "cuda" and (not torch.cuda.is_available() or (d.index or 0) >= torch.cuda.device_count()):
            raise PlacerError(f"--devices: {d} is not available on this machine")
    graph = graph or graph_from_program(ep)
    errors: dict[str, str] = {}
    if method not in ("context", "isolated"):
        raise PlacerError(f"profile method must be 'context' or 'isolated', not {method!r}")
    context = _in_context(ep, graph, torch_devices, warmup, repeats, errors) if method == "context" else {}
    fwd, bwd = _isolated(
        ep, graph, [d for d in torch_devices if str(d) not in context], warmup, repeats, errors, progress
    )
    links = _links(torch_devices, transfer_sizes, repeats)

    def col(a: np.ndarray) -> list:
        return [None if np.isnan(x) else float(x) for x in a.tolist()]

    def entry(d: Any) -> dict[str, Any]:
        out = {
            "kind": device_kind(str(d)),
            "name": _device_name(d),
            **(_host_probes(torch_devices, repeats) if d.type == "cpu" else {}),
        }
        if str(d) in context:
            return {**out, "method": "context", **context[str(d)]}
        return {**out, "method": "isolated", "fwd_s": col(fwd[str(d)]), "bwd_s": col(bwd[str(d)])}

    doc = {
        "format": FORMAT,
        "graph_hash": graph.content_hash,
        "graph_name": graph.name,
        "ops": list(graph.names),
        "devices": {str(d): entry(d) for d in torch_devices},
        "links": links,
        "settings": {"warmup": warmup, "repeats": repeats, "method": method, "thread_cache_off": thread_cache_off()},
        "errors": errors,
        "host": platform.node(),
        "torch": torch.__version__,
    }
    return fit_issue_scale(doc, graph)


#: The most windows the contention probe takes the best of (:func:`~envs.real.profiler.host.time_contention`): a
#: profile of fewer ``repeats`` takes that many, each window 0.2 s of both cores (a profile of one repeat, 0.7 s
#: instead of 2 s).
CONTENTION_TRIALS = 3


def _host_probes(devices: list[Any], repeats: int) -> dict[str, Any]:
    """The host's staging copy and contention (:mod:`envs.real.profiler.host`; the best of ``repeats`` windows, at
    most :data:`CONTENTION_TRIALS`), towards the first GPU if there is one, and its fixed cost per optimizer call
    (``step_call``, one thread)."""
    gpu = next((d for d in devices if d.type == "cuda"), None)
    step_call = time_step_call()  # one thread, as the worker steps beside the main one
    trials = max(1, min(CONTENTION_TRIALS, repeats))
    return {
        "staging": time_staging(gpu, repeats=repeats),
        "contention": time_contention(gpu, trials=trials),
        "step_call": step_call,
    }


def _device_name(d: Any) -> str:
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    return platform.processor() or platform.machine()


def profile_model(
    model: Any,
    example_inputs: tuple,
    devices: Sequence[str],
    *,
    microbatches: int = 1,
    batch_dim: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """Export ``model`` (as :func:`graphs.capture` does) and :func:`profile_program` it.

    ``microbatches`` K > 1: profile it again on one of K microbatches of the inputs (cut along ``batch_dim`` as a
    pipelined plan cuts them, :func:`envs.real.pipeline.split_batch`), into the ``micro_*`` columns
    (:func:`with_microbatch_times`): what an op costs on a small batch is not its whole batch's time over K (a dense
    layer reads its whole weight), and the simulator takes each op's cost between the two sizes from them
    (:func:`envs.sim.cost.op_times`).
    """
    check_runnable(model)
    doc = profile_program(export_program(model, example_inputs), devices, **options)
    if microbatches > 1:
        from envs.real.pipeline import split_batch  # the runtime's own cut

        part = split_batch(tuple(example_inputs), microbatches, batch_dim, source="--microbatches")[0]
        micro = profile_program(export_program(model, part), devices, **options)
        doc = with_microbatch_times(doc, micro, microbatches)
    return doc


def with_microbatch_times(doc: dict[str, Any], micro: dict[str, Any], microbatches: int) -> dict[str, Any]:
    """``doc`` (a profile of the whole batch) with the forward and backward times of ``micro`` (the same model's
    profile on one of ``microbatches`` microbatches) as each device's ``micro_fwd_s``, ``micro_bwd_s`` and
    ``micro_m`` columns, op by op by name (an op the microbatch's program lacks: ``None``).

    >>> whole = {"ops": ["a", "b"], "devices": {"cpu": {"fwd_s": [2.0, 4.0], "bwd_s": [4.0, 8.0]}}}
    >>> part = {"ops": ["b"], "devices": {"cpu": {"fwd_s": [3.0], "bwd_s": [5.0]}}}
    >>> with_microbatch_times(whole, part, 4)["devices"]["cpu"]["micro_fwd_s"]
    [None, 3.0]
    """
    out = copy.deepcopy(doc)
    at = {name: k for k, name in enumerate(micro["ops"])}
    rows = [at.get(name) for name in out["ops"]]  # each op's row in the microbatch's profile
    for torch_device, entry in out["devices"].items():
        other = micro["devices"].get(torch_device)
        if other is None:
            continue
        for col in ("fwd_s", "bwd_s"):
            entry[f"micro_{col}"] = [None if k is None else other[col][k] for k in rows]
        entry["micro_m"] = [None if k is None or other["fwd_s"][k] is None else microbatches for k in rows]
    return out


def time_link(
    src: Any, dst: Any, sizes_bytes: Sequence[int] = DEFAULT_TRANSFER_SIZES, *, repeats: int = 5
) -> tuple[list[int], list[float]]:
    """Median seconds to copy a float32 tensor of each size from ``src`` to ``dst``, as :func:`placer.apply` copies it.

    Host -> GPU copies go from pinned memory, ``non_blocking`` (the copy into the pinned
    buffer is the host's staging cost, :func:`envs.real.profiler.host.time_staging`);
    others are the ordinary ``copy_``.
    """
    src, dst = torch.device(src), torch.device(dst)
    pinned = src.type == "cpu" and dst.type == "cuda"
    times = []
    for n in sizes_bytes:
        x = torch.rand(max(1, int(n) // 4), device=src)
        if pinned:
            x = x.pin_memory()
        buf = torch.empty_like(x, device=dst)

        def run(_: Any) -> None:
            buf.copy_(x, non_blocking=pinned)
            sync_device(dst)
            sync_device(src)

        timing_dev = dst if dst.type == "cuda" else src
        times.append(time_call(run, lambda: None, timing_dev, warmup=1, repeats=repeats))
    return [int(n) for n in sizes_bytes], times
