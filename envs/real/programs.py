"""The placed programs of one model, by train/eval mode and by the sizes of a call's inputs.

A placed module is built from the program exported at the example's sizes, in
the mode the model was in (the program the OpGraph was captured from). A
training loop calls it at other sizes (a smaller last batch, another sequence
length) and switches it to ``eval()``; each of these runs another program of the
same model, exported once, on first need, under the plan carried over to it
(:func:`envs.real.alignment.carry_plan`) and reading the very parameters and
buffers of the first program:

* at other sizes: the program with dynamic dimensions (``Dim.AUTO`` on every
  input dimension, :func:`graphs.export.export_program`), its sizes checked
  first (:func:`envs.real.shapes.check_sizes`);
* at sizes that program refuses (a dimension the model fixed in it, its shape
  guards such as ``batch != 1``, a size range): the model exported at exactly
  those sizes, once per such size;
* in the other mode: the same, from the model exported in that mode.

Where no program of the model takes the sizes (the model fixes a dimension), a
call raises :class:`envs.real.shapes.ShapeError`, one line naming the input, the
dimension and the size it was captured at. ``dynamic=False`` keeps the example's
sizes only.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from envs.real.alignment import ProgramPlan, carry_plan, program_graph
from envs.real.placing import HOMES_META, module_tensor, place_module, set_module_tensor
from envs.real.shapes import ShapeError, check_sizes, guard_failure, guard_reason, input_specs, tensors_of
from graphs import CaptureError, OpGraph
from graphs.export import export_program, input_dims, size_bound

DYNAMIC_META = "placer_dynamic_dims"  # GraphModule.meta key: each input's dynamic dimensions (graphs.export.input_dims)
PROGRAMS_ATTR = "placer_programs"  # attribute of a placed GraphModule: its Programs
ONLY_THE_EXAMPLE = "placer.apply(..., dynamic=False) takes the example's sizes only"


@dataclass
class _ModePrograms:
    """The programs of one mode (train or eval)."""

    static: fx.GraphModule | None  # at the example's sizes (the first program, in its mode)
    dynamic: fx.GraphModule | None = None
    why_not: str = ""  # why there is no dynamic program ("" while it may still be built)
    ranges: dict[str, list] = field(default_factory=dict)  # the dynamic program's size ranges, by symbol
    specialized: dict[tuple, fx.GraphModule] = field(default_factory=dict)  # by the inputs' shapes
    impossible: dict[tuple, str] = field(default_factory=dict)  # shapes no program takes -> why (not tried again)


class Programs:
    """The placed programs of one model (see the module doc).

    Args:
        model: the model (its forward is exported again; its tensors are not read).
        example_inputs: the inputs ``graph`` was captured at.
        options: the export options of that program (``decompose``, ``unroll_rnn``).
        graph: the OpGraph the plan is for; ``plan`` is in its op names.
        device_map: as for :func:`envs.real.placing.place_module`.
        static: the placed first program, in the model's mode, at the example's sizes (at
            a microbatch's for a pipelined plan): its tensors are every program's.
        stages: ``static``'s stage starts (one-forward-one-backward).
        dynamic: False: no program with dynamic dimensions (another size is a ShapeError).
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
        dynamic: bool = True,
    ) -> None:
        self.model, self.example_inputs, self.options = model, example_inputs, options
        self.graph, self.plan, self.device_map, self.source = graph, plan, device_map, static
        self.training = model.training  # the mode static was captured in
        self.captured = dict(input_specs(static))  # the static program's inputs: every size a number
        self.modes = {self.training: _ModePrograms(static)}
        if not dynamic:
            self.modes[self.training].why_not = ONLY_THE_EXAMPLE
        self.stages: dict[int, list[str]] = {id(static): list(stages)}  # id(program) -> its stage starts

    def mode(self, training: bool) -> _ModePrograms:
        """The programs of mode ``training`` (the other mode's start without a static program)."""
        if training not in self.modes:
            self.modes[training] = _ModePrograms(None, why_not=self.modes[self.training].why_not)
        return self.modes[training]

    def program_for(self, args: tuple, kwargs: dict, training: bool) -> fx.GraphModule:
        """The program that runs a call with ``args`` and ``kwargs`` in mode ``training``; ShapeError when none can."""
        mode = self.mode(training)
        tensors = tensors_of(args, kwargs)
        refused = check_sizes(list(self.captured.items()), {}, self.captured, tensors)
        if refused is None and mode.static is not None:
            return mode.static
        if refused is not None and self.build_dynamic(training) is not None:
            refused = self.refusal(training, args, kwargs)
            if refused is None:
                return mode.dynamic
        if refused is not None and mode.why_not == ONLY_THE_EXAMPLE:
            raise ShapeError(f"{refused} ({ONLY_THE_EXAMPLE})")
        return self._specialized(mode, training, tensors, refused)

    def build_dynamic(self, training: bool) -> fx.GraphModule | None:
        """Mode ``training``'s program with dynamic dimensions, placed (built once); None when there is none."""
        mode = self.mode(training)
        if mode.dynamic is not None or mode.why_not:
            return mode.dynamic
        try:
            ep = self._export(self.example_inputs, training, dynamic=True)
        except CaptureError as e:
            mode.why_not = f"it cannot be exported with dynamic sizes: {e}"
            return None
        mode.dynamic = self._placed(ep)
        mode.ranges = {str(s): [size_bound(r.lower), size_bound(r.upper)] for s, r in ep.range_constraints.items()}
        mode.dynamic.meta[DYNAMIC_META] = self.source.meta[DYNAMIC_META] = input_dims(ep)
        return mode.dynamic

    def refusal(self, training: bool, args: tuple, kwargs: dict) -> str | None:
        """Why mode ``training``'s (built) dynamic program cannot take a call's inputs, or None when it can.

        Its sizes are checked (:func:`envs.real.shapes.check_sizes`), then its shape guards run.
        """
        mode = self.mode(training)
        assert mode.dynamic is not None
        refused = check_sizes(input_specs(mode.dynamic), mode.ranges, self.captured, tensors_of(args, kwargs))
        guards = getattr(mode.dynamic, "_guards_fn", None)  # torch.export's check of the program's shape guards
        if refused is None and guards is not None:
            try:
                guards(*tree_leaves((args, kwargs)))
            except AssertionError as e:
                refused = guard_reason(str(e), self.captured)
        return refused

    def _specialized(
        self, mode: _ModePrograms, training: bool, tensors: list[torch.Tensor], refused: str | None
    ) -> fx.GraphModule:
        """The model's program at exactly the sizes of ``tensors``, which no other program takes (``refused``: why;
        None: the example's sizes, in the mode without a program yet)."""
        key = tuple(tuple(t.shape) for t in tensors)
        if key in mode.impossible:
            raise ShapeError(mode.impossible[key])
        if key not in mode.specialized:
            sizes = iter(key)
            inputs = tree_map(
                lambda x: (
                    torch.zeros(next(sizes), dtype=x.dtype, device=x.device) if isinstance(x, torch.Tensor) else x
                ),
                self.example_inputs,
            )
            try:
                ep = self._export(inputs, training, dynamic=False)
            except CaptureError as e:
                if refused is None:
                    raise
                mode.impossible[key] = f"{refused}, and the model cannot be exported at these sizes ({e})"
                raise ShapeError(mode.impossible[key]) from None
            mode.specialized[key] = self._placed(ep)
        return mode.specialized[key]

    def _export(self, inputs: tuple, training: bool, *, dynamic: bool) -> Any:
        with _exportable(self.model), _in_mode(self.model, training):
            return export_program(self.model, inputs, dynamic=dynamic, **self.options)

    def _placed(self, ep: Any) -> fx.GraphModule:
        """Program ``ep`` of the model placed under the carried plan, reading the first program's tensors."""
        plan = carry_plan(self.graph, self.plan, program_graph(ep))
        homes = self.source.meta[HOMES_META]
        shared = {fqn: (module_tensor(self.source, fqn), device) for fqn, device in homes.items()}
        module = place_module(
            ep, plan.assignment, self.device_map, order=plan.order, shared=shared, checkpoint=plan.checkpoint
        )
        self.stages[id(module)] = plan.stages
        return module


@contextlib.contextmanager
def _in_mode(model: torch.nn.Module, training: bool) -> Iterator[None]:
    """While active, every module of ``model`` is in mode ``training`` (each one's own mode restored after)."""
    modes = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for m, was in modes:
            m.training = was


@contextlib.contextmanager
def _exportable(model: torch.nn.Module) -> Iterator[None]:
    """While active, a model whose tensors span devices (after :func:`envs.real.placed_model.unwrap`) has them on
    the meta device: export traces shapes, and every program here reads the placed tensors anyway."""
    if len({t.device for t in chain(model.parameters(), model.buffers())}) <= 1:
        yield
        return
    params = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names = params + [n for n, _ in model.named_buffers(remove_duplicate=False)]
    originals = {fqn: module_tensor(model, fqn) for fqn in names}
    meta_of: dict[int, torch.Tensor] = {}
    for fqn in names:
        t = originals[fqn]
        if id(t) not in meta_of:
            on_meta = t.detach().to("meta")
            meta_of[id(t)] = torch.nn.Parameter(on_meta, t.requires_grad) if fqn in params else on_meta
        set_module_tensor(model, fqn, meta_of[id(t)])
    try:
        yield
    finally:
        for fqn, t in originals.items():
            set_module_tensor(model, fqn, t)


def dispatch(static: fx.GraphModule, programs: Programs) -> None:
    """Make ``static`` run each call through the program for its mode and its inputs' sizes.

    Wraps that instance's ``forward`` (a ``GraphModule`` has a class of its own):
    at the captured sizes, in the captured mode, the static program runs exactly as
    built. ``train()``/``eval()`` (which an exported program's module refuses) set
    the mode that picks the program.
    """
    cls = type(static)
    run: Callable[..., Any] = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        program = programs.program_for(args, kwargs, self.training)
        if program is self:
            return run(self, *args, **kwargs)
        try:
            return program(*args, **kwargs)
        except AssertionError as e:  # a shape guard _guards_fn did not run first (another torch)
            error = guard_failure(e, programs.captured)
            if error is None:
                raise
            raise error from None

    def train(self: Any, mode: bool = True) -> Any:
        for m in self.modules():
            m.training = bool(mode)
        return self

    forward.__wrapped__ = run  # type: ignore[attr-defined]
    cls.forward = forward
    static.train = types.MethodType(train, static)
    static.eval = types.MethodType(lambda self: self.train(False), static)
    static.train(programs.training)
    object.__setattr__(static, PROGRAMS_ATTR, programs)  # outside the module tree: no second state dict
