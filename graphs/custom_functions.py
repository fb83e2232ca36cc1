"""A model's own ``torch.autograd.Function`` s, kept whole in its captured program.

``torch.export`` traces such a function's forward into the program's ops and keeps nothing of its backward (strict
export even runs it without gradients), so a placed program's backward would be autograd's of those ops. Where the
function's backward is that gradient written by hand (BLOOM's GELU) nothing changes; where it is not (a gradient
reversal, a straight-through estimator's rounding, torchao's fake quantization for quantization-aware training) the
placed program would train on other gradients, silently: every quantized weight of a QAT model on a zero gradient.

So while a model is traced (:func:`functions_kept`), each call of a function of the model's own (not torch's),
however it is made (``apply`` bound once at import too: every call goes through :data:`_LEVEL`), is
recorded as one op of the program, ``placer::autograd_function``, whose inputs are the call's tensors and whose
constant ``key`` names the call in :data:`KEPT` (the function and the call's other arguments). The op runs the
function's forward without gradients; its backward runs that forward again on the saved inputs, with gradients, and
asks autograd for the gradient through it, which is the function's own backward. The function's forward runs twice a
step, as an op of a checkpointed block does. Each process that runs a program holds the calls of the captures it
made (a job's ranks export the model themselves).

The model's parameters and buffers the function reads are inputs of the op too: those of a module it is given (a
reversible network's layers), and those it reads without being given them (a closure's or a bound method's: a
library's own checkpointing), found over its forward's run at capture and bound after export (:func:`bind_hidden`).
While the function runs, each is swapped into the modules that hold it (:func:`_given`), so a plan places, counts
and updates them with the op and any copy of the model runs the function on its own; a backward that accumulates
their gradients itself (a reversible network's) gives them as the op's.

A function whose forward draws random numbers (a dropout written by hand) draws the same ones in its backward's run:
the op notes the random state of the host and of its tensors' devices before its forward, and the backward runs
again from that state and puts the process's back after, as ``torch.utils.checkpoint`` does. A function that writes
into its inputs (``mark_dirty``) or into a buffer it reads is refused at capture, in one line.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten  # noqa: PLC2701 (torch has no public pytree module)
from torch.utils.checkpoint import get_device_states, set_device_states

from graphs.thread_patch import patched_in_this_thread

#: The op type of a kept call in an :class:`~graphs.ir.OpGraph`.
KEPT_OP_TYPE = "placer.autograd_function.default"

#: ``torch.autograd.Function.apply`` as torch defines it.
_APPLY = torch.autograd.Function.__dict__["apply"].__func__

#: The class whose ``apply`` (torch._C._FunctionBase's, inherited) every ``Function.apply`` calls: where a call is
#: caught, including one through an ``apply`` bound at import (mambapy's ``pscan = PScan.apply``), which the name on
#: ``torch.autograd.Function`` never sees again. torch has no public hook there.
_LEVEL = torch.autograd.function._SingleLevelFunction  # noqa: SLF001

#: The model this thread is capturing (:func:`functions_kept`'s), whose parameters a kept call's forward may read.
_ROOT = threading.local()

#: Whether this thread is running a kept call's function (its own calls of functions are part of it, not kept).
_RUNNING = threading.local()


@dataclass
class KeptCall:
    """One call of a function kept whole: the function, the call's arguments with its tensors taken out
    (``leaves``, flattened with ``spec``; ``slots``: where the tensors go), and the structure of what it returns
    (``out_spec`` and its leaves that are not tensors, from its first run)."""

    cls: Any
    leaves: list
    spec: Any
    slots: tuple[int, ...]
    out_spec: Any = None
    out_leaves: list = field(default_factory=list)
    #: The model's parameters and buffers the call reads, as the modules holding them: those of a module it is given
    #: (a reversible network's layers), and, once :func:`bind_hidden` has bound them, those it reads without being
    #: given them. ``(module, attribute, a parameter?, index among the op's tensors)``: the op's tensor runs in each
    #: one's place (:func:`_given`).
    bound: list[tuple[Any, str, bool, int]] = field(default_factory=list)
    #: The model's parameters and buffers its forward read at capture, through the modules that hold them (a closure's,
    #: a bound method's: a library's own checkpointing): ``(their names, a parameter?, the op's input that is the
    #: tensor, or None where it is not given)``; :func:`bind_hidden` makes those not given inputs of the op, and has
    #: the function read the op's tensors through those modules. None: not looked for.
    hidden: list[tuple[list[str], bool, int | None]] | None = None

    @property
    def name(self) -> str:
        """The function's name, for a message."""
        return getattr(self.cls, "__qualname__", self.cls.__name__)


#: The calls kept in this process, by key (the op's constant argument).
KEPT: dict[str, KeptCall] = {}


@contextlib.contextmanager
def _given(call: KeptCall, tensors: list[torch.Tensor]) -> Iterator[None]:
    """Through the block, each parameter or buffer ``call`` reads (:attr:`KeptCall.bound`) is its tensor of
    ``tensors`` (the op's own, on the op's device: what the plan placed), whichever copy of the model the modules
    are of."""
    saved = []
    try:
        for owner, name, is_param, i in call.bound:
            store = owner._parameters if is_param else owner._buffers  # noqa: SLF001 (what functional_call swaps)
            saved.append((store, name, store[name]))
            store[name] = tensors[i]
        yield
    finally:
        for store, name, old in reversed(saved):
            store[name] = old


#: Per thread, what each run of a kept call's function is entered in (:func:`around_kept_calls`).
_AROUND = threading.local()


@contextlib.contextmanager
def around_kept_calls(make: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """Through the block, each run of a kept call's function in this thread (its forward, and its run again in the
    backward) is inside ``make()``. A ``TorchDispatchMode`` active around a placed program does not see the ops a
    custom op runs inside (torch sets the mode aside while it handles an op), so a mode meant for every op of a step
    (:func:`envs.real.fixed_draws.fixed_draws`: a reversible layer's hashing draws, held) reaches a kept call's so."""
    makers = _AROUND.__dict__.setdefault("makers", [])
    makers.append(make)
    try:
        yield
    finally:
        makers.pop()


def _run(call: KeptCall, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``call``'s function applied to ``tensors`` in their places (the modules it is given reading theirs:
    :func:`_given`); its tensors out, in order."""
    leaves = list(call.leaves)
    for slot, t in zip(call.slots, tensors):
        leaves[slot] = t
    args, kwargs = tree_unflatten(leaves, call.spec)
    outer, _RUNNING.on = getattr(_RUNNING, "on", False), True
    try:
        with _given(call, tensors), contextlib.ExitStack() as around:
            for make in getattr(_AROUND, "makers", ()):
                around.enter_context(make())
            out = _APPLY(call.cls, *args, **kwargs)
    finally:
        _RUNNING.on = outer
    out_leaves, call.out_spec = tree_flatten(out)
    call.out_leaves = [None if isinstance(x, torch.Tensor) else x for x in out_leaves]
    return [x for x in out_leaves if isinstance(x, torch.Tensor)]


def _kept(key: str) -> KeptCall:
    try:
        return KEPT[key]
    except KeyError:
        raise RuntimeError(
            f"placer::autograd_function: call {key!r} was kept by a capture in another process; export the model in "
            "this one (placer.apply does)"
        ) from None


#: The random state before this thread's last forward of a kept call, for its ``setup_context`` (which autograd runs
#: right after the forward, in the same thread).
_DRAWN = threading.local()


def _random_state(tensors: list[torch.Tensor]) -> tuple:
    """The host's random state and that of each device of ``tensors``."""
    return torch.get_rng_state(), *get_device_states(*tensors)


@contextlib.contextmanager
def _drawing_from(state: tuple) -> Iterator[None]:
    """Random numbers drawn in the block come from ``state``; the process's state is as it was after."""
    host, devices, device_states = state
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(host)
        set_device_states(devices, device_states)
        yield


# tagged as drawing random numbers (it may): a program's random ops keep their order among themselves when its ops are
# reordered (envs.real.reorder.order_constraints), so each draws what it drew in the model
@torch.library.custom_op("placer::autograd_function", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def autograd_function(tensors: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    """The kept call ``key`` of a model's own autograd.Function on ``tensors`` (module doc)."""
    _DRAWN.state = _random_state(tensors)
    with torch.no_grad():
        outs = _run(_kept(key), tensors)
    inputs = {t.untyped_storage().data_ptr() for t in tensors}
    fresh = []
    for o in outs:  # an op's outputs may share no memory with its inputs or with each other
        ptr = o.untyped_storage().data_ptr()
        fresh.append(o.clone() if ptr in inputs else o)
        inputs.add(ptr)
    return fresh


class _Reads(TorchFunctionMode):
    """The tensors of ``named`` (by id) that torch functions are given through the block, with their versions when
    first given."""

    def __init__(self, named: dict[int, Any]) -> None:
        super().__init__()
        self.named = named
        self.read: dict[int, tuple[torch.Tensor, int]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor) and id(x) in self.named and id(x) not in self.read:
                self.read[id(x)] = (x, x._version)
        return func(*args, **kwargs)


def _state_by_id(root: torch.nn.Module) -> dict[int, tuple[list[str], bool]]:
    """Each parameter and buffer of ``root`` (as its attributes hold them now: the trace's), by id: ``(its names,
    a parameter?)``."""
    out: dict[int, tuple[list[str], bool]] = {}
    for is_param, named in (
        (True, root.named_parameters(remove_duplicate=False)),
        (False, root.named_buffers(remove_duplicate=False)),
    ):
        for name, t in named:
            out.setdefault(id(t), ([], is_param))[0].append(name)
    return out


def _refuse_writes(call: KeptCall) -> None:
    raise RuntimeError(
        f"{call.name}, a torch.autograd.Function of the model's, writes "
        "into a tensor it is given in place (mark_dirty, or a module's buffer): placer keeps a function whole only "
        "where it writes none"
    )


def _refuse_freed(call: KeptCall, tensors: list[torch.Tensor]) -> None:
    """A function that frees the memory of a tensor it is given (memcnn's invertible couplings, which recompute
    their input from their output in the backward) is refused, at capture (its fake run frees the fake's storage):
    the op's backward runs the forward again on it."""
    if any(t.numel() > 0 and t.untyped_storage().nbytes() == 0 for t in tensors):
        raise RuntimeError(
            f"{call.name}, a torch.autograd.Function of the model's, frees "
            "the memory of a tensor it is given (memcnn: keep_input=False); placer keeps a function whole only where "
            "its inputs stay (memcnn: keep_input=True)"
        )


@autograd_function.register_fake
def _(tensors: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    call = _kept(key)
    versions = [t._version for t in tensors]
    root = getattr(_ROOT, "module", None)
    if root is None or call.hidden is not None:
        with torch.no_grad():
            outs = _run(call, tensors)
    else:  # at capture: which of the model's parameters and buffers the forward reads without being given them
        state = _state_by_id(root)
        given = {id(t): k for k, t in enumerate(tensors)}
        with torch.no_grad(), _Reads(state) as reads:
            outs = _run(call, tensors)
        if any(t._version != v for i, (t, v) in reads.read.items() if i not in given):  # a buffer it reads, written
            _refuse_writes(call)
        call.hidden = [(*state[i], given.get(i)) for i in reads.read]
    if any(t._version != v for t, v in zip(tensors, versions)):  # an input written in place (mark_dirty)
        _refuse_writes(call)
    _refuse_freed(call, tensors)
    return [torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=o.device) for o in outs]


def bind_hidden(ep: Any, root: torch.nn.Module) -> None:
    """Bind the parameters and buffers each kept call of exported program ``ep`` read through the modules holding them
    (:attr:`KeptCall.hidden`): those it was not given become inputs of its op (the program's placeholders for them
    are appended to the op's tensors), and the call swaps each, given or not, into every module of ``root`` that
    holds it (:func:`_given`). So a plan places, counts and updates them with the op, any copy of the model runs the
    function on its own, and a function given its weights and reading them through its module too (memcnn's) reads
    the tensors whose gradients its backward asks for."""
    signature = ep.graph_signature
    placeholder_of = {
        fqn: name for name, fqn in {**signature.inputs_to_parameters, **signature.inputs_to_buffers}.items()
    }
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    changed = False
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.placer.autograd_function.default:
            continue
        call = KEPT.get(node.args[1])
        if call is None or not call.hidden:
            continue
        inputs = list(node.args[0])
        for names, is_param, given in call.hidden:
            i = given
            if i is None:  # read without being given it: a new input of the op, the program's own for it
                fqn = next((n for n in names if n in placeholder_of), None)
                if fqn is None:  # not an input of the program (torch.export lifts every parameter and buffer)
                    raise RuntimeError(f"{call.name} reads {names[0]}, which the exported program has no input for")
                i = len(inputs)
                inputs.append(nodes[placeholder_of[fqn]])
            for name in names:
                prefix, _, attr = name.rpartition(".")
                call.bound.append((root.get_submodule(prefix), attr, is_param, i))
        node.args = (inputs, *node.args[1:])
        changed = True
    if changed:
        ep.graph_module.recompile()


def kept_flops(tensors: list[torch.Tensor], key: str, count: Callable[[Any, tuple, dict, Any], float]) -> float | None:
    """The forward FLOPs of kept call ``key`` on tensors shaped as ``tensors`` (fake or meta): the function's forward
    run on meta tensors, each ATen op it runs counted by ``count(op, args, kwargs, out)`` (the graph's own count of
    an op: :func:`graphs.flops.op_flops`); None where the forward cannot run on meta tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701 (torch's dispatch-mode base)

    class Counting(TorchDispatchMode):
        total = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            self.total += count(func, args, kwargs or {}, out)
            return out

    meta = [torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta") for t in tensors]
    try:
        with torch.no_grad(), Counting() as mode:
            _run(_kept(key), meta)
    except Exception:  # a forward that meta tensors cannot run (it reads a value): the caller's estimate
        return None
    return float(mode.total)


def _setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
    tensors, key = inputs
    ctx.key = key
    ctx.drawn = _DRAWN.__dict__.pop("state", None)
    ctx.save_for_backward(*tensors)


def _backward(ctx: Any, grads: list[torch.Tensor | None]) -> tuple:
    """The function's forward again on the saved inputs, and autograd's gradient through it: its own backward.

    The function runs on a view of a fresh leaf per input, and one ``backward`` (not ``grad``: a function may refuse
    ``grad``, as memcnn's invertible couplings do) leaves in each leaf's ``grad`` all that reaches it: what the
    function's backward returns, and what a backward that accumulates its modules' parameters' gradients itself (a
    reversible network's, recomputing each layer) sends there. What a backward sets on its inputs' ``grad`` by hand
    (memcnn's, mimicking a backward) lands on the views, and is not counted twice."""
    call = _kept(ctx.key)
    drawn = _drawing_from(ctx.drawn) if ctx.drawn is not None else contextlib.nullcontext()
    # a complex input (a spectrum between FFTs) takes a gradient like a floating one
    fresh = [t.detach().requires_grad_(t.is_floating_point() or t.is_complex()) for t in ctx.saved_tensors]
    with torch.enable_grad(), drawn:
        given = [f.view_as(f) if f.requires_grad else f for f in fresh]
        with _given(call, given):
            outs = _run(call, given)
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
            if pairs and any(f.requires_grad for f in fresh):
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [f.grad if f.requires_grad else None for f in fresh], None


autograd_function.register_autograd(_backward, setup_context=_setup_context)


def _torch_s_own(cls: type) -> bool:
    """A function of torch itself (``torch.utils.checkpoint``'s): traced through, as torch means it to be."""
    module = getattr(cls, "__module__", "") or ""
    return module == "torch" or module.startswith(("torch.", "functorch"))


def _holds_no_tensor(x: Any) -> bool:
    """A part of a call's arguments kept whole, as the object it is (a dict the function writes its notes into and
    its caller reads after: fairscale's checkpointing), where no tensor is in it; only where tensors are is it taken
    apart (and put together again, another object, when the function runs)."""
    return not isinstance(x, torch.Tensor) and not any(isinstance(y, torch.Tensor) for y in tree_flatten(x)[0])


def _module_tensors(modules: list[torch.nn.Module], tensors: list[torch.Tensor]) -> list[tuple[Any, str, bool, int]]:
    """:attr:`KeptCall.bound` of a call given ``modules``: each parameter and buffer of theirs, appended to the op's
    ``tensors`` (once each: a tensor the call is given as one, or tied, is one input)."""
    index = {id(t): i for i, t in enumerate(tensors)}
    bound = []
    for module in modules:
        for owner in module.modules():
            for store, is_param in ((owner._parameters, True), (owner._buffers, False)):  # noqa: SLF001
                for name in store:
                    t = getattr(owner, name)
                    if not isinstance(t, torch.Tensor):
                        continue
                    if id(t) not in index:
                        index[id(t)] = len(tensors)
                        tensors.append(t)
                    bound.append((owner, name, is_param, index[id(t)]))
    return bound


@contextlib.contextmanager
def functions_kept(root: torch.nn.Module | None = None) -> Iterator[None]:
    """Through the block, in this thread, each call of a ``torch.autograd.Function`` of the model's own is the op
    ``placer::autograd_function`` (module doc); with ``root``, the model traced, each call notes which of its
    parameters and buffers the function reads without being given them (:func:`bind_hidden` then binds them)."""

    def make(apply: Callable) -> Callable:
        def call(cls: type, *args: Any, **kwargs: Any) -> Any:
            if _torch_s_own(cls) or getattr(_RUNNING, "on", False):
                return apply(cls, *args, **kwargs)
            leaves, spec = tree_flatten((args, kwargs), is_leaf=_holds_no_tensor)
            slots = tuple(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor))
            key = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', cls.__name__)}:{len(KEPT)}"
            kept = KEPT[key] = KeptCall(cls, [None if i in slots else x for i, x in enumerate(leaves)], spec, slots)
            tensors = [leaves[i] for i in slots]
            kept.bound = _module_tensors([x for x in leaves if isinstance(x, torch.nn.Module)], tensors)
            outs = iter(torch.ops.placer.autograd_function(tensors, key))
            return tree_unflatten([next(outs) if x is None else x for x in kept.out_leaves], kept.out_spec)

        return call

    outer, _ROOT.module = getattr(_ROOT, "module", None), root
    try:
        with patched_in_this_thread(_LEVEL, "apply", make):
            yield
    finally:
        _ROOT.module = outer
