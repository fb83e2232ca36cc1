"""Activation checkpointing per block in a placed program: each block's ops run under torch's checkpoint.

A plan's ``checkpoint`` names modules (:attr:`graphs.plan.Placement.checkpoint`).
:func:`checkpoint_blocks` rewrites the placed FX graph so the nodes of each block,
the ops whose module path is the block's or below it and the nodes placed among
them (``getitem``, copies of its own tensors; a copy of a tensor from outside is
made before the block and passed in), become one submodule called through
:func:`torch.utils.checkpoint.checkpoint` (non-reentrant): the forward keeps the
block's inputs, not the activations its ops save, and autograd runs the block's
forward again when its backward first needs one of them (the random state as it
was, so dropout draws the same masks). :mod:`envs.sim.checkpointing` charges
exactly that.

A block's ops must be issued one after the other (no other op of the plan between
them) and must not write a tensor from outside the block in place (an in-place
update of a running statistic would be made twice): both are a
:class:`graphs.PlacerError` naming the block. ``gm.meta[CHECKPOINT_META]`` maps each
block to its submodule's name.

A homed parameter's reader (:mod:`envs.real.homes`) may be inside a block: its
``fetch`` and ``release`` nodes go into the block with it, and
:data:`envs.real.homes.PHASE` tells them which forward runs (the block's first, or
its second in the backward), so the second forward's copy is kept for the reader's
backward rather than made again.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from envs.real.homes import HOME_COPY_META, HOME_VIEW_META, PHASE
from envs.real.reorder import written_nodes
from envs.real.transfers import to_device
from graphs import PlacerError
from graphs.plan import in_module
from graphs.program_nodes import module_path

CHECKPOINT_META = "placer_checkpoint"  # GraphModule.meta key: block (module path) -> its submodule's name


@contextmanager
def _phase(name: str) -> Iterator[None]:
    token = PHASE.set(name)
    try:
        yield
    finally:
        PHASE.reset(token)


def _phases() -> tuple[object, object]:
    return _phase("forward"), _phase("recompute")


def checkpointed(fn: torch.nn.Module, *args: object) -> object:
    """``fn(*args)`` under :func:`torch.utils.checkpoint.checkpoint`, non-reentrant (what a block node calls), with
    :data:`envs.real.homes.PHASE` set in each of its forwards."""
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_phases)


def checkpoint_blocks(gm: fx.GraphModule, blocks: Sequence[str], ops: Collection[str]) -> None:
    """Wrap each block of ``blocks`` (module paths) in ``gm`` in a checkpointed submodule (the module doc); ``ops``:
    the names of the program's ops (the call_function nodes a plan places)."""
    gm.meta[CHECKPOINT_META] = {}
    for k, block in enumerate(blocks):
        gm.meta[CHECKPOINT_META][block] = _wrap(gm, block, k, ops)
    gm.graph.lint()


def _wrap(gm: fx.GraphModule, block: str, k: int, ops: Collection[str]) -> str:
    graph = gm.graph
    nodes = list(graph.nodes)
    mine = [n for n in nodes if n.op == "call_function" and n.name in ops and in_module(module_path(n), block)]
    if not mine:
        raise PlacerError(f"checkpoint: block {block!r} runs no op of this program")
    index = {n: i for i, n in enumerate(nodes)}
    # a homed parameter's fetch before its reader, the views it is read through and the release after it
    # (envs.real.homes) belong to the block
    views = []
    for n in mine:
        for a in n.all_input_nodes:
            while a.meta.get(HOME_VIEW_META):
                views.append(a)
                a = a.all_input_nodes[0]
    mine_set = set(mine) | set(views)
    fetches = [a for n in mine_set for a in n.all_input_nodes if a.meta.get(HOME_COPY_META)]
    releases = [u for n in mine for u in n.users if u.meta.get(HOME_COPY_META)]
    ends = [index[n] for n in (*mine, *views, *fetches, *releases)]
    first, last = min(ends), max(ends)
    start, end = nodes[first], nodes[last]
    span = set(nodes[first : last + 1])
    for n in nodes[first : last + 1]:
        # an attribute read, or a copy of a tensor from outside, among the block's nodes: made before the block and
        # passed in, so its second forward reads it rather than copying it again
        if n.op == "get_attr" or (n.target is to_device and not any(a in span for a in n.all_input_nodes)):
            if n is start:
                start = n.next
            start.prepend(n)
            span.discard(n)
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    first, last = index[start], index[end]
    span = nodes[first : last + 1]
    inside = set(span)
    for n in span:
        if n.op == "call_function" and n.name in ops and n not in mine_set:
            raise PlacerError(
                f"checkpoint: block {block!r}'s ops are not issued one after the other ({n.name!r} of another "
                "module runs between them): give the plan an order that issues them together"
            )
        if n.op != "call_function":
            raise PlacerError(f"checkpoint: block {block!r} holds a {n.op} node ({n.name!r}), which cannot be wrapped")
        outside = [w for w in written_nodes(n) if w not in inside]
        if outside:
            raise PlacerError(
                f"checkpoint: block {block!r} writes {outside[0].name!r} in place ({n.name!r}), which its second "
                "forward would write again: leave it out of the checkpoint"
            )
    inputs: list[fx.Node] = []
    for n in span:
        for a in n.all_input_nodes:
            if a not in inside and a not in inputs:
                inputs.append(a)
    outputs = [n for n in span if any(u not in inside for u in n.users)]
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for a in inputs:
        env[a] = sub.placeholder(a.name)
        env[a].meta = dict(a.meta)
    for n in span:
        env[n] = sub.node_copy(n, lambda x: env[x])
    sub.output(tuple(env[o] for o in outputs))
    name = f"_placer_checkpoint_{k}"
    gm.add_submodule(name, fx.GraphModule(gm, sub))
    with graph.inserting_before(span[0]):
        fn = graph.get_attr(name)
        call = graph.call_function(checkpointed, (fn, *inputs))
        results = [graph.call_function(operator.getitem, (call, j)) for j in range(len(outputs))]
    for o, r in zip(outputs, results):
        r.meta = dict(o.meta)
        o.replace_all_uses_with(r, delete_user_cb=lambda user: user not in inside)
    for n in reversed(span):
        graph.erase_node(n)
    return name


__all__ = ["CHECKPOINT_META", "checkpoint_blocks", "checkpointed"]
