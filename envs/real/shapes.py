"""The sizes a placed program takes, checked before it runs: one line where it cannot take a call's inputs.

A program exported with dynamic dimensions names each input dimension by a
number (static: the size it was captured at) or a symbol (dynamic, within a
range). :func:`check_sizes` checks a call's inputs against that, and
:func:`guard_reason` turns a failed shape guard of torch's into a line naming the
sizes the inputs were captured at; :class:`ShapeError` is what a placed module
raises (see :mod:`envs.real.programs`).
"""

from __future__ import annotations

import re

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves  # noqa: PLC2701 (torch has no public pytree module)

from graphs import PlacerError
from graphs.export import static_size

_GUARD = re.compile(r"(\w+)\.size\(\)\[(\d+)\]")


class ShapeError(PlacerError):
    """A placed module was called with inputs at sizes its program cannot take."""


def input_specs(gm: fx.GraphModule) -> list[tuple[str, list[int | str]]]:
    """``(name, shape)`` of each tensor input of a placed program, in call order; a symbol names a dynamic size."""
    return [
        (n.name, [str(d) if static_size(d) is None else static_size(d) for d in n.meta["val"].shape])
        for n in gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    ]


def check_sizes(
    specs: list[tuple[str, list[int | str]]],
    ranges: dict[str, list],
    captured: dict[str, list[int]],
    tensors: list[torch.Tensor],
) -> str | None:
    """Why a program with input ``specs`` cannot take a call's ``tensors`` (one line), or None when it can.

    A dimension written as a number is static: only that size. A dimension named
    by a symbol takes ``ranges[symbol]`` (``[min, max]``, None: no bound), and two
    dimensions with one symbol must be equal. ``captured``: each input's shape as
    captured, for the reason. Another number of inputs or of dimensions is a
    :class:`ShapeError` (no program of the model takes it).
    """
    if len(specs) != len(tensors):
        raise ShapeError(f"the placed module takes {len(specs)} tensor inputs, got {len(tensors)}")
    for (name, spec), t in zip(specs, tensors):
        if t.dim() != len(spec):
            raise ShapeError(f"input {name}: {t.dim()} dimensions, but the placed program takes {len(spec)}")
    seen: dict[str, tuple[str, int, int]] = {}
    for (name, spec), t in zip(specs, tensors):
        for d, (want, size) in enumerate(zip(spec, t.shape)):
            at = captured.get(name, spec)[d]
            if isinstance(want, int):
                if size != want:
                    return (
                        f"input {name}: dimension {d} is {size}, but the placed program takes only {want} there, "
                        "the size it was captured at"
                    )
                continue
            low, high = ranges.get(want, [0, None])
            if size < low or (high is not None and size > high):
                allowed = f"{low} or more" if high is None else f"{low} to {high}"
                return f"input {name}: dimension {d} is {size}; the placed program takes {allowed} (captured at {at})"
            if want in seen and seen[want][2] != size:
                other, other_d, other_size = seen[want]
                return (
                    f"input {name}: dimension {d} is {size}, but the placed program takes it equal to input {other}'s "
                    f"dimension {other_d} ({other_size}), as when captured (both {at})"
                )
            seen.setdefault(want, (name, d, int(size)))
    return None


def guard_failure(error: AssertionError, captured: dict[str, list[int]]) -> ShapeError | None:
    """The :class:`ShapeError` for a program's failed shape guard (``Guard failed: ids.size()[1] != 1``), else None."""
    text = str(error).strip()
    if not text.startswith("Guard failed:"):
        return None
    return ShapeError(guard_reason(text, captured))


def guard_reason(text: str, captured: dict[str, list[int]]) -> str:
    """One line for a failed shape guard's message ``text``, with the sizes its inputs were captured at."""
    condition = text.removeprefix("Guard failed:").strip().splitlines()[0]
    sizes = sorted(
        {
            f"{name} dimension {d} was {captured[name][int(d)]}"
            for name, d in _GUARD.findall(condition)
            if name in captured
        }
    )
    return f"the inputs' sizes fail the placed program's shape check `{condition}`" + (
        f" (captured: {', '.join(sizes)})" if sizes else ""
    )


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors of a call's arguments, in the order the program takes them."""
    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
