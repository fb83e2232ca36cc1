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

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from torch import nn

from envs.microbatch import check_inflight, check_microbatches, stage_starts
from envs.real.pipeline import MicrobatchedModule, split_batch
from envs.real.placing import place_module
from graphs import OpGraph, PlacerError
from graphs.ops import free_mask
from graphs.plan import as_indices, check_order
from graphs.torch_capture import check_runnable, export_program, graph_from_program
from placer._callable import make_module_callable


def apply(
    model: nn.Module,
    placement: Any,
    example_inputs: tuple,
    device_map: Mapping[str, str] | str | None = None,
    *,
    graph: OpGraph | None = None,
    decompose: bool | None = None,
    order: Sequence[int] | None = None,
    microbatches: int | None = None,
    inflight: int | None = None,
    batch_dim: int = 0,
    loss_reduction: str = "mean",
) -> nn.Module:
    """A module computing ``model`` with each op on the device ``placement`` gives it.

    The model is exported once more exactly as :func:`graphs.capture` does, so op
    names match ``OpGraph.names``; the placement is checked against that graph
    (its hash, every op placed, known devices) and a mismatch raises
    :class:`graphs.PlacerError`. The result is a ``torch.fx.GraphModule``:

    * outputs and gradients equal the unplaced model's; outputs are returned on
      the device of the op that produced them;
    * parameters and buffers live on their first consumer's device (other devices
      read differentiable copies); parameters that stay on their device are the
      model's own tensors, so the result shares them, like ``model.to(device)``
      does; build the optimizer on the *returned* module's parameters;
    * buffers (batch-norm running statistics) update in place as in the model;
    * the train/eval mode is the one the model had when this was called;
    * random ops (dropout) draw from their placed device's generator, so their
      masks match the unplaced model's only where both run on the same device;
    * the ops run in the placement's issue order (``placement.order``, or ``order``),
      each cross-device copy issued right before its first consumer in that order;
      without one, in node order (see :func:`envs.real.placing.reorder`). The order run
      is ``result.meta["placer_issue_order"]`` (op names).

    Args:
        model: the module to place.
        placement: a :class:`placer.Placement` or a mapping op name -> logical device.
        example_inputs: positional inputs of one forward call (same shapes as later calls).
        device_map: logical -> torch device, e.g. ``{"gpu:0": "cuda:1", "*": "cpu"}``
            or ``"gpu:0=cuda:1,*=cpu"``; default ``gpu:i -> cuda:i``, ``cpu:0 -> cpu``.
        graph: the OpGraph the placement was made for, if it was captured with other
            options; its ``meta["decomposed"]`` selects the export flavour.
        decompose: export with core-ATen decomposition (default: as ``graph`` says, else False).
        order: issue order, op indices of the graph (a topological order); overrides
            ``placement.order``. A bad order raises :class:`graphs.PlacerError`.
        microbatches: M; overrides ``placement.microbatches`` (default 1). With M > 1
            the result is an :class:`envs.real.pipeline.MicrobatchedModule`: each call
            splits its inputs into M microbatches along ``batch_dim``, runs them one
            after the other through the placed program (exported at the microbatch
            size, the plan carried over to it by :func:`microbatch_plan`), the issue
            order within each, and
            joins the outputs: 0-dim outputs (the loss) averaged (``loss_reduction=
            "mean"``) or summed (``"sum"``), so one ``backward()`` accumulates
            gradients equal to the unsplit step's; batched outputs concatenated.
        inflight: W, the most microbatches in flight; overrides ``placement.inflight``
            (default M, fill-drain). Fewer than M is one-forward-one-backward: the
            issue order is cut into stages where the GPU changes
            (:func:`envs.microbatch.stage_starts`; logical devices named ``cpu...``
            are the host), and the program runs stage by stage in the simulator's
            host program, each stage holding at most W microbatches' activations;
            the model's output must then be its loss, and ``loss.backward()``
            finishes the step (see :class:`envs.real.pipeline.MicrobatchedModule`).
        batch_dim: the dimension of the inputs that holds the batch (default 0).
        loss_reduction: how the model's loss reduces over the batch, ``"mean"`` or ``"sum"``.
    """
    if isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    check_runnable(model)
    if decompose is None:
        decompose = bool(graph.meta.get("decomposed", False)) if graph is not None else False
    ep, captured = _exported(model, example_inputs, graph, decompose)
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
    if M == 1:
        return place_module(ep, assignment, device_map, order=names)
    if isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim < 0:
        raise PlacerError(f"batch_dim {batch_dim!r}: must be a dimension index >= 0")
    W = check_inflight(
        getattr(placement, "inflight", None) if inflight is None else inflight,
        M,
        f"{source}: inflight" if inflight is None else "inflight",
    )
    part = split_batch(example_inputs, M, batch_dim, source="example_inputs")[0]
    ep_mb = export_program(model, part, decompose=decompose)
    stages = _stage_names(captured, assignment, names) if W < M else []
    plan = microbatch_plan(captured, graph_from_program(ep_mb), assignment, names, stages)
    return MicrobatchedModule(
        place_module(ep_mb, plan.assignment, device_map, order=plan.order), M, batch_dim, loss_reduction, W, plan.stages
    )


def _exported(model: nn.Module, example_inputs: tuple, graph: OpGraph | None, decompose: bool) -> tuple[Any, OpGraph]:
    """The model's program and its OpGraph, which must be ``graph`` (same hash) when one is given."""
    ep = export_program(model, example_inputs, decompose=decompose)
    captured = graph_from_program(ep, name=graph.name if graph is not None else "")
    if graph is not None and graph.content_hash != captured.content_hash:
        raise PlacerError(
            f"graph {graph.name or ''} ({graph.content_hash}) is not the graph of this model and inputs "
            f"({captured.content_hash}); was it captured from another model, batch size or torch version?"
        )
    return ep, captured


def _stage_names(graph: OpGraph, assignment: Mapping[str, str], order: Sequence[str] | None) -> list[str]:
    """The first op of each stage after the first, where the simulator cuts the plan
    (:func:`envs.microbatch.stage_starts`)."""
    devices = sorted(set(assignment.values()))
    position = {d: i for i, d in enumerate(devices)}
    idx = np.array([position[assignment[name]] for name in graph.names])
    host = np.array([d.startswith("cpu") for d in devices])
    op_order = np.arange(graph.num_ops) if order is None else np.array([graph.index[x] for x in order])
    return [graph.names[op_order[s]] for s in stage_starts(idx, op_order, host, free_mask(graph))[1:]]


class MicrobatchPlan(NamedTuple):
    """A whole-batch plan carried over to the program exported at the microbatch size."""

    assignment: dict[str, str]  # every op of the microbatch program -> logical device
    order: list[str] | None  # issue order (microbatch program names), None for node order
    stages: list[str]  # first op of each stage after the first (microbatch program names)


def microbatch_plan(
    whole: OpGraph,
    part: OpGraph,
    assignment: Mapping[str, str],
    order: Sequence[str] | None = None,
    stages: Sequence[str] = (),
) -> MicrobatchPlan:
    """Carry a plan of ``whole`` over to ``part``, the same model exported at a microbatch's size.

    A smaller batch can specialise the export: at batch 1, torch drops ``expand``
    and ``contiguous`` ops that are no-ops there, and the ops after them are
    numbered differently. The two programs are aligned by their op types and
    module paths, in program order (:func:`align_programs`). A matched op takes
    its whole-batch op's device; an op only the microbatch program has runs with
    its first input's op, or else with the op before it. The issue order and the
    stage starts follow the matched ops (an op with no match runs right after the
    op before it in program order, as :func:`envs.runtime.reorder` places it).

    >>> from graphs import OpGraph
    >>> whole = OpGraph.from_edges(["a", "expand", "b"], [("a", "expand", 8), ("expand", "b", 8)],
    ...                            op_types=["aten.mm.default", "aten.expand.default", "aten.relu.default"])
    >>> part = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], op_types=["aten.mm.default", "aten.relu.default"])
    >>> microbatch_plan(whole, part, {"a": "cpu:0", "expand": "gpu:0", "b": "gpu:1"}, ["a", "expand", "b"], ["b"])
    MicrobatchPlan(assignment={'a': 'cpu:0', 'b': 'gpu:1'}, order=['a', 'b'], stages=['b'])
    """
    match = align_programs(whole, part)  # part name -> whole name
    by_whole = {w: p for p, w in match.items()}
    placed: dict[str, str] = {}
    preds: list[list[int]] = [[] for _ in range(part.num_ops)]
    for s, d in zip(part.edge_src.tolist(), part.edge_dst.tolist()):
        preds[d].append(s)
    previous = assignment[whole.names[0]] if whole.num_ops else ""
    for i, name in enumerate(part.names):
        if name in match:
            placed[name] = assignment[match[name]]
        else:
            placed[name] = next((placed[part.names[p]] for p in preds[i]), previous)
        previous = placed[name]
    part_order = None if order is None else [by_whole[w] for w in order if w in by_whole]
    sequence = list(order) if order is not None else whole.names
    rank = {w: r for r, w in enumerate(sequence)}
    part_stages = []
    for start in stages:
        nxt = next((by_whole[w] for w in sequence[rank[start] :] if w in by_whole), None)
        if nxt is not None and nxt not in part_stages:
            part_stages.append(nxt)
    return MicrobatchPlan(placed, part_order, part_stages)


def align_programs(whole: OpGraph, part: OpGraph) -> dict[str, str]:
    """``part``'s op names -> the ``whole`` op each stands for, matched by op type and module path in order.

    Identical programs map every name to itself; otherwise the longest matching
    runs of (op type, module path), in program order (``difflib``), are paired.
    """
    if whole.names == part.names:
        return {n: n for n in part.names}

    def tokens(g: OpGraph) -> list[str]:
        return [f"{t}@{m}" for t, m in zip(g.op_types, g.module_paths)]

    matcher = difflib.SequenceMatcher(None, tokens(whole), tokens(part), autojunk=False)
    return {part.names[b + k]: whole.names[a + k] for a, b, size in matcher.get_matching_blocks() for k in range(size)}


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
    idx = as_indices(placement, graph, devices, source=source)
    return {name: devices[int(i)] for name, i in zip(graph.names, idx)}


make_module_callable(__name__, apply)  # `placer.apply(model, ...)` calls apply()
