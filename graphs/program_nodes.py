"""What the nodes of an exported program say, beyond their op: module paths, shape arithmetic, traced sizes.

>>> module_fqn("getattr(L['self'].h, '1').mlp")
'h.1.mlp'
"""

from __future__ import annotations

import re
from typing import Any

import torch

try:
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw
except ImportError:  # torch < 2.12 (the GPU machines' 2.11): size_hint gives the same concrete hint
    from torch.fx.experimental.symbolic_shapes import size_hint as guarding_hint_or_throw
from torch.utils._pytree import tree_flatten, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from graphs.flops import op_type
from graphs.ops import SHAPE_OPS, base_op_name


def shape_nodes(nodes: Any) -> set[torch.fx.Node]:
    """The nodes of a program that compute with sizes only, not ops of its graph.

    A program with dynamic dimensions reads sizes (``sym_size``: :data:`graphs.ops.SHAPE_OPS`),
    does arithmetic on them and asserts their ranges; a static program, with its
    sizes written in, has none of these. Leaving them out keeps its ops those of
    the static program (the one an OpGraph is captured from).
    """
    found: set[torch.fx.Node] = set()
    for n in nodes:
        if n.op != "call_function":
            continue
        if base_op_name(op_type(n.target)) in SHAPE_OPS:
            found.add(n)
        elif not _holds_tensor(n.meta.get("val")) and n.all_input_nodes and all(a in found for a in n.all_input_nodes):
            found.add(n)
    return found


def _holds_tensor(val: Any) -> bool:
    return any(isinstance(t, torch.Tensor) for t in tree_flatten(val)[0])


def concrete(val: Any) -> Any:
    """``val`` (a node's ``meta["val"]``) at the sizes it was traced with: symbolic sizes replaced by their hints.

    A tensor whose shape is symbolic becomes a meta tensor of the traced shape and
    strides (what FLOP formulas and byte counts read); anything else is returned as is.
    """

    def one(x: Any) -> Any:
        if isinstance(x, torch.SymInt):
            return guarding_hint_or_throw(x)
        if isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride())):
            shape = [guarding_hint_or_throw(d) for d in x.shape]
            stride = [guarding_hint_or_throw(d) for d in x.stride()]
            return torch.empty_strided(shape, stride, dtype=x.dtype, device="meta")
        return x

    return tree_map(one, val)


def module_path(node: torch.fx.Node) -> str:
    """The dotted path of the innermost module ``node`` ran in, from the root model ("" for the root itself)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return module_fqn(path) if isinstance(path, str) else ""


_ROOT_PREFIX = re.compile(r"^L\[['\"]self['\"]\]\.?|^L__self__\.?")
_GETATTR = re.compile(r"getattr\(([^()]*?),\s*['\"]([^'\"]+)['\"]\)")
_INDEX = re.compile(r"(?:\.?_modules)?\[['\"]?([^\]'\"]+)['\"]?\]")


def module_fqn(path: str) -> str:
    """A module path as torch.export records it, as the dotted name ``model.named_modules()`` gives it.

    torch.export normalizes most paths (``model.h.0.attn``) but leaves the
    tracer's form where it does not add a root entry (``L['self'].model.h[0]``,
    ``getattr(L['self'].model.h, '0')``); a wrapper model then got paths that
    matched no module of the one it wraps.

    >>> module_fqn("L['self'].model.transformer.h[0].attn"), module_fqn("getattr(L['self'].h, '1').mlp")
    ('model.transformer.h.0.attn', 'h.1.mlp')
    >>> module_fqn("L['self']"), module_fqn("L['self']._modules['enc']._modules['0']"), module_fqn("model.h.0")
    ('', 'enc.0', 'model.h.0')
    """
    while True:
        inner = _GETATTR.sub(lambda m: f"{m.group(1)}.{m.group(2)}", path)
        if inner == path:
            break
        path = inner
    path = _ROOT_PREFIX.sub("", path)
    return _INDEX.sub(lambda m: f".{m.group(1)}", path).strip(".")
