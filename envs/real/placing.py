"""Run an exported training step on real torch devices, one device per op.

This is the machinery behind :func:`placer.apply` and the Ray measurement
harness (``envs.real.measured``): it lives in ``envs`` because the harness needs it
and imports flow ``graphs <- envs <- placer``.

:func:`place_module` is a small pass over the unlifted ``torch.fx`` graph of an
``ExportedProgram`` (``ep.module()``), so the node names are the export's node
names, i.e. ``OpGraph.names``:

* every placed ``call_function`` node runs on its device: a ``device=`` keyword
  (factory ops such as ``aten.ones``) is rewritten to it, and each tensor argument
  produced on another logical device is copied there by one inserted
  ``_to_device`` node per (tensor, device), shared by all consumers on that device;
* a parameter or buffer lives on the device of its first consumer (the op that
  "owns" it in ``OpGraph.param_bytes``); other consumers read a differentiable
  ``.to()`` copy, so gradients flow back into the one master tensor;
* an op that writes into a copied tensor in place (``add_``, the running
  statistics of ``aten.batch_norm``) is followed by a write-back into the master,
  and stale copies of a written tensor are never reused;
* user inputs are copied once per consumer device, straight from where the caller
  passes them; outputs stay on the device of the op that produced them;
* nodes the export adds that are not ops of the graph (``copy_`` write-backs of
  mutated buffers after decomposition) run on the device of their first argument;
* given an issue ``order`` (op names, a topological order of the graph), the ops
  are first re-emitted in that order (:func:`reorder`), so each copy is then issued
  right before its first consumer *in that order*. Two kinds of constraint that the
  OpGraph's edges do not show are kept: an op that writes a tensor in place stays
  after the ops that read that tensor (or a view of it) before it in node order, and
  before those that read it after; random ops (dropout) keep their node order, so
  they draw the same numbers. Where the order crosses one, the later op waits (the
  rest of the order is followed as given); ``gm.meta[ORDER_META]`` is the order run.

Copies avoid host synchronisation where torch allows (:func:`_to_device`): GPU->GPU
copies are ``non_blocking`` peer copies, host->GPU copies go from pinned memory
with ``non_blocking=True``, and GPU->host copies stay synchronous, as the host op
that reads the result needs the data at once.

Transfers are decided on *logical* devices, so a map of every logical device to
``cpu`` still builds (and tests) every cross-device copy, as no-op copies.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from graphs import PlacerError
from graphs.flops import is_alias
from graphs.ops import written_arguments


MOVE_META = "placer_transfer"  # node.meta key on inserted copies: (source node name, logical device)
DEVICE_META = "placer_device"  # node.meta key: the logical device a node runs on
WRITEBACK_META = "placer_writeback"  # node.meta key on inserted write-backs: master node name
ORDER_META = "placer_issue_order"  # GraphModule.meta key: the placed ops' names in the order the module runs them

_LOGICAL_RE = re.compile(r"^(cpu|gpu):(\d+)$")


# ----------------------------------------------------------------- device maps
def parse_device_map(text: str) -> dict[str, str]:
    """Parse ``"gpu:0=cuda:1,*=cpu"`` into ``{"gpu:0": "cuda:1", "*": "cpu"}``.

    >>> parse_device_map("gpu:0=cuda:1, *=cpu")
    {'gpu:0': 'cuda:1', '*': 'cpu'}
    """
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise PlacerError(f"--device-map: {item!r} is not LOGICAL=TORCH_DEVICE (e.g. gpu:0=cuda:1 or *=cpu)")
        out[key.strip()] = value.strip()
    return out


def resolve_devices(logical: Iterable[str], device_map: Mapping[str, str] | str | None = None) -> dict[str, torch.device]:
    """Torch device of each logical device name.

    Explicit entries of ``device_map`` win, then its ``"*"`` wildcard, then the
    default ``gpu:i -> cuda:i``, ``cpu:i -> cpu``.

    >>> resolve_devices(["cpu:0", "gpu:0", "gpu:1"], "gpu:1=cuda:0,*=cpu")
    {'cpu:0': device(type='cpu'), 'gpu:0': device(type='cpu'), 'gpu:1': device(type='cuda', index=0)}
    """
    dmap = parse_device_map(device_map) if isinstance(device_map, str) else dict(device_map or {})
    out: dict[str, torch.device] = {}
    for name in logical:
        if name in out:
            continue
        target = dmap.get(name, dmap.get("*"))
        if target is None:
            m = _LOGICAL_RE.match(name)
            if not m:
                raise PlacerError(f"device map: no torch device for logical device {name!r} (add {name}=... or *=...)")
            target = "cpu" if m.group(1) == "cpu" else f"cuda:{m.group(2)}"
        try:
            out[name] = torch.device(target)
        except (RuntimeError, ValueError):
            raise PlacerError(f"device map: {target!r} (for {name!r}) is not a torch device") from None
    return out


def check_available(devices: Mapping[str, torch.device]) -> None:
    """Raise :class:`PlacerError` if a logical device maps to a CUDA device this machine lacks."""
    for name, dev in devices.items():
        if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
            raise PlacerError(f"{name} maps to {dev}, which this machine does not have (use a device map, e.g. --device-map '*=cpu')")


# ------------------------------------------------------------------ transfers
def copy_kind(src: torch.device, dst: torch.device) -> str:
    """How :func:`_to_device` copies a tensor from ``src`` to ``dst``.

    ``"same"``: no copy; ``"peer"``: GPU->GPU, ``non_blocking``; ``"pinned"``: host->GPU
    from pinned memory, ``non_blocking``; ``"sync"``: any other pair (GPU->host, which
    the host op needs at once, and CPU/meta pairs), an ordinary ``.to()``.

    >>> copy_kind(torch.device("cpu"), torch.device("cuda:1")), copy_kind(torch.device("cuda:0"), torch.device("cpu"))
    ('pinned', 'sync')
    """
    if src == dst:
        return "same"
    if dst.type == "cuda":
        if src.type == "cuda":
            return "peer"
        if src.type == "cpu":
            return "pinned"
    return "sync"


def _copy_tensor(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    kind = copy_kind(t.device, device)
    if kind == "same":
        return t
    if kind == "pinned":
        # pin_memory() is differentiable (its gradient is the identity) and torch's pinned
        # allocator keeps the block alive until the asynchronous copy has read it.
        if not t.is_pinned():
            t = t.pin_memory()
        return t.to(device, non_blocking=True)
    if kind == "peer":
        return t.to(device, non_blocking=True)  # stream-ordered on both devices; autograd's backward too
    return t.to(device)


def _to_device(value: Any, device: str | torch.device) -> Any:
    """Copy a tensor (or a tuple/list of them) to ``device``; other values pass through.

    >>> _to_device((torch.ones(1), [torch.zeros(2), 3]), "cpu")
    (tensor([1.]), [tensor([0., 0.]), 3])
    """
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, torch.device(device))
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _write_back(master: torch.Tensor, copy: torch.Tensor) -> None:
    """Copy an in-place update made on ``copy`` back into ``master`` (another device)."""
    with torch.no_grad():
        master.copy_(copy)


def _written_args(node: fx.Node) -> list[fx.Node]:
    """Node arguments that ``node`` mutates in place (:func:`graphs.ops.written_arguments`: schema and known composites)."""
    written = [node.args[i] if i < len(node.args) else node.kwargs.get(name) for i, name in written_arguments(node.target)]
    return [w for w in written if isinstance(w, fx.Node)]


def _module_tensor(gm: nn.Module, fqn: str) -> Any:
    obj: Any = gm
    for part in fqn.split("."):
        obj = getattr(obj, part)
    return obj


def _set_module_tensor(gm: nn.Module, fqn: str, value: torch.Tensor) -> None:
    *path, leaf = fqn.split(".")
    mod: Any = gm
    for part in path:
        mod = getattr(mod, part)
    if isinstance(mod, nn.Module) and leaf in mod._parameters:
        mod._parameters[leaf] = value  # type: ignore[assignment]
    elif isinstance(mod, nn.Module) and leaf in mod._buffers:
        mod._buffers[leaf] = value
    else:
        setattr(mod, leaf, value)


def _moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device == device:
        return t
    if isinstance(t, nn.Parameter):
        return nn.Parameter(t.detach().to(device), requires_grad=t.requires_grad)
    return t.detach().to(device)


# ---------------------------------------------------------------- the pass
def place_module(
    ep: torch.export.ExportedProgram,
    assignment: Mapping[str, str],
    device_map: Mapping[str, str] | str | None = None,
    order: Sequence[str] | None = None,
) -> fx.GraphModule:
    """An ``nn.Module`` running ``ep`` with op ``name`` on logical device ``assignment[name]``.

    ``assignment`` must name every op the caller cares about (it is validated
    against the OpGraph by :func:`placer.apply`); call_function nodes it does not
    name run next to their first argument. Parameters move to their owner's torch
    device (a new ``nn.Parameter`` where the device changes, the same tensor
    otherwise, like ``model.to``), so build the optimizer on the returned module.
    ``order``: op names in issue order (validated by :func:`graphs.plan.check_order`
    against the OpGraph by the caller); ``None`` keeps node order. See :func:`reorder`.
    """
    gm = ep.module()
    devices = resolve_devices(sorted(set(assignment.values())), device_map)
    check_available(devices)
    graph = gm.graph
    nodes = list(graph.nodes)
    home: dict[fx.Node, str] = {}  # logical device each value lives on (absent: unknown)

    # 1. Owners of parameters/buffers: the first placed consumer, shared by aliases (tied weights).
    attr_nodes = [n for n in nodes if n.op == "get_attr"]
    tensor_of = {n: _module_tensor(gm, str(n.target)) for n in attr_nodes}
    owner_by_id: dict[int, str] = {}
    position = {n: i for i, n in enumerate(nodes)}
    first_use: list[tuple[int, fx.Node, str]] = []
    for n in attr_nodes:
        placed_users = [u for u in n.users if u.op == "call_function" and u.name in assignment]
        if placed_users:
            u = min(placed_users, key=position.__getitem__)
            first_use.append((position[u], n, assignment[u.name]))
    for _, n, dev in sorted(first_use, key=lambda t: t[0]):
        owner_by_id.setdefault(id(tensor_of[n]), dev)
    moved_by_id: dict[int, torch.Tensor] = {}
    for n in attr_nodes:
        t = tensor_of[n]
        dev = owner_by_id.get(id(t))
        if dev is None or not isinstance(t, torch.Tensor):
            continue
        home[n] = dev
        if id(t) not in moved_by_id:
            moved_by_id[id(t)] = _moved(t, devices[dev])
        _set_module_tensor(gm, str(n.target), moved_by_id[id(t)])

    # 2. The issue order (owners above stay those of node order, as in OpGraph.param_bytes).
    if order is not None:
        reorder(graph, order)
        nodes = list(graph.nodes)
    gm.meta[ORDER_META] = [n.name for n in nodes if n.op == "call_function" and n.name in assignment]

    # 3. Walk the ops: pick a device, move arguments, rewrite device=, write back in-place updates.
    copies: dict[tuple[fx.Node, str], fx.Node] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        dev = assignment.get(node.name)
        if dev is None:
            dev = next((home[a] for a in node.all_input_nodes if a in home), None)
            if dev is None:
                continue  # nothing known about where it runs: leave it untouched
        home[node] = dev
        node.meta[DEVICE_META] = dev
        torch_dev = str(devices[dev])

        def move(arg: fx.Node) -> fx.Node:
            if arg.op == "get_attr" and not isinstance(tensor_of.get(arg), torch.Tensor):
                return arg  # e.g. a submodule or a script object
            if home.get(arg) == dev:
                return arg
            key = (arg, dev)
            if key not in copies:
                with graph.inserting_before(node):
                    copy = graph.create_node(
                        "call_function", _to_device, (arg, torch_dev), name=f"{arg.name}_to_{dev.replace(':', '')}"
                    )
                copy.meta[MOVE_META] = (arg.name, dev)
                copy.meta[DEVICE_META] = dev
                if "val" in arg.meta:
                    copy.meta["val"] = arg.meta["val"]
                home[copy] = dev
                copies[key] = copy
            return copies[key]

        original_args = list(node.all_input_nodes)
        node.args = fx.map_arg(node.args, move)
        node.kwargs = fx.map_arg(node.kwargs, move)
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": devices[dev]}
        # In-place writes: drop stale copies; push a write on a copy back into its master.
        inverse = {copies[(a, dev)]: a for a in original_args if (a, dev) in copies}
        for w in _written_args(node):
            master = inverse.get(w, w)
            for key in [k for k in copies if k[0] is master and copies[k] is not w]:
                del copies[key]
            if master is not w:
                with graph.inserting_after(node):
                    wb = graph.call_function(_write_back, (master, w))
                wb.meta[WRITEBACK_META] = master.name
    graph.lint()
    gm.recompile()
    return gm


def reorder(graph: fx.Graph, order: Sequence[str]) -> None:
    """Re-emit the nodes of ``graph`` so the ops named in ``order`` run in that order.

    ``order`` names call_function nodes (every op of the OpGraph, in a topological
    order of its edges). Other nodes stay where FX and the data need them:
    placeholders, attributes and guards before the first op, nodes between two ops
    right after the op they followed in node order (once their inputs exist), nodes
    after the last op (``copy_`` write-backs) after every op, and the output last.
    In-place writes and random ops keep their order relative to the ops they
    conflict with (see :func:`_order_constraints`); an op crossing one waits.
    Among everything else the result is the greedy topological order nearest to
    ``order``, which is ``order`` itself when it crosses no constraint.
    """
    nodes = [n for n in graph.nodes if n.op != "output"]
    by_name = {n.name: n for n in nodes if n.op == "call_function"}
    rank: dict[fx.Node, int] = {}
    for r, name in enumerate(order):
        node = by_name.get(name)
        if node is None or node in rank:
            what = "names it twice" if node is not None else "is not an op of the exported program"
            raise PlacerError(f"issue order: op {name!r} {what}")
        rank[node] = r
    position = {n: i for i, n in enumerate(nodes)}
    op_positions = [position[n] for n in rank]
    first, last = (min(op_positions), max(op_positions)) if op_positions else (len(nodes), -1)
    key: dict[fx.Node, tuple[int, int, int]] = {}
    anchor = -1
    for n in nodes:
        i = position[n]
        if n in rank:
            anchor = rank[n]
            key[n] = (anchor, 0, i)
        elif i < first:
            key[n] = (-1, 0, i)
        elif i > last:
            key[n] = (len(order), 0, i)
        else:
            key[n] = (anchor, 1, i)  # right after the op it followed
    preds: dict[fx.Node, set[fx.Node]] = {n: set(n.all_input_nodes) for n in nodes}
    for a, b in _order_constraints(nodes):
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


def _order_constraints(nodes: Sequence[fx.Node]) -> list[tuple[fx.Node, fx.Node]]:
    """``(a, b)`` pairs where ``a`` must run before ``b`` though ``b`` does not read ``a``.

    * An op writing a tensor in place (``add_``, ``copy_``, batch-norm statistics)
      and every other node reading that tensor, or a view of it, keep their node order.
    * Random ops (``torch.Tag.nondeterministic_seeded``) keep their node order.
    """
    position = {n: i for i, n in enumerate(nodes)}
    root: dict[fx.Node, fx.Node] = {}  # the node whose storage a node's value is
    written: dict[fx.Node, list[fx.Node]] = {}
    for n in nodes:
        root[n] = n
        if n.op != "call_function":
            continue
        w = _written_args(n)
        if w:
            written[n] = w
        schema = getattr(n.target, "_schema", None)
        returns_written = schema is not None and any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)
        base = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if base is not None and (is_alias(n.target) or returns_written):
            root[n] = root.get(base, base)
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
    seeded = [n for n in nodes if n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    pairs.extend(zip(seeded, seeded[1:]))
    return pairs



def transfers(gm: fx.GraphModule) -> list[tuple[str, str]]:
    """The ``(source node name, logical device)`` copies :func:`place_module` inserted."""
    return [n.meta[MOVE_META] for n in gm.graph.nodes if MOVE_META in n.meta]
