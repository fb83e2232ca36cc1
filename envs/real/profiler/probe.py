"""Probing a training step on the host: per-op seconds between timestamps, and what probing costs.

:func:`profile_in_context` runs real training steps of a program with every op
on the CPU, as :func:`envs.real.timing.train_step` runs a placed module, and
charges the time between consecutive probes (a timestamp after each forward op, a
pre-hook on each autograd node) to the op that owns it. The machinery here
(:class:`Probes`, the probed twin of a placed program, interval attribution and
the probe-cost correction) is shared with :mod:`envs.real.profiler.device`;
:mod:`envs.real.profiler.op_timing` times one call or one op alone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten  # noqa: PLC2701 (torch has no public pytree module)

from envs.real.placing import place_module
from envs.real.timing import adam, default_loss
from graphs import OpGraph, PlacerError


def attribute_intervals(owners: Sequence[int], seconds: Sequence[float], num_ops: int) -> tuple[np.ndarray, np.ndarray]:
    """Seconds and interval counts per owner: index 0 is "outside the graph" (owner -1), op ``i`` is ``i + 1``.

    A probed run is cut into consecutive intervals at its probes (a timestamp after
    each forward op, a pre-hook on each autograd node), so the intervals partition
    the phase's wall time and each holds exactly one probe.

    >>> t, n = attribute_intervals([-1, 0, 1, 0], [1.0, 2.0, 3.0, 4.0], 2)
    >>> t.tolist(), n.tolist()
    ([1.0, 6.0, 3.0], [1, 2, 1])
    """
    slots = np.asarray(owners, dtype=np.int64) + 1
    return np.bincount(slots, weights=np.asarray(seconds, dtype=np.float64), minlength=num_ops + 1), np.bincount(
        slots, minlength=num_ops + 1
    )


def backward_intervals(
    start_s: float, hooks: Sequence[tuple[int, float]], end_s: float
) -> tuple[list[int], np.ndarray]:
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
    >>> scale_to(np.array([1.0, 3.0]), 40.0, limit=np.inf)[1]  # a GPU's issue times: the clean phase always wins
    10.0
    """
    total = float(np.sum(per_owner_s))
    factor = total_s / total if total > 0 and total_s > 0 else 1.0
    if not 1.0 / limit <= factor <= limit:
        factor = 1.0
    return np.asarray(per_owner_s, dtype=np.float64) * factor, float(factor)


def grad_fns(values: Any) -> list:
    """The autograd nodes that produced the tensors in ``values`` (now: an in-place op may replace one later)."""
    return [t.grad_fn for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def autograd_nodes(heads: list, seen: dict) -> list:
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
    if clock == "auto":
        clock = "thread" if torch.get_num_threads() == 1 else "wall"
    if clock == "thread":
        return "thread", time.thread_time
    if clock == "wall":
        return "wall", time.perf_counter
    raise PlacerError(f"clock must be 'auto', 'thread' or 'wall', not {clock!r}")


class Probes:
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
        self.heads.append(grad_fns(out))  # the graph is walked after the forward, not inside it
        self.resume = self.clock()

    def hook(self, fns: list, owner: int) -> None:
        events, clock = self.bwd, self.clock

        def pre(_grads: Any) -> None:
            events.append((owner, clock()))

        self.handles.extend(fn.register_prehook(pre) for fn in fns)

    def hook_all(self, loss: Any) -> None:
        """Before backward: hook every node, owned by the first op (in forward order) whose outputs reach it."""
        for op, heads in zip(self.fwd_owner, self.heads):
            self.hook(autograd_nodes(heads, self.seen), op)
        self.hook(autograd_nodes(grad_fns(loss), self.seen), -1)  # the loss's own nodes

    def unhook(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _probed(target: Callable[..., Any], op: int, current: list) -> Callable[..., Any]:
    """``target`` reporting to ``current[0]`` (a :class:`Probes`) after each call."""

    def probed(*args: Any, **kwargs: Any) -> Any:
        out = target(*args, **kwargs)
        current[0].done(op, out)
        return out

    probed.__name__ = f"probed_{getattr(target, '__name__', 'op')}"
    return probed


def probe_costs(
    *, calls: int = 2000, nodes: int = 100, trials: int = 15, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, float]:
    """Seconds one forward probe and one backward pre-hook add to the interval they sit in.

    The forward: the median interval a probe records around a trivial function
    called ``calls`` times in a loop, less the same loop's fastest time per call
    unprobed (walking the outputs happens between intervals, so it does not count).
    The backward: a backward through a chain of ``nodes`` autograd nodes, all hooked
    minus none, per node. Each the fastest of ``trials`` (a busy machine only adds time).
    """
    x = torch.zeros(1)

    def plain(t: Any) -> Any:
        return t

    current = [Probes(clock)]
    probed = _probed(plain, 0, current)
    plain_s, probed_s, times = [], [], {False: [], True: []}
    for _ in range(trials):
        t0 = clock()
        for _ in range(calls):
            plain(x)
        plain_s.append((clock() - t0) / calls)
        current[0] = Probes(clock)
        for _ in range(calls):
            probed(x)
        probed_s.append(float(np.median(current[0].fwd_s[1:])))
        for hooked in (False, True):
            leaf = torch.zeros(1, requires_grad=True)
            y = leaf
            for _ in range(nodes):
                y = y * 1.0
            pr = Probes(clock)
            if hooked:
                pr.hook(autograd_nodes(grad_fns(y), pr.seen), 0)
            t0 = clock()
            y.backward()
            times[hooked].append(clock() - t0)
            pr.unhook()
    fwd = min(probed_s) - min(plain_s)
    bwd = (min(times[True]) - min(times[False])) / (nodes + 1)
    return max(fwd, 0.0), max(bwd, 0.0)


@contextlib.contextmanager
def restoring(ep: Any):
    """Training steps on ``ep``'s own tensors, put back afterwards (the profile must not train the model)."""
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


def probed_program(
    ep: Any, graph: OpGraph, torch_device: Any, inputs: Sequence[Any] | None, lr: float, current: list
) -> tuple:
    """``(module, probed twin, inputs on torch_device, Adam)``: ``ep`` with every op on ``torch_device``, and a twin
    whose every op reports to ``current[0]`` after it ran (:func:`_probed`; it shares the module's parameters and
    buffers)."""
    gm = place_module(ep, {name: "d:0" for name in graph.names}, {"d:0": str(torch_device)})
    if inputs is None:
        example = [
            p.meta["val"]
            for p in ep.graph.nodes
            if p.op == "placeholder" and p.name in set(ep.graph_signature.user_inputs)
        ]
        inputs = concrete_inputs(ep, example)
    inputs = tuple(t.to(torch_device) if isinstance(t, torch.Tensor) else t for t in inputs)
    probed_graph = fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        new = probed_graph.node_copy(node, lambda a: env[a])
        if node.op == "call_function":  # nodes the export added (buffer write-backs) count as "outside"
            new.target = _probed(node.target, graph.index.get(node.name, -1), current)
        env[node] = new
    return gm, fx.GraphModule(gm, probed_graph), inputs, adam(gm.parameters(), lr=lr)


def concrete_inputs(ep: Any, example: list) -> list:
    """Inputs for the reference run: the captured example inputs if kept, else random ones of their shapes."""
    stored = getattr(ep, "example_inputs", None)
    if stored is not None and stored[0]:
        return list(stored[0])
    out = []
    for v in example:
        if v.is_floating_point() or v.is_complex():
            out.append(torch.randn(tuple(v.shape), dtype=v.dtype))
        else:
            out.append(torch.zeros(tuple(v.shape), dtype=v.dtype))
    return out


def _param_bytes(gm: Any) -> int:
    """Bytes of ``gm``'s parameters that take a gradient: what the optimizer step updates (a frozen one it skips)."""
    return int(sum(p.numel() * p.element_size() for p in gm.parameters() if p.requires_grad))


def _phases(med: Mapping[str, float]) -> dict[str, float]:
    """A step's phase medians under the names a profile gives them."""
    return {
        "zero_grad": med["zero"],
        "forward": med["fwd"],
        "loss": med["loss"],
        "backward": med["bwd"],
        "optimizer": med["opt"],
    }


def host_probed_step(
    probed_gm: Any,
    inputs: tuple,
    opt: Any,
    current: list,
    clock: Callable[[], float],
    sync: Callable[[], None] = lambda: None,
) -> tuple:
    """One training step of the probed module with host stamps: ``(probes, tail, backward start, backward end)``.

    ``tail`` is the time from the last forward op to the module's return; ``sync``
    waits for the device before the step and after it (a GPU: so no earlier work
    is still queued when the stamps start).
    """
    opt.zero_grad(set_to_none=True)
    sync()
    pr = current[0] = Probes(clock)
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


def profile_in_context(
    ep: Any,
    graph: OpGraph,
    device: str = "cpu",
    *,
    warmup: int = 2,
    repeats: int = 5,
    inputs: Sequence[Any] | None = None,
    lr: float = 1e-3,
    clock: str = "auto",
) -> dict[str, Any]:
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
    torch_device = torch.device(device)
    if torch_device.type != "cpu":
        raise PlacerError(f"in-context profiling times host ops only, not {device}")
    with restoring(ep):
        return _in_context(ep, graph, torch_device, warmup, repeats, inputs, lr, clock)


def _in_context(
    ep: Any,
    graph: OpGraph,
    torch_device: Any,
    warmup: int,
    repeats: int,
    inputs: Sequence[Any] | None,
    lr: float,
    clock_name: str,
) -> dict[str, Any]:
    n = graph.num_ops
    clock_name, clock = host_clock(clock_name)
    current = [Probes(clock)]
    gm, probed_gm, inputs, opt = probed_program(ep, graph, torch_device, inputs, lr, current)

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
        pr, tail, b0, b1 = host_probed_step(probed_gm, inputs, opt, current, clock)
        if k >= warmup:
            f_s, fwd_counts = attribute_intervals(pr.fwd_owner + [-1], pr.fwd_s + [tail], n)
            b_s, bwd_counts = attribute_intervals(*backward_intervals(b0, pr.bwd, b1), n)
            fwd_rows.append(f_s)
            bwd_rows.append(b_s)
    current[0] = Probes(clock)
    fwd_probe_s, bwd_probe_s = probe_costs(clock=clock)
    med = {key: float(np.median(v)) for key, v in clean.items()}
    fwd = remove_probe_cost(np.median(fwd_rows, axis=0), fwd_counts, fwd_probe_s)
    bwd = remove_probe_cost(np.median(bwd_rows, axis=0), bwd_counts, bwd_probe_s)
    fwd, f_scale = scale_to(fwd, med["fwd"])
    bwd, b_scale = scale_to(bwd, med["bwd"])
    return profile_entry(
        gm,
        (fwd, bwd),
        med,
        update_s=med["opt"],
        overhead_s=float(fwd[0] + bwd[0] + med["zero"] + med["loss"]),
        probe_s={"forward": fwd_probe_s, "backward": bwd_probe_s},
        scale={"forward": f_scale, "backward": b_scale},
        clock=clock_name,
    )


def profile_entry(
    gm: Any,
    times: tuple[np.ndarray, np.ndarray],
    med: Mapping[str, float],
    *,
    update_s: float,
    overhead_s: float,
    probe_s: dict[str, float],
    scale: dict[str, float],
    clock: str,
    issue: tuple[np.ndarray, np.ndarray] | None = None,
    device_med: Mapping[str, float] | None = None,
    outside_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A device's entry of a profile, in context: per-op ``fwd_s``/``bwd_s`` (index 0 of each array: outside the ops)
    and, for an asynchronous device, ``issue_fwd_s``/``issue_bwd_s``; the step's phases and what was taken off."""
    entry: dict[str, Any] = {"fwd_s": [float(x) for x in times[0][1:]], "bwd_s": [float(x) for x in times[1][1:]]}
    if issue is not None:
        entry.update(issue_fwd_s=[float(x) for x in issue[0][1:]], issue_bwd_s=[float(x) for x in issue[1][1:]])
    entry.update(
        update_s=update_s,
        update_bytes=_param_bytes(gm),
        overhead_s=overhead_s,
        step_s=med["step"],
        phases_s=_phases(med),
    )
    if device_med is not None:
        entry["device_phases_s"] = _phases(device_med)
    if outside_s is not None:
        entry["outside_s"] = outside_s
    entry.update(probe_s=probe_s, scale=scale, clock=clock)
    return entry
