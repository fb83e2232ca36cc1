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
  ``contention_op`` and ``contention_issue``.

:func:`envs.real.profiler.fit.calibrate_cluster` puts both on the host device.
"""

from __future__ import annotations

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
    waiting; default the CPU). Each rate is the best of ``trials`` windows of
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
    }


def slowdown(alone_per_s: float, beside_per_s: float) -> float:
    """``alone / beside - 1``, at least 0 (0 where a rate is not positive).

    >>> slowdown(100.0, 80.0), slowdown(100.0, 120.0), slowdown(0.0, 1.0)
    (0.25, 0.0, 0.0)
    """
    if alone_per_s <= 0 or beside_per_s <= 0:
        return 0.0
    return max(alone_per_s / beside_per_s - 1.0, 0.0)
