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
dtype, whether it needs a gradient) on fake tensors, so torch's stages need not find
them by running the model on uninitialised data: read from one run of the whole
program (:func:`cached_program_values`, kept with the program for every plan of it:
the next job's, another plan's), or by running the chain of stages.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch import nn

from envs.real.placing import keep_global_state, on_device, reorder, reshape_views
from graphs import PlacerError
from graphs.buffer_writes import attribute, buffer_accesses, written_by
from graphs.flops import is_alias

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


def takes_gradient(t: torch.Tensor) -> bool:
    """A tensor a stage receives with its gradient to send back: a floating one, or a complex one (a spectrum that
    crosses stages between a Fourier layer's FFTs)."""
    return t.is_floating_point() or t.is_complex()


def dense_gradient(x: torch.Tensor) -> torch.Tensor:
    """:class:`DenseGradient` of ``x`` (a stage's node calls this; the class's ``apply`` is no plain function)."""
    return DenseGradient.apply(x)


#: The name each :func:`dense_gradient` node of a stage takes, before its input's: no op of a program is named so.
DENSE_GRADIENT_PREFIX = "placer_dense_gradient_"
#: The key of a stage node's ``meta`` that names the program's node it copies (a stage may have to rename it).
SOURCE = "placer_source"
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
    _check_buffer_writes(gm, stage)
    return carried


def _check_buffer_writes(gm: fx.GraphModule, stage: dict[fx.Node, int]) -> None:
    """Refuse a cut that splits the ops touching a buffer some op writes in place (:mod:`graphs.buffer_writes`): a
    stage writes its own copy of what it receives, so the write would never reach the buffer, and a stage reading
    it elsewhere would read it before or after the wrong write. The stage cut keeps such ops together
    (:class:`envs.real.distributed.cut.BufferWrites`) where the plan's graph was captured with their record."""
    buffers = dict(gm.named_buffers())
    writes, readers = buffer_accesses(
        gm, lambda n: str(n.target) if n.op == "get_attr" and str(n.target) in buffers else None
    )
    by_name = {n.name: n for n in stage}
    for op, buffer, _ in writes:
        if op not in by_name:
            continue
        s = max(stage[by_name[op]], 0)
        others = [by_name[r] for r in readers.get(buffer, ()) if r in by_name and max(stage[by_name[r]], 0) != s]
        if others:
            raise PlacerError(
                f"stage cut: buffer {buffer!r} is written in place by {op} in stage {s} and touched by "
                f"{others[0].name} in stage {max(stage[others[0]], 0)}; a stage writes its own copy of what it "
                "receives, so the write would not reach the other stage (spectral norm applied twice in one forward, "
                "say): place the ops that read and write it in one stage"
            )


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
            env[v].meta = {**v.meta, SOURCE: v.name}

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
                env[node].meta[SOURCE] = node.name  # the copy's own dict (node_copy copies it)
        if s + 1 < len(stage_ops):  # sent to another process: gloo and nccl send dense tensors only
            send, how = (_CLONE, {"memory_format": torch.contiguous_format}) if split_backward else (_CONTIGUOUS, {})
            graph.output(tuple(graph.call_function(send, (env[v],), how) for v in carried[s + 1]))
        else:
            graph.output(env[loss])
        reorder(graph, list(ops))
        if split_backward and s > 0:
            _dense_input_gradients(graph)
        if s > 0:
            _copy_written_inputs(graph)
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
            if not p.users or not isinstance(val, torch.Tensor) or not takes_gradient(val):
                continue
            node = graph.create_node("call_function", dense_gradient, (p,), name=DENSE_GRADIENT_PREFIX + p.name)
            node.meta = dict(p.meta)
            p.replace_all_uses_with(node, delete_user_cb=lambda user: user is not node)


def _copy_written_inputs(graph: fx.Graph) -> None:
    """Give every floating input of a stage that an op of it writes in place (itself, or through a view: a residual
    ``add_`` into what the last stage sent) a copy the ops read and write instead. Torch's stage holds what it
    receives as a leaf that needs a gradient, which autograd refuses to write (a leaf, a view of one, or the view
    :func:`dense_gradient` returns); in one process the same tensor is an op's output, written as the program says.
    The copy's gradient flows to the input (what the stage sends back), and what the stage passes on is the copy,
    written, as the program's later readers read it."""
    for p in [n for n in graph.nodes if n.op == "placeholder"]:
        val = p.meta.get("val")
        if not isinstance(val, torch.Tensor) or not takes_gradient(val):  # no gradient: written as it is
            continue
        head = next((u for u in p.users if u.name.startswith(DENSE_GRADIENT_PREFIX)), p)
        if not _written_in_place(head):
            continue
        with graph.inserting_after(head):
            fresh = graph.call_function(_CLONE, (head,))
        fresh.meta = dict(head.meta)
        head.replace_all_uses_with(fresh, delete_user_cb=lambda user: user is not fresh)


def _written_in_place(node: fx.Node) -> bool:
    """Whether an op writes into ``node``'s tensor in place, directly or through a chain of views of it."""
    seen, todo = {node}, [node]
    while todo:
        n = todo.pop()
        for user in n.users:
            if user.op != "call_function":
                continue
            if any(given is n for given in written_by(user)):
                return True
            if is_alias(user.target) and user not in seen:
                seen.add(user)
                todo.append(user)
    return False


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
    obj = attribute(gm, target)
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


def _meta(t: torch.Tensor, dense: bool = False) -> torch.Tensor:
    """A meta tensor like ``t``; ``dense``: with the strides a fresh tensor of its shape has (what a clone leaves).
    Its sizes and strides are plain ints (a fake run's may be symbols the program's asserts pinned to a value)."""
    shape = tuple(int(d) for d in t.shape)
    stride = torch.empty(shape, device="meta").stride() if dense else tuple(int(d) for d in t.stride())
    out = torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")
    return out.requires_grad_(True) if t.requires_grad and takes_gradient(t) else out


class _FakeRun(fx.Interpreter):
    """Runs a stage on fake tensors: its attributes (one fake per real tensor, so tied ones stay tied) too.

    ``values``, where given, takes every tensor the run makes as a meta tensor, by its node's name; the export's
    guard on the inputs' shapes (:data:`GUARDS`) is skipped, as the stages skip it."""

    def __init__(
        self, module: fx.GraphModule, mode: Any, fakes: dict[int, torch.Tensor], values: dict | None = None
    ) -> None:
        super().__init__(module)
        self.mode, self.fakes, self.values = mode, fakes, values

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            if id(value) not in self.fakes:
                self.fakes[id(value)] = self.mode.from_tensor(value)
            return self.fakes[id(value)]
        return value

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        return None if target == GUARDS else super().call_module(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if self.values is not None and isinstance(out, torch.Tensor):
            self.values[n.name] = _meta(out)
        return out


def _fake_inputs(mode: Any, inputs: Sequence[Any]) -> tuple:
    return tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)


def stage_shapes(
    modules: Sequence[fx.GraphModule], inputs: Sequence[Any], values: dict[str, torch.Tensor] | None = None
) -> list[StageShapes]:
    """Run the chain of ``modules`` on fake copies of ``inputs`` (one microbatch) with autograd on; no kernel runs.

    ``values``: the whole program's run (:func:`program_values`, kept for every plan of the program), from which
    the shapes are read instead, where it says them exactly (:func:`_shapes_from_values`: all but a rare case of
    a size-1 dimension); else the chain runs."""
    if values is not None:
        shapes = _shapes_from_values(modules, inputs, values)
        if shapes is not None:
            return shapes
    from torch._subclasses.fake_tensor import DynamicOutputShapeException  # noqa: PLC2701 (no public path)

    try:
        return _chain_shapes(modules, inputs, symbols=False)
    except DynamicOutputShapeException:  # a size the data sets (boolean-mask indexing: ArcFace's cosine[mask == 1])
        return _chain_shapes(modules, inputs, symbols=True)


def _chain_shapes(modules: Sequence[fx.GraphModule], inputs: Sequence[Any], symbols: bool) -> list[StageShapes]:
    """:func:`stage_shapes` by running the chain; ``symbols``: in a shape environment, so that a size the data sets
    is a symbol within a stage, sent to the next as the value the program pins it to, else refused in one line."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC2701 (torch's fake tensors: no public path)
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=ShapeEnv() if symbols else None)
    fakes: dict[int, torch.Tensor] = {}
    shapes = []
    with mode, torch.enable_grad():
        args = _fake_inputs(mode, inputs)
        for s, module in enumerate(modules):
            out = _FakeRun(module, mode, fakes).run(*args)
            out = out if isinstance(out, tuple) else (out,)
            sized = [o for o in out if isinstance(o, torch.Tensor) and symbols and free_unbacked_symbols(o)]
            if sized and s + 1 < len(modules):
                raise PlacerError(
                    f"stage cut: stage {s} sends the next a tensor whose size the data sets (of shape "
                    f"{list(sized[0].shape)}: boolean-mask indexing, nonzero), which a pipeline cannot receive; "
                    "cut elsewhere, or run the plan in one process"
                )
            shapes.append(
                StageShapes(
                    tuple(_meta(a) for a in args if isinstance(a, torch.Tensor)),
                    tuple(_meta(o) for o in out),
                )
            )
            args = out
    return shapes


def program_values(module: fx.GraphModule, inputs: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Every tensor of one run of the whole unlifted program ``module`` on fake copies of ``inputs`` (one
    microbatch), with autograd on, as a meta tensor (shape, stride, dtype, requires_grad) by its node's name."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC2701 (torch's fake tensors: no public path)

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    values: dict[str, torch.Tensor] = {}
    with mode, torch.enable_grad():
        _FakeRun(module, mode, {}, values).run(*_fake_inputs(mode, inputs))
    return values


#: :func:`cached_program_values`' runs, by the program (or module) they ran: a measured env's rank runs one job of
#: a program after another (:class:`~envs.real.distributed.worker.ProgramCache`), each with its own plan.
_VALUES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_program_values(owner: Any, module: fx.GraphModule, inputs: Sequence[Any]) -> dict[str, torch.Tensor] | None:
    """:func:`program_values` of ``module``, kept with ``owner`` (the ``ExportedProgram`` it was unlifted from, or
    itself) for the next schedule of the same inputs' shapes and dtypes and the same parameters needing gradients;
    None where the whole program does not run on fake tensors (the stages then run as a chain)."""
    key = (
        tuple((tuple(x.shape), x.dtype, x.requires_grad) if isinstance(x, torch.Tensor) else repr(x) for x in inputs),
        tuple(name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad),
    )
    kept = _VALUES.get(owner)
    if kept is None or kept[0] != key:
        try:
            values = program_values(module, inputs)
        except Exception:  # noqa: BLE001  (the stages' own run says what is wrong, if anything is)
            values = None
        kept = (key, values)
        _VALUES[owner] = kept
    return kept[1]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.stride(), a.dtype, a.requires_grad) == (b.shape, b.stride(), b.dtype, b.requires_grad)


def _shapes_from_values(
    modules: Sequence[fx.GraphModule], inputs: Sequence[Any], values: dict[str, torch.Tensor]
) -> list[StageShapes] | None:
    """:func:`stage_shapes` read from the whole program's ``values``, or None where they do not say.

    A value's shape, dtype and whether it needs a gradient do not depend on the layout of the tensors it was made
    from; its strides may. So what a stage sends is known where its layout is:

    * a split backward's stage sends fresh copies (dense strides);
    * another stage sends ``contiguous(y)``: ``y`` as it is where it is contiguous, else dense. Its ``y`` is the
      whole program's while every tensor the stage received is exactly the whole program's (as stage 0's inputs
      are); one it received and sends on is what it received; else ``contiguous(y)`` is dense unless a dimension
      of ``y`` has size 0 or 1 (where a contiguous tensor may keep other strides): only then None."""
    placeholders = [n for n in modules[0].graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):  # inputs in a structure: the chain's run flattens them
        return None
    received = {p.name: _meta(x) for p, x in zip(placeholders, inputs) if isinstance(x, torch.Tensor)}
    args = tuple(received.values())
    same = True  # what this stage received is exactly the whole program's
    shapes = []
    for s, module in enumerate(modules):
        output = next(n for n in module.graph.nodes if n.op == "output")
        last = s + 1 == len(modules)
        outs = []
        for send in [output] if last else output.args[0]:
            node = send.args[0]
            if not isinstance(node, fx.Node):
                return None
            whole = received.get(node.name) if node.op == "placeholder" else values.get(node.meta.get(SOURCE))
            if whole is None:
                return None
            if last:  # the loss: one scalar, whose strides are () whatever its inputs' were
                outs.append(whole)
            elif send.target is _CLONE:
                outs.append(_meta(whole, dense=True))
            elif node.op == "placeholder" or same:
                outs.append(whole if whole.is_contiguous() else _meta(whole, dense=True))
            elif min(whole.shape, default=2) > 1:
                outs.append(_meta(whole, dense=True))
            else:
                return None
        shapes.append(StageShapes(args, tuple(outs)))
        if not last:
            carried = [n for n in modules[s + 1].graph.nodes if n.op == "placeholder"]
            received = {p.name: t for p, t in zip(carried, outs)}
            same = all(p.meta.get(SOURCE) in values and _same(t, values[p.meta[SOURCE]]) for p, t in zip(carried, outs))
            args = tuple(outs)
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
    "SOURCE",
    "StageShapes",
    "cached_program_values",
    "carried_values",
    "dense_gradient",
    "parameters_by_name",
    "place_stage",
    "program_values",
    "stage_programs",
    "stage_shapes",
]
