"""The one ``torch.export`` call of the project, its options, and its failures as one line.

:func:`export_program` exports a model's forward as captured (static shapes: the
program an OpGraph is built from) or with dynamic dimensions (``dynamic=True``:
every dimension of every tensor input is ``Dim.AUTO``, so torch keeps dynamic
what the model allows and specialises the rest); :func:`input_dims` says which
dimensions of a program's inputs are dynamic.

Example:
    >>> import torch
    >>> ep = export_program(torch.nn.Linear(8, 16), (torch.randn(4, 8),), dynamic=True)
    >>> input_dims(ep)
    [{'name': 'input', 'shape': [4, 8], 'dynamic': {'0': [0, None]}}]
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import re
import sys
import sysconfig
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Iterator

import torch
import torch.fx.experimental._config as fx_config  # noqa: PLC2701 (the switch for size-oblivious tracing)

try:
    from torch.fx.experimental.symbolic_shapes import optimization_hint
except ImportError:  # torch < 2.12 (the GPU machines' 2.11) names it size_hint
    from torch.fx.experimental.symbolic_shapes import size_hint as optimization_hint
from torch.utils._pytree import tree_leaves, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from graphs.custom_functions import bind_hidden, functions_kept
from graphs.errors import CaptureError
from graphs.thread_patch import patched_in_this_thread

_TORCH_DIR = os.path.dirname(torch.__file__)
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"])
#: This package's capture modules: their frames are never "the user's line" of an error.
CAPTURE_FILES = frozenset(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
    for f in ("export.py", "torch_capture.py", "rnn.py", "custom_functions.py", "thread_patch.py")
)


def export_program(
    model: torch.nn.Module,
    example_inputs: tuple,
    *,
    decompose: bool = False,
    unroll_rnn: bool = False,
    dynamic: bool = False,
    stack_traces: bool = True,
):
    """``torch.export`` of ``model`` on ``example_inputs``; failures become :class:`CaptureError`.

    A training step keeps no key/value cache: a module whose ``config`` has
    ``use_cache`` (Hugging Face models) is exported with it off (see
    :func:`_no_kv_cache`), so a causal LM's output is its logits, not a cache object.

    A model built on the meta device (``with torch.device("meta"):``, or
    accelerate's ``init_empty_weights()``) has shapes but no weights, which is
    all a capture needs: its tensor inputs are moved to the meta device too (see
    :func:`on_meta`). The program of a meta model can be simulated, not run.

    Args:
        model: the module; captured in its current train/eval mode.
        example_inputs: positional inputs of one forward call.
        decompose: lower to core ATen (``ep.run_decompositions()``), which unrolls
            ``nn.LSTM`` over time and splits ``linear`` into ``permute`` + ``addmm``.
        unroll_rnn: write every ``nn.LSTM`` and ``nn.GRU`` as one op per layer and
            time step (:mod:`graphs.rnn`), so a placement can split a recurrent layer.
        dynamic: every dimension of every tensor input ``Dim.AUTO``, traced
            size-obliviously (a dimension of size 1 is not assumed to be 1, so
            the program says, by a guard, where a size of 1 would change it).
        stack_traces: each node keeps the stack of the model's code that made it (``node.meta["stack_trace"]``:
            what an error in the program, or in reading it, names the user's line with). False: none are recorded
            (:func:`without_stack_traces`), which makes the export 13-27 % faster on the zoo's models; for a
            program that is only read.
    """
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"capture failed: model is a {type(model).__name__}, not a torch.nn.Module")
    if isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if on_meta(model):
        example_inputs = tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, example_inputs)
    traces = contextlib.nullcontext() if stack_traces else without_stack_traces()
    taken: list[str] = []
    written: list[str] = []
    with quiet(), traces, _no_kv_cache(model), _rnn_written_out(model, unroll_rnn):
        try:
            with (
                model_kept(model),
                one_process_world(),
                gradients_noted(taken),
                data_writes_noted(written),
                functions_kept(model),
                distributions_unchecked(),
            ):
                ep = _export(model, example_inputs, dynamic)  # (model_kept: the trace's fakes stay off the model)
            bind_hidden(ep, model)  # the parameters a kept function reads without being given them: its inputs
            bind_state_constants(ep, model)  # parameters read through a plain dict: the program's, not constants
        except CaptureError:
            raise
        except Exception as e:
            if taken:  # torch's own error names a fake tensor left in the program's constants, and no line
                raise CaptureError(
                    f"capture failed: the forward takes a gradient itself ({taken[0]}), which torch.export cannot "
                    f"trace into the program ({type(e).__name__}: {first_line(e, limit=120)})"
                ) from None
            if written:  # torch's error names a fake tensor left in the program's constants, and no line
                raise CaptureError(
                    f"capture failed: the forward sets a tensor's .data (at {written[0]}), which torch.export cannot "
                    f"trace into the program ({type(e).__name__}: {first_line(e, limit=120)})"
                ) from None
            raise CaptureError(describe_failure(e)) from None
        if decompose:
            try:
                ep = ep.run_decompositions()
            except Exception as e:
                raise CaptureError(describe_failure(e, stage="decomposition")) from None
    return ep


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def bind_state_constants(ep: Any, model: torch.nn.Module) -> None:
    """The model's parameters and buffers that its forward reads other than through the modules holding them (a
    plain dict or list of them, as ncps' liquid time-constant cell keeps its weights) are the program's inputs for
    them, not constants.

    ``torch.export`` swaps a module's parameters and buffers for its trace's, so a tensor reached another way is
    the real one, which the trace lifts into a constant of the program, one per read: the placed program would run
    on the weights' values at capture, give them no gradient and never see them train. Each constant that is a
    parameter or buffer (the same memory, offset, shape, strides and dtype) is replaced by the program's input for
    it, and dropped. A constant that shares a parameter's memory some other way (a view of it) is refused in one
    line: it would be a frozen copy of a weight that trains."""
    from torch.export.graph_signature import InputKind

    signature = ep.graph_signature
    lifted = {s.target: s.arg.name for s in signature.input_specs if s.kind in (InputKind.PARAMETER, InputKind.BUFFER)}
    state: dict[tuple, str] = {}
    trained: dict[int, str] = {}  # the memory of each parameter that takes a gradient, by its address
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if name in lifted:
            state.setdefault(_storage_key(t), name)
        if isinstance(t, torch.nn.Parameter) and t.requires_grad and t.numel() > 0:  # (no memory: no address)
            trained.setdefault(t.untyped_storage().data_ptr(), name)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    kept, changed = [], False
    for spec in signature.input_specs:
        constant = ep.constants.get(spec.target) if spec.kind == InputKind.CONSTANT_TENSOR else None
        if not isinstance(constant, torch.Tensor) or constant.device.type == "meta" or constant.numel() == 0:
            kept.append(spec)
            continue
        name = state.get(_storage_key(constant))
        if name is None:
            owner = trained.get(constant.untyped_storage().data_ptr())
            if owner is not None:
                raise CaptureError(
                    f"capture failed: the forward reads part of parameter {owner} other than through its module (a "
                    "view of it kept in a plain attribute, say), which the program would hold as a constant that "
                    "never trains; read it through the module (self.<name>[...]) in the forward"
                )
            kept.append(spec)
            continue
        node = placeholders[spec.arg.name]
        node.replace_all_uses_with(placeholders[lifted[name]])
        ep.graph.erase_node(node)
        del ep.constants[spec.target]
        changed = True
    if changed:
        signature.input_specs[:] = kept
        ep.graph_module.recompile()


def _export(model: torch.nn.Module, example_inputs: tuple, dynamic: bool) -> Any:
    if dynamic:
        with fx_config.patch(backed_size_oblivious=True):
            return torch.export.export(model, example_inputs, dynamic_shapes=_auto_dims(model, example_inputs))
    return torch.export.export(model, example_inputs)


#: The containers of a module's state that its forward may add to in place (``register_buffer``, ``register_module``).
_STATE = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


@contextlib.contextmanager
def model_kept(model: torch.nn.Module) -> Iterator[None]:
    """Every submodule's attributes, parameters, buffers and children as they were before, restored after.

    A model's forward may cache what it computes on the module: x-transformers' ALiBi registers its bias as a buffer
    on the first call, a rotary embedding keeps its table as an attribute. Traced by ``torch.export``, that cache is
    a fake tensor of the trace, which export leaves on the user's model: its next forward (or copy, or export) then
    fails ("Cannot access data pointer of Tensor"), or reads a cache of the captured shapes. What export adds or
    replaces is undone, so the model is as it was (what it holds of its own is never copied).

    >>> class Cached(torch.nn.Module):
    ...     def forward(self, x):
    ...         if not hasattr(self, "table"):
    ...             self.register_buffer("table", torch.arange(x.shape[-1], dtype=x.dtype), persistent=False)
    ...         return x + self.table
    >>> m = Cached()
    >>> _ = export_program(m, (torch.zeros(2, 3),))
    >>> hasattr(m, "table"), m(torch.zeros(1, 4)).tolist()
    (False, [[0.0, 1.0, 2.0, 3.0]])
    """
    saved = []
    for module in model.modules():
        attrs = dict(vars(module))
        saved.append((module, attrs, {k: copy.copy(attrs[k]) for k in _STATE if k in attrs}))
    try:
        yield
    finally:
        for module, attrs, contents in saved:
            now = vars(module)
            now.clear()
            now.update(attrs)
            for k, held in contents.items():  # the same containers, with what they held
                now[k].clear()
                now[k].update(held)


def _auto_dims(model: torch.nn.Module, example_inputs: tuple) -> Any:
    """``dynamic_shapes`` marking every dimension of every tensor input ``Dim.AUTO``, whatever the signature."""
    shapes = torch.export.ShapesCollection()
    for t in tree_leaves(example_inputs):
        if isinstance(t, torch.Tensor) and t.dim():
            shapes[t] = {d: torch.export.Dim.AUTO for d in range(t.dim())}
    return shapes.dynamic_shapes(model, example_inputs)


def _rnn_written_out(model: torch.nn.Module, unroll: bool) -> contextlib.AbstractContextManager:
    if not unroll:
        return contextlib.nullcontext()
    from graphs.rnn import written_out  # only when asked: the unrolled layers

    return written_out(model)


def input_dims(ep: Any) -> list[dict[str, Any]]:
    """Each user input of program ``ep``: its name, its size as captured, and its dynamic dimensions.

    ``dynamic`` maps a dimension (as a string, a JSON key) to the ``[min, max]``
    sizes the program takes there (``None``: no bound); a dimension not listed is
    static: the program takes only the captured size there.
    """
    ranges = {str(s): r for s, r in ep.range_constraints.items()}
    user = set(ep.graph_signature.user_inputs)
    out = []
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        shape = list(val.shape) if isinstance(val, torch.Tensor) else []
        dynamic = {}
        for d, size in enumerate(shape):
            if static_size(size) is None:
                r = ranges.get(str(size))
                dynamic[str(d)] = [size_bound(r.lower) if r else 0, size_bound(r.upper) if r else None]
        out.append({"name": node.name, "shape": [optimization_hint(s) for s in shape], "dynamic": dynamic})
    return out


def static_size(size: int | torch.SymInt) -> int | None:
    """A program's size as an int when it is one (a symbol the trace fixed included), else None (dynamic)."""
    return size if isinstance(size, int) else size.node.maybe_as_int()


def size_bound(value: Any) -> int | None:
    """A bound of a dynamic size's range as an int; None for no bound (torch's sympy infinity)."""
    return int(value) if isinstance(value, int) or getattr(value, "is_Integer", False) else None


def on_meta(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a parameter on the meta device (it was built without weights).

    >>> with torch.device("meta"):
    ...     m = torch.nn.Linear(2, 2)
    >>> on_meta(m), on_meta(torch.nn.Linear(2, 2))
    (True, False)
    """
    return any(p.is_meta for p in model.parameters())


def check_runnable(model: Any) -> None:
    """Raise :class:`CaptureError` if ``model`` has no weights (meta device): it cannot run."""
    if isinstance(model, torch.nn.Module) and on_meta(model):
        raise CaptureError(
            f"{type(model).__name__} has its parameters on the meta device (built without weights): "
            "it can be captured, simulated, compared and placed, but not run; build it with weights to run it"
        )


@contextlib.contextmanager
def without_stack_traces() -> Iterator[None]:
    """Tracing records no stack trace per node (``torch.fx.config.do_not_emit_stack_traces``, where this torch has
    it: each node's stack is otherwise walked and symbolized as it is made, 13-27 % of an export)."""
    import torch.fx.config as fx_tracing  # a plain module of flags (no patch())

    if not hasattr(fx_tracing, "do_not_emit_stack_traces"):
        yield
        return
    saved = fx_tracing.do_not_emit_stack_traces
    fx_tracing.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_tracing.do_not_emit_stack_traces = saved


@contextlib.contextmanager
def _no_kv_cache(model: torch.nn.Module) -> Iterator[None]:
    """``config.use_cache = False`` on every submodule's config while exporting (restored after).

    Generation's key/value cache (transformers' ``DynamicCache``) is an output
    that torch.export cannot flatten and a training step never reads.
    """
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", None) is True and id(config) not in configs:
            configs[id(config)] = config
    for config in configs.values():
        config.use_cache = False
    try:
        yield
    finally:
        for config in configs.values():
            config.use_cache = True


@contextlib.contextmanager
def gradients_noted(taken: list[str]) -> Iterator[None]:
    """Note in ``taken`` each gradient the model's forward takes while it is traced (``torch.autograd.grad``, or
    ``backward()``, as an interatomic potential takes its forces, ``-dE/dpos``), by the model's line; each still runs
    as it would. A forward that takes one cannot be exported, and torch's error then names no line. Only this
    thread's calls count (another thread's backward meanwhile is not the model's)."""

    def noting(name: str) -> Callable[[Callable], Callable]:
        def make(run: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                where = user_line([(f.filename, f.lineno) for f in traceback.extract_stack()[:-2]])
                taken.append(f"{name} at {where}" if where else name)
                return run(*args, **kwargs)

            return call

        return make

    with (
        patched_in_this_thread(torch.autograd, "grad", noting("torch.autograd.grad")),
        patched_in_this_thread(torch.autograd, "backward", noting("backward()")),  # Tensor.backward calls it
    ):
        yield


#: ``torch.Tensor.data`` as torch defines it (a descriptor of its C base).
_DATA = torch._C.TensorBase.data  # noqa: SLF001 (where torch keeps it)


def _same_data(t: torch.Tensor, value: Any) -> bool:
    """Whether setting ``t.data = value`` changes nothing: ``value`` is ``t``'s memory as ``t`` lays it out."""
    return (
        isinstance(value, torch.Tensor)
        and torch._C._is_alias_of(value, t)  # noqa: SLF001 (torch's own test of shared memory, fake tensors too)
        and (value.dtype, value.device, value.shape) == (t.dtype, t.device, t.shape)
        and (value.stride(), value.storage_offset()) == (t.stride(), t.storage_offset())
    )


@contextlib.contextmanager
def data_writes_noted(written: list[str]) -> Iterator[None]:
    """While the model is traced, what its code (not torch's) does with a tensor's ``.data`` is traced as it
    computes: a read is ``detach()`` (the same memory, no gradient), a write that changes nothing is skipped, and
    any other write is noted in ``written`` by the model's line and fails the export (the trace would go on with the
    write in its tensor and none in the program). Only this thread's calls (another thread's, and torch's own, go
    through as they are).

    ``torch.export`` traces neither: the tensor ``.data`` gives is outside its trace, so an op that reads it becomes
    a fake tensor left in the program's constants, which it refuses naming no line. pytorch-metric-learning's losses
    with weights (ArcFace, CosFace, ...) do both on every call: they cast their weights to the embeddings' device and
    dtype, ``self.W.data = to_device(self.W.data, ...)``, which writes what is already there. A write of another
    tensor (weights clipped in the forward) is refused, and the capture's error names its line."""
    me = threading.get_ident()

    def by_model() -> bool:  # the caller of the caller (the model's code reading or writing .data), not torch's
        return threading.get_ident() == me and not sys._getframe(2).f_code.co_filename.startswith(_TORCH_DIR)

    def get_data(t: torch.Tensor) -> torch.Tensor:
        return t.detach() if by_model() else _DATA.__get__(t)

    def set_data(t: torch.Tensor, value: Any) -> None:
        if by_model():
            if _same_data(t, value):
                return
            where = user_line([(f.filename, f.lineno) for f in traceback.extract_stack()[:-1]])
            written.append(where or "the model's code")
            # traced on, the write would change the trace's tensor and not the program: refused
            raise RuntimeError("a .data write that replaces a tensor's memory")
        _DATA.__set__(t, value)

    torch.Tensor.data = property(get_data, set_data, doc=_DATA.__doc__)
    try:
        yield
    finally:
        del torch.Tensor.data


@contextlib.contextmanager
def one_process_world() -> Iterator[None]:
    """``torch.distributed.is_initialized()`` is False in this thread through the block: the model is built, run
    for a reference and captured as one process's program (the program every plan is made for), in a process of a
    job of placer's ranks too. Their process group is the pipeline's, not a data-parallel world the model's code
    could take part in: a library that averages a statistic over the data-parallel ranks when it finds a group
    (vector-quantize-pytorch's LFQ: ``dist.is_initialized() and dist.get_world_size() > 1``) would otherwise put
    a collective in the program, or wait on rank 0 for ranks that never call it. torch's own calls are not
    affected (they read ``torch.distributed.distributed_c10d``'s), nor another thread's."""
    import torch.distributed as dist

    if not dist.is_available():
        yield
        return
    with patched_in_this_thread(dist, "is_initialized", lambda initialized: lambda: False):
        yield


@contextlib.contextmanager
def distributions_unchecked() -> Iterator[None]:
    """``torch.distributions`` check no values in this thread through the block: a distribution made without
    ``validate_args`` is made with ``validate_args=False``, and no distribution checks a sample given to its
    ``log_prob`` (one made before, a prior kept on the model, included).

    The checks are Python's debug checks (on while ``__debug__``): each asks whether a tensor's values lie in a
    support (``if not valid.all(): raise``), a branch on the data that ``torch.export`` cannot trace, so a model
    that made a ``Normal`` in its forward (a VAE, a policy's ``Categorical``, a forecaster's ``StudentT``) could
    not be captured. They never change what a valid step computes; in the captured program a parameter out of its
    support gives NaN where the model's own forward would have raised. A distribution made with
    ``validate_args=True`` keeps its parameters' check (and capture names its line). Another thread's
    distributions are unaffected.

    >>> import torch.distributions as D
    >>> with distributions_unchecked():
    ...     D.Normal(torch.zeros(1), torch.ones(1))._validate_args
    False
    >>> D.Normal(torch.zeros(1), torch.ones(1))._validate_args == D.Distribution._validate_args  # the default again
    True
    """
    from torch.distributions import Distribution

    def unchecked_init(init: Callable) -> Callable:
        def made(
            self: Any,
            batch_shape: torch.Size = torch.Size(),  # noqa: B008 (Distribution.__init__'s own defaults)
            event_shape: torch.Size = torch.Size(),  # noqa: B008
            validate_args: bool | None = None,
        ) -> None:
            init(self, batch_shape, event_shape, False if validate_args is None else validate_args)

        return made

    with (
        patched_in_this_thread(Distribution, "__init__", unchecked_init),
        patched_in_this_thread(Distribution, "_validate_sample", lambda check: lambda self, value: None),
    ):
        yield


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence torch's logging and graph dumps while exporting (errors are re-raised)."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message, without torch's debugging hints (its type name if empty)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return re.split(r"\s\s|\s\(unhinted", first)[0][:limit]


def describe_failure(exc: BaseException, stage: str = "capture") -> str:
    """One line naming the cause and the user's source line of an export failure.

    >>> describe_failure(RuntimeError("boom\\nmore"))
    'capture failed: RuntimeError (boom)'
    """
    first = first_line(exc, limit=10_000)
    if len(first) > 200:
        first = first[:197] + "..."
    name = type(exc).__name__
    text = str(exc)
    if name.startswith("GuardOnDataDependent") or "data-dependent" in text or "data dependent" in text:
        cause = "data-dependent control flow"
    elif name == "UnsupportedOperatorException" or "Unsupported" in name or "not supported" in text:
        cause = "unsupported operation"
    else:
        cause = name
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(exc.__traceback__)]
    where = user_line(frames)
    loc = f" at {where}" if where else ""
    if cause == name:
        return f"{stage} failed: {name}{loc} ({first})"
    return f"{stage} failed: {cause}{loc} ({name}: {first})"


#: Installed packages that are torch or that torch calls while it traces (sympy reasons about the shapes, optree
#: flattens the inputs): their frames are never the user's line. A library the model comes from (transformers, timm,
#: the user's own installed package) is the model's code, where the line that failed usually is.
TORCH_PACKAGES = frozenset(
    {
        "torch",
        "sympy",
        "mpmath",
        "optree",
        "typing_extensions",
        "numpy",
        "triton",
        "functorch",
        "torchgen",
        "filelock",
        "fsspec",
    }
)


def installed_path(path: str) -> str:
    """An installed file's path inside site-packages or dist-packages ("" for one that is not installed).

    >>> installed_path("/venv/lib/python3.11/site-packages/monai/losses/utils.py")
    'monai/losses/utils.py'
    >>> installed_path("/usr/lib/python3/dist-packages/six.py"), installed_path("/home/me/model.py")
    ('six.py', '')
    """
    parts = path.replace(os.sep, "/").split("/")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in ("site-packages", "dist-packages"):
            return "/".join(parts[i + 1 :])
    return ""


def user_line(frames: list[tuple[str, Any]]) -> str:
    """``file.py:line`` of the innermost of ``(file, line)`` frames outside torch and the packages it calls
    (:data:`TORCH_PACKAGES`), the stdlib and capture itself: the model's line, in the user's file or in the
    installed library it comes from (an installed file is judged by its package alone: a Python installed without a
    venv keeps site-packages inside the stdlib's folder). A library's file is named by its path in the library
    (``monai/losses/utils.py``: a library has many a ``utils.py``), the user's by its name.

    >>> site = "/venv/lib/python3.11/site-packages/"
    >>> user_line([("/home/me/train.py", 9), (site + "transformers/models/dbrx/modeling_dbrx.py", 296),
    ...            (site + "torch/_tensor.py", 1100), (site + "sympy/core/relational.py", 512)])
    'transformers/models/dbrx/modeling_dbrx.py:296'
    """
    best = ""
    for filename, line in frames:
        path = os.path.abspath(filename) if not filename.startswith("<") else ""
        installed = installed_path(path)
        package = installed.split("/")[0].removesuffix(".py")
        outside = package in TORCH_PACKAGES if package else path.startswith((_TORCH_DIR, _STDLIB_DIR))
        if path and not outside and path not in CAPTURE_FILES:
            best = f"{installed or os.path.basename(path)}:{line}"
    return best
