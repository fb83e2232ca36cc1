"""A placed program's nodes re-emitted in a plan's issue order.

The OpGraph's edges are the data dependencies; a program has two more kinds of
constraint, kept here: an op that writes a tensor in place stays after the ops
that read that tensor (or a view of it) before it in node order, and before those
that read it after; random ops (dropout) keep their node order, so they draw the
same numbers. Where an order crosses one, the later op waits.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
import torch.fx as fx

from graphs import PlacerError
from graphs.flops import is_alias
from graphs.ops import written_arguments


def written_nodes(node: fx.Node) -> list[fx.Node]:
    """Node arguments that ``node`` mutates in place (:func:`graphs.ops.written_arguments`: schema and known
    composites)."""
    written = [
        node.args[i] if i < len(node.args) else node.kwargs.get(name) for i, name in written_arguments(node.target)
    ]
    return [w for w in written if isinstance(w, fx.Node)]


def alias_roots(nodes: Sequence[fx.Node]) -> dict[fx.Node, fx.Node]:
    """Each node -> the node whose storage its value is (itself, unless it is a view or an in-place op's result)."""
    root: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        root[n] = n
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        returns_written = schema is not None and any(
            r.alias_info is not None and r.alias_info.is_write for r in schema.returns
        )
        base = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if base is not None and (is_alias(n.target) or returns_written):
            root[n] = root.get(base, base)
    return root


def reorder(graph: fx.Graph, order: Sequence[str]) -> None:
    """Re-emit the nodes of ``graph`` so the ops named in ``order`` run in that order.

    ``order`` names call_function nodes (every op of the OpGraph, in a topological
    order of its edges). Other nodes stay where FX and the data need them:
    placeholders, attributes and guards before the first op, nodes between two ops
    right after the op they followed in node order (once their inputs exist), nodes
    after the last op (``copy_`` write-backs) after every op, and the output last.
    In-place writes and random ops keep their order relative to the ops they
    conflict with (see :func:`order_constraints`); an op crossing one waits.
    Among everything else the result is the greedy topological order nearest to
    ``order``, which is ``order`` itself when it crosses no constraint.
    """
    nodes = [n for n in graph.nodes if n.op != "output"]
    rank = _ranks(nodes, order)
    key = _sort_keys(nodes, rank, len(order))
    position = {n: i for i, n in enumerate(nodes)}
    preds: dict[fx.Node, set[fx.Node]] = {n: set(n.all_input_nodes) for n in nodes}
    for a, b in order_constraints(nodes):
        preds[b].add(a)
    succs: dict[fx.Node, list[fx.Node]] = {n: [] for n in nodes}
    waiting = {}
    for n in nodes:
        waiting[n] = len(preds[n])
        for p in preds[n]:
            succs[p].append(n)
    ready = [(key[n], position[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    out: list[fx.Node] = []
    while ready:
        _, _, n = heapq.heappop(ready)
        out.append(n)
        for s in succs[n]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (key[s], position[s], s))
    if len(out) != len(nodes):  # cannot happen for an exported program: its node order is one
        raise PlacerError("issue order: the exported program's constraints form a cycle")
    output = next(n for n in graph.nodes if n.op == "output")
    for n in out:
        output.prepend(n)


def _ranks(nodes: Sequence[fx.Node], order: Sequence[str]) -> dict[fx.Node, int]:
    """Each op named in ``order`` -> its position there; a name twice or unknown is a PlacerError."""
    by_name = {n.name: n for n in nodes if n.op == "call_function"}
    rank: dict[fx.Node, int] = {}
    for r, name in enumerate(order):
        node = by_name.get(name)
        if node is None or node in rank:
            what = "names it twice" if node is not None else "is not an op of the exported program"
            raise PlacerError(f"issue order: op {name!r} {what}")
        rank[node] = r
    return rank


def _sort_keys(nodes: Sequence[fx.Node], rank: dict[fx.Node, int], length: int) -> dict[fx.Node, tuple[int, int, int]]:
    """Where each node wants to run: an op at its rank, any other node right after the op it followed."""
    position = {n: i for i, n in enumerate(nodes)}
    op_positions = [position[n] for n in rank]
    first, last = (min(op_positions), max(op_positions)) if op_positions else (len(nodes), -1)
    key: dict[fx.Node, tuple[int, int, int]] = {}
    anchor = -1
    for i, n in enumerate(nodes):
        if n in rank:
            anchor = rank[n]
            key[n] = (anchor, 0, i)
        elif i < first:
            key[n] = (-1, 0, i)
        elif i > last:
            key[n] = (length, 0, i)
        else:
            key[n] = (anchor, 1, i)  # right after the op it followed
    return key


def order_constraints(nodes: Sequence[fx.Node]) -> list[tuple[fx.Node, fx.Node]]:
    """``(a, b)`` pairs where ``a`` must run before ``b`` though ``b`` does not read ``a``.

    * An op writing a tensor in place (``add_``, ``copy_``, batch-norm statistics)
      and every other node reading that tensor, or a view of it, keep their node order.
    * Random ops (``torch.Tag.nondeterministic_seeded``) keep their node order.
    """
    position = {n: i for i, n in enumerate(nodes)}
    root = alias_roots(nodes)
    written: dict[fx.Node, list[fx.Node]] = {}
    for n in nodes:
        w = written_nodes(n) if n.op == "call_function" else []
        if w:
            written[n] = w
    readers: dict[fx.Node, list[fx.Node]] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            readers.setdefault(root.get(a, a), []).append(n)
    pairs = []
    for w, args in written.items():
        for r in {root.get(a, a) for a in args}:
            for u in readers.get(r, ()):
                if u is not w:
                    pairs.append((u, w) if position[u] < position[w] else (w, u))
    seeded = [
        n
        for n in nodes
        if n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
    ]
    pairs.extend(zip(seeded, seeded[1:]))
    return pairs
