"""A plan made for one program of a model, carried over to another program of the same model.

The plan's op names are those of the program an OpGraph was captured from: the
model at the example's sizes. Two other programs of the same model run it:

* the program at a microbatch's size (a pipelined plan): a smaller batch can
  specialise the export; at batch 1 torch drops ``expand`` and ``contiguous`` ops
  that are no-ops there, and the ops after them are numbered differently;
* the program with dynamic dimensions (inputs at other sizes): torch keeps slices
  and expands it could drop at the example's sizes, and reads sizes (``sym_size``).

:func:`align_programs` matches the two programs' ops by op type and module path,
in program order; :func:`carry_plan` gives every op of the other program a device,
and carries the issue order and the stage starts over. Only where ops run
depends on the alignment: any assignment computes the model's values.
"""

from __future__ import annotations

import difflib
from typing import Any, NamedTuple

from graphs import OpGraph
from graphs.flops import op_type
from graphs.program_nodes import module_path, shape_nodes


class ProgramPlan(NamedTuple):
    """A plan in the op names of one program: what :func:`envs.real.placing.place_module` takes."""

    assignment: dict[str, str]  # every op of the program -> logical device
    order: list[str] | None  # issue order (op names), None for node order
    stages: list[str]  # first op of each stage after the first (1F1B), [] for one stage
    checkpoint: tuple[str, ...] = ()  # module paths run under activation checkpointing (any program of the model)


def program_graph(ep: Any) -> OpGraph:
    """The ops of program ``ep`` with their types, module paths and edges: what an alignment reads.

    No FLOPs or bytes (a program with dynamic dimensions has symbolic sizes), and
    no shape reads (:func:`graphs.torch_capture.shape_nodes`), as in a capture.
    """
    skip = shape_nodes(ep.graph.nodes)
    ops = [n for n in ep.graph.nodes if n.op == "call_function" and n not in skip]
    index = {n: i for i, n in enumerate(ops)}
    edges = [(a.name, n.name, 0) for n in ops for a in n.all_input_nodes if a in index]
    return OpGraph.from_edges(
        [n.name for n in ops],
        edges,
        op_types=[op_type(n.target) for n in ops],
        module_paths=[module_path(n) for n in ops],
    )


def carry_plan(whole: OpGraph, plan: ProgramPlan, part: OpGraph) -> ProgramPlan:
    """Carry ``plan``, made for ``whole``, over to ``part``, another program of the same model.

    The two programs are aligned by their op types and module paths, in program
    order (:func:`align_programs`). A matched op takes its ``whole`` op's device;
    an op only ``part`` has runs with its first input's op, or else with the op
    before it. The issue order and the stage starts follow the matched ops (an op
    with no match runs right after the op before it in program order, as
    :func:`envs.real.reorder.reorder` places it).

    >>> whole = OpGraph.from_edges(["a", "expand", "b"], [("a", "expand", 8), ("expand", "b", 8)],
    ...                            op_types=["aten.mm.default", "aten.expand.default", "aten.relu.default"])
    >>> part = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], op_types=["aten.mm.default", "aten.relu.default"])
    >>> plan = ProgramPlan({"a": "cpu:0", "expand": "gpu:0", "b": "gpu:1"}, ["a", "expand", "b"], ["b"])
    >>> carry_plan(whole, plan, part)
    ProgramPlan(assignment={'a': 'cpu:0', 'b': 'gpu:1'}, order=['a', 'b'], stages=['b'], checkpoint=())
    """
    match = align_programs(whole, part)  # part name -> whole name
    by_whole = {w: p for p, w in match.items()}
    assignment: dict[str, str] = {}
    preds: list[list[int]] = [[] for _ in range(part.num_ops)]
    for s, d in zip(part.edge_src.tolist(), part.edge_dst.tolist()):
        preds[d].append(s)
    previous = plan.assignment[whole.names[0]] if whole.num_ops else ""
    for i, name in enumerate(part.names):
        if name in match:
            assignment[name] = plan.assignment[match[name]]
        else:
            assignment[name] = next((assignment[part.names[p]] for p in preds[i]), previous)
        previous = assignment[name]
    order = None if plan.order is None else [by_whole[w] for w in plan.order if w in by_whole]
    sequence = list(plan.order) if plan.order is not None else whole.names
    rank = {w: r for r, w in enumerate(sequence)}
    stages: list[str] = []
    for start in plan.stages:
        nxt = next((by_whole[w] for w in sequence[rank[start] :] if w in by_whole), None)
        if nxt is not None and nxt not in stages:
            stages.append(nxt)
    return ProgramPlan(assignment, order, stages, plan.checkpoint)


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
