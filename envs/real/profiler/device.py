"""Probing a training step on a GPU: each op's kernel time and the host's time to issue it.

:func:`profile_device_in_context` runs real training steps with every op on the
device and measures two times per op, forward and backward: its kernels' time
(CUDA events, :class:`CudaMarks`, with the stream held back so that the host runs
ahead) and the host's time to issue it (host stamps, :mod:`envs.real.profiler.probe`;
in the backward, the autograd worker's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from envs.real.profiler.probe import (
    Probes,
    attribute_intervals,
    backward_intervals,
    grad_fns,
    host_probed_step,
    probe_costs,
    probed_program,
    profile_entry,
    remove_probe_cost,
    restoring,
    scale_to,
)
from envs.real.timing import default_loss
from graphs import OpGraph, PlacerError


class HostMarks:
    """Stand-in for a device's event timeline where the device is the host (tests, CPU runs).

    The same interface as :class:`CudaMarks`: ``mark()`` a point in the device's
    timeline, ``sleep(s)`` hold the device back ``s`` seconds (a no-op here),
    ``elapsed(a, b)`` seconds between two marks, ``sync()`` wait for the device.
    """

    def mark(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        pass

    def elapsed(self, a: float, b: float) -> float:
        return b - a

    def sync(self) -> None:
        pass


class CudaMarks:
    """CUDA events on the current stream as marks, and ``torch.cuda._sleep`` to hold the stream back."""

    def __init__(self, device: Any) -> None:
        self.torch, self.device = torch, device
        with torch.cuda.device(device):
            torch.cuda._sleep(1_000_000)  # clocks up, module loaded
            self.sync()
            a = self.mark()
            torch.cuda._sleep(20_000_000)
            b = self.mark()
            self.sync()
            self.cycles_per_s = 20_000_000 / max(self.elapsed(a, b), 1e-6)

    def mark(self) -> Any:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def sleep(self, seconds: float) -> None:
        self.torch.cuda._sleep(max(int(seconds * self.cycles_per_s), 1))

    def elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)


class _DeviceProbes(Probes):
    """Device marks after each forward op and at each autograd node's start.

    The device is held back (``marks.sleep``) before the forward, before the
    backward and every ``every`` probes, each time long enough for the host to
    issue the next ``every`` ops, so the device runs the queued kernels back to
    back: the time between two marks is the kernels' own time, not the host's
    issue time. A sleep falls between two intervals (a mark closes the one before
    it, another opens the one after it), so no op is charged for it.
    """

    def __init__(self, marks: Any, every: int, sleep_s: float) -> None:
        super().__init__(time.perf_counter)
        self.marks, self.every, self.sleep_s = marks, max(int(every), 1), float(sleep_s)
        self.fwd_iv: list[tuple[int, Any, Any]] = []  # (owner, open mark, close mark)
        self.bwd_iv: list[tuple[int, Any, Any]] = []
        self.count = 0
        self.open = self._hold()

    def _hold(self) -> Any:
        self.marks.sleep(self.sleep_s)
        return self.marks.mark()

    def done(self, op: int, out: Any) -> None:
        close = self.marks.mark()
        self.fwd_iv.append((op, self.open, close))
        self.fwd_owner.append(op)
        self.heads.append(grad_fns(out))
        self.count += 1
        self.open = self._hold() if self.count % self.every == 0 else close

    def start_backward(self) -> None:
        self.count = 0
        self.open, self.owner = self._hold(), -1

    def hook(self, fns: list, owner: int) -> None:
        def pre(_grads: Any) -> None:
            close = self.marks.mark()
            self.bwd_iv.append((self.owner, self.open, close))
            self.count += 1
            self.open, self.owner = (self._hold() if self.count % self.every == 0 else close), owner

        self.handles.extend(fn.register_prehook(pre) for fn in fns)

    def end_backward(self) -> None:
        self.bwd_iv.append((self.owner, self.open, self.marks.mark()))

    def seconds(self, intervals: list, num_ops: int) -> tuple[np.ndarray, np.ndarray]:
        """After ``marks.sync()``: seconds and interval counts per owner (as :func:`attribute_intervals`)."""
        return attribute_intervals(
            [o for o, _, _ in intervals], [self.marks.elapsed(a, b) for _, a, b in intervals], num_ops
        )


def cap_to(per_owner_s: np.ndarray, total_s: float) -> np.ndarray:
    """Per-owner seconds scaled down to sum to ``total_s`` where they sum to more (else unchanged).

    >>> cap_to(np.array([1.0, 3.0]), 2.0).tolist(), cap_to(np.array([1.0, 3.0]), 8.0).tolist()
    ([0.5, 1.5], [1.0, 3.0])
    """
    total = float(np.sum(per_owner_s))
    return np.asarray(per_owner_s, dtype=np.float64) * (total_s / total if total > total_s > 0 else 1.0)


def device_mark_cost(marks: Any, *, count: int = 200, trials: int = 5) -> float:
    """Device seconds one mark adds to the interval it closes: ``count`` marks back to back, queued behind a sleep."""
    best = float("inf")
    for _ in range(trials):
        marks.sync()
        marks.sleep(2e-3)
        first = marks.mark()
        last = first
        for _ in range(count):
            last = marks.mark()
        marks.sync()
        best = min(best, marks.elapsed(first, last) / count)
    return max(best, 0.0)


def profile_device_in_context(
    ep: Any,
    graph: OpGraph,
    device: str,
    *,
    warmup: int = 2,
    repeats: int = 5,
    inputs: Sequence[Any] | None = None,
    lr: float = 1e-3,
    marks: Any = None,
    every: int = 32,
) -> dict[str, Any]:
    """Per-op kernel and host-issue seconds inside real training steps with every op on ``device``.

    An asynchronous device (a GPU) costs an eager step twice per op: the host
    thread's time to issue it (the FX node's Python, dispatch, the launch; in the
    backward, the autograd worker's time per node) and the kernels' time on the
    device, which overlap. Three kinds of step alternate, as
    :func:`envs.real.timing.train_step` runs them:

    * clean steps time each phase on the host (issue) and in the device's
      timeline (``marks``: CUDA events), and the whole step, synchronised;
    * host-probed steps stamp the host clock after each forward op and in a
      pre-hook of every autograd node (:class:`Probes`, as the CPU profile):
      each op's issue time, less the probes' cost, scaled to the clean host phase;
    * device-probed steps mark the device's timeline at the same points, with
      the device held back so that the host runs ahead (:class:`_DeviceProbes`):
      each op's kernel time, less the marks' cost.

    Returns the CPU profile's fields (``fwd_s``/``bwd_s`` are kernel seconds;
    ``update_s`` the optimizer step in the device's timeline) plus
    ``issue_fwd_s``/``issue_bwd_s`` (host seconds per op) and ``device_phases_s``.
    """
    torch_device = torch.device(device)
    if marks is None:
        if torch_device.type != "cuda":
            raise PlacerError(f"device in-context profiling needs CUDA events, not {device}")
        marks = CudaMarks(torch_device)
    with restoring(ep):
        return _device_in_context(ep, graph, torch_device, warmup, repeats, inputs, lr, marks, every)


_PHASES = ("zero", "fwd", "loss", "bwd", "opt")


def _clean_step(gm: Any, inputs: tuple, opt: Any, marks: Any, clock: Any) -> tuple[list[float], list[float], float]:
    """One unprobed step: ``(host seconds per phase, device seconds per phase, the whole step synchronised)``."""
    marks.sync()
    t = [clock()]
    m = [marks.mark()]
    opt.zero_grad(set_to_none=True)
    t.append(clock())
    m.append(marks.mark())
    out = gm(*inputs)
    t.append(clock())
    m.append(marks.mark())
    loss = default_loss(out)
    t.append(clock())
    m.append(marks.mark())
    loss.backward()
    t.append(clock())
    m.append(marks.mark())
    opt.step()
    t.append(clock())
    m.append(marks.mark())
    marks.sync()
    t_end = clock()
    del out, loss
    return (
        [t[j + 1] - t[j] for j in range(len(_PHASES))],
        [marks.elapsed(m[j], m[j + 1]) for j in range(len(_PHASES))],
        t_end - t[0],
    )


def _device_probed_step(
    probed_gm: Any, inputs: tuple, opt: Any, marks: Any, current: list, every: int, sleep_s: float
) -> "_DeviceProbes":
    """One step with device marks at every probe, the device held back so that the host runs ahead."""
    opt.zero_grad(set_to_none=True)
    marks.sync()
    dp = current[0] = _DeviceProbes(marks, every, sleep_s)
    out = probed_gm(*inputs)
    loss = default_loss(out)
    dp.hook_all(loss)
    dp.start_backward()
    loss.backward()
    dp.end_backward()
    dp.unhook()
    opt.step()
    marks.sync()
    del out, loss
    return dp


def _device_in_context(
    ep: Any,
    graph: OpGraph,
    torch_device: Any,
    warmup: int,
    repeats: int,
    inputs: Sequence[Any] | None,
    lr: float,
    marks: Any,
    every: int,
) -> dict[str, Any]:
    n = graph.num_ops
    current: list = [Probes(time.perf_counter)]
    gm, probed_gm, inputs, opt = probed_program(ep, graph, torch_device, inputs, lr, current)
    clock = time.perf_counter
    host: dict[str, list[float]] = {k: [] for k in _PHASES + ("step",)}
    device: dict[str, list[float]] = {k: [] for k in _PHASES}
    issue_f, issue_b, kern_f, kern_b = [], [], [], []
    fcount = bcount = np.zeros(n + 1, dtype=np.int64)
    dfcount = dbcount = np.zeros(n + 1, dtype=np.int64)
    for k in range(warmup + repeats):
        # a clean step: host phases (issue) and device phases (marks), the whole step synchronised
        host_s, device_s, step_s = _clean_step(gm, inputs, opt, marks, clock)
        if k >= warmup:
            for j, key in enumerate(_PHASES):
                host[key].append(host_s[j])
                device[key].append(device_s[j])
            host["step"].append(step_s)
        # a host-probed step: issue time per op
        pr, tail, b0, b1 = host_probed_step(probed_gm, inputs, opt, current, clock, marks.sync)
        # host seconds per forward op and per backward probe: the sleeps' length
        per_op_host = [
            max(float(np.median(pr.fwd_s)), 1e-6) if pr.fwd_s else 1e-4,
            max((b1 - b0) / max(len(pr.bwd), 1), 1e-6),
        ]
        if k >= warmup:
            f_s, fcount = attribute_intervals(pr.fwd_owner + [-1], pr.fwd_s + [tail], n)
            b_s, bcount = attribute_intervals(*backward_intervals(b0, pr.bwd, b1), n)
            issue_f.append(f_s)
            issue_b.append(b_s)
        # a device-probed step: kernel time per op, the device held back so the host runs ahead
        dp = _device_probed_step(probed_gm, inputs, opt, marks, current, every, 4.0 * every * max(per_op_host) + 2e-4)
        if k >= warmup:
            f_s, dfcount = dp.seconds(dp.fwd_iv, n)
            b_s, dbcount = dp.seconds(dp.bwd_iv, n)
            kern_f.append(f_s)
            kern_b.append(b_s)
    current[0] = Probes(clock)
    return _device_profile(
        gm, host, device, (issue_f, issue_b, fcount, bcount), (kern_f, kern_b, dfcount, dbcount), marks, clock
    )


def _device_profile(
    gm: Any,
    host: dict[str, list[float]],
    device: dict[str, list[float]],
    issue: tuple,
    kernels: tuple,
    marks: Any,
    clock: Any,
) -> dict[str, Any]:
    """The profile entry of a device from its steps' samples: medians, the probes' costs taken off, scaled to the clean
    phases."""
    issue_f, issue_b, fcount, bcount = issue
    kern_f, kern_b, dfcount, dbcount = kernels
    fwd_probe_s, bwd_probe_s = probe_costs(clock=clock)
    mark_s = device_mark_cost(marks)
    med = {key: float(np.median(v)) for key, v in host.items()}
    dmed = {key: float(np.median(v)) for key, v in device.items()}
    # the clean phases say how long the host issued for, whatever the probes cost beyond their measured cost: scaled
    # to them however far off (a fallback to unscaled times overstated small-kernel models, where probes dominate)
    issue_fwd, f_scale = scale_to(
        remove_probe_cost(np.median(issue_f, axis=0), fcount, fwd_probe_s), med["fwd"], limit=np.inf
    )
    issue_bwd, b_scale = scale_to(
        remove_probe_cost(np.median(issue_b, axis=0), bcount, bwd_probe_s), med["bwd"], limit=np.inf
    )
    # the kernels of a phase cannot take longer than the phase did on the device, unprobed
    kern_fwd = cap_to(remove_probe_cost(np.median(kern_f, axis=0), dfcount, mark_s), dmed["fwd"])
    kern_bwd = cap_to(remove_probe_cost(np.median(kern_b, axis=0), dbcount, mark_s), dmed["bwd"])
    return profile_entry(
        gm,
        (kern_fwd, kern_bwd),
        med,
        issue=(issue_fwd, issue_bwd),
        device_med=dmed,
        update_s=dmed["opt"],
        overhead_s=float(issue_fwd[0] + issue_bwd[0] + med["zero"] + med["loss"]),
        outside_s={"forward_kernels": float(kern_fwd[0]), "backward_kernels": float(kern_bwd[0])},
        probe_s={"forward": fwd_probe_s, "backward": bwd_probe_s, "device_mark": mark_s},
        scale={"forward": f_scale, "backward": b_scale},
        clock="wall",
    )
