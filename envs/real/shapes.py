"""Inputs at sizes other than the example's: the placed program with dynamic dimensions, and one-line shape errors.

A placed module is built from the program exported at the example's sizes (the
program the OpGraph was captured from). Called at other sizes (a smaller last
batch, another sequence length, an evaluation batch), it runs a second program of
the same model exported with dynamic dimensions (:class:`DynamicProgram`): built
on the first such call (or at once), the plan carried over to it
(:func:`envs.real.alignment.carry_plan`), reading the very parameters and buffers
of the first. Where the model fixes a dimension, or the program cannot take a
size, the call raises :class:`ShapeError`: one line naming the input, the
dimension and the size it was captured at.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from envs.real.alignment import ProgramPlan, carry_plan, program_graph
from envs.real.placing import HOMES_META, module_tensor, place_module, set_module_tensor
from graphs import CaptureError, OpGraph, PlacerError
from graphs.export import export_program, input_dims, size_bound, static_size

DYNAMIC_META = "placer_dynamic_dims"  # GraphModule.meta key: each input's dynamic dimensions (graphs.export.input_dims)
PROGRAMS_ATTR = "placer_programs"  # attribute of a placed GraphModule: its ProgramsBySize

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
    fixed: str = "the model fixes it",
) -> str | None:
    """Raise :class:`ShapeError` where a call's ``tensors`` cannot fit a program's input ``specs``; say where the
    program refuses their sizes.

    A dimension written as a number is static: only that size (``fixed`` says
    why), else a ShapeError. A dimension named by a symbol takes ``ranges[symbol]``
    (``[min, max]``, None: no bound), and two dimensions with one symbol must be
    equal: a size that breaks either is returned as a one-line reason (the model
    may still run at exactly those sizes); None when the sizes fit.
    ``captured``: each input's shape as captured, for the messages.
    """
    if len(specs) != len(tensors):
        raise ShapeError(f"the placed module takes {len(specs)} tensor inputs, got {len(tensors)}")
    seen: dict[str, tuple[str, int, int]] = {}
    for (name, spec), t in zip(specs, tensors):
        if t.dim() != len(spec):
            raise ShapeError(f"input {name}: {t.dim()} dimensions, but the placed program takes {len(spec)}")
        for d, (want, size) in enumerate(zip(spec, t.shape)):
            at = captured.get(name, spec)[d]
            if isinstance(want, int):
                if size != want:
                    raise ShapeError(
                        f"input {name}: dimension {d} is {size}, but the placed program takes only {want} there, "
                        f"the size it was captured at ({fixed})"
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


class ProgramsBySize:
    """The placed programs of one model, by the sizes of a call's inputs.

    * at the sizes ``static`` was captured at: ``static`` itself, exactly as built;
    * at others: the model's program with dynamic dimensions (built once, on the
      first such call, or by :meth:`build_dynamic`), its sizes checked first
      (:func:`check_sizes`);
    * at sizes that program's shape guards refuse (``batch != 1``, where a size of
      1 would change the program): the model exported at exactly those sizes, once
      per such size.

    Each reads ``static``'s parameters and buffers (the same tensors), and runs the
    plan carried over to it (:func:`envs.real.alignment.carry_plan`).

    Args:
        model: the model (its forward is exported again; its tensors are not read).
        example_inputs: the inputs ``graph`` was captured at.
        options: the export options of that program (``decompose``, ``unroll_rnn``).
        graph: the OpGraph the plan is for; ``plan`` is in its op names.
        device_map: as for :func:`envs.real.placing.place_module`.
        static: the placed program at the example's sizes (at a microbatch's for a pipelined plan).
        stages: ``static``'s stage starts (one-forward-one-backward).
        allowed: False: no other program (another size is a :class:`ShapeError`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        example_inputs: tuple,
        options: dict[str, Any],
        graph: OpGraph,
        plan: ProgramPlan,
        device_map: Any,
        static: fx.GraphModule,
        stages: list[str],
        allowed: bool = True,
    ) -> None:
        self.model, self.example_inputs, self.options = model, example_inputs, options
        self.graph, self.plan, self.device_map, self.static = graph, plan, device_map, static
        self.captured = dict(input_specs(static))  # the static program's inputs: every size a number
        self.why_not = "" if allowed else "placer.apply(..., dynamic=False)"
        self.dynamic: fx.GraphModule | None = None
        self.ranges: dict[str, list] = {}
        self.specialized: dict[tuple, fx.GraphModule] = {}
        self.stages: dict[int, list[str]] = {id(static): list(stages)}  # id(program) -> its stage starts

    def build_dynamic(self) -> fx.GraphModule | None:
        """The program with dynamic dimensions, placed (built on the first call); None when there is none."""
        if self.dynamic is not None or self.why_not:
            return self.dynamic
        try:
            with _exportable(self.model):
                ep = export_program(self.model, self.example_inputs, dynamic=True, **self.options)
        except CaptureError as e:
            self.why_not = f"it cannot be exported with dynamic sizes: {e}"
            return None
        self.dynamic = self._placed(ep)
        self.ranges = {str(s): [size_bound(r.lower), size_bound(r.upper)] for s, r in ep.range_constraints.items()}
        self.dynamic.meta[DYNAMIC_META] = self.static.meta[DYNAMIC_META] = input_dims(ep)
        return self.dynamic

    def _placed(self, ep: Any) -> fx.GraphModule:
        """Program ``ep`` of the model placed under the carried plan, reading ``static``'s tensors."""
        plan = carry_plan(self.graph, self.plan, program_graph(ep))
        homes = self.static.meta[HOMES_META]
        shared = {fqn: (module_tensor(self.static, fqn), device) for fqn, device in homes.items()}
        module = place_module(ep, plan.assignment, self.device_map, order=plan.order, shared=shared)
        self.stages[id(module)] = plan.stages
        return module

    def program_for(self, args: tuple, kwargs: dict) -> fx.GraphModule:
        """The program that runs a call with ``args`` and ``kwargs``; a :class:`ShapeError` when none can."""
        tensors = tensors_of(args, kwargs)
        specs = list(self.captured.values())
        if len(specs) == len(tensors) and all(list(t.shape) == spec for spec, t in zip(specs, tensors)):
            return self.static
        dynamic = self.build_dynamic()
        if dynamic is None:
            fixed = f"the placed program takes no other size: {self.why_not}"
            check_sizes(list(self.captured.items()), {}, self.captured, tensors, fixed)
            return self.static  # not reached: the sizes differ somewhere
        refused = self.refusal(args, kwargs)
        return dynamic if refused is None else self._specialized(tensors, refused)

    def refusal(self, args: tuple, kwargs: dict) -> str | None:
        """Why the (built) dynamic program cannot take a call's inputs, or None when it can.

        Its sizes are checked (:func:`check_sizes`), then its shape guards run.
        """
        assert self.dynamic is not None
        refused = check_sizes(input_specs(self.dynamic), self.ranges, self.captured, tensors_of(args, kwargs))
        guards = getattr(self.dynamic, "_guards_fn", None)  # torch.export's check of the program's shape guards
        if refused is None and guards is not None:
            try:
                guards(*tree_leaves((args, kwargs)))
            except AssertionError as e:
                refused = guard_reason(str(e), self.captured)
        return refused

    def _specialized(self, tensors: list[torch.Tensor], refused: str) -> fx.GraphModule:
        """The model's program at exactly the sizes of ``tensors``, which the dynamic program ``refused`` (why)."""
        key = tuple(tuple(t.shape) for t in tensors)
        if key not in self.specialized:
            sizes = iter(key)
            inputs = tree_map(
                lambda x: (
                    torch.zeros(next(sizes), dtype=x.dtype, device=x.device) if isinstance(x, torch.Tensor) else x
                ),
                self.example_inputs,
            )
            try:
                with _exportable(self.model):
                    ep = export_program(self.model, inputs, **self.options)
            except CaptureError:
                raise ShapeError(f"{refused}, and the model cannot be exported at these sizes") from None
            self.specialized[key] = self._placed(ep)
        return self.specialized[key]


@contextlib.contextmanager
def _exportable(model: torch.nn.Module) -> Iterator[None]:
    """While active, a model whose tensors span devices (after :func:`envs.real.placed_model.unwrap`) has them on
    the meta device: export traces shapes, and every program here reads the placed tensors anyway."""
    tensors = [t for t in chain(model.parameters(), model.buffers())]
    if len({t.device for t in tensors}) <= 1:
        yield
        return
    names = [
        *((n, "p") for n, _ in model.named_parameters(remove_duplicate=False)),
        *((n, "b") for n, _ in model.named_buffers(remove_duplicate=False)),
    ]
    originals = {fqn: module_tensor(model, fqn) for fqn, _ in names}
    meta_of: dict[int, torch.Tensor] = {}
    for fqn, kind in names:
        t = originals[fqn]
        if id(t) not in meta_of:
            on_meta = t.detach().to("meta")
            meta_of[id(t)] = torch.nn.Parameter(on_meta, requires_grad=t.requires_grad) if kind == "p" else on_meta
        set_module_tensor(model, fqn, meta_of[id(t)])
    try:
        yield
    finally:
        for fqn, t in originals.items():
            set_module_tensor(model, fqn, t)


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors of a call's arguments, in the order the program takes them."""
    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


def dispatch_on_sizes(static: fx.GraphModule, programs: ProgramsBySize) -> None:
    """Make ``static`` run each call through the program for its inputs' sizes (:meth:`ProgramsBySize.program_for`).

    Wraps that instance's ``forward`` (a ``GraphModule`` has a class of its own):
    at the captured sizes the static program runs exactly as built.
    """
    cls = type(static)
    run: Callable[..., Any] = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        program = programs.program_for(args, kwargs)
        if program is self:
            return run(self, *args, **kwargs)
        try:
            return program(*args, **kwargs)
        except AssertionError as e:  # a shape guard _guards_fn did not run (another torch)
            error = guard_failure(e, programs.captured)
            if error is None:
                raise
            raise error from None

    forward.__wrapped__ = run  # type: ignore[attr-defined]
    cls.forward = forward
    object.__setattr__(static, PROGRAMS_ATTR, programs)  # outside the module tree: no second state dict
