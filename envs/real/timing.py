"""Timed training steps of a placed module on real devices: one step, warm-up and timed steps, limits.

:func:`measure_steps` is what ``placer run`` and the Ray harness
(:mod:`envs.real.measured`) report: the median step time and the peak memory
per logical device. :func:`failure_status` turns what a step raised into a
Result status.

A measurement that repeats (:class:`Protocol`): the host's threads fixed and the
process pinned to fixed cores, Python's garbage collector run before the timed
steps and kept out of them, glibc's malloc keeping what a step frees for the next
(:mod:`envs.real.allocator`), a warm-up long enough for the allocator and the
clocks, every CUDA device synchronised around each step, and the median as the
statistic; :mod:`envs.real.interleaved` times several placements' steps in
interleaved rounds under it (``bench/validate_gpu.py`` measures with it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn

from envs.real.allocator import steady_malloc, thread_cache_off, trim_malloc
from graphs import PlacerError
from graphs.schema import check_float

#: Device types whose parameters torch's fused Adam steps (one kernel pass over a device's parameters, in place).
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def adam(params: Iterable[torch.Tensor], lr: float = 1e-3) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` as placer measures it and its simulator charges it: the fused kernels where every
    parameter is a floating-point tensor on a device that has them (:data:`FUSED_ADAM_DEVICES`), else torch's
    default path.

    With a parameter on the host (a host op's, or a GPU op's homed there) torch's defaults take the single-tensor
    path for every parameter, which allocates two temporaries the size of a parameter and, on the host, ran 3.5x
    slower than the fused kernel (BENCHMARKS.md, "Parameter homes measured on an H200 at 24 GiB"); the fused
    kernel updates in place. Build the optimizer of a placed module this way (or with ``fused=True``) to run what
    the plan was scored on.

    >>> adam([torch.nn.Parameter(torch.zeros(2))]).defaults["fused"]
    True
    """
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in FUSED_ADAM_DEVICES for p in params)
    return torch.optim.Adam(params, lr=lr, fused=True if fused else None)


def placed_adam(placed: torch.nn.Module, placement: Any, lr: float = 1e-3) -> torch.optim.Optimizer:
    """:func:`adam` on the parameters of ``placed`` (:func:`placer.apply` of ``placement``): where the plan steps its
    homed parameters in the backward (``placement.host_step == "backward"``), registered to do so
    (:func:`envs.real.homes.step_in_backward`); else, as the plan says too, they step in its ``step()``."""
    from envs.real.homes import step_in_backward

    optimizer = adam(placed.parameters(), lr=lr)
    if getattr(placement, "host_step", "after") == "backward":
        step_in_backward(placed, optimizer)
    return optimizer


def default_loss(outputs: Any) -> torch.Tensor:
    """Sum of the means of every floating-point output tensor (on the first one's device).

    A stand-in training objective that touches every output, so backward runs
    through the whole graph; a model whose output is its loss gives that loss.
    """
    leaves = [
        t for t in torch.utils._pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    if not leaves:
        raise PlacerError("model: returns no floating-point tensor to build a loss from")
    device = leaves[0].device
    total = leaves[0].float().mean()
    for t in leaves[1:]:
        total = total + t.float().mean().to(device)
    return total


def synchronize(devices: Iterable[torch.device]) -> None:
    """Wait for every CUDA device in ``devices`` (CPU work is synchronous)."""
    for d in set(devices):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def train_step(
    module: nn.Module,
    inputs: tuple,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
) -> torch.Tensor:
    """One training step: forward, loss, backward, optimizer step; returns the (detached) loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(module(*inputs))
    loss.backward()
    optimizer.step()
    return loss.detach()


def run_steps(
    module: nn.Module,
    inputs: tuple,
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    timed_steps: int,
    devices: Iterable[torch.device],
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    protocol: "Protocol | None" = None,
) -> tuple[list[float], list[float]]:
    """Run warm-up then timed training steps; returns (step seconds, losses) of the timed ones.

    Each timed step is bracketed by a synchronisation of every CUDA device used,
    so its wall time covers all the device work it queued. With a ``protocol``,
    the warm-up also lasts at least ``protocol.warmup_s`` and the timed steps run
    with the garbage collector held off (:func:`no_gc`).
    """
    devs = list(devices)
    t_warm = time.perf_counter()
    done = 0
    while done < warmup_steps or (protocol is not None and time.perf_counter() - t_warm < protocol.warmup_s):
        train_step(module, inputs, optimizer, loss_fn)
        done += 1
    synchronize(devs)
    times_s, losses = [], []
    with no_gc(protocol is not None and protocol.gc_off):
        for _ in range(timed_steps):
            t0 = time.perf_counter()
            loss = train_step(module, inputs, optimizer, loss_fn)
            synchronize(devs)
            times_s.append(time.perf_counter() - t0)
            losses.append(float(loss))
    return times_s, losses


@dataclass(frozen=True)
class Protocol:
    """How steps are timed so that the same placement measured twice agrees (see the module docstring).

    Attributes:
        threads: torch's intra-op threads while measuring (None: as they are).
        cpus: the host cores the process is pinned to (None: as it is).
        gc_off: collect before the timed steps and keep the garbage collector out of them (a collection of a large
            heap inside a step is tens of ms that the placement did not cost).
        warmup_s: the warm-up lasts at least this long, beyond its steps (the allocator's cache, the clocks).
        steady_malloc: glibc's malloc keeps the memory freed between steps (:mod:`envs.real.allocator`; set for
            the rest of the process), so a step does not fault in again the pages of the last one's tensors.
    """

    threads: int | None = None
    cpus: tuple[int, ...] | None = None
    gc_off: bool = True
    warmup_s: float = 0.0
    steady_malloc: bool = True

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "cpus": None if self.cpus is None else list(self.cpus)}


@contextlib.contextmanager
def no_gc(on: bool = True) -> Iterator[None]:
    """Collect now, then keep Python's garbage collector off inside the block (restored after); ``on=False``:
    nothing."""
    if not on:
        yield
        return
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def pinned_host(protocol: Protocol | None) -> Iterator[None]:
    """Torch's intra-op threads and the process's cores as ``protocol`` says, inside the block; restored after.

    Pinning needs ``os.sched_setaffinity`` (Linux); elsewhere only the threads are set.
    """
    if protocol is None:
        yield
        return
    threads = torch.get_num_threads()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        if protocol.threads is not None:
            torch.set_num_threads(max(1, int(protocol.threads)))
        if protocol.cpus is not None and affinity is not None:
            os.sched_setaffinity(0, set(protocol.cpus))
        yield
    finally:
        torch.set_num_threads(threads)
        if protocol.cpus is not None and affinity is not None:
            os.sched_setaffinity(0, affinity)


def check_timeout(seconds: Any, name: str = "--measure-timeout") -> float:
    """``seconds`` as a float if it is a finite number > 0, else :class:`PlacerError` naming ``name``."""
    return check_float(seconds, name, above=0)


class StepTimeout(Exception):
    """Training steps ran past the limit of :func:`time_limit`."""


#: How often :func:`time_limit`'s alarm rings again once the time is up (seconds).
RING_AGAIN_S = 0.2


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`StepTimeout` in the block once ``seconds`` of wall time pass.

    Uses ``SIGALRM``, so it limits only the main thread of a POSIX process, and
    takes effect when the interpreter next runs (a kernel that never returns is
    not interrupted); ``None``, another thread or no ``SIGALRM``: no limit. Once
    the time is up the alarm rings again every :data:`RING_AGAIN_S` until the
    block is left: an exception raised where Python cannot pass it on (a garbage
    collector's callback, a ``__del__``) is printed and dropped, and the block
    would otherwise run on unlimited.
    """
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    seconds = check_timeout(seconds)

    def expired(signum: int, frame: Any) -> None:
        raise StepTimeout(f"ran past {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds, RING_AGAIN_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def failure_status(e: BaseException) -> str:
    """Result status of an exception raised by a training step: ``"oom"``, ``"timeout"`` or ``"error"``.

    Out of memory is ``torch.OutOfMemoryError`` (CUDA), Python's ``MemoryError``
    (a CPU allocation the process cannot get) or an allocator's message saying so.

    >>> failure_status(MemoryError()), failure_status(StepTimeout()), failure_status(ValueError("bad shape"))
    ('oom', 'timeout', 'error')
    """
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return "oom"
    if isinstance(e, StepTimeout):
        return "timeout"
    text = str(e).lower()
    return "oom" if "can't allocate memory" in text or "out of memory" in text else "error"


# ------------------------------------------------------------------ memory
def _proc_status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_cpu_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def step_extra(m: dict[str, Any]) -> dict[str, Any]:
    """What a Result's ``extra`` carries of a :func:`measure_steps` measurement: the step times, the losses and, on
    CUDA, the allocator's reserve.

    >>> step_extra({"step_time_s": 1.0, "step_times_s": [1.0], "losses": [0.5], "peak_bytes": {}})
    {'step_times_s': [1.0], 'losses': [0.5]}
    """
    keys = ("step_times_s", "losses", "peak_reserved_bytes")
    return {k: m[k] for k in keys if k in m}


def measure_steps(
    module: nn.Module,
    inputs: tuple,
    optimizer: torch.optim.Optimizer,
    devices: Mapping[str, torch.device],
    *,
    warmup_steps: int,
    timed_steps: int,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    protocol: Protocol | None = None,
) -> dict[str, Any]:
    """Time training steps of a placed module and record peak memory per logical device.

    Peak memory: ``torch.cuda.max_memory_allocated`` for CUDA devices (and under ``"peak_reserved_bytes"`` the
    caching allocator's ``max_memory_reserved``: what a memory cap limits, the allocated bytes plus the
    fragmentation; ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` keeps the two close); for the
    CPU, how far the process's peak resident set (``VmHWM``, reset through
    ``/proc/self/clear_refs``) rose above its resident set at the start (0 where
    ``/proc`` is unavailable). Logical devices on one torch device share its peak.

    Returns ``{"step_time_s": median, "step_times_s": [...], "losses": [...], "peak_bytes": {...}}``;
    with a ``protocol`` (:class:`Protocol`: threads, cores, the garbage collector, warm-up) also ``"protocol"``.
    """
    cuda = sorted({d for d in devices.values() if d.type == "cuda"}, key=str)
    for d in cuda:
        torch.cuda.reset_peak_memory_stats(d)
    if protocol is not None and protocol.steady_malloc:
        steady_malloc()
        trim_malloc()  # what an earlier measurement's steps left is not this one's resident set
    _reset_cpu_peak()
    rss0 = _proc_status_bytes("VmRSS")
    with pinned_host(protocol):
        times_s, losses = run_steps(
            module,
            inputs,
            optimizer,
            warmup_steps=warmup_steps,
            timed_steps=timed_steps,
            devices=devices.values(),
            loss_fn=loss_fn,
            protocol=protocol,
        )
    peak = {str(d): int(torch.cuda.max_memory_allocated(d)) for d in cuda}
    reserved = {str(d): int(torch.cuda.max_memory_reserved(d)) for d in cuda}
    peak["cpu"] = max(0, _proc_status_bytes("VmHWM") - rss0)
    out = {
        "step_time_s": float(statistics.median(times_s)),
        "step_times_s": times_s,
        "losses": losses,
        "peak_bytes": {name: peak.get(str(torch_device), 0) for name, torch_device in devices.items()},
    }
    if reserved:
        out["peak_reserved_bytes"] = {n: reserved[str(d)] for n, d in devices.items() if str(d) in reserved}
    if protocol is not None:  # and whether the process started with glibc's thread cache off (envs.real.allocator)
        out["protocol"] = {**protocol.describe(), "thread_cache_off": thread_cache_off()}
    return out
