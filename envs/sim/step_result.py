"""A simulated step's Result: peak memory per device, busy time per device and link, and the out-of-memory verdict.

:func:`step_result` reads one :class:`~envs.sim.tasks.Schedule` of a
:class:`~envs.sim.simulator.SimEnv` into the :class:`envs.result.Result` every
scorer returns: the memory sweep of :mod:`envs.sim.memory` on top of each
device's static bytes (torch's fused Adam step adds nothing to them), and
``oom`` with the worst device named where a peak exceeds its capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from envs.result import Result
from envs.sim.checkpointing import recompute_seconds
from envs.sim.homes import schedule_param_devices
from envs.sim.memory import param_grad_bytes, peak_bytes
from envs.sim.tasks import ACT, Schedule
from envs.sim.trace import chrome_trace

if TYPE_CHECKING:
    from envs.sim.simulator import SimEnv


def format_bytes(nbytes: float) -> str:
    """``"1.50 GB"`` from 100 MB up, else ``"12.3 MB"``.

    >>> format_bytes(1.5e9), format_bytes(12.3e6)
    ('1.50 GB', '12.3 MB')
    """
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def busy_seconds(env: "SimEnv", schedule: Schedule) -> dict[str, float]:
    """Seconds each device computes (its forward, backward and optimizer step) and each used link ``"a->b"`` copies."""
    names = env.cluster.device_names
    D = env.num_devices
    p = schedule.op_devices
    n = len(p)
    device_busy = np.bincount(p, weights=env.fwd_s[np.arange(n), p] + env.bwd_s[np.arange(n), p], minlength=D)
    device_busy = device_busy + schedule.update_s
    steps = schedule.host_steps  # parameters stepped during the backward (envs.sim.homes.host_steps)
    np.add.at(device_busy, steps.home, steps.end_s - steps.start_s)
    if len(schedule.blocks):  # checkpointed blocks run their forward twice (envs.sim.checkpointing)
        device_busy = device_busy + recompute_seconds(schedule.blocks, p, env.fwd_s)
    busy = {names[d]: float(device_busy[d]) for d in range(D)}
    link_busy = np.zeros((D, D))
    np.add.at(link_busy, (schedule.xfer_src, schedule.xfer_dst), schedule.xfer_end_s - schedule.xfer_start_s)
    h = schedule.homes  # parameters copied from their homes and their gradients sent back (envs.sim.homes)
    on = p[h.op]
    np.add.at(link_busy, (h.home, on), h.fetch_end_s - h.fetch_start_s + h.refetch_end_s - h.refetch_start_s)
    np.add.at(link_busy, (on, h.home), h.grad_end_s - h.grad_start_s)
    for a, b in zip(*np.nonzero(link_busy)):
        busy[f"{names[a]}->{names[b]}"] = float(link_busy[a, b])
    return busy


def schedule_peaks(env: "SimEnv", schedule: Schedule) -> np.ndarray:
    """Peak bytes per device of ``schedule``, a schedule of ``env``: the static bytes without the parameters'
    gradients, which the sweep allocates at their owners' backward (:func:`envs.sim.memory.param_grad_bytes`)."""
    grads = param_grad_bytes(env.sim_graph.param_bytes, env.grad, schedule.homes.owner)
    static = env.static_per_device(schedule.op_devices, schedule_param_devices(schedule))
    np.subtract.at(static, schedule.op_devices.astype(np.int64), grads)
    peaks, _ = peak_bytes(
        schedule,
        env.act_bytes,
        static,
        env.num_devices,
        env.grad,
        env.kept,
        env.consumers,
        grads,
        env.microbatches,
        env.readers,
    )
    return peaks


def step_result(env: "SimEnv", schedule: Schedule, *, trace: bool = False) -> Result:
    """The Result of ``schedule``, a schedule of ``env`` (memory sweep, busy times, OOM check).

    ``trace``: also put the Chrome/Perfetto trace of the schedule in ``extra["trace"]``.
    """
    c = env.cluster
    names = c.device_names
    D = env.num_devices
    peaks = schedule_peaks(env, schedule)
    over = [d for d in range(D) if peaks[d] > c.memory_bytes[d]]
    extra: dict[str, Any] = {
        "sim_step_time_s": schedule.step_time_s,
        "oom_devices": [names[d] for d in over],
        "backward_end_s": float(schedule.backward_end_s),
        "update_s": float(schedule.update_s.max()) if D else 0.0,
        "num_transfers": int(np.sum(schedule.xfer_kind == ACT)),
        "transfer_bytes": int(schedule.xfer_bytes.sum()),
        "executor": env.executor,
        "microbatches": env.microbatches,
        "inflight": env.inflight,
    }
    if len(schedule.host_steps.owner):  # stepped during the backward: its steps, and how long backward() waits
        steps = schedule.host_steps
        extra["host_steps"] = {
            "calls": len(set(zip(steps.batch.tolist(), steps.home.tolist()))),  # one per batch and home
            "stepped": len(steps.owner),
            "waited_s": float(schedule.host_step_wait_s),
        }
    if trace:
        extra["trace"] = chrome_trace(env, schedule)
    result = Result(
        step_time_s=schedule.step_time_s,
        peak_bytes={names[d]: int(peaks[d]) for d in range(D)},
        busy_s=busy_seconds(env, schedule),
        source=env.source,
        extra=extra,
    )
    if over:
        worst = max(over, key=lambda d: peaks[d] / c.memory_bytes[d])
        others = f" (also {', '.join(names[d] for d in over if d != worst)})" if len(over) > 1 else ""
        result.status = "oom"
        result.step_time_s = float("inf")
        result.message = (
            f"out of memory on {names[worst]}: peak {format_bytes(peaks[worst])} > capacity "
            f"{format_bytes(c.memory_bytes[worst])}{others}"
        )
    return result
