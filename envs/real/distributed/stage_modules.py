"""Each stage of a plan as a module cut from placer's captured program, and the shapes torch's stages need.

:func:`stage_programs` cuts the unlifted program of an ``ExportedProgram``
(``ep.module()``, whose node names are the OpGraph's op names) into one
``fx.GraphModule`` per stage, the chain that ``torch.distributed.pipelining`` runs:

* stage 0 takes the model's inputs; stage ``s > 0`` takes what stage ``s - 1`` returns;
* a stage returns every value that a later stage reads, its own or one it received:
  a value needed by a later, non-adjacent stage (a skip connection, the labels of the
  loss) travels through the stages between; what it returns is made contiguous, as
  the process groups send dense tensors only (the gradients it sends back are in the
  layout of what it received: autograd accumulates a leaf's gradient so);
* the last stage returns the model's output, which must be its loss (one scalar);
* a parameter or buffer is an attribute of every stage that reads it: the stages of
  one rank share the tensor (tied weights accumulate one gradient there), the
  stages of other ranks have their own copy (:mod:`~envs.real.distributed.runtime`
  sums the gradients of those);
* within a stage the ops run in the plan's issue order (:func:`envs.real.placing.reorder`);
* for a schedule that splits the backward into an input part and a weight part (torch's
  zero-bubble schedules, ``split_backward``): what a stage returns is a fresh copy, not
  the tensor itself, since torch's input part detaches the stage's outputs in place,
  which autograd refuses for a view (a slice of the labels) and for a tensor an op of
  the stage saved for its backward (the weight part still needs it); and each floating
  input the stage receives passes through :class:`DenseGradient`, since that input part
  sends the gradient autograd's last op left, in whatever layout (a transpose's), where
  the full backward accumulates it dense.

:func:`place_stage` moves a stage to its torch device as ``placer.apply`` would
(device arguments, views, the bodies of ``no_grad``/autocast regions), and
:func:`stage_shapes` finds what every stage takes and returns (shape, stride,
dtype, whether it needs a gradient) by running the chain on fake tensors, so torch's
stages need not find them by running the model on uninitialised data.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch import nn

from envs.real.placing import keep_global_state, on_device, reorder, reshape_views
from graphs import PlacerError

_CONTIGUOUS = torch.ops.aten.contiguous.default
_CLONE = torch.ops.aten.clone.default


class DenseGradient(torch.autograd.Function):
    """The identity forward; backward, the gradient made contiguous (what the process groups send)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def dense_gradient(x: torch.Tensor) -> torch.Tensor:
    """:class:`DenseGradient` of ``x`` (a stage's node calls this; the class's ``apply`` is no plain function)."""
    return DenseGradient.apply(x)


#: The name each :func:`dense_gradient` node of a stage takes, before its input's: no op of a program is named so.
DENSE_GRADIENT_PREFIX = "placer_dense_gradient_"
#: The export's guard on the inputs' shapes (a call_module of ``ep.module()``); a stage checks nothing of the sort.
GUARDS = "_guards_fn"


def _stage_of_nodes(gm: fx.GraphModule, stage_ops: Sequence[Sequence[str]]) -> dict[fx.Node, int]:
    """The stage of every value node: inputs -1, placed ops theirs, other call_function nodes their inputs' latest."""
    named = {name: s for s, ops in enumerate(stage_ops) for name in ops}
    stage: dict[fx.Node, int] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            stage[node] = -1
        elif node.op == "call_function":
            # a node the export adds that is not an op (a write-back of a mutated buffer) runs with its inputs
            inputs = [stage[a] for a in node.all_input_nodes if a in stage]
            stage[node] = named.get(node.name, max([0, *inputs]))
        elif node.op == "call_module" and node.target != GUARDS:
            raise PlacerError(f"stage cut: node {node.format_node()} calls a module; the program should call none")
    missing = [name for name in named if name not in {n.name for n in gm.graph.nodes}]
    if missing:
        raise PlacerError(f"stage cut: op {missing[0]!r} of the plan is not in the exported program")
    return stage


def _loss_node(gm: fx.GraphModule) -> fx.Node:
    """The program's one output: the loss."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    val = outs[0].meta.get("val") if len(outs) == 1 and isinstance(outs[0], fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 0 or not val.is_floating_point():
        raise PlacerError(
            "stage cut: the model must return its loss (one scalar) to run across processes; "
            "wrap it: forward(inputs, labels) -> loss"
        )
    return outs[0]


def carried_values(gm: fx.GraphModule, stage_ops: Sequence[Sequence[str]]) -> list[list[fx.Node]]:
    """``carried[s]``: the values stage ``s`` receives (stage 0: the model's inputs), in node order."""
    S = len(stage_ops)
    stage = _stage_of_nodes(gm, stage_ops)
    loss = _loss_node(gm)
    last_use: dict[fx.Node, int] = {}
    for node in stage:
        uses = [stage[u] for u in node.users if u in stage]
        last_use[node] = S - 1 if node is loss else max(uses, default=stage[node])
    carried = [[n for n in gm.graph.nodes if n.op == "placeholder"]]
    for s in range(1, S):
        values = [n for n in stage if stage[n] < s <= last_use[n]]
        for v in values:
            if not isinstance(v.meta.get("val"), torch.Tensor):
                raise PlacerError(
                    f"stage cut: {v.name} ({type(v.meta.get('val')).__name__}), made in stage {max(stage[v], 0)}, "
                    f"is read in stage {last_use[v]}; only tensors travel between processes (place its readers "
                    "with it)"
                )
        carried.append(values)
    return carried


def stage_programs(
    gm: fx.GraphModule, stage_ops: Sequence[Sequence[str]], *, split_backward: bool = False
) -> list[fx.GraphModule]:
    """One ``GraphModule`` per stage of ``gm`` (see the module doc); ``stage_ops[s]``: stage s's op names, in order;
    ``split_backward``: for a schedule that splits the backward (fresh outputs, dense input gradients)."""
    stage = _stage_of_nodes(gm, stage_ops)
    carried = carried_values(gm, stage_ops)
    loss = _loss_node(gm)
    modules = []
    for s, ops in enumerate(stage_ops):
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        attrs: dict[str, Any] = {}
        for v in carried[s]:
            env[v] = graph.placeholder(v.name)
            env[v].meta = dict(v.meta)

        def value(a: fx.Node) -> fx.Node:
            if a.op == "get_attr" and a not in env:  # a parameter, buffer or region body: this stage's attribute too
                target = str(a.target)
                attrs[target] = _attribute(gm, target)
                env[a] = graph.get_attr(target)
                env[a].meta = dict(a.meta)
            return env[a]

        for node in gm.graph.nodes:
            if node.op == "call_function" and stage.get(node) == s:
                env[node] = graph.node_copy(node, value)
        if s + 1 < len(stage_ops):  # sent to another process: gloo and nccl send dense tensors only
            send, how = (_CLONE, {"memory_format": torch.contiguous_format}) if split_backward else (_CONTIGUOUS, {})
            graph.output(tuple(graph.call_function(send, (env[v],), how) for v in carried[s + 1]))
        else:
            graph.output(env[loss])
        reorder(graph, list(ops))
        if split_backward and s > 0:
            _dense_input_gradients(graph)
        if split_backward:
            _dense_group_norm_inputs(graph)
        graph.lint()
        modules.append(fx.GraphModule(attrs, graph, class_name=f"Stage{s}"))
    return modules


def _dense_input_gradients(graph: fx.Graph) -> None:
    """Route every floating input of a stage that an op reads through :func:`dense_gradient` (module doc)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return
    with graph.inserting_after(placeholders[-1]):
        for p in reversed(placeholders):
            val = p.meta.get("val")
            if not p.users or not isinstance(val, torch.Tensor) or not val.is_floating_point():
                continue
            node = graph.create_node("call_function", dense_gradient, (p,), name=DENSE_GRADIENT_PREFIX + p.name)
            node.meta = dict(p.meta)
            p.replace_all_uses_with(node, delete_user_cb=lambda user: user is not node)


#: The ops whose CPU backward crashes the process (SIGSEGV, torch 2.13) when asked for the weight's and bias's
#: gradients alone on an input in another layout than the gradient's (channels last, as a transpose's reshape
#: leaves it): what a split backward's weight part asks (diffusers' autoencoder, whose attention hands a transposed
#: tensor to a resnet's GroupNorm). :func:`_dense_group_norm_inputs`.
_NORMS_NEEDING_DENSE_INPUT = (torch.ops.aten.group_norm.default, torch.ops.aten.native_group_norm.default)


def _dense_group_norm_inputs(graph: fx.Graph) -> None:
    """Make the input of every group norm of a stage dense (``contiguous``: nothing copied where it is already) for
    a schedule that splits the backward, whose weight part otherwise crashes there (:data:`_NORMS_NEEDING_DENSE_INPUT`;
    the same values, the same gradients, in the layout the full backward would see from a dense input)."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _NORMS_NEEDING_DENSE_INPUT:
            continue
        x = node.args[0]
        if not isinstance(x, fx.Node):
            continue
        with graph.inserting_before(node):
            dense = graph.call_function(_CONTIGUOUS, (x,))
        dense.meta = dict(x.meta)
        node.replace_input_with(x, dense)


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    # a region's body is placed per stage (its device arguments): each stage gets its own copy
    return copy.deepcopy(obj) if isinstance(obj, fx.GraphModule) else obj


def place_stage(module: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    """Move a stage to ``device``: its tensors, and every device argument and view of it and of its regions' bodies.

    What :func:`envs.real.placing.place_module` does for an op placed on a device,
    for every op of the stage, whose bodies (``no_grad``, autocast regions) are its
    submodules. The stage's tensors move in place (``nn.Module.to``), so the stages
    of one rank keep sharing the tensors they share.
    """
    for sub in module.modules():
        if isinstance(sub, fx.GraphModule):
            for node in sub.graph.nodes:
                if node.op == "call_function":
                    on_device(node, device)
            reshape_views(sub.graph)
            sub.recompile()
    keep_global_state(module)
    return module.to(device)


class StageShapes(NamedTuple):
    """What one stage takes and returns, as meta tensors (shape, stride, dtype, requires_grad)."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]


def _meta(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
    return out.requires_grad_(True) if t.requires_grad and t.is_floating_point() else out


class _FakeRun(fx.Interpreter):
    """Runs a stage on fake tensors: its attributes (one fake per real tensor, so tied ones stay tied) too."""

    def __init__(self, module: fx.GraphModule, mode: Any, fakes: dict[int, torch.Tensor]) -> None:
        super().__init__(module)
        self.mode, self.fakes = mode, fakes

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            if id(value) not in self.fakes:
                self.fakes[id(value)] = self.mode.from_tensor(value)
            return self.fakes[id(value)]
        return value


def stage_shapes(modules: Sequence[fx.GraphModule], inputs: Sequence[Any]) -> list[StageShapes]:
    """Run the chain of ``modules`` on fake copies of ``inputs`` (one microbatch) with autograd on; no kernel runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC2701 (torch's fake tensors: no public path)

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    fakes: dict[int, torch.Tensor] = {}
    shapes = []
    with mode, torch.enable_grad():
        args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)
        for module in modules:
            out = _FakeRun(module, mode, fakes).run(*args)
            out = out if isinstance(out, tuple) else (out,)
            shapes.append(
                StageShapes(
                    tuple(_meta(a) for a in args if isinstance(a, torch.Tensor)),
                    tuple(_meta(o) for o in out),
                )
            )
            args = out
    return shapes


def parameters_by_name(modules: Sequence[nn.Module]) -> dict[str, nn.Parameter]:
    """Every parameter of ``modules`` under its name in the model (tied ones under each name they have)."""
    out: dict[str, nn.Parameter] = {}
    for module in modules:
        out.update(dict(module.named_parameters(remove_duplicate=False)))
    return out


__all__ = [
    "DENSE_GRADIENT_PREFIX",
    "DenseGradient",
    "GUARDS",
    "StageShapes",
    "carried_values",
    "dense_gradient",
    "parameters_by_name",
    "place_stage",
    "stage_programs",
    "stage_shapes",
]
