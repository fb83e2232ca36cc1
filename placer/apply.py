"""Apply a placement to a real model: every op runs on its placed device.

>>> import torch
>>> from placer import Placement
>>> from graphs.torch_capture import capture
>>> model, x = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), torch.randn(2, 4)
>>> g = capture(model, (x,))
>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 0])
>>> placed = apply(model, p, (x,), device_map="*=cpu")   # gpu:0 runs on the CPU here
>>> torch.equal(placed(x), model(x))
True

Inputs at other sizes than the example's run too (the program with dynamic
dimensions, built on the first such call):

>>> torch.equal(placed(torch.ones(5, 4)), model(torch.ones(5, 4)))
True

A placement's issue order (``Placement.order``, or ``order=``) is the order the
module runs its ops in:

>>> class Branches(torch.nn.Module):
...     def forward(self, x):
...         return x.sin(), x.cos()
>>> g = capture(Branches(), (x,))
>>> placed = apply(Branches(), {"sin": "cpu:0", "cos": "gpu:0"}, (x,), device_map="*=cpu", order=[1, 0])
>>> g.names, placed.meta["placer_issue_order"]
(['sin', 'cos'], ['cos', 'sin'])

A pipelined plan (``Placement.microbatches`` M, or ``microbatches=``) runs the batch
as M microbatches, split along ``batch_dim``; its loss and gradients are the
unsplit step's:

>>> model, x = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), torch.randn(4, 4)
>>> g = capture(model, (x,))
>>> p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [1, 0], microbatches=2)
>>> placed = apply(model, p, (x,), device_map="*=cpu")
>>> placed.meta["placer_microbatches"], torch.allclose(placed(x), model(x))
(2, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from envs.microbatch import check_inflight, check_microbatches
from envs.real.alignment import ProgramPlan, carry_plan
from envs.real.homes import (
    HOST_STEP_META,
    homes_apart,
    runtime_of,
    step_in_backward,  # noqa: F401  (placer.apply.step_in_backward, public)
)
from envs.real.pipeline import stage_names
from envs.real.placed_model import Pipelining, build_placed_model, unwrap  # noqa: F401  (placer.apply.unwrap)
from envs.real.shapes import ShapeError  # noqa: F401  (what a placed module raises at sizes it cannot take)
from graphs import OpGraph, PlacerError
from graphs.hash_seed import hash_seed_hint
from graphs.plan import as_indices, check_host_step, check_order, checkpoint_blocks, in_module, keeps_last_copies
from graphs.torch_capture import check_runnable, export_program, graph_from_program
from placer._callable import make_module_callable

#: Deprecated name of :func:`envs.real.alignment.carry_plan` (kept for one release).
microbatch_plan = carry_plan


def apply(
    model: nn.Module,
    placement: Any,
    example_inputs: tuple,
    device_map: Mapping[str, str] | str | None = None,
    *,
    graph: OpGraph | None = None,
    decompose: bool | None = None,
    unroll_rnn: bool | None = None,
    order: Sequence[int] | None = None,
    microbatches: int | None = None,
    inflight: int | None = None,
    batch_dim: int = 0,
    loss_reduction: str = "mean",
    dynamic: bool | str = "auto",
) -> nn.Module:
    """A module computing ``model`` with each op on the device ``placement`` gives it.

    The model is exported once more exactly as :func:`graphs.capture` does, so op
    names match ``OpGraph.names``; the placement is checked against that graph
    (its hash, every op placed, known devices) and a mismatch raises
    :class:`graphs.PlacerError`. The result is a ``torch.fx.GraphModule``:

    * outputs and gradients equal the unplaced model's; outputs are returned on
      the device of the op that produced them;
    * its parameters and buffers have the model's names (``state_dict`` loads into
      either); each lives on its first consumer's device (other devices read
      differentiable copies); those that stay on their device are the model's own
      tensors, like ``model.to(device)`` makes them; build the optimizer on the
      *returned* module's parameters. :func:`unwrap` gives the model back, sharing them all;
    * a parameter the placement gives a home apart from its op (``placement.param_homes``, one
      microbatch) lives there, with its gradient: the optimizer steps it where it lives (the
      host's Adam for a host home), and its op reads a copy made ahead of it (:mod:`envs.real.homes`);
      by default in its ``step()`` after the backward, or, where ``placement.host_step`` is
      ``"backward"``, during the backward once :func:`step_in_backward` registers the optimizer (the
      first backward without one warns). The plan's ``host_step`` is ``result.meta["placer_host_step"]``;
    * buffers (batch-norm running statistics) update in place as in the model;
    * the train/eval mode is the one the model had when this was called;
    * random ops (dropout) draw from their placed device's generator, so their
      masks match the unplaced model's only where both run on the same device;
    * the ops run in the placement's issue order (``placement.order``, or ``order``),
      each cross-device copy issued right before its first consumer in that order;
      without one, in node order (see :func:`envs.real.reorder.reorder`). The order run
      is ``result.meta["placer_issue_order"]`` (op names);
    * inputs at other sizes (a smaller last batch, another sequence length) run the
      model's program with dynamic dimensions under the same plan
      (:mod:`envs.real.programs`); its dynamic dimensions are then
      ``result.meta["placer_dynamic_dims"]``. A size the model fixes raises
      :class:`envs.real.shapes.ShapeError`, one line naming the input, the dimension
      and the size it was captured at.

    Args:
        model: the module to place.
        placement: a :class:`placer.Placement` or a mapping op name -> logical device.
        example_inputs: positional inputs of one forward call (the sizes the graph was captured at).
        device_map: logical -> torch device, e.g. ``{"gpu:0": "cuda:1", "*": "cpu"}``
            or ``"gpu:0=cuda:1,*=cpu"``; default ``gpu:i -> cuda:i``, ``cpu:0 -> cpu``.
        graph: the OpGraph the placement was made for, if it was captured with other
            options; its ``meta["decomposed"]`` and ``meta["unroll_rnn"]`` select the export.
        decompose: export with core-ATen decomposition (default: as ``graph`` says, else False).
        unroll_rnn: export ``nn.LSTM``/``nn.GRU`` one op per layer and step (default: as ``graph`` says).
        order: issue order, op indices of the graph (a topological order); overrides
            ``placement.order``. A bad order raises :class:`graphs.PlacerError`.
        microbatches: M; overrides ``placement.microbatches`` (default 1). With M > 1
            the result is an :class:`envs.real.pipeline.MicrobatchedModule`: each call
            splits its inputs into M microbatches along ``batch_dim`` (of whatever
            batch arrives; sizes differ by one where M does not divide it), runs them
            one after the other through the placed program (exported at the
            microbatch size, the plan carried over to it by
            :func:`envs.real.alignment.carry_plan`), the issue order within each, and
            joins the outputs: 0-dim outputs (the loss) averaged, each weighted by its
            share of the batch (``loss_reduction="mean"``), or summed (``"sum"``), so
            one ``backward()`` accumulates gradients equal to the unsplit step's;
            batched outputs concatenated.
        inflight: W, the most microbatches in flight; overrides ``placement.inflight``
            (default M, fill-drain). Fewer than M is one-forward-one-backward: the
            issue order is cut into stages where the GPU changes
            (:func:`envs.real.pipeline.stage_names`; logical devices named ``cpu...``
            are the host), and the program runs stage by stage in the simulator's
            host program, each stage holding at most W microbatches' activations;
            the model's output must then be its loss, and ``loss.backward()``
            finishes the step (see :class:`envs.real.pipeline.MicrobatchedModule`).
        batch_dim: the dimension of the inputs that holds the batch (default 0).
        loss_reduction: how the model's loss reduces over the batch, ``"mean"`` or ``"sum"``.
        dynamic: when to build the program with dynamic dimensions: on the first call
            at other sizes (``"auto"``), now (True; raises if the model allows none),
            or never (False: other sizes raise ``ShapeError``).
    """
    example_inputs = _as_tuple(example_inputs)
    check_runnable(model)
    options = _export_options(graph, decompose, unroll_rnn)
    ep = export_program(model, example_inputs, **options)
    return apply_program(
        model,
        ep,
        placement,
        example_inputs,
        device_map,
        graph=graph,
        options=options,
        order=order,
        microbatches=microbatches,
        inflight=inflight,
        batch_dim=batch_dim,
        loss_reduction=loss_reduction,
        dynamic=dynamic,
    )


def apply_program(
    model: nn.Module,
    ep: Any,
    placement: Any,
    example_inputs: tuple,
    device_map: Mapping[str, str] | str | None = None,
    *,
    graph: OpGraph | None = None,
    options: Mapping[str, bool] | None = None,
    order: Sequence[int] | None = None,
    microbatches: int | None = None,
    inflight: int | None = None,
    batch_dim: int = 0,
    loss_reduction: str = "mean",
    dynamic: bool | str = "auto",
    part_programs: Mapping[int, Any] | None = None,
) -> nn.Module:
    """:func:`apply` with the model's program already exported: ``ep`` is ``export_program(model, example_inputs,
    **options)`` (``options``: ``decompose`` and ``unroll_rnn``; None: as ``graph`` records them, else off), made
    once for many plans of one model (:mod:`bench.conformance` applies eight; ``copy.deepcopy((model, ep))`` gives a
    fresh pair that share their tensors as the originals do). ``part_programs``: M -> the program at a microbatch's
    size (``export_program(model, split_batch(example_inputs, M, batch_dim)[0], **options)``) for pipelined plans of
    M microbatches, likewise made once (else exported here). A program whose parameters and buffers are not
    ``model``'s own tensors raises :class:`PlacerError`: it was exported from another model (or the model was
    copied without it).
    """
    example_inputs = _as_tuple(example_inputs)
    options = _export_options(graph, None, None) if options is None else dict(options)
    own = {id(t) for t in (*model.parameters(), *model.buffers())}
    for what, program in [("program", ep), *((f"part_programs[{m}]", p) for m, p in (part_programs or {}).items())]:
        foreign = next((k for k, t in program.state_dict.items() if id(t) not in own), None)
        if foreign is not None:
            raise PlacerError(f"{what}: its tensor {foreign!r} is not the model's own (a program of another model?)")
    captured = graph_from_program(ep, name=graph.name if graph is not None else "")
    if graph is not None and graph.content_hash != captured.content_hash:
        raise PlacerError(
            f"graph {graph.name or ''} ({graph.content_hash}) is not the graph of this model and inputs "
            f"({captured.content_hash}); was it captured from another model, batch size or torch version?"
            f"{hash_seed_hint()}"
        )
    source = getattr(placement, "source", "") or "placement"
    assignment = validated_assignment(placement, captured, source=source)
    if order is None:
        order = getattr(placement, "order", None)
    names = None
    if order is not None:
        names = [captured.names[i] for i in check_order(order, captured, source=f"{source}: order").tolist()]
    M = check_microbatches(
        getattr(placement, "microbatches", 1) if microbatches is None else microbatches,
        f"{source}: microbatches" if microbatches is None else "microbatches",
    )
    W = M
    if M > 1:
        if isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim < 0:
            raise PlacerError(f"batch_dim {batch_dim!r}: must be a dimension index >= 0")
        W = check_inflight(
            getattr(placement, "inflight", None) if inflight is None else inflight,
            M,
            f"{source}: inflight" if inflight is None else "inflight",
        )
    stages = stage_names(captured, assignment, names) if W < M else []
    blocks = checked_blocks(placement, captured, assignment, source)
    plan = ProgramPlan(assignment, names, stages, blocks)
    pipelining = Pipelining(M, W, batch_dim, loss_reduction)
    homes = homes_apart(placement, captured)  # its parameters' homes apart from their ops (envs.real.homes)
    host_step = check_host_step(getattr(placement, "host_step", "after"), source)
    placed = build_placed_model(
        model, example_inputs, ep, captured, plan, device_map, options, pipelining, dynamic, homes, part_programs
    )
    if isinstance(getattr(placed, "meta", None), dict):
        placed.meta[HOST_STEP_META] = host_step
    runtime = runtime_of(placed)
    if runtime is not None:
        runtime.host_step = host_step  # "backward": its first backward without an optimizer registered warns
        runtime.keep_last = keeps_last_copies(placement)
    return placed


def _as_tuple(example_inputs: Any) -> tuple:
    """Positional inputs as a tuple (a list's items, or one input alone)."""
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    return example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)


def _export_options(graph: OpGraph | None, decompose: bool | None, unroll_rnn: bool | None) -> dict[str, bool]:
    """The export options of the placement's program: as given, else as ``graph`` records, else off."""
    meta = graph.meta if graph is not None else {}
    return {
        "decompose": bool(meta.get("decomposed", False)) if decompose is None else bool(decompose),
        "unroll_rnn": bool(meta.get("unroll_rnn", False)) if unroll_rnn is None else bool(unroll_rnn),
    }


def checked_blocks(placement: Any, graph: OpGraph, assignment: dict[str, str], source: str) -> tuple[str, ...]:
    """The plan's checkpointed blocks (``placement.checkpoint``), checked against ``graph``: known modules, none
    inside another (:func:`graphs.plan.checkpoint_blocks`), each on one device."""
    names = tuple(getattr(placement, "checkpoint", None) or ())
    checkpoint_blocks(graph, names, source)
    for name in names:
        ops = [i for i, p in enumerate(graph.module_paths) if in_module(p, name)]
        devices = sorted({assignment[graph.names[i]] for i in ops})
        if len(devices) > 1:
            raise PlacerError(
                f"{source}: checkpoint block {name!r} runs on {', '.join(devices)}: a block runs on one device"
            )
    return names


def validated_assignment(placement: Any, graph: OpGraph, *, source: str = "placement") -> dict[str, str]:
    """The op name -> logical device mapping of ``placement``, checked against ``graph``.

    Raises :class:`PlacerError` if it was made for another graph (hash), misses ops,
    names unknown ops, or is not a Placement or a mapping.
    """
    if hasattr(placement, "assignment"):
        devices = list(getattr(placement, "devices", None) or sorted(set(placement.assignment.values())))
    elif isinstance(placement, Mapping):
        devices = sorted(set(placement.values()))
    else:
        raise PlacerError(
            f"{source}: expected a Placement or a mapping op name -> device, got {type(placement).__name__}"
        )
    op_devices = as_indices(placement, graph, devices, source=source)
    return {name: devices[int(d)] for name, d in zip(graph.names, op_devices)}


make_module_callable(__name__, apply)  # `placer.apply(model, ...)` calls apply()
