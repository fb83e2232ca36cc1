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
  ``to_device`` node per (tensor, device), shared by all consumers on that device;
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

Copies avoid host synchronisation where torch allows (:func:`to_device`): GPU->GPU
copies are ``non_blocking`` peer copies, host->GPU copies go from pinned memory
with ``non_blocking=True``, and GPU->host copies stay synchronous, as the host op
that reads the result needs the data at once.

Transfers are decided on *logical* devices, so a map of every logical device to
``cpu`` still builds (and tests) every cross-device copy, as no-op copies.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


def resolve_devices(
    logical: Iterable[str], device_map: Mapping[str, str] | str | None = None
) -> dict[str, torch.device]:
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
            raise PlacerError(
                f"{name} maps to {dev}, which this machine does not have (use a device map, e.g. --device-map '*=cpu')"
            )


# ------------------------------------------------------------------ transfers
def copy_kind(src: torch.device, dst: torch.device) -> str:
    """How :func:`to_device` copies a tensor from ``src`` to ``dst``.

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
        if not t.is_pinned():
            t = staged(t)
        return t.to(device, non_blocking=True)
    if kind == "peer":
        return t.to(device, non_blocking=True)  # stream-ordered on both devices; autograd's backward too
    return t.to(device)


def staged(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a new dense, contiguous host buffer, pinned where CUDA is present.

    The staging buffer of a host->GPU copy. Any strided tensor is accepted: an
    expanded one (stride 0, which ``Tensor.pin_memory()`` refuses, as it keeps the
    strides), a slice, a transpose. The copy into it is differentiable (its
    gradient is the identity), and torch's pinned allocator keeps the block alive
    until the asynchronous copy to the GPU has read it. Without CUDA nothing can
    be pinned: the buffer is ordinary memory (the path tests take on the CPU).

    >>> x = torch.ones(3, 1, requires_grad=True)
    >>> s = staged(x.expand(3, 4))
    >>> s.is_contiguous(), s.stride(), s.requires_grad
    (True, (4, 1), True)
    """
    buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
    return buffer.copy_(t)


def to_device(value: Any, device: str | torch.device) -> Any:
    """Copy a tensor (or a tuple/list of them) to ``device``; other values pass through.

    >>> to_device((torch.ones(1), [torch.zeros(2), 3]), "cpu")
    (tensor([1.]), [tensor([0., 0.]), 3])
    """
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, torch.device(device))
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value


def _write_back(master: torch.Tensor, copy: torch.Tensor) -> None:
    """Copy an in-place update made on ``copy`` back into ``master`` (another device)."""
    with torch.no_grad():
        master.copy_(copy)


def _written_args(node: fx.Node) -> list[fx.Node]:
    """Node arguments that ``node`` mutates in place (:func:`graphs.ops.written_arguments`: schema and known
    composites)."""
    written = [
        node.args[i] if i < len(node.args) else node.kwargs.get(name) for i, name in written_arguments(node.target)
    ]
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
    home, tensor_of = _home_parameters(gm, assignment, devices)
    # The issue order (the owners above stay those of node order, as in OpGraph.param_bytes).
    if order is not None:
        reorder(graph, order)
    nodes = list(graph.nodes)
    gm.meta[ORDER_META] = [n.name for n in nodes if n.op == "call_function" and n.name in assignment]
    # Walk the ops: pick a device, move arguments, rewrite device arguments, write back in-place updates.
    copies = _Copies(graph, home, tensor_of)
    body_device: dict[str, torch.device] = {}  # a higher-order op's body (submodule name) -> its op's device
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
        original_args = list(node.all_input_nodes)
        node.args = fx.map_arg(node.args, lambda a: copies.on(a, dev, devices[dev], before=node))
        node.kwargs = fx.map_arg(node.kwargs, lambda a: copies.on(a, dev, devices[dev], before=node))
        on_device(node, devices[dev])
        for sub in _submodule_args(gm, node):  # a higher-order op's body (a no_grad or autocast region)
            if body_device.setdefault(str(sub.target), devices[dev]) != devices[dev]:
                raise PlacerError(f"op {node.name}: its body {sub.target} is shared with an op on another device")
        copies.written(node, original_args, dev)
    for target, device in body_device.items():
        # ep.module() shares the bodies with the exported program (and every module built from it): place a copy.
        body = copy.deepcopy(_module_tensor(gm, target))
        parent, _, leaf = target.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, leaf, body)
        _place_body(body, device)
    reshape_views(graph)
    graph.lint()
    gm.recompile()
    keep_global_state(gm)
    return gm


def _home_parameters(
    gm: fx.GraphModule, assignment: Mapping[str, str], devices: Mapping[str, torch.device]
) -> tuple[dict[fx.Node, str], dict[fx.Node, Any]]:
    """Move each parameter and buffer to its owner's device: the first placed op reading it (tied weights share one).

    Returns the logical device of each ``get_attr`` node that now holds a tensor,
    and what each ``get_attr`` node names (a tensor, a submodule, ...).
    """
    nodes = list(gm.graph.nodes)
    attr_nodes = [n for n in nodes if n.op == "get_attr"]
    tensor_of = {n: _module_tensor(gm, str(n.target)) for n in attr_nodes}
    position = {n: i for i, n in enumerate(nodes)}
    first_use: list[tuple[int, fx.Node, str]] = []
    for n in attr_nodes:
        placed_users = [u for u in n.users if u.op == "call_function" and u.name in assignment]
        if placed_users:
            u = min(placed_users, key=position.__getitem__)
            first_use.append((position[u], n, assignment[u.name]))
    owner_by_id: dict[int, str] = {}
    for _, n, dev in sorted(first_use, key=lambda t: t[0]):
        owner_by_id.setdefault(id(tensor_of[n]), dev)
    home: dict[fx.Node, str] = {}
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
    return home, tensor_of


class _Copies:
    """The copies :func:`place_module` inserts: one per (value, logical device), shared by that device's readers."""

    def __init__(self, graph: fx.Graph, home: dict[fx.Node, str], tensor_of: Mapping[fx.Node, Any]) -> None:
        self.graph, self.home, self.tensor_of = graph, home, tensor_of
        self.made: dict[tuple[fx.Node, str], fx.Node] = {}

    def on(self, arg: fx.Node, dev: str, torch_dev: torch.device, *, before: fx.Node) -> fx.Node:
        """``arg`` as a value on logical device ``dev``: itself, or its copy there (inserted before ``before``)."""
        if arg.op == "get_attr" and not isinstance(self.tensor_of.get(arg), torch.Tensor):
            return arg  # e.g. a submodule or a script object
        if self.home.get(arg) == dev:
            return arg
        key = (arg, dev)
        if key not in self.made:
            with self.graph.inserting_before(before):
                copy = self.graph.create_node(
                    "call_function", to_device, (arg, str(torch_dev)), name=f"{arg.name}_to_{dev.replace(':', '')}"
                )
            copy.meta[MOVE_META] = (arg.name, dev)
            copy.meta[DEVICE_META] = dev
            if "val" in arg.meta:
                copy.meta["val"] = arg.meta["val"]
            self.home[copy] = dev
            self.made[key] = copy
        return self.made[key]

    def written(self, node: fx.Node, original_args: list[fx.Node], dev: str) -> None:
        """After an op that writes in place: drop stale copies of what it wrote; push a write on a copy back into its
        master."""
        inverse = {self.made[(a, dev)]: a for a in original_args if (a, dev) in self.made}
        for w in _written_args(node):
            master = inverse.get(w, w)
            for key in [k for k in self.made if k[0] is master and self.made[k] is not w]:
                del self.made[key]
            if master is not w:
                with self.graph.inserting_after(node):
                    wb = self.graph.call_function(_write_back, (master, w))
                wb.meta[WRITEBACK_META] = master.name


# ----------------------------------------------- what the capture device decided
def on_device(node: fx.Node, device: torch.device) -> None:
    """Make every device-valued argument of ``node`` the device it is placed on.

    A program captured on the CPU names the CPU wherever an op takes a device:
    factory ops (``arange(..., device=cpu)``), copies (``_to_copy``, ``to.device``
    with the device positional), assertions (``_assert_tensor_metadata``), and the
    device type of an autocast region. Placed elsewhere, each must name the device
    the op runs on, or it makes its tensor on the capture device (or asserts that
    it is there).
    """

    def swap(value: Any) -> Any:
        return device if isinstance(value, torch.device) else value

    node.args = fx.node.map_aggregate(node.args, swap)
    node.kwargs = fx.node.map_aggregate(node.kwargs, swap)
    if node.target is _AUTOCAST_HOP and node.args and isinstance(node.args[0], str):
        node.args = (device.type, *node.args[1:])


_AUTOCAST_HOP = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def reshape_views(graph: fx.Graph) -> int:
    """Run each ``view`` whose storage nothing writes in place as a ``reshape``; returns how many.

    Whether a ``view`` is legal depends on its input's strides, and those depend on
    the kernel that made the input: CPU and CUDA attention kernels return their
    outputs in different layouts, so a view that is legal after the capture
    device's kernel may not be after the placed device's. ``reshape`` is that view
    wherever the view is legal, and a copy where it is not. A view whose storage
    is written in place (by the view or through another alias) keeps its view
    semantics: a copy would not see the write.
    """
    nodes = list(graph.nodes)
    root = _alias_roots(nodes)
    written = {root.get(w, w) for n in nodes if n.op == "call_function" for w in _written_args(n)}
    changed = 0
    for n in nodes:
        if n.op == "call_function" and n.target in _VIEWS and root.get(n, n) not in written:
            n.target = torch.ops.aten.reshape.default
            changed += 1
    return changed


def _submodule_args(gm: nn.Module, node: fx.Node) -> list[fx.Node]:
    """The ``get_attr`` arguments of ``node`` that name a graph module (a higher-order op's body)."""
    return [
        a
        for a in node.args
        if isinstance(a, fx.Node)
        and a.op == "get_attr"
        and isinstance(_module_tensor(gm, str(a.target)), fx.GraphModule)
    ]


def _place_body(body: fx.GraphModule, device: torch.device) -> None:
    """A higher-order op's body runs on its op's device: its device arguments and views, as for the program's ops."""
    for node in body.graph.nodes:
        if node.op == "call_function":
            on_device(node, device)
            for sub in _submodule_args(body, node):
                _place_body(_module_tensor(body, str(sub.target)), device)
    reshape_views(body.graph)
    body.recompile()


@contextlib.contextmanager
def global_state_kept() -> Iterator[None]:
    """Restore torch's grad mode and autocast state if the block raises.

    An exported program switches grad mode on entering a ``no_grad`` region and
    back on leaving it (``wrap_with_set_grad_enabled`` does not use a ``finally``):
    an error inside the region would leave the caller's process with gradients off.
    """
    grad = torch.is_grad_enabled()
    autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}
    try:
        yield
    except BaseException:
        torch.set_grad_enabled(grad)
        for d, (enabled, dtype) in autocast.items():
            torch.set_autocast_enabled(d, enabled)
            torch.set_autocast_dtype(d, dtype)
        raise


def keep_global_state(gm: fx.GraphModule) -> None:
    """Run every call of ``gm`` under :func:`global_state_kept` (until ``gm.recompile()``).

    A ``GraphModule`` has a class of its own, so this wraps that instance's forward only.
    """
    cls = type(gm)
    run = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        with global_state_kept():
            return run(self, *args, **kwargs)

    forward.__wrapped__ = run  # type: ignore[attr-defined]
    cls.forward = forward


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
    root = _alias_roots(nodes)
    written: dict[fx.Node, list[fx.Node]] = {}
    for n in nodes:
        w = _written_args(n) if n.op == "call_function" else []
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


def _alias_roots(nodes: Sequence[fx.Node]) -> dict[fx.Node, fx.Node]:
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


def transfers(gm: fx.GraphModule) -> list[tuple[str, str]]:
    """The ``(source node name, logical device)`` copies :func:`place_module` inserted."""
    return [n.meta[MOVE_META] for n in gm.graph.nodes if MOVE_META in n.meta]
