"""A model's own ``torch.autograd.Function`` s under capture: their backward must be their forward's gradient.

``torch.export`` traces such a function's forward into the program's ops and keeps nothing of its backward (strict
export even runs it without gradients), so the backward of a placed program is autograd's of the forward's ops. Where
the function's backward is that gradient written by hand (BLOOM's GELU, for speed or memory), nothing changes; where
it is not (a gradient reversal, a straight-through estimator's rounding, a derivative bounded near zero), the placed
program would train on other gradients, silently.

:func:`functions_noted` notes each such function applied while the model is traced; :func:`custom_functions_refusal`
then runs the model once on the example inputs (no gradient of the model, its buffers and the random state put back)
and, at the first calls of each noted function, compares its backward with autograd's gradient of its forward run as
plain ops, on those calls' own inputs and one random output gradient: one line refusing the model where they differ.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map  # noqa: PLC2701 (torch has no public pytree module)

#: The calls of each function compared (its first ones): enough for a layer applied in every block.
CALLS_CHECKED = 2
#: How far apart (relative, in norm) a function's backward and its forward's gradient may be: float32 rounding of two
#: ways of writing one derivative, far below what a different gradient gives.
TOLERANCE = 1e-3


#: The functions whose backward agreed with their forward's gradient in this process (checked once each).
AGREED: "weakref.WeakSet[type]" = weakref.WeakSet()


def _torch_s_own(cls: type) -> bool:
    """A function of torch itself (``torch.utils.checkpoint``'s): its backward is the forward's gradient."""
    module = getattr(cls, "__module__", "") or ""
    return module == "torch" or module.startswith(("torch.", "functorch"))


def _patched_apply(hook: Any) -> contextlib.AbstractContextManager:
    """``torch.autograd.Function.apply`` as ``hook(apply, cls, *args, **kwargs)`` in this thread through the block."""

    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        apply = torch.autograd.Function.__dict__["apply"]
        me = threading.get_ident()

        def call(cls: type, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != me or _torch_s_own(cls):
                return apply.__func__(cls, *args, **kwargs)
            return hook(apply.__func__, cls, *args, **kwargs)

        torch.autograd.Function.apply = classmethod(call)
        try:
            yield
        finally:
            torch.autograd.Function.apply = apply

    return patched()


def functions_noted(functions: dict[type, str]) -> contextlib.AbstractContextManager:
    """Note in ``functions`` each ``torch.autograd.Function`` of the model's own (not torch's) that its forward
    applies in this thread through the block, with the model's line of its first call; each still runs as it would."""
    from graphs.export import user_line

    def hook(apply: Any, cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls not in functions:
            functions[cls] = user_line([(f.filename, f.lineno) for f in traceback.extract_stack()[:-2]])
        return apply(cls, *args, **kwargs)

    return _patched_apply(hook)


class _Context:
    """What a function's ``forward(ctx, ...)`` may ask of its context, run outside autograd's machinery."""

    def __init__(self, needs: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs
        self.saved_tensors: tuple = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def _floats(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def gradient_gap(cls: Any, args: tuple, kwargs: dict) -> float | None:
    """How far apart, relative in norm, ``cls``'s backward and autograd's gradient of its forward (as plain ops) are
    on ``args`` for one random gradient of its floating outputs: 0 where equal; None where nothing is compared (no
    floating input or output)."""
    inputs = [a.detach().clone().requires_grad_(True) if _is_float(a) else a for a in args]
    leaves = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
    if not leaves:
        return None
    seed = int(torch.randint(0, 2**31 - 1, ()).item())

    def grads(run: Any) -> list[torch.Tensor] | None:
        with _random_kept(), torch.enable_grad():
            torch.manual_seed(seed)  # the same dropout, if any, both ways
            fresh = [a.detach().clone().requires_grad_(True) if _is_float(a) else a for a in inputs]
            outs = _floats(run(fresh))
            if not outs:
                return None
            torch.manual_seed(seed + 1)
            weights = [torch.randn_like(o) for o in outs]
            wanted = [o for o in outs if o.requires_grad]
            taken = [a for a in fresh if isinstance(a, torch.Tensor) and a.requires_grad]
            if not wanted:
                return [torch.zeros_like(a) for a in taken]
            got = torch.autograd.grad(
                wanted, taken, [w for o, w in zip(outs, weights) if o.requires_grad], allow_unused=True
            )
            return [torch.zeros_like(a) if g is None else g for a, g in zip(taken, got)]

    def plain(fresh: list) -> Any:
        if _has_setup_context(cls):
            return cls.forward(*fresh, **kwargs)
        needs = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in fresh)
        return cls.forward(_Context(needs), *fresh, **kwargs)

    own = grads(lambda fresh: cls.apply(*fresh, **kwargs))
    traced = grads(plain)
    if own is None or traced is None:
        return None
    gap = 0.0
    for a, b in zip(own, traced):
        scale = max(float(a.double().norm()), float(b.double().norm()), 1e-12)
        gap = max(gap, float((a.double() - b.double()).norm()) / scale)
    return gap


def _random_kept() -> contextlib.AbstractContextManager:
    """The random state put back after the block: the CPU's, and each CUDA device's where CUDA is in use."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else [])


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def _has_setup_context(cls: Any) -> bool:
    """Whether ``cls`` separates ``setup_context`` from its ``forward`` (which then takes no context)."""
    return cls.setup_context is not torch.autograd.Function.setup_context


def custom_functions_refusal(model: torch.nn.Module, inputs: tuple, functions: dict[type, str]) -> str:
    """The line refusing ``model`` where a function of ``functions`` (:func:`functions_noted`) has a backward that is
    not its forward's gradient at its first calls on ``inputs`` (module doc); "" where each agrees, or none was
    called. ``model`` is run once without its gradient, on copies of ``inputs``; its buffers and the random state
    are put back."""
    functions = {cls: where for cls, where in functions.items() if cls not in AGREED}
    if not functions:  # each checked already in this process (another export of the model: a microbatch's size)
        return ""
    gaps: dict[type, float] = {}
    seen: dict[type, int] = {}

    def hook(apply: Any, cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls in functions and seen.get(cls, 0) < CALLS_CHECKED:
            seen[cls] = seen.get(cls, 0) + 1
            try:
                gap = gradient_gap(cls, args, kwargs)
            except Exception:  # its forward cannot run outside autograd's machinery: judged by what it does
                gap = None
            if gap is not None:
                gaps[cls] = max(gaps.get(cls, 0.0), gap)
        return apply(cls, *args, **kwargs)

    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    inputs = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs)  # a write stays here
    try:
        with _random_kept(), torch.no_grad(), _patched_apply(hook):
            model(*inputs)
    except Exception:  # the program was captured; a model that cannot run eagerly here is judged by what was seen
        pass
    finally:
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)
    AGREED.update(cls for cls, gap in gaps.items() if gap <= TOLERANCE)
    for cls, gap in gaps.items():
        if gap > TOLERANCE:
            name = getattr(cls, "__qualname__", cls.__name__)
            where = functions.get(cls, "")
            return (
                f"capture failed: the forward applies {name}, a torch.autograd.Function"
                f"{f' (at {where})' if where else ''} whose backward is not its forward's gradient ({gap:.0%} apart "
                "on the example inputs): torch.export keeps its forward and drops its backward, so a placed "
                f"program would train on other gradients than {name}.backward's; placer cannot place this model"
            )
    return ""
