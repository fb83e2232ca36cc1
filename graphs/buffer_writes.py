"""Which ops of a program write a buffer in place, through which alias, and which ops touch it.

A training step's program is functional but for a few writes torch.export keeps in
place: spectral norm's power iteration under ``no_grad`` writes its ``u`` and ``v``
buffers with ``out=`` inside a ``wrap_with_set_grad_enabled`` region, and returns them;
``batch_norm`` in training updates its running statistics; an op whose schema writes an
argument (``add_``: batch norm's count of batches) writes it. One batch norm applied to
two batches in one forward (a Siamese or contrastive network's two views) updates its
statistics twice, in that order. A value that *aliases* a
buffer (the buffer itself, a view of it, what a region wrote into it and returned) read
by a later op reads the buffer as the writes left it.

Across processes that matters: a stage writes its own copy of what it receives, so a
buffer's alias made in one stage and written in a later one never reaches the buffer.
Capture records what it needs to keep such ops in one stage (:func:`buffer_accesses`,
``meta["buffer_writes"]`` and ``meta["buffer_readers"]``; the stage cut's rule,
:class:`envs.real.distributed.cut.BufferWrites`), and the stage cut refuses what is
still split (:func:`envs.real.distributed.stage_modules.carried_values`).

The program may be an ``ExportedProgram``'s graph (buffers are placeholders, named by
the signature) or its unlifted module (buffers are ``get_attr`` nodes): ``buffer_of``
names the buffer a node is, or None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

from graphs.flops import is_alias
from graphs.ops import written_arguments


def written_by(node: fx.Node, *, hidden: bool = False) -> list[Any]:
    """What the op ``node`` writes in place: the arguments its schema marks written (``add_``'s ``self``, an
    ``.out`` overload's ``out=``); with ``hidden``, also those :func:`graphs.ops.written_arguments` knows the schema
    leaves unmarked (``batch_norm``'s running statistics)."""
    if node.op != "call_function":
        return []
    return [
        node.args[i] if i < len(node.args) else node.kwargs.get(name)
        for i, name in written_arguments(node.target, hidden=hidden)
    ]


def attribute(gm: fx.GraphModule, target: str) -> Any:
    """``gm``'s attribute at the dotted path ``target`` (a region's body, a buffer)."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def region(gm: fx.GraphModule, node: fx.Node) -> tuple[Any, list]:
    """``(body, operands)`` of a ``wrap_with_set_grad_enabled`` region's node, else ``(None, [])``."""
    if node.op != "call_function" or getattr(node.target, "__name__", "") != "wrap_with_set_grad_enabled":
        return None, []
    body = node.args[1] if len(node.args) > 1 else None
    if not isinstance(body, fx.Node) or body.op != "get_attr":
        return None, []
    return attribute(gm, str(body.target)), list(node.args[2:])


def writes(gm: fx.GraphModule, node: fx.Node) -> list[fx.Node]:
    """The values ``node`` writes in place: its written arguments (``batch_norm``'s running statistics too), and a
    region's operands its body writes."""
    out = [given for given in written_by(node, hidden=True) if isinstance(given, fx.Node)]
    body, operands = region(gm, node)
    if body is not None:
        places = [n for n in body.graph.nodes if n.op == "placeholder"]
        out += [operands[places.index(w)] for n in body.graph.nodes for w in written_by(n, hidden=True) if w in places]
    return out


def region_output_source(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """For ``getitem(region, i)`` where the region's output ``i`` is what its body wrote into an operand (``out=``):
    that operand. Else None."""
    if getattr(node.target, "__name__", "") != "getitem" or not isinstance(node.args[0], fx.Node):
        return None
    body, operands = region(gm, node.args[0])
    if body is None:
        return None
    places = [n for n in body.graph.nodes if n.op == "placeholder"]
    output = next(n for n in body.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    result = results[node.args[1]] if isinstance(node.args[1], int) and node.args[1] < len(results) else None
    written = [w for w in written_by(result) if w in places] if isinstance(result, fx.Node) else []
    return operands[places.index(written[0])] if written else None


def alias_source(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The value ``node``'s output aliases, one step back: a region's written operand (for its getitem), a view's
    input, the argument an in-place op wrote and returned (``add_``, an ``out=`` overload). None: no alias."""
    if node.op != "call_function":
        return None
    source = region_output_source(gm, node)  # before the views: a region's outputs are its getitems
    if source is not None:
        return source
    if is_alias(node.target) and node.args and isinstance(node.args[0], fx.Node):
        return node.args[0]
    schema = getattr(node.target, "_schema", None)
    returns = schema.returns if schema is not None else ()
    if returns and all(r.alias_info is not None and r.alias_info.is_write for r in returns):
        given = written_by(node)
        return given[0] if given and isinstance(given[0], fx.Node) else None
    return None


def buffer_chain(gm: fx.GraphModule, node: fx.Node, buffer_of: Callable[[fx.Node], str | None]) -> tuple[str, list]:
    """``(buffer, chain)`` where ``node`` aliases a buffer: its name, and the ops from ``node`` back to the buffer
    (``node`` first; empty where ``node`` is the buffer itself). ``("", [])``: it aliases none."""
    chain: list[fx.Node] = []
    seen: set[fx.Node] = set()
    while node is not None and node not in seen:
        seen.add(node)
        name = buffer_of(node)
        if name:
            return name, chain
        if node.op != "call_function":
            return "", []
        chain.append(node)
        node = alias_source(gm, node)
    return "", []


def buffer_accesses(
    gm: fx.GraphModule, buffer_of: Callable[[fx.Node], str | None], ops: set[str] | None = None
) -> tuple[list[list[str]], dict[str, list[str]]]:
    """``(buffer_writes, buffer_readers)`` of the program ``gm``, for its ops (``ops``: their names; None: every
    call_function node):

    - ``buffer_writes``: ``[op, buffer, through]`` for each op that writes a buffer in place, where ``through`` is
      the first op of the alias it writes (the op nearest the buffer: a region's getitem, a view of the buffer);
      ``""`` where it writes the buffer itself;
    - ``buffer_readers``: for each buffer some op writes, every op that reads, writes or makes an alias of it, in
      program order.
    """
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and (ops is None or n.name in ops)]
    chains: dict[fx.Node, tuple[str, list]] = {}

    def chain_of(value: fx.Node) -> tuple[str, list]:
        if value not in chains:
            chains[value] = buffer_chain(gm, value, buffer_of)
        return chains[value]

    found: list[list[str]] = []
    for node in nodes:
        for value in writes(gm, node):
            name, chain = chain_of(value)
            if name:
                entry = [node.name, name, chain[-1].name if chain else ""]
                if entry not in found:
                    found.append(entry)
    written = {b for _, b, _ in found}
    readers: dict[str, list[str]] = {}
    if written:
        for node in nodes:
            operands = list(node.all_input_nodes) + region(gm, node)[1]
            touched = {chain_of(node)[0]} | {chain_of(a)[0] for a in operands if isinstance(a, fx.Node)}
            for name in sorted(touched & written):
                readers.setdefault(name, []).append(node.name)
    return found, readers


__all__ = ["alias_source", "buffer_accesses", "buffer_chain", "region", "region_output_source", "writes", "written_by"]
