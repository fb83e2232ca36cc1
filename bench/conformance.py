"""Conformance: every corpus model, under every kind of plan, computes its float64 loss and gradients.

For one model of :mod:`bench.conformance_corpus`, :func:`check_model` captures it once,
computes a float64 reference (a float64 copy of the model on the CPU) and the
unplaced float32 step's own error against it, then applies each plan of
:data:`PLANS` with :func:`placer.apply` and compares the placed step's loss and
every parameter's gradient with the reference. A plan passes when each tensor's
relative error (``||x - ref|| / ||ref||``) is within :data:`FACTOR` times the
unplaced float32 step's error on the same tensor, or under :data:`FLOOR`:
placing ops must not cost more accuracy than float32 itself does.

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

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from bench.conformance_corpus import build
from envs.cluster import resolve_cluster
from graphs import OpGraph
from graphs.plan import Placement
from graphs.torch_capture import capture
from placer.apply import apply

CLUSTER = "h100x8"
PLANS = ("gpu", "split", "split_m2", "round_robin", "heuristic", "pipe_m2", "pipe_m4", "1f1b")
#: A placed step's relative error may be this many times the unplaced float32 step's ...
FACTOR = 10.0
#: ... or under this, whichever is larger (float32's epsilon is 1.2e-7).
FLOOR = 1e-5


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
    step_time_s: float = math.nan  # median timed step (only when steps are timed)
    seconds: float = 0.0  # wall time of the check

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


@dataclass
class Reference:
    """The float64 step (loss, gradients) and the unplaced float32 step's relative errors against it."""

    loss: float
    grads: dict[str, torch.Tensor]
    plain_errors: dict[str, float] = field(default_factory=dict)  # "loss" and each parameter name
    floor: float = 0.0  # norms below this count as this (gradients that are 0 in exact arithmetic)


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


# ------------------------------------------------------------------ reference
def _float64(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: p.grad.detach().double().cpu()
        for k, p in model.named_parameters(remove_duplicate=False)
        if p.grad is not None
    }


def _eager_experts(model: nn.Module) -> nn.Module:
    """Mixture-of-experts layers of transformers run their plain loop: ``torch._grouped_mm`` has no float64 kernel."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_experts_implementation", None) not in (None, "eager"):
            config._experts_implementation = "eager"
    return model


def relative_error(x: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """``||x - ref|| / max(||ref||, floor)`` in float64 (the absolute error where both are 0).

    ``floor`` keeps a gradient that is 0 in exact arithmetic (a key projection's
    bias, which softmax cancels) from dividing rounding noise by rounding noise.

    >>> relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])) < 0.2
    True
    """
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    scale = max(float(ref.norm()), floor)
    diff = float((x - ref).norm())
    return diff / scale if scale > 0 else diff


def reference(model: nn.Module, inputs: tuple) -> Reference:
    """The float64 step of ``model`` on the CPU, and the unplaced float32 step's errors against it."""
    m64 = _eager_experts(copy.deepcopy(model)).double()
    loss64 = m64(*[_float64(x) for x in inputs])
    loss64.backward()
    grads = _grads(m64)
    ref = Reference(loss64.item(), grads, floor=1e-6 * max((float(g.norm()) for g in grads.values()), default=0.0))
    m32 = copy.deepcopy(model)
    loss32 = m32(*inputs)
    loss32.backward()
    ref.plain_errors = {"loss": relative_error(loss32, loss64)}
    ref.plain_errors.update({k: relative_error(g, grads[k], ref.floor) for k, g in _grads(m32).items() if k in grads})
    return ref


def compare(
    loss: torch.Tensor, grads: Mapping[str, torch.Tensor], ref: Reference
) -> tuple[bool, float, float, str, float]:
    """``(ok, loss error, largest gradient error, worst tensor, its error / allowed)`` of a placed step."""
    errors = {"loss": relative_error(loss, torch.tensor(ref.loss, dtype=torch.float64))}
    missing = [k for k in ref.grads if k not in grads]
    if missing:
        return False, errors["loss"], math.inf, f"no gradient for {missing[0]}", math.inf
    errors.update({k: relative_error(grads[k], ref.grads[k], ref.floor) for k in ref.grads})
    ratios = {k: e / max(FACTOR * ref.plain_errors.get(k, 0.0), FLOOR) for k, e in errors.items()}
    worst = max(ratios, key=ratios.__getitem__)
    grad_error = max((e for k, e in errors.items() if k != "loss"), default=0.0)
    return ratios[worst] <= 1.0, errors["loss"], grad_error, worst, ratios[worst]


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
) -> tuple[bool, float, float, str, float, float]:
    """Apply ``placement`` to a copy of ``model``, check one step against ``ref``, then time ``timed_steps`` steps.

    Returns ``compare``'s tuple plus the median step time (NaN when nothing is timed).
    """
    placed = apply(copy.deepcopy(model), placement, inputs, device_map=device_map, graph=graph)
    loss = placed(*inputs)
    loss.backward()
    check = compare(loss, _grads(placed), ref)
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
    graph = capture(model, inputs, name=name)
    ref = reference(model, inputs)
    rows = []
    for plan_name, placement in plans(graph, names=plan_names).items():
        t0 = time.perf_counter()
        try:
            ok, loss_err, grad_err, worst, ratio, step = run_plan(
                model,
                inputs,
                graph,
                placement,
                ref,
                device_map=device_map,
                timed_steps=timed_steps,
                warmup_steps=warmup_steps,
                synchronize=synchronize,
            )
            rows.append(PlanResult(name, plan_name, ok, loss_err, grad_err, worst, ratio, step_time_s=step))
        except Exception as e:  # a failing plan is a row, with its first line
            text = str(e).strip().splitlines()
            rows.append(
                PlanResult(name, plan_name, False, message=f"{type(e).__name__}: {text[0][:300] if text else ''}")
            )
        rows[-1].seconds = time.perf_counter() - t0
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
        if r.message:
            line = f"| {r.model} | {r.plan} | FAIL | {r.message} | | |"
        else:
            worst = r.worst if len(r.worst) <= 32 else "…" + r.worst[-31:]
            line = (
                f"| {r.model} | {r.plan} | {'ok' if r.ok else 'FAIL'} | {r.loss_error:.1e} | {r.grad_error:.1e} | "
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
