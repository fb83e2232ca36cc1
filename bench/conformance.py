"""Conformance: every corpus model, under every kind of plan, computes its float64 loss and gradients.

For one model of :mod:`graphs.models.corpus`, :func:`check_model` captures it once,
computes a float64 reference (a float64 copy of the model on the CPU) and the
unplaced float32 step's own error against it, then applies each plan of
:data:`PLANS` with :func:`placer.apply` (the first as a user calls it; the rest on one shared export of
the model, :func:`placer.apply.apply_program`) and compares the placed step's loss,
every parameter's gradient and every buffer after the step (batch norm's running statistics) with the reference.
A plan passes when each tensor's
relative error (``||x - ref|| / ||ref||``) is within :data:`FACTOR` times the
unplaced float32 step's error on the same tensor, or under :data:`FLOOR`:
placing ops must not cost more accuracy than float32 itself does. Where the model's step mixes the samples of
its batch (:func:`envs.real.pipeline.batch_mixing`: batch norm in training, a contrastive loss), a plan of M
microbatches computes gradient accumulation's step, not the whole batch's: its reference is then the float64
accumulation over the same M parts (the row's ``against``, "(vs accumulation)" in the table).

The plans (logical devices of :data:`CLUSTER`, ``cpu:0`` + ``gpu:0..7``):

==============  ==================================================================
``gpu``         every op on ``gpu:0``
``split``       the first third of the ops (node order) on the host, the rest on ``gpu:0``
``split_m2``    that split, 2 microbatches
``round_robin`` op ``i`` on ``gpu:(i mod 4)``: a copy on nearly every edge
``heuristic``   ``m_etf``'s placement and its planned issue order
``pipe_m2``     the ops in 8 contiguous blocks on ``gpu:0..7``, 2 microbatches, fill-drain
``pipe_m4``     the same, 4 microbatches, fill-drain
``1f1b``        the same, 4 microbatches, at most 1 in flight (one-forward-one-backward)
==============  ==================================================================

On the CPU every logical device maps to ``cpu`` (``device_map="*=cpu"``), so
every cross-device copy is built; on a GPU machine ``python -m bench.gpu_conformance``
maps the host to ``cpu`` and every logical GPU to ``cuda:0``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from envs.cluster import resolve_cluster
from envs.real.conformance import (  # noqa: F401  (moved there: the product's check; re-exported)
    DRAWS,
    FACTOR,
    FLOOR,
    Reference,
    checked_reference,
    compare,
    model_buffers,
    parameter_grads,
    plan_reference,
    reference,
    relative_error,
)
from envs.real.fixed_draws import fixed_draws
from envs.real.pipeline import batch_mixing, part_failure_of, split_batch
from graphs import OpGraph
from graphs.models.corpus import build
from graphs.plan import Placement
from graphs.torch_capture import capture_program, export_program
from placer.apply import apply, apply_program

CLUSTER = "h100x8"
PLANS = ("gpu", "split", "split_m2", "round_robin", "heuristic", "pipe_m2", "pipe_m4", "1f1b")


@dataclass
class PlanResult:
    """One model under one plan."""

    model: str
    plan: str
    ok: bool
    loss_error: float = math.nan  # relative error of the loss against float64
    grad_error: float = math.nan  # largest relative gradient error over the parameters
    worst: str = ""  # the tensor with the largest error relative to what is allowed
    allowed_ratio: float = math.nan  # that error / what is allowed (<= 1 passes)
    message: str = ""  # why it failed (an exception), else ""
    #: "accumulation": checked against gradient accumulation over the plan's microbatches, as the model's step mixes
    #: the samples of its batch (envs.real.pipeline.batch_mixing), not against the whole batch's step
    against: str = ""
    step_time_s: float = math.nan  # median timed step (only when steps are timed)
    seconds: float = 0.0  # wall time of the check

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


# ------------------------------------------------------------------ plans
def plans(graph: OpGraph, cluster: Any = None, names: Sequence[str] = PLANS) -> dict[str, Placement]:
    """The conformance plans of ``graph`` (see the module docstring), by name."""
    cluster = resolve_cluster(CLUSTER) if cluster is None else cluster
    devices = cluster.device_names
    n = graph.num_ops
    gpu = devices.index("gpu:0")
    third = np.where(np.arange(n) < max(1, n // 3), devices.index("cpu:0"), gpu)
    gpus = [i for i, d in enumerate(devices) if d.startswith("gpu")]
    blocks = np.asarray(gpus)[np.minimum(np.arange(n) * len(gpus) // max(n, 1), len(gpus) - 1)]
    out: dict[str, Placement] = {}
    for name in names:
        if name == "gpu":
            out[name] = Placement.from_indices(graph, devices, np.full(n, gpu))
        elif name == "split":
            out[name] = Placement.from_indices(graph, devices, third)
        elif name == "split_m2":
            out[name] = Placement.from_indices(graph, devices, third, microbatches=2)
        elif name == "round_robin":
            out[name] = Placement.from_indices(graph, devices, np.asarray(gpus[:4])[np.arange(n) % 4])
        elif name == "heuristic":
            from placer.methods.registry import place

            out[name] = place("m_etf", graph, cluster)
        elif name == "pipe_m2":
            out[name] = Placement.from_indices(graph, devices, blocks, microbatches=2)
        elif name == "pipe_m4":
            out[name] = Placement.from_indices(graph, devices, blocks, microbatches=4)
        elif name == "1f1b":
            out[name] = Placement.from_indices(graph, devices, blocks, microbatches=4, inflight=1)
        else:
            raise KeyError(f"unknown plan {name!r} (known: {', '.join(PLANS)})")
    return out


# ------------------------------------------------------------------ running
def run_plan(
    model: nn.Module,
    inputs: tuple,
    graph: OpGraph,
    placement: Placement,
    ref: Reference,
    *,
    device_map: Any = "*=cpu",
    timed_steps: int = 0,
    warmup_steps: int = 1,
    synchronize: Callable[[], None] = lambda: None,
    program: Any = None,
    parts: dict[int, Any] | None = None,
    copied: bool = True,
) -> tuple[bool, float, float, str, float, float]:
    """Apply ``placement`` to a copy of ``model``, check one step against ``ref``, then time ``timed_steps`` steps.

    ``program``: the model's exported program (:func:`graphs.torch_capture.export_program`), copied with the model
    and applied (:func:`placer.apply.apply_program`) instead of exported again; None: :func:`placer.apply` exports.
    ``parts``: with ``program``, M -> its program at a microbatch's size, copied and applied with them likewise.
    ``copied=False``: applied to ``model`` itself (and the programs themselves), whose tensors' values are put back
    afterwards and gradients cleared (:func:`copies_keep_program`).

    Returns ``compare``'s tuple plus the median step time (NaN when nothing is timed).
    """
    if not copied:
        with kept_as_it_was(model):
            return _run_plan(
                model, inputs, graph, placement, ref, device_map, timed_steps, warmup_steps, synchronize, program, parts
            )
    if program is None:
        model = copy.deepcopy(model)
    else:  # a copy of the model and its program together (they share their tensors as the originals do)
        with warnings.catch_warnings():  # torch's own pytree deprecation, raised by copying its tree specs
            warnings.simplefilter("ignore", FutureWarning)
            model, program, parts = copy.deepcopy((model, program, parts or {}))
    return _run_plan(
        model, inputs, graph, placement, ref, device_map, timed_steps, warmup_steps, synchronize, program, parts
    )


def copies_keep_program(model: nn.Module, program: Any) -> bool:
    """Whether a deep copy of ``model`` and its exported ``program`` together is a model and its program (the
    program's tensors the copied model's own), as :func:`run_plan` copies them for each plan. Not for a model whose
    modules pickle themselves anew: e3nn's tensor products pickle the code they generate, and a copy traces it
    again, into fresh tensors and other ops (another graph). Such a model's plans run on the model itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        copied, ep = copy.deepcopy((model, program))
    own = {id(t) for t in (*copied.parameters(), *copied.buffers())}
    return all(id(t) in own for t in ep.state_dict.values())


@contextlib.contextmanager
def kept_as_it_was(model: nn.Module):
    """``model``'s parameters and buffers keep their values through the block, and its parameters end with no
    gradient (a plan applied to the model itself shares its tensors)."""
    saved = [(t, t.detach().clone()) for t in (*model.parameters(), *model.buffers())]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)
        for p in model.parameters():
            p.grad = None


def _run_plan(
    model, inputs, graph, placement, ref, device_map, timed_steps, warmup_steps, synchronize, program, parts
) -> tuple[bool, float, float, str, float, float]:
    if program is None:
        placed = apply(model, placement, inputs, device_map=device_map, graph=graph)
    else:
        placed = apply_program(model, program, placement, inputs, device_map, graph=graph, part_programs=parts)
    with fixed_draws():  # dropout keeps every unit, as in the reference's steps
        loss = placed(*inputs)
        loss.backward()
    check = compare(loss, parameter_grads(placed), ref, model_buffers(placed))
    step = math.nan
    if timed_steps > 0:
        opt = torch.optim.SGD(placed.parameters(), lr=1e-4)
        times = []
        for k in range(warmup_steps + timed_steps):
            synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            placed(*inputs).backward()
            opt.step()
            synchronize()
            if k >= warmup_steps:
                times.append(time.perf_counter() - t0)
        step = statistics.median(times)
    return (*check, step)


def check_model(
    name: str,
    plan_names: Sequence[str] = PLANS,
    *,
    device_map: Any = "*=cpu",
    timed_steps: int = 0,
    warmup_steps: int = 1,
    synchronize: Callable[[], None] = lambda: None,
    built: tuple[nn.Module, tuple] | None = None,
) -> list[PlanResult]:
    """Every plan of ``plan_names`` on corpus model ``name``: one :class:`PlanResult` each (never raises for a plan)."""
    model, inputs = built if built is not None else build(name)
    # one export: the graph's, and the program every plan after the first shares (the first goes through
    # placer.apply as a user calls it); pipelined plans share one program at each microbatch size, exported
    # without the nodes' stack traces as the capture's is (they only name a line in an error of the capture)
    program, graph = capture_program(model, inputs, name=name)
    ref = checked_reference(model, inputs)
    copied = copies_keep_program(model, program)
    rows = []
    parts: dict[int, Any] = {}
    accumulated: dict[int, Any] = {}  # M -> gradient accumulation's reference, where the step mixes its batch
    chosen = plans(graph, names=plan_names)
    split = sorted({p.microbatches for p in chosen.values() if p.microbatches > 1})
    mixes = bool(split) and batch_mixing(model, inputs, split[0]) is not None  # once, at the fewest microbatches
    for k, (plan_name, placement) in enumerate(chosen.items()):
        M = placement.microbatches
        if mixes and M > 1 and M not in accumulated:
            accumulated[M] = plan_reference(model, inputs, M, mixes=True)
        plan_ref = accumulated.get(M) or ref
        if k > 0 and placement.microbatches > 1 and placement.microbatches not in parts:
            with contextlib.suppress(Exception):  # a plan that cannot be cut fails as a row of its own
                parts[placement.microbatches] = export_program(
                    model, split_batch(inputs, placement.microbatches)[0], stack_traces=False
                )
        t0 = time.perf_counter()
        try:
            ok, loss_err, grad_err, worst, ratio, step = run_plan(
                model,
                inputs,
                graph,
                placement,
                plan_ref,
                device_map=device_map,
                timed_steps=timed_steps,
                warmup_steps=warmup_steps,
                synchronize=synchronize,
                program=program if k > 0 else None,
                parts=parts,
                copied=copied,
            )
            rows.append(PlanResult(name, plan_name, ok, loss_err, grad_err, worst, ratio, step_time_s=step))
            rows[-1].against = "accumulation" if plan_ref is not ref else ""
        except Exception as e:  # a failing plan is a row, with its first line (how a failed microbatch was cut)
            text = str(e).strip().splitlines()
            said = part_failure_of(e) or f"{type(e).__name__}: {text[0][:300] if text else ''}"
            rows.append(PlanResult(name, plan_name, False, message=said))
        rows[-1].seconds = time.perf_counter() - t0
        if plan_ref.draws and not rows[-1].message:  # the plan ran; what it computed cannot be compared
            rows[-1].ok, rows[-1].message = False, f"UNCHECKED: {DRAWS}"
        if plan_ref.unchecked and not rows[-1].message:  # the plan ran; there is nothing to compare it with
            rows[-1].ok, rows[-1].message = False, f"UNCHECKED: {plan_ref.unchecked}"
    return rows


def format_rows(rows: Sequence[PlanResult], baseline_plan: str = "gpu") -> list[str]:
    """A Markdown table of ``rows``: errors, pass/fail and, when timed, each plan's step time beside
    ``baseline_plan``'s."""
    timed = any(not math.isnan(r.step_time_s) for r in rows)
    base = {r.model: r.step_time_s for r in rows if r.plan == baseline_plan}
    head = "| model | plan | ok | loss rel. err | worst grad rel. err | worst / allowed |"
    head += " step ms | vs gpu |" if timed else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        plan = f"{r.plan} (vs accumulation)" if r.against else r.plan
        if r.message:
            line = f"| {r.model} | {plan} | FAIL | {r.message} | | |"
        else:
            worst = r.worst if len(r.worst) <= 32 else "…" + r.worst[-31:]
            line = (
                f"| {r.model} | {plan} | {'ok' if r.ok else 'FAIL'} | {r.loss_error:.1e} | {r.grad_error:.1e} | "
                f"{r.allowed_ratio:.2f} ({worst}) |"
            )
        if timed:
            b = base.get(r.model, math.nan)
            line += (
                f" {r.step_time_s * 1e3:.2f} | {r.step_time_s / b:.2f}x |"
                if not math.isnan(r.step_time_s) and b > 0
                else " | |"
            )
        lines.append(line)
    return lines
