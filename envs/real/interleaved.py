"""Several placements' training steps timed in interleaved rounds, so that drift over the run falls on all alike.

:func:`measure_interleaved` runs each placed module (a :class:`Run`) in blocks of
timed steps, round after round, each round in the other order (ABBA), under a
:class:`envs.real.timing.Protocol`; :func:`summarize_blocks` turns one run's blocks
into its measurement. ``scripts/validate_gpu.py`` measures with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from envs.real.timing import (
    Protocol,
    default_loss,
    failure_status,
    no_gc,
    pinned_host,
    synchronize,
    time_limit,
    train_step,
)


@dataclass
class Run:
    """One placed module in :func:`measure_interleaved`: the module, its optimizer, its logical -> torch devices."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    devices: Mapping[str, torch.device]


def resident_bytes(module: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Bytes of ``module``'s parameters, gradients and ``optimizer``'s state held on ``device`` (each storage once)."""
    seen: dict[int, int] = {}
    tensors = [p for p in module.parameters()] + [p.grad for p in module.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        if t.device == device:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return int(sum(seen.values()))


def _block(
    run: Run, inputs: tuple, steps: int, loss_fn: Callable[[Any], torch.Tensor], timeout_s: float | None
) -> dict[str, Any]:
    """``steps`` timed steps of one run: seconds per step, and its peak bytes per logical CUDA device.

    Other runs' tensors stay allocated meanwhile, so a device's peak is the
    allocator's peak over the block less what was allocated before it, plus what
    this run holds between steps (:func:`resident_bytes`).
    """
    cuda = sorted({d for d in run.devices.values() if d.type == "cuda"}, key=str)
    base = {}
    for d in cuda:
        synchronize([d])
        base[d] = resident_bytes(run.module, run.optimizer, d) - torch.cuda.memory_allocated(d)
        torch.cuda.reset_peak_memory_stats(d)
    times_s = []
    try:
        with time_limit(timeout_s):
            for _ in range(steps):
                t0 = time.perf_counter()
                train_step(run.module, inputs, run.optimizer, loss_fn)
                synchronize(cuda)
                times_s.append(time.perf_counter() - t0)
    except Exception as e:  # the model failed on this placement: a result, the other runs go on
        status = failure_status(e)
        return {
            "step_times_s": times_s,
            "status": status,
            "message": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
        }
    peak = {str(d): int(torch.cuda.max_memory_allocated(d)) + base[d] for d in cuda}
    return {
        "step_times_s": times_s,
        "status": "ok",
        "peak_bytes": {
            name: peak[str(torch_device)] for name, torch_device in run.devices.items() if str(torch_device) in peak
        },
    }


def measure_interleaved(
    runs: Mapping[str, Run],
    inputs: tuple,
    *,
    rounds: int,
    steps: int,
    warmup_steps: int,
    protocol: Protocol | None = None,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    timeout_s: float | None = None,
    done: Mapping[str, Sequence[dict]] | None = None,
    on_block: Callable[[str, int, dict], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Time several placements' training steps interleaved, so that drift over the run falls on all alike.

    Each run is warmed up (``warmup_steps``, then round-robin until ``protocol.warmup_s``
    has passed), then ``rounds`` rounds each give every run a block of ``steps``
    timed steps, in the order of ``runs`` on even rounds and reversed on odd ones
    (ABBA), under ``protocol`` (:func:`pinned_host`; the garbage collector runs between
    rounds, not inside them, unless ``protocol.gc_off`` is False). ``done``: blocks
    measured before (a resumed run): label -> blocks in round order, whose rounds
    are not run again. ``on_block(label, round, block)`` is called after each block
    (to log it: a run cut short keeps what it measured). A run whose step raises
    runs no more blocks. ``timeout_s`` limits each block (:func:`time_limit`).

    Returns label -> ``{"status", "message", "step_time_s" (median of every timed
    step), "step_times_s", "round_medians_s", "peak_bytes" (per logical CUDA
    device, the largest over the blocks)}``.
    """
    blocks: dict[str, list[dict]] = {k: list((done or {}).get(k, [])) for k in runs}
    labels = list(runs)
    with pinned_host(protocol):
        live = [k for k in labels if all(b.get("status", "ok") == "ok" for b in blocks[k])]
        t_warm = time.perf_counter()
        for k in list(live):
            warm = _block(runs[k], inputs, warmup_steps, loss_fn, timeout_s)
            if warm["status"] != "ok":  # failed in its warm-up: recorded, not run again
                live.remove(k)
                blocks[k].append({**warm, "step_times_s": []})
                if on_block is not None:
                    on_block(k, -1, blocks[k][-1])
        while protocol is not None and live and time.perf_counter() - t_warm < protocol.warmup_s:
            for k in live:
                _block(runs[k], inputs, 1, loss_fn, timeout_s)
        for r in range(rounds):
            with no_gc(protocol is None or protocol.gc_off):  # collected once per round, not inside it
                for k in labels if r % 2 == 0 else labels[::-1]:
                    if len(blocks[k]) > r or any(b.get("status", "ok") != "ok" for b in blocks[k]):
                        continue
                    b = _block(runs[k], inputs, steps, loss_fn, timeout_s)
                    blocks[k].append(b)
                    if on_block is not None:
                        on_block(k, r, b)
    return {k: summarize_blocks(blocks[k]) for k in labels}


def summarize_blocks(blocks: Sequence[dict]) -> dict[str, Any]:
    """One run's blocks (:func:`measure_interleaved`) as its measurement: the median step, the per-round medians, the
    peaks.

    >>> s = summarize_blocks([{"step_times_s": [3.0, 1.0], "peak_bytes": {"gpu:0": 5}},
    ...                       {"step_times_s": [2.0], "peak_bytes": {"gpu:0": 7}}])
    >>> s["status"], s["step_time_s"], s["round_medians_s"], s["peak_bytes"]
    ('ok', 2.0, [2.0, 2.0], {'gpu:0': 7})
    """
    failed = [b for b in blocks if b.get("status", "ok") != "ok"]
    times = [t for b in blocks for t in b.get("step_times_s", [])]
    peak: dict[str, int] = {}
    for b in blocks:
        for name, v in (b.get("peak_bytes") or {}).items():
            peak[name] = max(peak.get(name, 0), int(v))
    if failed or not times:
        return {
            "status": failed[0]["status"] if failed else "error",
            "message": failed[0].get("message", "") if failed else "no steps",
            "step_time_s": float("inf"),
            "step_times_s": times,
            "round_medians_s": [],
            "peak_bytes": peak,
        }
    return {
        "status": "ok",
        "message": "",
        "step_time_s": float(statistics.median(times)),
        "step_times_s": times,
        "round_medians_s": [float(statistics.median(b["step_times_s"])) for b in blocks if b.get("step_times_s")],
        "peak_bytes": peak,
    }
