"""Random draws held at their likeliest values, so that a step that draws (dropout, drop path, a sampled mask) can
be compared with another run of it.

A check compares a placed step with the one-process step (:mod:`envs.real.conformance`), and
:func:`envs.real.pipeline.batch_mixing` compares a whole batch's step with its microbatches'. Each run of a step
that draws random numbers draws its own, so such steps could not be compared: the check said ``UNCHECKED`` for
every model with dropout in training. Under :func:`fixed_draws` the random ops torch runs (below autograd, as
a ``TorchDispatchMode``: the model's eager ops and a placed program's alike) return, instead of a draw, the
value a draw most likely takes, the same for every run and for every sample of a batch however it is split:

- dropout keeps every unit, scaled by ``1 / (1 - p)`` as kept units are (its mask all ones, so its backward is
  the same scaling); ``scaled_dot_product_attention`` runs its math, whose dropout is such an op (a fused kernel
  would draw its mask inside);
- ``bernoulli`` is 1 where its probability is at least 0.5 (drop path keeps every path), else 0;
- ``rand``/``uniform`` the middle of their range, ``randn``/``normal`` their mean, ``exponential`` its median
  (Gumbel-softmax's noise then a constant), ``randint`` its low end, ``randperm`` the identity, ``multinomial``
  the likeliest classes.

What the step computes is then a deterministic function of its inputs that runs every op of the step but the
draws, which is what a check of a placement can compare. Other random ops (``poisson``, ``cauchy_``, an RNN's
own dropout) still draw: a caller sees the RNG state move and says the step is unchecked.

>>> import torch
>>> with fixed_draws() as fixed:
...     y = torch.nn.functional.dropout(torch.ones(2, 2), p=0.5)
>>> y.tolist(), bool(fixed)
([[2.0, 2.0], [2.0, 2.0]], True)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701 (torch has no public dispatch-mode module)

aten = torch.ops.aten


def _factory(kwargs: dict) -> dict:
    """A factory op's dtype/layout/device keywords, without its generator."""
    return {k: v for k, v in kwargs.items() if k in ("dtype", "layout", "device", "pin_memory") and v is not None}


def _like(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k in ("dtype", "layout", "device", "memory_format") and v is not None}


def _dropout(x: torch.Tensor, p: float, train: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.ones_like(x, dtype=torch.bool)
    if train is False or p == 0:
        return x.clone(), mask
    return (x * 0.0 if p >= 1 else x * (1.0 / (1.0 - p))), mask


def _bernoulli(x: torch.Tensor, p: Any = None) -> torch.Tensor:
    probs = x if p is None else p
    if isinstance(probs, torch.Tensor):
        return (probs >= 0.5).to(x.dtype).expand_as(x).clone()
    return torch.full_like(x, 1.0 if probs >= 0.5 else 0.0)


def _multinomial(probs: torch.Tensor, n: int, replacement: bool = False) -> torch.Tensor:
    if replacement:
        top = probs.argmax(-1, keepdim=True)
        return top.expand(*probs.shape[:-1], n).clone()
    return probs.topk(n, dim=-1).indices


#: For each random op handled (by its packet and overload names), its likeliest value from ``(args, kwargs)``.
_HANDLERS: dict[tuple[str, str], Callable[[tuple, dict], Any]] = {
    ("native_dropout", "default"): lambda a, k: _dropout(*a, **k),
    ("bernoulli", "default"): lambda a, k: _bernoulli(a[0]),
    ("bernoulli", "p"): lambda a, k: _bernoulli(a[0], a[1] if len(a) > 1 else k.get("p", 0.5)),
    ("bernoulli", "Tensor"): lambda a, k: _bernoulli(a[0], a[1] if len(a) > 1 else k["p"]),
    ("bernoulli_", "float"): lambda a, k: a[0].copy_(_bernoulli(a[0], a[1] if len(a) > 1 else k.get("p", 0.5))),
    ("bernoulli_", "Tensor"): lambda a, k: a[0].copy_(_bernoulli(a[0], a[1] if len(a) > 1 else k["p"])),
    ("rand", "default"): lambda a, k: torch.full(a[0], 0.5, **_factory(k)),
    ("rand", "generator"): lambda a, k: torch.full(a[0], 0.5, **_factory(k)),
    ("rand_like", "default"): lambda a, k: torch.full_like(a[0], 0.5, **_like(k)),
    ("rand_like", "generator"): lambda a, k: torch.full_like(a[0], 0.5, **_like(k)),
    ("uniform", "default"): lambda a, k: torch.full_like(a[0], _middle(a, k)),
    ("uniform_", "default"): lambda a, k: a[0].fill_(_middle(a, k)),
    ("randn", "default"): lambda a, k: torch.zeros(a[0], **_factory(k)),
    ("randn", "generator"): lambda a, k: torch.zeros(a[0], **_factory(k)),
    ("randn_like", "default"): lambda a, k: torch.zeros_like(a[0], **_like(k)),
    ("randn_like", "generator"): lambda a, k: torch.zeros_like(a[0], **_like(k)),
    ("normal", "Tensor_float"): lambda a, k: a[0].clone(),
    ("normal", "float_Tensor"): lambda a, k: torch.full_like(a[1], float(a[0])),
    ("normal", "Tensor_Tensor"): lambda a, k: (a[0] + torch.zeros_like(a[1])).clone(),
    ("normal", "float_float"): lambda a, k: torch.full(a[2], float(a[0]), **_factory(k)),
    ("normal_", "default"): lambda a, k: a[0].fill_(float(a[1]) if len(a) > 1 else float(k.get("mean", 0.0))),
    ("randint", "default"): lambda a, k: torch.zeros(a[1], **{"dtype": torch.int64, **_factory(k)}),
    ("randint", "generator"): lambda a, k: torch.zeros(a[1], **{"dtype": torch.int64, **_factory(k)}),
    ("randint", "low"): lambda a, k: torch.full(a[2], a[0], **{"dtype": torch.int64, **_factory(k)}),
    ("randint", "low_generator"): lambda a, k: torch.full(a[2], a[0], **{"dtype": torch.int64, **_factory(k)}),
    ("randint_like", "default"): lambda a, k: torch.zeros_like(a[0], **_like(k)),
    ("randint_like", "low_dtype"): lambda a, k: torch.full_like(a[0], a[1], **_like(k)),
    ("randperm", "default"): lambda a, k: torch.arange(a[0], **{"dtype": torch.int64, **_factory(k)}),
    ("randperm", "generator"): lambda a, k: torch.arange(a[0], **{"dtype": torch.int64, **_factory(k)}),
    ("multinomial", "default"): lambda a, k: _multinomial(*a, **{n: v for n, v in k.items() if n != "generator"}),
    ("exponential", "default"): lambda a, k: torch.full_like(a[0], _median_exponential(a, k)),
    ("exponential_", "default"): lambda a, k: a[0].fill_(_median_exponential(a, k)),
}


def _median_exponential(args: tuple, kwargs: dict) -> float:
    """An exponential draw's median, ``ln 2 / lambd`` (its mode, 0, would make Gumbel noise infinite)."""
    return math.log(2.0) / float(args[1] if len(args) > 1 else kwargs.get("lambd", 1.0))


def _middle(args: tuple, kwargs: dict) -> float:
    low = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
    high = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
    return (float(low) + float(high)) / 2


def _without_generator(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k != "generator"}


class FixedDraws(TorchDispatchMode):
    """The dispatch mode of :func:`fixed_draws`; ``fixed``: the names of the random ops it held fixed."""

    def __init__(self, fixed: set[str] | None = None) -> None:
        super().__init__()
        self.fixed: set[str] = set() if fixed is None else fixed

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        handler = _HANDLERS.get((name, func._overloadname))
        if handler is not None:
            self.fixed.add(name)
            return handler(args, _without_generator(kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def fixed_draws() -> Iterator[set[str]]:
    """Within the block, random ops return their likeliest values (the module doc); yields the set of the names of
    those it held fixed, filled as the block runs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from graphs.custom_functions import around_kept_calls

    mode = FixedDraws()
    # attention by its math (its dropout a dropout op, held as the others): a fused kernel draws its own mask inside,
    # and may be chosen for one run and not another (the float64 reference's and a placed program's); and the ops of
    # a model's own autograd.Function, kept whole in a placed program as one op, held too (the mode does not see the
    # ops an op runs inside)
    with sdpa_kernel([SDPBackend.MATH]), mode, around_kept_calls(lambda: FixedDraws(mode.fixed)):
        yield mode.fixed


__all__ = ["FixedDraws", "fixed_draws"]
