"""Timing one call, or one op of a graph alone, on a torch device (the profiler's isolated measurements).

:func:`time_call` is the median of repeated calls (CUDA events on a GPU, the
wall clock on the CPU); :func:`op_timer` times one fx node's forward and its
backward through autograd, each call on fresh copies of its inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map  # noqa: PLC2701 (torch has no public pytree module)


def sync_device(device: Any) -> None:
    """Wait for ``device`` (a torch.device) to finish its queued work: a CUDA device's, nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    run: Callable[[Any], Any], setup: Callable[[], Any], device: Any, *, warmup: int = 1, repeats: int = 5
) -> float:
    """Median seconds of ``run(setup())`` on ``device``; ``setup`` is not timed."""
    times = []
    for k in range(warmup + repeats):
        state = setup()
        if device.type == "cuda":
            with torch.cuda.device(device):  # events record on this device's current stream
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                sync_device(device)
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


def op_timer(node: Any, args: tuple, kwargs: dict, device: Any, warmup: int, repeats: int) -> tuple[float, float]:
    """(forward s, backward s) of one fx node's call on ``device``."""

    def fresh(grad: bool) -> tuple[tuple, dict, list]:
        leaves: list = []

        def move(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            copy = t.detach().to(device, copy=True)  # a fresh copy per call: in-place ops cannot leak
            if grad and t.requires_grad and (copy.is_floating_point() or copy.is_complex()):  # a spectrum too
                copy.requires_grad_(True)
                leaves.append(copy)
                return copy.clone()  # a non-leaf, so in-place ops are allowed on it
            return copy

        a, kw = tree_map(move, (args, kwargs))
        return a, kw, leaves

    target = node.target
    with torch.enable_grad():
        fwd_s = time_call(
            lambda st: target(*st[0], **st[1]), lambda: fresh(True), device, warmup=warmup, repeats=repeats
        )

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
