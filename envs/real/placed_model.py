"""A whole plan made runnable: the placed program, pipelined or not, that takes any size the model allows.

:func:`build_placed_model` is what :func:`placer.apply` returns once the plan is
checked: the program placed (:func:`envs.real.placing.place_module`), for a
pipelined plan exported at a microbatch's size and wrapped in a
:class:`envs.real.pipeline.MicrobatchedModule`, and given its twin with dynamic
dimensions for other sizes, and in the other mode (:mod:`envs.real.programs`). :func:`unwrap` goes back to
the user's model, which then shares the placed module's parameters and buffers.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Mapping, NamedTuple

import torch.fx as fx
from torch import nn

from envs.real.alignment import ProgramPlan, carry_plan, program_graph
from envs.real.pipeline import MicrobatchedModule, export_microbatch
from envs.real.placing import module_tensor, place_module, set_module_tensor
from envs.real.programs import PROGRAMS_ATTR, Programs, dispatch
from graphs import OpGraph, PlacerError


class Pipelining(NamedTuple):
    """How a plan splits a step into microbatches (see :class:`envs.real.pipeline.MicrobatchedModule`)."""

    microbatches: int = 1  # M
    inflight: int | None = None  # W, the most microbatches in flight (None: M)
    batch_dim: int = 0  # the inputs' batch dimension
    loss_reduction: str = "mean"  # how the model's loss reduces over the batch: "mean" or "sum"


def build_placed_model(
    model: nn.Module,
    example_inputs: tuple,
    ep: Any,
    graph: OpGraph,
    plan: ProgramPlan,
    device_map: Any,
    options: dict[str, Any],
    pipelining: Pipelining = Pipelining(),
    dynamic: Any = "auto",
    homes: dict[str, str] | None = None,
    part_programs: Mapping[int, Any] | None = None,
) -> nn.Module:
    """The placed module of a checked ``plan`` of ``graph``, the OpGraph of program ``ep`` (the model at the example).

    ``options``: the export options of ``ep`` (``decompose``, ``unroll_rnn``), used
    for every other program of the model. With ``pipelining.microbatches`` M > 1 the
    model is exported again at a microbatch's size and the plan carried over to that
    program (:func:`envs.real.alignment.carry_plan`). ``dynamic``: build the program
    with dynamic dimensions on the first call at other sizes (``"auto"``), now
    (True: a model that allows none raises here), or never (False: other sizes
    raise :class:`envs.real.shapes.ShapeError`). ``homes``: parameter name -> the logical
    device it lives on apart from its reader (:mod:`envs.real.homes`; one microbatch only);
    the programs for other sizes read those parameters where they live through ordinary
    copies, kept from the forward to the backward. ``part_programs``: M -> the model's
    program at a microbatch's size, made once for many plans (else exported here).
    """
    if not (isinstance(dynamic, bool) or dynamic == "auto"):
        raise PlacerError(f"dynamic {dynamic!r}: must be 'auto', True or False")
    if homes and pipelining.microbatches > 1:
        raise PlacerError("param_homes: parameters apart from their ops run with one microbatch (not pipelined plans)")
    if plan.checkpoint and pipelining.microbatches > 1:
        raise PlacerError("checkpoint: checkpointed blocks run with one microbatch (not pipelined plans)")
    if pipelining.microbatches == 1:
        placed = place_module(
            ep, plan.assignment, device_map, order=plan.order, homes=homes, checkpoint=plan.checkpoint
        )
        _by_size(placed, [], model, example_inputs, options, graph, plan, device_map, dynamic)
        return placed
    M, W, batch_dim, reduction = pipelining
    ep_part = (part_programs or {}).get(M) or export_microbatch(
        model, example_inputs, M, batch_dim, source="example_inputs", **options
    )
    carried = carry_plan(graph, plan, program_graph(ep_part))
    placed = place_module(ep_part, carried.assignment, device_map, order=carried.order)
    _by_size(placed, carried.stages, model, example_inputs, options, graph, plan, device_map, dynamic)
    return MicrobatchedModule(placed, M, batch_dim, reduction, W, carried.stages)


def _by_size(
    placed: fx.GraphModule,
    stages: list[str],
    model: nn.Module,
    example_inputs: tuple,
    options: dict[str, Any],
    graph: OpGraph,
    plan: ProgramPlan,
    device_map: Any,
    dynamic: Any,
) -> None:
    """Let ``placed`` take inputs at other sizes, and in the other mode (:class:`envs.real.programs.Programs`)."""
    programs = Programs(model, example_inputs, options, graph, plan, device_map, placed, stages, dynamic is not False)
    dispatch(placed, programs)
    if dynamic is True and programs.build_dynamic(programs.training) is None:
        raise PlacerError(f"dynamic=True: {type(model).__name__}: {programs.mode(programs.training).why_not}")


def unwrap(placed: nn.Module) -> nn.Module:
    """The model ``placed`` was made from, now reading the placed module's parameters and buffers.

    For what the placed module cannot do (``generate``, ``save_pretrained``, hooks on
    its submodules): every parameter and buffer of the model becomes the placed
    module's tensor of the same name, so the two share them (training either
    trains both, a checkpoint of either is the other's). The tensors stay where
    the plan put them: to run the model as it is, move it to one device first
    (``model.to("cuda:0")`` moves the placed module's parameters too).
    """
    program = placed.placed if isinstance(placed, MicrobatchedModule) else placed
    programs = getattr(program, PROGRAMS_ATTR, None)
    if not isinstance(programs, Programs):
        raise PlacerError(f"unwrap: a {type(placed).__name__} is not a module placer.apply returned")
    model = programs.model
    tensors = chain(program.named_parameters(remove_duplicate=False), program.named_buffers(remove_duplicate=False))
    for fqn, tensor in tensors:
        try:
            module_tensor(model, fqn)
        except AttributeError:
            continue  # a tensor the program made (a lifted constant), not the model's
        set_module_tensor(model, fqn, tensor)
    return model
