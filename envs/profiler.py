"""The profiler: per-op forward/backward seconds and link speeds, measured on real devices.

:func:`profile_program` times every op on each requested torch device.

* **The CPU, in context** (the default): :func:`profile_in_context` runs real
  training steps of the program with every op on the CPU, as
  :func:`envs.real.timing.train_step` runs a placed module, and charges the time
  between consecutive probes (a timestamp after each forward op, a pre-hook on each
  autograd node) to the op that owns it. So an op's time includes eager dispatch
  and the autograd engine's work for it, the caches are as warm or cold as in
  training, and the optimizer step and the rest of the step are measured too.
* **A CUDA device, in context** (the default): :func:`profile_device_in_context`
  runs real training steps with every op on the GPU and measures two times per
  op, forward and backward: its kernels' time (CUDA events, with the stream held
  back so that the host runs ahead) and the host's time to issue it (host stamps;
  in the backward, the autograd worker's). The simulator charges the first to the
  GPU's stream and the second to the issuing thread (``issue_fwd_s``,
  ``issue_bwd_s``; :func:`envs.cost.issue_times`): an eager step of small ops on
  a fast GPU is bound by the issuing.
* **Other devices (and ``method="isolated"``), op by op**: one walk of the graph
  with concrete values (a ``torch.fx.Interpreter`` on the CPU) times each op alone
  on the device: its forward (inputs already on the device, autograd recording as
  in training), then its backward (``torch.autograd.grad`` of the op's outputs
  with respect to its inputs that need gradients, after an untimed forward).
  CUDA is timed with events bracketed by synchronisation. On an H200 this charged
  every op the autograd engine's start and the dispatch (a median of 130 µs per
  backward op against 5 µs of kernel in a real step): 5-7x too slow.

Each time is the median of ``repeats`` runs after ``warmup`` runs.
:func:`time_link` times copies of a few sizes between two devices and
:func:`fit_link` fits ``time = latency_s + bytes / bandwidth``.

The result is a ``placer-profile/1`` document tied to the graph hash::

    {"format": "placer-profile/1", "graph_hash": "...", "ops": [names...],
     "devices": {"cpu": {"kind": "cpu", "method": "context", "fwd_s": [...], "bwd_s": [...],
                         "update_s": .., "update_bytes": .., "overhead_s": .., "step_s": ..},
                 "cuda:0": {"kind": "gpu", "method": "context", "fwd_s": [...], "bwd_s": [...],
                            "issue_fwd_s": [...], "issue_bwd_s": [...], ...}},
     "links": [{"src": "cpu", "dst": "cuda:0", "latency_s": ..,
                "bandwidth_bytes_per_s": .., "sizes_bytes": [..], "times_s": [..]}]}

(``null`` marks an op that could not run on that device; ``update_s`` and the
fields after it are optional, written by in-context profiling: the Adam step over
``update_bytes`` of parameters, the rest of the step outside the graph's ops, and
the whole measured step.) The simulator takes it
in two ways: :func:`apply_profile` fills ``graph.profile[kind]`` (the content hash
leaves ``profile`` out, so placements made before profiling stay valid), and
:func:`calibrate_cluster` replaces link latency/bandwidth with the measured ones
and, given the graph, fits each device kind's launch overhead and compute rate
for ops the profile does not cover, and its memory bandwidth to the measured
optimizer step where there is one. :func:`with_profile` does both for a
``--profile`` command-line option.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from envs.cluster import Cluster
from graphs import OpGraph, PlacerError, schema
from graphs.ir import PROFILE_COLUMNS
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


# ------------------------------------------------------------ in context
def attribute_intervals(owners: Sequence[int], seconds: Sequence[float], num_ops: int) -> tuple[np.ndarray, np.ndarray]:
    """Seconds and interval counts per owner: index 0 is "outside the graph" (owner -1), op ``i`` is ``i + 1``.

    A probed run is cut into consecutive intervals at its probes (a timestamp after
    each forward op, a pre-hook on each autograd node), so the intervals partition
    the phase's wall time and each holds exactly one probe.

    >>> t, n = attribute_intervals([-1, 0, 1, 0], [1.0, 2.0, 3.0, 4.0], 2)
    >>> t.tolist(), n.tolist()
    ([1.0, 6.0, 3.0], [1, 2, 1])
    """
    idx = np.asarray(owners, dtype=np.int64) + 1
    return np.bincount(idx, weights=np.asarray(seconds, dtype=np.float64), minlength=num_ops + 1), np.bincount(idx, minlength=num_ops + 1)


def backward_intervals(start_s: float, hooks: Sequence[tuple[int, float]], end_s: float) -> tuple[list[int], np.ndarray]:
    """Owners and seconds of a probed backward: from its start to the first node's pre-hook
    (autograd's start: outside the graph), then from each pre-hook to the next (that
    node's work, charged to its owner), the last one up to the end.

    >>> owners, secs = backward_intervals(0.0, [(3, 1.0), (-1, 4.0), (3, 5.0)], 7.0)
    >>> owners, secs.tolist()
    ([-1, 3, -1, 3], [1.0, 3.0, 1.0, 2.0])
    """
    owners = [-1] + [o for o, _ in hooks]
    stamps = [start_s] + [t for _, t in hooks] + [end_s]
    return owners, np.diff(np.asarray(stamps, dtype=np.float64))


def remove_probe_cost(per_owner_s: np.ndarray, counts: np.ndarray, per_probe_s: float) -> np.ndarray:
    """Per-owner seconds less what the probes in them cost (``per_probe_s`` each), never below 0.

    >>> remove_probe_cost(np.array([1.0, 6.0, 3.0]), np.array([1, 2, 1]), 0.5).tolist()
    [0.5, 5.0, 2.5]
    """
    return np.maximum(np.asarray(per_owner_s, dtype=np.float64) - max(per_probe_s, 0.0) * np.asarray(counts), 0.0)


def scale_to(per_owner_s: np.ndarray, total_s: float, *, limit: float = 2.0) -> tuple[np.ndarray, float]:
    """Per-owner seconds scaled to sum to ``total_s`` (a clean phase's median), and the factor.

    The probes say how a phase divides among the ops; the phase timed without them
    says how long it takes. A factor beyond ``limit`` (either way) means the probes
    measured something else: they are then left unscaled (factor 1.0).

    >>> arr, f = scale_to(np.array([1.0, 3.0]), 6.0)
    >>> arr.tolist(), f
    ([1.5, 4.5], 1.5)
    >>> scale_to(np.array([1.0, 3.0]), 40.0)[1]
    1.0
    """
    total = float(np.sum(per_owner_s))
    factor = total_s / total if total > 0 and total_s > 0 else 1.0
    if not 1.0 / limit <= factor <= limit:
        factor = 1.0
    return np.asarray(per_owner_s, dtype=np.float64) * factor, float(factor)


def _grad_fns(values: Any) -> list:
    """The autograd nodes that produced the tensors in ``values`` (now: an in-place op may replace one later)."""
    import torch
    from torch.utils._pytree import tree_flatten

    return [t.grad_fn for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _autograd_nodes(heads: list, seen: dict) -> list:
    """Autograd nodes reachable from the nodes ``heads`` that are not in ``seen`` yet (added to it).

    Edges point from a node to older ones, so walking, after the forward, from the
    nodes each op produced, op by op in forward order, gives each op exactly the
    nodes that were new when it ran.
    """
    stack = list(heads)
    found = []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen[fn] = True
        found.append(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return found


def host_clock(clock: str = "auto") -> tuple[str, Callable[[], float]]:
    """The clock timing host work: ``"thread"`` (this thread's CPU time), ``"wall"``, or ``"auto"``.

    ``"auto"`` is the thread's CPU time when torch computes on this one thread (then
    time the thread waited while a busy machine ran other processes does not count,
    and on a quiet core it equals wall time), else wall time (other threads work too).
    """
    import torch

    if clock == "auto":
        clock = "thread" if torch.get_num_threads() == 1 else "wall"
    if clock == "thread":
        return "thread", time.thread_time
    if clock == "wall":
        return "wall", time.perf_counter
    raise PlacerError(f"clock must be 'auto', 'thread' or 'wall', not {clock!r}")


class _Probes:
    """The probes of one step: forward stamps per op, then a pre-hook on every autograd node."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.fwd_owner: list[int] = []
        self.fwd_s: list[float] = []
        self.heads: list[list] = []
        self.bwd: list[tuple[int, float]] = []
        self.handles: list = []
        self.seen: dict = {}
        self.resume = clock()

    def done(self, op: int, out: Any) -> None:
        """After forward op ``op``: its interval ends; walking its outputs is not timed."""
        t = self.clock()
        self.fwd_owner.append(op)
        self.fwd_s.append(t - self.resume)
        self.heads.append(_grad_fns(out))  # the graph is walked after the forward, not inside it
        self.resume = self.clock()

    def hook(self, fns: list, owner: int) -> None:
        events, clock = self.bwd, self.clock

        def pre(_grads: Any) -> None:
            events.append((owner, clock()))

        self.handles.extend(fn.register_prehook(pre) for fn in fns)

    def hook_all(self, loss: Any) -> None:
        """Before backward: hook every node, owned by the first op (in forward order) whose outputs reach it."""
        for op, heads in zip(self.fwd_owner, self.heads):
            self.hook(_autograd_nodes(heads, self.seen), op)
        self.hook(_autograd_nodes(_grad_fns(loss), self.seen), -1)  # the loss's own nodes

    def unhook(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _probed(target: Callable[..., Any], op: int, current: list) -> Callable[..., Any]:
    """``target`` reporting to ``current[0]`` (a :class:`_Probes`) after each call."""

    def probed(*args: Any, **kwargs: Any) -> Any:
        out = target(*args, **kwargs)
        current[0].done(op, out)
        return out

    probed.__name__ = f"probed_{getattr(target, '__name__', 'op')}"
    return probed


def probe_costs(*, calls: int = 2000, nodes: int = 100, trials: int = 15, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Seconds one forward probe and one backward pre-hook add to the interval they sit in.

    The forward: the median interval a probe records around a trivial function
    called ``calls`` times in a loop, less the same loop's fastest time per call
    unprobed (walking the outputs happens between intervals, so it does not count).
    The backward: a backward through a chain of ``nodes`` autograd nodes, all hooked
    minus none, per node. Each the fastest of ``trials`` (a busy machine only adds time).
    """
    import torch

    x = torch.zeros(1)

    def plain(t: Any) -> Any:
        return t

    current = [_Probes(clock)]
    probed = _probed(plain, 0, current)
    plain_s, probed_s, times = [], [], {False: [], True: []}
    for _ in range(trials):
        t0 = clock()
        for _ in range(calls):
            plain(x)
        plain_s.append((clock() - t0) / calls)
        current[0] = _Probes(clock)
        for _ in range(calls):
            probed(x)
        probed_s.append(float(np.median(current[0].fwd_s[1:])))
        for hooked in (False, True):
            leaf = torch.zeros(1, requires_grad=True)
            y = leaf
            for _ in range(nodes):
                y = y * 1.0
            pr = _Probes(clock)
            if hooked:
                pr.hook(_autograd_nodes(_grad_fns(y), pr.seen), 0)
            t0 = clock()
            y.backward()
            times[hooked].append(clock() - t0)
            pr.unhook()
    fwd = min(probed_s) - min(plain_s)
    bwd = (min(times[True]) - min(times[False])) / (nodes + 1)
    return max(fwd, 0.0), max(bwd, 0.0)


@contextlib.contextmanager
def _restoring(ep: Any):
    """Training steps on ``ep``'s own tensors, put back afterwards (the profile must not train the model)."""
    import torch

    snapshot = {k: v.detach().clone() for k, v in ep.state_dict.items()}
    constants = {k: v.detach().clone() for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in ep.state_dict.items():
                v.copy_(snapshot[k].to(v.device))
            for k, v in constants.items():
                ep.constants[k].copy_(v.to(ep.constants[k].device))


def _probed_program(ep: Any, graph: OpGraph, dev: Any, inputs: Sequence[Any] | None, lr: float, current: list) -> tuple:
    """``(module, probed twin, inputs on dev, Adam)``: ``ep`` with every op on ``dev``, and a twin whose every op
    reports to ``current[0]`` after it ran (:func:`_probed`; it shares the module's parameters and buffers)."""
    import torch
    import torch.fx as fx

    from envs.real.placing import place_module

    gm = place_module(ep, {name: "d:0" for name in graph.names}, {"d:0": str(dev)})
    if inputs is None:
        example = [p.meta["val"] for p in ep.graph.nodes if p.op == "placeholder" and p.name in set(ep.graph_signature.user_inputs)]
        inputs = _concrete_inputs(ep, example)
    inputs = tuple(t.to(dev) if isinstance(t, torch.Tensor) else t for t in inputs)
    probed_graph = fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        new = probed_graph.node_copy(node, lambda a: env[a])
        if node.op == "call_function":  # nodes the export added (buffer write-backs) count as "outside"
            new.target = _probed(node.target, graph.index.get(node.name, -1), current)
        env[node] = new
    return gm, fx.GraphModule(gm, probed_graph), inputs, torch.optim.Adam(gm.parameters(), lr=lr)


def _param_bytes(gm: Any) -> int:
    """Bytes of ``gm``'s parameters: what the optimizer step updates."""
    return int(sum(p.numel() * p.element_size() for p in gm.parameters()))


def _phases(med: Mapping[str, float]) -> dict[str, float]:
    """A step's phase medians under the names a profile gives them."""
    return {"zero_grad": med["zero"], "forward": med["fwd"], "loss": med["loss"], "backward": med["bwd"], "optimizer": med["opt"]}


def _host_probed_step(probed_gm: Any, inputs: tuple, opt: Any, current: list, clock: Callable[[], float],
                      sync: Callable[[], None] = lambda: None) -> tuple:
    """One training step of the probed module with host stamps: ``(probes, tail, backward start, backward end)``.

    ``tail`` is the time from the last forward op to the module's return; ``sync``
    waits for the device before the step and after it (a GPU: so no earlier work
    is still queued when the stamps start).
    """
    from envs.real.timing import default_loss

    opt.zero_grad(set_to_none=True)
    sync()
    pr = current[0] = _Probes(clock)
    out = probed_gm(*inputs)
    tail = clock() - pr.resume
    loss = default_loss(out)
    pr.hook_all(loss)
    b0 = clock()
    loss.backward()
    b1 = clock()
    pr.unhook()
    opt.step()
    sync()
    return pr, tail, b0, b1


def profile_in_context(ep: Any, graph: OpGraph, device: str = "cpu", *, warmup: int = 2, repeats: int = 5, inputs: Sequence[Any] | None = None, lr: float = 1e-3, clock: str = "auto") -> dict[str, Any]:
    """Per-op forward/backward seconds measured inside real training steps on one device.

    Every op of ``graph`` runs on ``device`` in the module :func:`envs.real.placing.place_module`
    builds, trained as :func:`envs.real.timing.train_step` does (zero_grad, forward, the
    default loss, backward, Adam). Probed steps stamp the time after each forward op
    (each FX node's call is wrapped) and in a pre-hook of every autograd node; each
    autograd node belongs to the op whose outputs first reach it (a parameter's
    gradient accumulation to its first consumer, like its owner in the graph).
    The time between two probes is charged to the op of the first (forward: of the
    second), so an op's forward includes the eager dispatch and the generated code
    around it, and its backward the autograd engine's work for its nodes, up to the
    next node. What the probes themselves cost (:func:`probe_costs`) is taken off
    (:func:`remove_probe_cost`). Clean steps (no probes) alternate with the probed
    ones and time each phase: the forward and backward per op are then scaled to
    their clean phases (:func:`scale_to`; the factors are kept as ``"scale"``), and
    the optimizer and the rest of the step come from them. Each figure is the
    median over ``repeats`` steps after ``warmup``.

    CPU only: the time between two host timestamps is the op's time only where
    the op runs on the host thread (a CUDA op returns once it is queued). Times
    are read from :func:`host_clock` (``clock``; recorded as ``"clock"``): by default
    the thread's CPU time when torch uses one thread, so a busy machine's
    preemptions do not count.

    Returns ``{"fwd_s": [...], "bwd_s": [...], "update_s", "update_bytes",
    "overhead_s", "step_s", "phases_s", "probe_s", "scale", "clock"}``: per-op columns in ``graph``
    order; ``update_s`` the optimizer step over ``update_bytes`` of parameters;
    ``overhead_s`` the rest of the step (zero_grad, the loss, autograd's start, nodes
    of no op); ``step_s`` the median clean step, ``phases_s`` the median of each of
    its phases (robuster than the step's median on a busy machine, where a step is
    often preempted); ``probe_s`` the probe costs taken off.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cpu":
        raise PlacerError(f"in-context profiling times host ops only, not {device}")
    with _restoring(ep):
        return _in_context(ep, graph, dev, warmup, repeats, inputs, lr, clock)


def _in_context(ep: Any, graph: OpGraph, dev: Any, warmup: int, repeats: int, inputs: Sequence[Any] | None, lr: float, clock_name: str) -> dict[str, Any]:
    from envs.real.timing import default_loss

    n = graph.num_ops
    clock_name, clock = host_clock(clock_name)
    current = [_Probes(clock)]
    gm, probed_gm, inputs, opt = _probed_program(ep, graph, dev, inputs, lr, current)

    clean: dict[str, list[float]] = {k: [] for k in ("zero", "fwd", "loss", "bwd", "opt", "step")}
    fwd_rows, bwd_rows = [], []
    fwd_counts = bwd_counts = np.zeros(n + 1, dtype=np.int64)
    for k in range(warmup + repeats):
        # a clean step, timed by phase
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        t1 = clock()
        out = gm(*inputs)
        t2 = clock()
        loss = default_loss(out)
        t3 = clock()
        loss.backward()
        t4 = clock()
        opt.step()
        t5 = clock()
        del out, loss
        if k >= warmup:
            for key, v in zip(clean, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                clean[key].append(v)
        # a probed step
        pr, tail, b0, b1 = _host_probed_step(probed_gm, inputs, opt, current, clock)
        if k >= warmup:
            f_s, fwd_counts = attribute_intervals(pr.fwd_owner + [-1], pr.fwd_s + [tail], n)
            b_s, bwd_counts = attribute_intervals(*backward_intervals(b0, pr.bwd, b1), n)
            fwd_rows.append(f_s)
            bwd_rows.append(b_s)
    current[0] = _Probes(clock)
    fwd_probe_s, bwd_probe_s = probe_costs(clock=clock)
    med = {key: float(np.median(v)) for key, v in clean.items()}
    fwd = remove_probe_cost(np.median(fwd_rows, axis=0), fwd_counts, fwd_probe_s)
    bwd = remove_probe_cost(np.median(bwd_rows, axis=0), bwd_counts, bwd_probe_s)
    fwd, f_scale = scale_to(fwd, med["fwd"])
    bwd, b_scale = scale_to(bwd, med["bwd"])
    return {
        "fwd_s": [float(x) for x in fwd[1:]],
        "bwd_s": [float(x) for x in bwd[1:]],
        "update_s": med["opt"],
        "update_bytes": _param_bytes(gm),
        "overhead_s": float(fwd[0] + bwd[0] + med["zero"] + med["loss"]),
        "step_s": med["step"],
        "phases_s": _phases(med),
        "probe_s": {"forward": fwd_probe_s, "backward": bwd_probe_s},
        "scale": {"forward": f_scale, "backward": b_scale},
        "clock": clock_name,
    }


# ------------------------------------------------------- in context, device
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
        import torch

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


class _DeviceProbes(_Probes):
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
        self.heads.append(_grad_fns(out))
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
        return attribute_intervals([o for o, _, _ in intervals], [self.marks.elapsed(a, b) for _, a, b in intervals], num_ops)


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


def profile_device_in_context(ep: Any, graph: OpGraph, device: str, *, warmup: int = 2, repeats: int = 5, inputs: Sequence[Any] | None = None, lr: float = 1e-3, marks: Any = None, every: int = 32) -> dict[str, Any]:
    """Per-op kernel and host-issue seconds inside real training steps with every op on ``device``.

    An asynchronous device (a GPU) costs an eager step twice per op: the host
    thread's time to issue it (the FX node's Python, dispatch, the launch; in the
    backward, the autograd worker's time per node) and the kernels' time on the
    device, which overlap. Three kinds of step alternate, as
    :func:`envs.real.timing.train_step` runs them:

    * clean steps time each phase on the host (issue) and in the device's
      timeline (``marks``: CUDA events), and the whole step, synchronised;
    * host-probed steps stamp the host clock after each forward op and in a
      pre-hook of every autograd node (:class:`_Probes`, as the CPU profile):
      each op's issue time, less the probes' cost, scaled to the clean host phase;
    * device-probed steps mark the device's timeline at the same points, with
      the device held back so that the host runs ahead (:class:`_DeviceProbes`):
      each op's kernel time, less the marks' cost.

    Returns the CPU profile's fields (``fwd_s``/``bwd_s`` are kernel seconds;
    ``update_s`` the optimizer step in the device's timeline) plus
    ``issue_fwd_s``/``issue_bwd_s`` (host seconds per op) and ``device_phases_s``.
    """
    import torch

    dev = torch.device(device)
    if marks is None:
        if dev.type != "cuda":
            raise PlacerError(f"device in-context profiling needs CUDA events, not {device}")
        marks = CudaMarks(dev)
    with _restoring(ep):
        return _device_in_context(ep, graph, dev, warmup, repeats, inputs, lr, marks, every)


def _device_in_context(ep: Any, graph: OpGraph, dev: Any, warmup: int, repeats: int, inputs: Sequence[Any] | None, lr: float,
                       marks: Any, every: int) -> dict[str, Any]:
    from envs.real.timing import default_loss

    n = graph.num_ops
    current: list = [_Probes(time.perf_counter)]
    gm, probed_gm, inputs, opt = _probed_program(ep, graph, dev, inputs, lr, current)
    clock = time.perf_counter
    keys = ("zero", "fwd", "loss", "bwd", "opt")
    host: dict[str, list[float]] = {k: [] for k in keys + ("step",)}
    device: dict[str, list[float]] = {k: [] for k in keys}
    issue_f, issue_b, kern_f, kern_b = [], [], [], []
    fcount = bcount = np.zeros(n + 1, dtype=np.int64)
    dfcount = dbcount = np.zeros(n + 1, dtype=np.int64)
    per_op_host = [1e-4, 1e-4]  # host seconds per forward op and per backward probe: the sleeps' length
    for k in range(warmup + repeats):
        # a clean step: host phases (issue) and device phases (marks), the whole step synchronised
        marks.sync()
        t = [clock()]
        m = [marks.mark()]
        opt.zero_grad(set_to_none=True)
        t.append(clock()); m.append(marks.mark())
        out = gm(*inputs)
        t.append(clock()); m.append(marks.mark())
        loss = default_loss(out)
        t.append(clock()); m.append(marks.mark())
        loss.backward()
        t.append(clock()); m.append(marks.mark())
        opt.step()
        t.append(clock()); m.append(marks.mark())
        marks.sync()
        t_end = clock()
        del out, loss
        if k >= warmup:
            for j, key in enumerate(keys):
                host[key].append(t[j + 1] - t[j])
                device[key].append(marks.elapsed(m[j], m[j + 1]))
            host["step"].append(t_end - t[0])
        # a host-probed step: issue time per op
        pr, tail, b0, b1 = _host_probed_step(probed_gm, inputs, opt, current, clock, marks.sync)
        per_op_host = [max(float(np.median(pr.fwd_s)), 1e-6) if pr.fwd_s else 1e-4, max((b1 - b0) / max(len(pr.bwd), 1), 1e-6)]
        if k >= warmup:
            f_s, fcount = attribute_intervals(pr.fwd_owner + [-1], pr.fwd_s + [tail], n)
            b_s, bcount = attribute_intervals(*backward_intervals(b0, pr.bwd, b1), n)
            issue_f.append(f_s)
            issue_b.append(b_s)
        # a device-probed step: kernel time per op, the device held back so the host runs ahead
        opt.zero_grad(set_to_none=True)
        marks.sync()
        sleep_s = 4.0 * every * max(per_op_host) + 2e-4
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
        if k >= warmup:
            f_s, dfcount = dp.seconds(dp.fwd_iv, n)
            b_s, dbcount = dp.seconds(dp.bwd_iv, n)
            kern_f.append(f_s)
            kern_b.append(b_s)
    current[0] = _Probes(clock)
    fwd_probe_s, bwd_probe_s = probe_costs(clock=clock)
    mark_s = device_mark_cost(marks)
    med = {key: float(np.median(v)) for key, v in host.items()}
    dmed = {key: float(np.median(v)) for key, v in device.items()}
    issue_fwd, f_scale = scale_to(remove_probe_cost(np.median(issue_f, axis=0), fcount, fwd_probe_s), med["fwd"])
    issue_bwd, b_scale = scale_to(remove_probe_cost(np.median(issue_b, axis=0), bcount, bwd_probe_s), med["bwd"])
    kern_fwd = remove_probe_cost(np.median(kern_f, axis=0), dfcount, mark_s)
    kern_bwd = remove_probe_cost(np.median(kern_b, axis=0), dbcount, mark_s)
    return {
        "fwd_s": [float(x) for x in kern_fwd[1:]],
        "bwd_s": [float(x) for x in kern_bwd[1:]],
        "issue_fwd_s": [float(x) for x in issue_fwd[1:]],
        "issue_bwd_s": [float(x) for x in issue_bwd[1:]],
        "update_s": dmed["opt"],
        "update_bytes": _param_bytes(gm),
        "overhead_s": float(issue_fwd[0] + issue_bwd[0] + med["zero"] + med["loss"]),
        "step_s": med["step"],
        "phases_s": _phases(med),
        "device_phases_s": _phases(dmed),
        "outside_s": {"forward_kernels": float(kern_fwd[0]), "backward_kernels": float(kern_bwd[0])},
        "probe_s": {"forward": fwd_probe_s, "backward": bwd_probe_s, "device_mark": mark_s},
        "scale": {"forward": f_scale, "backward": b_scale},
        "clock": "wall",
    }


def profile_program(ep: Any, devices: Sequence[str], *, warmup: int = 1, repeats: int = 5, transfer_sizes: Sequence[int] = DEFAULT_TRANSFER_SIZES, graph: OpGraph | None = None, progress: Callable[[int, int], None] | None = None, method: str = "context") -> dict[str, Any]:
    """Profile every op of an ``ExportedProgram`` on each torch device in ``devices``.

    ``method="context"`` (default) times the CPU and CUDA devices inside real
    training steps (:func:`profile_in_context`, :func:`profile_device_in_context`)
    and any other device op by op; ``"isolated"`` times every device op by op. A
    device whose in-context run fails is timed op by op (the failure is noted in
    ``errors``). Returns the ``placer-profile/1``
    document (see the module docstring).
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
    if method not in ("context", "isolated"):
        raise PlacerError(f"profile method must be 'context' or 'isolated', not {method!r}")
    context: dict[str, dict[str, Any]] = {}
    for d in torch_devices:
        if method == "context" and d.type in ("cpu", "cuda"):
            try:
                if d.type == "cpu":
                    context[str(d)] = profile_in_context(ep, graph, str(d), warmup=max(warmup, 1), repeats=repeats)
                else:
                    context[str(d)] = profile_device_in_context(ep, graph, str(d), warmup=max(warmup, 1), repeats=repeats)
            except Exception as e:  # time it op by op instead
                errors[f"in-context@{d}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    isolated = [d for d in torch_devices if str(d) not in context]
    done = [0]

    class _Timer(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            i = index.get(n.name) if n.op == "call_function" else None
            if i is not None:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                for d in isolated:
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
    if isolated:
        with torch.enable_grad():
            _Timer(gm).run(*inputs)
    elif progress:
        progress(graph.num_ops, graph.num_ops)
    links = []
    for a in torch_devices:
        for b in torch_devices:
            if a != b:
                sizes, times = time_link(a, b, transfer_sizes, repeats=repeats)
                lat, bw = fit_link(sizes, times)
                links.append({"src": str(a), "dst": str(b), "latency_s": lat, "bandwidth_bytes_per_s": bw, "sizes_bytes": list(sizes), "times_s": times})

    def col(a: np.ndarray) -> list:
        return [None if np.isnan(x) else float(x) for x in a.tolist()]

    def entry(d: Any) -> dict[str, Any]:
        out = {"kind": device_kind(str(d)), "name": _device_name(d)}
        if str(d) in context:
            return {**out, "method": "context", **context[str(d)]}
        return {**out, "method": "isolated", "fwd_s": col(fwd[str(d)]), "bwd_s": col(bwd[str(d)])}

    return {
        "format": FORMAT,
        "graph_hash": graph.content_hash,
        "graph_name": graph.name,
        "ops": list(graph.names),
        "devices": {str(d): entry(d) for d in torch_devices},
        "links": links,
        "settings": {"warmup": warmup, "repeats": repeats, "method": method},
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
    from graphs.torch_capture import check_runnable, export_program

    check_runnable(model)
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

    schema.document(doc, source, FORMAT)
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
        for col in PROFILE_COLUMNS:
            arr = entry.get(col)
            if col.startswith("issue") and arr is None:  # optional: devices profiled in context
                continue
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
    """Device kind -> {"fwd_s", "bwd_s"[, "issue_fwd_s", "issue_bwd_s"]} arrays aligned with ``graph`` (median over devices of a kind)."""
    if profile.get("graph_hash") and profile["graph_hash"] != graph.content_hash:
        raise PlacerError(f"{source}: profiled graph {profile['graph_hash']}, not this graph ({graph.name or 'graph'} {graph.content_hash})")
    pos = {name: k for k, name in enumerate(profile["ops"])}
    rows = np.array([pos.get(name, -1) for name in graph.names])
    if np.all(rows < 0) and graph.num_ops:
        raise PlacerError(f"{source}: names none of the graph's ops")
    by_kind: dict[str, dict[str, list[np.ndarray]]] = {}
    for dev, entry in profile["devices"].items():
        kind = entry.get("kind") or device_kind(dev)
        for col in PROFILE_COLUMNS:
            if col not in entry:  # the issue columns: devices profiled in context only
                continue
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
    time are estimated at this machine's speed; where the profile measured the
    optimizer step (``update_s``), ``mem_bw_bytes_per_s`` is fitted so that
    :func:`envs.cost.update_times_s` of all the parameters gives that step plus the
    step's measured ``overhead_s`` (:func:`_fit_update`).
    """
    from envs.cluster import Cluster, Link
    from envs.real.placing import resolve_devices

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
        from graphs.ops import free_mask

        rates = _fit_rates(graph, profile_columns(graph, profile), ~free_mask(graph))
        _fit_update(rates, profiled)
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


def _fit_update(rates: dict[str, dict[str, float]], devices: Mapping[str, Any]) -> None:
    """Per kind, the memory bandwidth that makes the modelled optimizer step the measured one.

    The measured step outside the graph's ops (``overhead_s``: zero_grad, the loss,
    autograd's start) is charged with it: like the update, it runs once per step
    after (or around) the ops. Median over the kind's devices that measured one.
    """
    from envs.cost import update_bandwidth

    by_kind: dict[str, list[float]] = {}
    for dev, entry in devices.items():
        upd, nbytes = entry.get("update_s"), entry.get("update_bytes")
        if not isinstance(upd, (int, float)) or not isinstance(nbytes, (int, float)) or upd <= 0 or nbytes <= 0:
            continue
        extra = entry.get("overhead_s")
        total = float(upd) + (float(extra) if isinstance(extra, (int, float)) and extra > 0 else 0.0)
        kind = entry.get("kind") or device_kind(dev)
        launch = rates.get(kind, {}).get("launch_overhead_s", 0.0)
        by_kind.setdefault(kind, []).append(update_bandwidth(total, float(nbytes), launch))
    for kind, bws in by_kind.items():
        rates.setdefault(kind, {})["mem_bw_bytes_per_s"] = float(np.median(bws))


def with_profile(graph: OpGraph, cluster: Any, profile: str | os.PathLike | Mapping[str, Any] | None, *, device_map: Mapping[str, str] | str | None = None) -> tuple[OpGraph, Any]:
    """``--profile`` in one call: the profiled graph and the calibrated cluster (both unchanged if None)."""
    if profile is None:
        return graph, cluster
    source = os.fspath(profile) if not isinstance(profile, Mapping) else "profile"
    doc = load_profile(profile) if not isinstance(profile, Mapping) else profile
    if isinstance(profile, Mapping):
        check_profile(doc)
    return apply_profile(graph, doc, source=source), calibrate_cluster(cluster, doc, graph=graph, device_map=device_map)



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


# The method stays on the data class (its documented API) but is defined here, with its owner.
Cluster.with_profile = cluster_with_profile  # type: ignore[attr-defined]

