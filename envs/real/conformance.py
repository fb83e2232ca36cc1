"""The conformance check: a step's loss and gradients against the float64 one-process step, at float32's tolerance.

:func:`reference` runs the model once in float64 on the CPU (the exact answer, up
to float64's rounding) and once as it is (float32): the unplaced step's own error
on each tensor is what float32 costs. :func:`compare` checks a step computed some
other way (a placed module, a plan across processes): each tensor's relative error
(``||x - ref|| / ||ref||``) must be within :data:`FACTOR` times the unplaced float32
step's error on the same tensor, or under :data:`FLOOR`: running a plan must not cost
more accuracy than float32 itself does. ``bench/conformance.py`` runs it over the
conformance corpus, ``placer run --check`` on one model.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701 (torch has no public dispatch-mode module)

from envs.real import fixed_draws as fixed_draws_module
from envs.real.compared import float64_cpu
from envs.real.fixed_draws import fixed_draws

#: A placed step's relative error may be this many times the unplaced float32 step's ...
FACTOR = 10.0
#: ... or under this, whichever is larger (float32's epsilon is 1.2e-7).
FLOOR = 1e-5


@dataclass
class Reference:
    """The float64 step (loss, gradients) and the unplaced float32 step's relative errors against it."""

    loss: float
    grads: dict[str, torch.Tensor]
    plain_errors: dict[str, float] = field(default_factory=dict)  # "loss" and each parameter name
    floor: float = 0.0  # norms below this count as this (gradients that are 0 in exact arithmetic)
    #: The step draws random numbers that :func:`envs.real.fixed_draws.fixed_draws` does not hold fixed (a Poisson
    #: draw, an RNN's own dropout): the float64 and float32 steps, and a plan's, each drew their own, so the
    #: comparison has no verdict (:data:`DRAWS`).
    draws: bool = False
    #: The random ops held at their likeliest values in the steps compared (dropout, ``bernoulli``: the check's
    #: steps all keep every unit), sorted; empty: the step draws nothing.
    fixed: list[str] = field(default_factory=list)
    #: Over 1: the steps are gradient accumulation over this many microbatches (:func:`reference`).
    microbatches: int = 1
    #: Why there is no reference (:func:`checked_reference`: the model's float64 copy failed), else "": no verdict.
    unchecked: str = ""
    #: Every buffer after the float64 step (:func:`model_buffers`: batch norm's running statistics, spectral norm's
    #: vectors, as the step left them), and the norm below which a buffer's error counts against this floor.
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    buffer_floor: float = 0.0


#: What a check of a step that draws random numbers says instead of a verdict.
DRAWS = (
    "the step draws random numbers that the check cannot hold fixed (a Poisson or Cauchy draw, an RNN's own "
    "dropout), so the steps compared drew different ones; check with them off"
)

#: What a check of a step whose draws were held fixed adds to its verdict.
FIXED = "random draws held at their likeliest values: dropout keeps every unit"


def _wide(t: torch.Tensor) -> torch.Tensor:
    """A floating tensor in float64 and a complex one in complex128 (a spectral layer's weights: a Fourier neural
    operator's); any other as it is."""
    if t.is_complex():
        return t.to(torch.complex128)
    return t.double() if t.is_floating_point() else t


def _float64(value: Any) -> Any:
    return _wide(value) if isinstance(value, torch.Tensor) else value


def parameter_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient under each of its names (tied ones under all), as float64 on the CPU
    (:func:`float64_cpu`)."""
    return {k: float64_cpu(p.grad) for k, p in model.named_parameters(remove_duplicate=False) if p.grad is not None}


def model_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every buffer of ``model`` under each of its names, as float64 on the CPU (a count too: compared as a number;
    a complex one as its two parts, :func:`float64_cpu`)."""
    return {k: float64_cpu(b) for k, b in model.named_buffers(remove_duplicate=False)}


def _eager_experts(model: nn.Module) -> nn.Module:
    """Mixture-of-experts layers of transformers run their plain loop: ``torch._grouped_mm`` has no float64 kernel."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_experts_implementation", None) not in (None, "eager"):
            config._experts_implementation = "eager"
    return model


def _held_float64(model: nn.Module) -> nn.Module:
    """The floating (and complex) tensors ``model``'s modules hold as plain attributes (neither parameters nor
    buffers: TabNet's group matrix) in float64 (complex128) too, as ``double()`` leaves them in float32 (the float64
    copy's matmuls would mix)."""
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
                setattr(module, name, _wide(value))
    return model


def _double(model: nn.Module) -> nn.Module:
    """``model.double()``, its complex parameters and buffers in complex128 too (``double()`` casts floating ones
    only: a Fourier layer's complex64 weights would meet complex128 spectra)."""
    model.double()
    return model._apply(lambda t: t.to(torch.complex128) if t.is_complex() else t)  # noqa: SLF001 (as double() does)


@contextlib.contextmanager
def float64_by_default() -> Iterator[None]:
    """``torch.get_default_dtype()`` is float64 through the block (the float64 reference's forward): a floating
    tensor the model's code makes without a dtype (``torch.zeros(batch, hidden)``, an RNN's first state) is float64
    like the copy's weights, where it would be float32 and fail the first matmul with them. The default again after.

    >>> with float64_by_default():
    ...     torch.zeros(1).dtype
    torch.float64
    >>> torch.zeros(1).dtype == torch.get_default_dtype()
    True
    """
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(was)


#: The dtype the float64 copy runs an op in where the model asks for a narrower floating one (:func:`widened`).
_WIDER = {
    torch.float32: torch.float64,
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.complex32: torch.complex128,
    torch.complex64: torch.complex128,
}


class _Widened(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if kwargs.get("dtype") in _WIDER:
            kwargs = {**kwargs, "dtype": _WIDER[kwargs["dtype"]]}
        return func(*args, **kwargs)


@contextlib.contextmanager
def widened() -> Iterator[None]:
    """Through the block (the float64 reference's step), an op asked for a narrower floating dtype gets float64
    (complex128 for a complex one): ``x.float()`` (a spectral layer's, a norm's computed "in float32"), a softmax
    in float32, ``torch.eye(n, dtype=torch.float32)``. The model asks for float32 because it runs in something
    narrower; in the float64 copy such a cast would put float32 rounding into the reference, or mix float32 with
    float64 and fail. Below autograd (a ``TorchDispatchMode``), so the backward's casts follow; a cast to an integer
    dtype, and a reinterpreting view (``view(dtype)``, whose dtype is not a keyword), are left alone.

    >>> with widened():
    ...     torch.ones(2, dtype=torch.float64).float().dtype, torch.eye(2, dtype=torch.float32).dtype
    (torch.float64, torch.float64)
    """
    with _Widened():
        yield


def relative_error(x: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """``||x - ref|| / max(||ref||, floor)`` in float64 (the absolute error where both are 0).

    ``floor`` keeps a gradient that is 0 in exact arithmetic (a key projection's
    bias, which softmax cancels) from dividing rounding noise by rounding noise.

    >>> relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])) < 0.2
    True
    """
    x, ref = float64_cpu(x), float64_cpu(ref)
    scale = max(float(ref.norm()), floor)
    diff = float((x - ref).norm())
    return diff / scale if scale > 0 else diff


def reference(
    model: nn.Module, inputs: tuple, microbatches: int = 1, batch_dim: int = 0, loss_reduction: str = "mean"
) -> Reference:
    """The float64 step of ``model`` on the CPU, and the unplaced float32 step's errors against it.

    ``microbatches`` over 1: both steps are gradient accumulation over the parts of the batch a plan of that many
    microbatches cuts (:func:`envs.real.pipeline.split_batch`; each part's loss weighted by its share of the batch
    for a ``"mean"`` loss), the step such a plan computes where the model's step mixes the samples of its batch
    (:func:`envs.real.pipeline.batch_mixing`); for any other model it is the whole batch's step, to rounding.
    """
    from envs.real.pipeline import part_weights, split_batch

    parts, weights = [tuple(inputs)], [1.0]
    if microbatches > 1:
        parts = split_batch(tuple(inputs), microbatches, batch_dim)
        weights = part_weights(parts, batch_dim, loss_reduction)

    def step(m: nn.Module, cast: Any) -> torch.Tensor:
        total = None
        for part, w in zip(parts, weights):
            loss = m(*[cast(x) for x in part])
            (loss * w if w != 1.0 else loss).backward()
            total = loss.detach() * w if total is None else total + loss.detach() * w
        return total

    m64 = _held_float64(_double(_eager_experts(copy.deepcopy(model))))
    # a tensor the forward makes without a dtype (an RNN's zero state) is float64 too; dropout keeps every unit
    with float64_by_default(), fixed_draws() as fixed64, widened():
        loss64 = step(m64, _float64)
    grads = parameter_grads(m64)
    floor = 1e-6 * max((float(g.norm()) for g in grads.values()), default=0.0)
    ref = Reference(loss64.item(), grads, floor=floor, microbatches=max(1, microbatches))
    ref.buffers = model_buffers(m64)
    ref.buffer_floor = 1e-6 * max((float(b.norm()) for b in ref.buffers.values()), default=0.0)
    m32 = copy.deepcopy(model)
    state = torch.get_rng_state()
    with fixed_draws() as fixed32:
        loss32 = step(m32, lambda x: x)
    ref.draws = not torch.equal(state, torch.get_rng_state())
    ref.fixed = sorted(fixed64 | fixed32)
    ref.plain_errors = {"loss": relative_error(loss32, loss64)}
    ref.plain_errors.update(
        {k: relative_error(g, grads[k], ref.floor) for k, g in parameter_grads(m32).items() if k in grads}
    )
    ref.plain_errors.update(
        {
            k: relative_error(b, ref.buffers[k], ref.buffer_floor)
            for k, b in model_buffers(m32).items()
            if k in ref.buffers and k not in grads
        }
    )
    return ref


def checked_reference(model: nn.Module, inputs: tuple, *args: Any, **kwargs: Any) -> Reference:
    """:func:`reference`, or, where the model's float64 copy (or its float32 step) fails, a :class:`Reference` with
    no numbers whose ``unchecked`` says why, naming the model's line: a plan's check then gives no verdict rather
    than failing the run that was asked to be checked (a forward that makes a float32 tensor outside torch's
    factories, ``torch.from_numpy`` of a float32 array, cannot be multiplied with the float64 copy's activations;
    one it asks torch for in float32 is widened, :func:`widened`).
    """
    import traceback

    from graphs.export import first_line, user_line

    try:
        return reference(model, inputs, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the model's own code, in a copy: any error is its)
        frames = [(f.filename, f.lineno) for f in traceback.extract_tb(e.__traceback__)]
        # the dispatch modes (fixed_draws', widened's here) run every op: never the model's line
        held = {os.path.abspath(fixed_draws_module.__file__), os.path.abspath(__file__)}
        where = user_line([(f, line) for f, line in frames if os.path.abspath(f) not in held])
        at = f" at {where}" if where else ""
        return Reference(
            math.nan,
            {},
            unchecked=(
                f"the model's float64 copy, the check's reference, fails ({type(e).__name__}{at}: {first_line(e)}); "
                "a tensor of a fixed float32 dtype in its forward, say"
            ),
        )


def plan_reference(
    model: nn.Module,
    inputs: tuple,
    microbatches: int = 1,
    loss_reduction: str = "mean",
    *,
    mixes: bool | None = None,
) -> Reference:
    """What a plan of ``microbatches`` is checked against (:func:`checked_reference`): the whole batch's step, or,
    where its microbatches compute another step (``mixes``; None: :func:`envs.real.pipeline.batch_mixing` asks:
    the step mixes the samples of its batch, or its forward updates state the next one reads), gradient
    accumulation over the same microbatches, which is what such a plan computes. ``placer run --check`` across
    ranks and ``bench.conformance`` (which asks ``batch_mixing`` once for all its plans) both."""
    from envs.real.pipeline import batch_mixing

    if microbatches > 1 and mixes is None:
        mixes = batch_mixing(model, inputs, microbatches, loss_reduction=loss_reduction) is not None
    if microbatches > 1 and mixes:
        return checked_reference(model, inputs, microbatches, loss_reduction=loss_reduction)
    return checked_reference(model, inputs)


def compare(
    loss: torch.Tensor,
    grads: Mapping[str, torch.Tensor],
    ref: Reference,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> tuple[bool, float, float, str, float]:
    """``(ok, loss error, largest gradient error, worst tensor, its error / allowed)`` of a placed step.

    ``buffers``: the placed model's buffers after the step (:func:`model_buffers`); each one the reference has is
    held to the same tolerance as a gradient (a batch norm's statistics updated on a stale copy fail), and a
    buffer the plan does not hold (no op of it reads it) is not compared."""
    errors = {"loss": relative_error(loss, torch.tensor(ref.loss, dtype=torch.float64))}
    missing = [k for k in ref.grads if k not in grads]
    if missing:
        return False, errors["loss"], math.inf, f"no gradient for {missing[0]}", math.inf
    errors.update({k: relative_error(grads[k], ref.grads[k], ref.floor) for k in ref.grads})
    for k, b in (buffers or {}).items():
        if k in ref.buffers and k not in errors:
            same = b.shape == ref.buffers[k].shape
            errors[k] = relative_error(b, ref.buffers[k], ref.buffer_floor) if same else math.inf
    ratios = {k: e / max(FACTOR * ref.plain_errors.get(k, 0.0), FLOOR) for k, e in errors.items()}
    worst = max(ratios, key=ratios.__getitem__)
    grad_error = max((e for k, e in errors.items() if k in ref.grads), default=0.0)
    return ratios[worst] <= 1.0, errors["loss"], grad_error, worst, ratios[worst]


def verdict(
    ref: Reference,
    loss: torch.Tensor | None,
    grads: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """A check's report of a placed step against ``ref`` (:func:`compare`): ``{"ok", "worst", ...}``, what
    ``placer run --check`` prints (in one process and across ranks); not ok where the step draws what cannot be held
    (``"draws"``: no verdict, :data:`DRAWS`) or ``ref`` has no numbers (``"unchecked"``: why; ``loss`` unread)."""
    if ref.unchecked or loss is None:
        return {"ok": False, "draws": False, "unchecked": ref.unchecked}
    ok, loss_error, grad_error, worst, ratio = compare(loss, grads, ref, buffers)
    return {
        "ok": bool(ok) and not ref.draws,
        "draws": ref.draws,
        "fixed": ref.fixed,  # the random ops held fixed in the steps compared (dropout)
        "accumulated": ref.microbatches,  # over 1: against gradient accumulation over that many microbatches
        "loss_error": loss_error,
        "grad_error": grad_error,
        "worst": worst,
        "worst_ratio": ratio,
    }


__all__ = [
    "DRAWS",
    "FACTOR",
    "FIXED",
    "FLOOR",
    "Reference",
    "checked_reference",
    "compare",
    "model_buffers",
    "parameter_grads",
    "plan_reference",
    "reference",
    "relative_error",
    "verdict",
]
