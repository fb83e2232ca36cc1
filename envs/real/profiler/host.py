"""What the host pays beside its ops, measured: the staging copy before each host -> GPU copy, and contention.

The eager simulator (:mod:`envs.sim.eager`, model 4) charges the host thread for
copying every tensor it sends to a GPU into a pinned buffer
(:func:`envs.real.placing.staged`) and slows host ops and a GPU's autograd worker
where they run side by side (:class:`envs.sim.cost.HostCosts`). These probes measure
both on this machine, with the intra-op threads torch uses now:

* :func:`time_staging`: host seconds of ``staged(x)`` (and, towards a GPU, the
  asynchronous ``.to()`` that follows, without waiting for it) for a few sizes,
  fitted to ``latency + bytes / bandwidth``;
* :func:`time_contention`: an intra-op-parallel host workload (matrix products)
  and a second thread issuing tiny ops (on the GPU where there is one: what an
  autograd worker does), each timed alone and side by side; the slowdowns are
  ``contention_op`` and ``contention_issue``;
* :func:`time_step_call`: the fixed cost of one fused Adam call on the host, which the
  worker stepping homed parameters during the backward pays per batch
  (:mod:`envs.real.homes`): the host's ``step_call_s``.

:func:`envs.real.profiler.fit.calibrate_cluster` puts them on the host device.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from envs.real.profiler.fit import fit_link
from envs.real.transfers import staged

DEFAULT_STAGE_SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)


def time_staging(
    device: Any = None, sizes_bytes: Sequence[int] = DEFAULT_STAGE_SIZES, *, repeats: int = 5
) -> dict[str, Any]:
    """Host seconds of :func:`placer.apply`'s staging copy of a host tensor of each size, and the fit.

    Towards a CUDA ``device`` the asynchronous copy is issued too (its host cost:
    the launch and the event that keeps the pinned block alive) and waited for
    outside the timing. Returns ``{"latency_s", "bandwidth_bytes_per_s",
    "sizes_bytes", "times_s", "device"}``.
    """
    torch_device = torch.device(device) if device is not None else None
    to_gpu = torch_device is not None and torch_device.type == "cuda"
    times = []
    for n in sizes_bytes:
        x = torch.rand(max(1, int(n) // 4))  # pageable, as a host op's output is
        samples = []
        for k in range(1 + repeats):
            t0 = time.perf_counter()
            buf = staged(x)
            if to_gpu:
                out = buf.to(torch_device, non_blocking=True)
            t1 = time.perf_counter()
            if to_gpu:
                torch.cuda.synchronize(torch_device)
                del out
            del buf
            if k:
                samples.append(t1 - t0)
        times.append(float(np.median(samples)))
    lat, bw = fit_link(list(sizes_bytes), times)
    return {
        "latency_s": lat,
        "bandwidth_bytes_per_s": bw,
        "sizes_bytes": [int(s) for s in sizes_bytes],
        "times_s": times,
        "device": str(torch_device) if to_gpu else "cpu",
    }


def _host_work(a: torch.Tensor, seconds: float) -> float:
    """Matrix products of ``a`` for about ``seconds``; returns products per second."""
    count, t0 = 0, time.perf_counter()
    while True:
        torch.mm(a, a)
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return count / elapsed


class _Issuer(threading.Thread):
    """A thread issuing tiny in-place ops on ``x`` (on a GPU: launches, as an autograd worker makes) until stopped."""

    def __init__(self, x: torch.Tensor) -> None:
        super().__init__(daemon=True)
        self.x, self.stop, self.count = x, threading.Event(), 0
        self.window: list[float] = []

    def run(self) -> None:
        x, stop = self.x, self.stop
        with torch.no_grad():
            while not stop.is_set():
                x.add_(1.0)
                self.count += 1

    def rate(self, seconds: float) -> float:
        """Ops per second over the next ``seconds`` (the thread runs meanwhile)."""
        c0, t0 = self.count, time.perf_counter()
        time.sleep(seconds)
        return (self.count - c0) / (time.perf_counter() - t0)


def time_contention(device: Any = None, *, seconds: float = 0.2, trials: int = 3, size: int = 384) -> dict[str, Any]:
    """How much an intra-op-parallel host workload and a thread issuing tiny ops slow each other.

    ``device``: where the issuing thread's ops run (a GPU: kernel launches without
    waiting; default the CPU). Each rate is the best of ``trials`` windows (``"windows"``) of
    ``seconds`` (a busy machine only slows a window down). Returns
    ``{"op": host slowdown - 1, "issue": issuing slowdown - 1, "threads", "rates": {...}}``,
    both at least 0.
    """
    torch_device = torch.device(device) if device is not None else torch.device("cpu")
    a = torch.randn(size, size)
    x = torch.zeros(1, device=torch_device)
    _host_work(a, seconds / 4)  # warm: the threads' pool, the caches
    host_alone = max(_host_work(a, seconds) for _ in range(trials))
    issuer = _Issuer(x)
    issuer.start()
    try:
        time.sleep(seconds / 4)
        issue_alone = max(issuer.rate(seconds) for _ in range(trials))
        host_beside, issue_beside = 0.0, 0.0
        for _ in range(trials):
            c0, t0 = issuer.count, time.perf_counter()
            h = _host_work(a, seconds)
            i = (issuer.count - c0) / (time.perf_counter() - t0)
            host_beside, issue_beside = max(host_beside, h), max(issue_beside, i)
    finally:
        issuer.stop.set()
        issuer.join()
        if torch_device.type == "cuda":
            torch.cuda.synchronize(torch_device)
    rates = {
        "host_alone": host_alone,
        "host_beside": host_beside,
        "issue_alone": issue_alone,
        "issue_beside": issue_beside,
    }
    return {
        "op": slowdown(host_alone, host_beside),
        "issue": slowdown(issue_alone, issue_beside),
        "threads": torch.get_num_threads(),
        "device": str(torch_device),
        "rates": rates,
        "windows": int(trials),
    }


#: Parameters per call :func:`time_step_call` times (the first is 1).
STEP_CALL_COUNTS = (1, 2, 4, 8, 16, 32)
#: The Adam paths :func:`time_step_call` can time: the fused kernels placer builds (:func:`envs.real.timing.adam`),
#: and torch's foreach path.
ADAM_PATHS = {"fused": {"fused": True}, "foreach": {"foreach": True}}


def time_step_call(
    counts: Sequence[int] = STEP_CALL_COUNTS, *, numel: int = 4096, repeats: int = 50, path: str = "fused"
) -> dict[str, Any]:
    """The fixed cost of one ``torch.optim.Adam`` call (``path``: a key of :data:`ADAM_PATHS`) on the host, in this
    thread with torch's intra-op threads at one (as the worker stepping in the backward runs, beside the main
    thread): the median seconds of one ``step()`` over each count of parameters of ``numel`` elements (``counts[0]``
    is 1; after a warm-up step), and ``call_s``, what merging calls saves (:func:`call_cost`): stepping ``k``
    parameters in ``k`` calls of one takes ``(k - 1) * call_s`` longer than in one call of ``k``.

    >>> r = time_step_call((1, 2), numel=16, repeats=3)
    >>> sorted(r), len(r["seconds"]), r["call_s"] > 0 or r["call_s"] <= 0
    (['call_s', 'counts', 'numel', 'path', 'seconds'], 2, True)
    """
    if not counts or counts[0] != 1 or min(counts) < 1:
        raise ValueError(f"counts {tuple(counts)}: must start at 1 and be positive")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = [_median_step(k, numel, repeats, path) for k in counts]
    finally:
        torch.set_num_threads(threads)
    call_s = call_cost(counts, seconds)
    return {"path": path, "counts": list(counts), "numel": numel, "seconds": seconds, "call_s": call_s}


def _median_step(k: int, numel: int, repeats: int, path: str) -> float:
    """Median seconds of one Adam ``step()`` over ``k`` parameters of ``numel`` elements, after a warm-up step."""
    params = [torch.nn.Parameter(torch.randn(numel)) for _ in range(k)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, **ADAM_PATHS[path])
    opt.step()  # the moments
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def call_cost(counts: Sequence[int], seconds: Sequence[float]) -> float:
    """A call's fixed cost from the seconds of one call over each count of parameters (``counts[0]`` is 1): the
    median over the counts ``k`` above 1 of ``(k * seconds[0] - seconds(k)) / (k - 1)`` (``seconds[0]`` alone).

    >>> round(call_cost([1, 2, 4], [40e-6, 50e-6, 70e-6]) * 1e6, 6)  # 30 us a call, 10 us a parameter
    30.0
    """
    saved = [(k * seconds[0] - t) / (k - 1) for k, t in zip(counts[1:], seconds[1:])]
    return statistics.median(saved) if saved else float(seconds[0])


def slowdown(alone_per_s: float, beside_per_s: float) -> float:
    """``alone / beside - 1``, at least 0 (0 where a rate is not positive).

    >>> slowdown(100.0, 80.0), slowdown(100.0, 120.0), slowdown(0.0, 1.0)
    (0.25, 0.0, 0.0)
    """
    if alone_per_s <= 0 or beside_per_s <= 0:
        return 0.0
    return max(alone_per_s / beside_per_s - 1.0, 0.0)
