"""Place an exported program on real torch devices, one device per op.

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
* a parameter the plan gives a home apart from its reader (``homes``) lives there,
  and its reader reads a copy made ahead of it on a side stream, freed after it and
  made again for its backward, its gradient sent home (:mod:`envs.real.homes`);
* an op that writes into a copied tensor in place (``add_``, the running
  statistics of ``aten.batch_norm``) is followed by a write-back into the master,
  and stale copies of a written tensor are never reused;
* user inputs are copied once per consumer device, straight from where the caller
  passes them; outputs stay on the device of the op that produced them;
* nodes the export adds that are not ops of the graph (``copy_`` write-backs of
  mutated buffers after decomposition, the shape reads of a program with dynamic
  dimensions) run on the device of their first argument;
* a plan's checkpointed blocks run under :func:`torch.utils.checkpoint.checkpoint`
  (:mod:`envs.real.checkpointing`);
* given an issue ``order`` (op names, a topological order of the graph), the ops
  are first re-emitted in that order (:func:`envs.real.reorder.reorder`), so each
  copy is then issued right before its first consumer *in that order*;
  ``gm.meta[ORDER_META]`` is the order run.

Copies avoid host synchronisation where torch allows (:mod:`envs.real.transfers`).
Transfers are decided on *logical* devices, so a map of every logical device to
``cpu`` still builds (and tests) every cross-device copy, as no-op copies.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from envs.real.checkpointing import checkpoint_blocks
from envs.real.devices import check_available, resolve_devices
from envs.real.global_state import keep_global_state
from envs.real.homes import HOME_COPY_META, home_master, insert_home_copies
from envs.real.reorder import alias_roots, reorder, written_nodes
from envs.real.transfers import to_device, write_back
from graphs import PlacerError

MOVE_META = "placer_transfer"  # node.meta key on inserted copies: (source node name, logical device)
DEVICE_META = "placer_device"  # node.meta key: the logical device a node runs on
WRITEBACK_META = "placer_writeback"  # node.meta key on inserted write-backs: master node name
ORDER_META = "placer_issue_order"  # GraphModule.meta key: the placed ops' names in the order the module runs them
HOMES_META = "placer_homes"  # GraphModule.meta key: parameter or buffer name -> the logical device it lives on

#: What another program of the same model passes :func:`place_module` to share its placed tensors:
#: parameter or buffer name -> (the tensor, the logical device it lives on).
SharedTensors = Mapping[str, tuple[torch.Tensor, str]]


def place_module(
    ep: torch.export.ExportedProgram,
    assignment: Mapping[str, str],
    device_map: Mapping[str, str] | str | None = None,
    order: Sequence[str] | None = None,
    shared: SharedTensors | None = None,
    homes: Mapping[str, str] | None = None,
    checkpoint: Sequence[str] = (),
) -> fx.GraphModule:
    """An ``nn.Module`` running ``ep`` with op ``name`` on logical device ``assignment[name]``.

    ``assignment`` must name every op the caller cares about (it is validated
    against the OpGraph by :func:`placer.apply`); call_function nodes it does not
    name run next to their first argument. Parameters move to their owner's torch
    device (a new ``nn.Parameter`` where the device changes, the same tensor
    otherwise, like ``model.to``), so build the optimizer on the returned module.
    ``order``: op names in issue order (validated by :func:`graphs.plan.check_order`
    against the OpGraph by the caller); ``None`` keeps node order. ``shared``: the
    placed tensors of another program of the same model (:data:`SharedTensors`),
    read instead of this program's own, where they live. ``homes``: parameter name ->
    the logical device it lives on where that is not its reader's (a plan's
    ``param_homes``; the parameter, its gradient and optimizer state live there). ``checkpoint``: module paths
    whose ops run under activation checkpointing (a plan's ``checkpoint``, :mod:`envs.real.checkpointing`).
    """
    gm = ep.module()
    homes = dict(homes or {})
    torch_devices = resolve_devices(sorted(set(assignment.values()) | set(homes.values())), device_map)
    check_available(torch_devices)
    graph = gm.graph
    home, tensor_of, apart = _home_parameters(gm, assignment, torch_devices, shared or {}, homes)
    gm.meta[HOMES_META] = {str(n.target): device for n, device in home.items()}
    # The issue order (the owners above stay those of node order, as in OpGraph.param_bytes).
    if order is not None:
        reorder(graph, order)
    insert_home_copies(gm, apart, torch_devices, home)
    nodes = list(graph.nodes)
    gm.meta[ORDER_META] = [n.name for n in nodes if n.op == "call_function" and n.name in assignment]
    copies = _Copies(graph, home, tensor_of)
    body_device: dict[str, torch.device] = {}  # a higher-order op's body (submodule name) -> its op's device
    for node in nodes:
        if node.op == "call_function" and not node.meta.get(HOME_COPY_META):
            _place_node(gm, node, assignment, torch_devices, home, copies, body_device)
    for target, torch_device in body_device.items():
        # ep.module() shares the bodies with the exported program (and every module built from it): place a copy.
        body = copy.deepcopy(module_tensor(gm, target))
        parent, _, leaf = target.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, leaf, body)
        _place_body(body, torch_device)
    reshape_views(graph)
    if checkpoint:
        checkpoint_blocks(gm, checkpoint, set(assignment))
    graph.lint()
    gm.recompile()
    keep_global_state(gm)  # a call that raises restores grad mode and autocast
    return gm


def _place_node(
    gm: fx.GraphModule,
    node: fx.Node,
    assignment: Mapping[str, str],
    torch_devices: Mapping[str, torch.device],
    home: dict[fx.Node, str],
    copies: _Copies,
    body_device: dict[str, torch.device],
) -> None:
    """Run ``node`` on its device: its arguments moved there, its device arguments rewritten, its writes pushed back."""
    device = assignment.get(node.name)
    if device is None:
        device = next((home[a] for a in node.all_input_nodes if a in home), None)
        if device is None:
            return  # nothing known about where it runs: leave it untouched
    home[node] = device
    node.meta[DEVICE_META] = device
    torch_device = torch_devices[device]
    original_args = list(node.all_input_nodes)
    node.args = fx.map_arg(node.args, lambda a: copies.on(a, device, torch_device, before=node))
    node.kwargs = fx.map_arg(node.kwargs, lambda a: copies.on(a, device, torch_device, before=node))
    on_device(node, torch_device)
    for sub in _submodule_args(gm, node):  # a higher-order op's body (a no_grad or autocast region)
        if body_device.setdefault(str(sub.target), torch_device) != torch_device:
            raise PlacerError(f"op {node.name}: its body {sub.target} is shared with an op on another device")
    copies.written(node, original_args, device)


def module_tensor(gm: nn.Module, fqn: str) -> Any:
    """The attribute ``fqn`` (dotted) of ``gm``: a parameter, buffer, constant or submodule."""
    obj: Any = gm
    for part in fqn.split("."):
        obj = getattr(obj, part)
    return obj


def set_module_tensor(gm: nn.Module, fqn: str, value: torch.Tensor) -> None:
    """Make ``value`` the parameter, buffer or attribute ``fqn`` (dotted) of ``gm``, keeping its kind."""
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


def _moved(t: torch.Tensor, torch_device: torch.device) -> torch.Tensor:
    if t.device == torch_device:
        return t
    if isinstance(t, nn.Parameter):
        return nn.Parameter(t.detach().to(torch_device), requires_grad=t.requires_grad)
    return t.detach().to(torch_device)


def _home_parameters(
    gm: fx.GraphModule,
    assignment: Mapping[str, str],
    torch_devices: Mapping[str, torch.device],
    shared: SharedTensors,
    homes: Mapping[str, str],
) -> tuple[dict[fx.Node, str], dict[fx.Node, Any], dict[fx.Node, tuple[str, nn.Parameter]]]:
    """Move each parameter and buffer to its owner's device: the first placed op reading it (tied weights share one);
    a parameter named in ``homes`` with another device, there (:func:`envs.real.homes.home_master`).

    A tensor in ``shared`` is not moved: the program reads that tensor, on its device.
    Returns the logical device of each ``get_attr`` node that now holds a tensor,
    what each ``get_attr`` node names (a tensor, a submodule, ...), and the parameters
    living apart from their owner (node -> the owner's logical device and the master).
    """
    nodes = list(gm.graph.nodes)
    attr_nodes = [n for n in nodes if n.op == "get_attr"]
    tensor_of = {n: module_tensor(gm, str(n.target)) for n in attr_nodes}
    position = {n: i for i, n in enumerate(nodes)}
    first_use: list[tuple[int, fx.Node, str]] = []
    for n in attr_nodes:
        placed_users = [u for u in n.users if u.op == "call_function" and u.name in assignment]
        if placed_users:
            u = min(placed_users, key=position.__getitem__)
            first_use.append((position[u], n, assignment[u.name]))
    owner_by_id: dict[int, str] = {}
    for _, n, device in sorted(first_use, key=lambda t: t[0]):
        owner_by_id.setdefault(id(tensor_of[n]), device)
    home: dict[fx.Node, str] = {}
    moved_by_id: dict[int, torch.Tensor] = {}
    apart: dict[fx.Node, tuple[str, nn.Parameter]] = {}
    # a parameter with a home apart, under every name tied to it (one master: the names stay one tensor)
    home_of_id = {
        id(tensor_of[n]): homes[str(n.target)]
        for n in attr_nodes
        if isinstance(tensor_of[n], nn.Parameter)
        and str(n.target) not in shared
        and homes.get(str(n.target), owner_by_id.get(id(tensor_of[n]))) != owner_by_id.get(id(tensor_of[n]))
    }
    masters: dict[int, nn.Parameter] = {}
    for n in attr_nodes:
        fqn, t = str(n.target), tensor_of[n]
        if fqn in shared:
            t, home[n] = shared[fqn]
            tensor_of[n] = t
            set_module_tensor(gm, fqn, t)
            continue
        device = owner_by_id.get(id(t))
        if device is None or not isinstance(t, torch.Tensor):
            continue
        if id(t) in home_of_id:
            if id(t) not in masters:
                masters[id(t)] = home_master(t, torch_devices[home_of_id[id(t)]])
            if any(u.op == "call_function" for u in n.users):
                apart[n] = (device, masters[id(t)])
            home[n] = home_of_id[id(t)]
            tensor_of[n] = masters[id(t)]
            set_module_tensor(gm, fqn, masters[id(t)])
            continue
        home[n] = device
        if id(t) not in moved_by_id:
            moved_by_id[id(t)] = _moved(t, torch_devices[device])
        set_module_tensor(gm, fqn, moved_by_id[id(t)])
    return home, tensor_of, apart


def _is_number(node: fx.Node) -> bool:
    """Whether ``node``'s value is a number (a shape read of a program with dynamic dimensions), not a tensor."""
    return isinstance(node.meta.get("val"), (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


class _Copies:
    """The copies :func:`place_module` inserts: one per (value, logical device), shared by that device's readers."""

    def __init__(self, graph: fx.Graph, home: dict[fx.Node, str], tensor_of: Mapping[fx.Node, Any]) -> None:
        self.graph, self.home, self.tensor_of = graph, home, tensor_of
        self.made: dict[tuple[fx.Node, str], fx.Node] = {}

    def on(self, arg: fx.Node, device: str, torch_device: torch.device, *, before: fx.Node) -> fx.Node:
        """``arg`` as a value on logical device ``device``: itself, or its copy there (inserted before ``before``)."""
        if arg.op == "get_attr" and not isinstance(self.tensor_of.get(arg), torch.Tensor):
            return arg  # e.g. a submodule or a script object
        if self.home.get(arg) == device or _is_number(arg):
            return arg
        key = (arg, device)
        if key not in self.made:
            with self.graph.inserting_before(before):
                moved = self.graph.create_node(
                    "call_function",
                    to_device,
                    (arg, str(torch_device)),
                    name=f"{arg.name}_to_{device.replace(':', '')}",
                )
            moved.meta[MOVE_META] = (arg.name, device)
            moved.meta[DEVICE_META] = device
            if "val" in arg.meta:
                moved.meta["val"] = arg.meta["val"]
            self.home[moved] = device
            self.made[key] = moved
        return self.made[key]

    def written(self, node: fx.Node, original_args: list[fx.Node], device: str) -> None:
        """After an op that writes in place: drop stale copies of what it wrote; push a write on a copy back into its
        master."""
        inverse = {self.made[(a, device)]: a for a in original_args if (a, device) in self.made}
        for w in written_nodes(node):
            master = inverse.get(w, w)
            for key in [k for k in self.made if k[0] is master and self.made[k] is not w]:
                del self.made[key]
            if master is not w:
                with self.graph.inserting_after(node):
                    wb = self.graph.call_function(write_back, (master, w))
                wb.meta[WRITEBACK_META] = master.name


# ----------------------------------------------- what the capture device decided
def on_device(node: fx.Node, torch_device: torch.device) -> None:
    """Make every device-valued argument of ``node`` the device it is placed on.

    A program captured on the CPU names the CPU wherever an op takes a device:
    factory ops (``arange(..., device=cpu)``), copies (``_to_copy``, ``to.device``
    with the device positional), assertions (``_assert_tensor_metadata``), and the
    device type of an autocast region. Placed elsewhere, each must name the device
    the op runs on, or it makes its tensor on the capture device (or asserts that
    it is there).
    """

    def swap(value: Any) -> Any:
        return torch_device if isinstance(value, torch.device) else value

    node.args = fx.node.map_aggregate(node.args, swap)
    node.kwargs = fx.node.map_aggregate(node.kwargs, swap)
    if node.target is _AUTOCAST_HOP and node.args and isinstance(node.args[0], str):
        node.args = (torch_device.type, *node.args[1:])


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
    root = alias_roots(nodes)
    written = {root.get(w, w) for n in nodes if n.op == "call_function" for w in written_nodes(n)}
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
        and isinstance(module_tensor(gm, str(a.target)), fx.GraphModule)
    ]


def _place_body(body: fx.GraphModule, torch_device: torch.device) -> None:
    """A higher-order op's body runs on its op's device: its device arguments and views, as for the program's ops."""
    for node in body.graph.nodes:
        if node.op == "call_function":
            on_device(node, torch_device)
            for sub in _submodule_args(body, node):
                _place_body(module_tensor(body, str(sub.target)), torch_device)
    reshape_views(body.graph)
    body.recompile()


def transfers(gm: fx.GraphModule) -> list[tuple[str, str]]:
    """The ``(source node name, logical device)`` copies :func:`place_module` inserted."""
    return [n.meta[MOVE_META] for n in gm.graph.nodes if MOVE_META in n.meta]
