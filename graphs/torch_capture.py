"""Capture a model's forward pass with ``torch.export`` as an :class:`OpGraph`.

The ops are the ``call_function`` nodes of the exported graph, in graph order (a
topological order), named by their torch.export node names so a placement maps
1:1 onto the program :func:`export_program` returns. Placeholders (parameters,
buffers, user inputs) and the output node are not ops:

- a parameter or buffer is *owned* by the first op that reads it (its bytes go in
  ``param_bytes`` / ``buffer_bytes`` of that op, so the totals equal the model's
  bytes, tied weights once); ``params[i]`` lists every FQN op ``i`` reads;
- user inputs are listed in ``meta["inputs"]`` with the ops that consume them.

Views and ``getitem`` keep their logical output size in ``out_bytes`` but have
zero FLOPs; their names are listed in ``meta["alias_ops"]`` (they share memory with
their input), ops that write into an input in ``meta["inplace_ops"]``. FLOPs come
from :mod:`graphs.flops`. One forward is captured: the simulator models backward.

Example:
    >>> import torch
    >>> g = capture(torch.nn.Linear(8, 16), (torch.randn(4, 8),))
    >>> g.op_types, float(g.flops[0]), g.total_param_bytes
    (['aten.linear.default'], 1024.0, 576)
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import os
import re
import sysconfig
import traceback
import warnings
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from graphs import flops as _flops
from graphs.errors import CaptureError, GraphFormatError
from graphs.ir import OpGraph
from graphs.ops import is_inplace

# Bump when the graph built from the same program changes (invalidates zoo caches).
CAPTURE_VERSION = 1

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"])


# ------------------------------------------------------------------ export
def export_program(model: torch.nn.Module, example_inputs: tuple, *, decompose: bool = False):
    """The one ``torch.export`` call of the project; failures become :class:`CaptureError`.

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
    """
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"capture failed: model is a {type(model).__name__}, not a torch.nn.Module")
    if isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if on_meta(model):
        example_inputs = tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, example_inputs)
    with _quiet(), _no_kv_cache(model):
        try:
            ep = torch.export.export(model, example_inputs)
        except Exception as e:
            raise CaptureError(describe_failure(e)) from None
        if decompose:
            try:
                ep = ep.run_decompositions()
            except Exception as e:
                raise CaptureError(describe_failure(e, stage="decomposition")) from None
    return ep


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
def _quiet() -> Iterator[None]:
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


def describe_failure(exc: BaseException, stage: str = "capture") -> str:
    """One line naming the cause and the user's source line of an export failure.

    >>> describe_failure(RuntimeError("boom\\nmore"))
    'capture failed: RuntimeError (boom)'
    """
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.split(r"\s\s|\s\(unhinted", first)[0]  # drop torch's debugging hints
    if len(first) > 200:
        first = first[:197] + "..."
    name = type(exc).__name__
    if name.startswith("GuardOnDataDependent") or "data-dependent" in text or "data dependent" in text:
        cause = "data-dependent control flow"
    elif name == "UnsupportedOperatorException" or "Unsupported" in name or "not supported" in text:
        cause = "unsupported operation"
    else:
        cause = name
    where = _user_frame(exc)
    loc = f" at {where}" if where else ""
    if cause == name:
        return f"{stage} failed: {name}{loc} ({first})"
    return f"{stage} failed: {cause}{loc} ({name}: {first})"


def _user_frame(exc: BaseException) -> str:
    """``file.py:line`` of the innermost traceback frame outside torch and this module."""
    best = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename) if not frame.filename.startswith("<") else ""
        skip = path.startswith((_TORCH_DIR, _STDLIB_DIR)) or path == _HERE or "/site-packages/" in path
        if not path or skip:
            continue
        best = f"{os.path.basename(path)}:{frame.lineno}"
    return best


# ------------------------------------------------------------------ program -> graph
def graph_from_program(ep, name: str = "") -> OpGraph:
    """Build the :class:`OpGraph` of an ``ExportedProgram`` (see the module docstring).

    Raises:
        CaptureError: the program has something the IR cannot hold (a
            data-dependent output shape, as ``torch.nonzero`` makes), with the node
            and the user's source line, on one line.
    """
    current: list = [None]  # the node being converted, for the error message
    try:
        return _graph_from_program(ep, name, current)
    except (CaptureError, GraphFormatError):
        raise
    except Exception as e:
        raise CaptureError(describe_node_failure(e, current[0])) from None


def describe_node_failure(exc: BaseException, node: Any) -> str:
    """One line for a failure while turning exported node ``node`` into an op."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.split(r"\s\s|\s\(unhinted", first)[0][:200]
    if node is None:
        return f"capture failed: cannot read the exported program ({type(exc).__name__}: {first})"
    where = _node_source(node)
    loc = f" at {where}" if where else ""
    label = f"node {node.name} ({_flops.op_type(node.target) if node.op == 'call_function' else node.op}){loc}"
    name = type(exc).__name__
    if name.startswith("GuardOnDataDependent") or "data-dependent" in text or "data dependent" in text:
        return (
            f"capture failed: data-dependent output shape at {label}; placer needs static shapes "
            f"(ops such as torch.nonzero or boolean-mask indexing size their output by the data) ({name}: {first})"
        )
    return f"capture failed: cannot convert {label} ({name}: {first})"


def _node_source(node: Any) -> str:
    """``file.py:line`` of the user's code that made ``node`` (from its recorded stack trace)."""
    trace = node.meta.get("stack_trace") or ""
    best = ""
    for path, line in re.findall(r'File "([^"]+)", line (\d+)', trace):
        full = os.path.abspath(path) if not path.startswith("<") else ""
        if not full or full.startswith((_TORCH_DIR, _STDLIB_DIR)) or full == _HERE or "/site-packages/" in full:
            continue
        best = f"{os.path.basename(full)}:{line}"
    return best


def _graph_from_program(ep, name: str, current: list) -> OpGraph:
    reader = _ProgramReader(ep)
    for node in ep.graph.nodes:
        current[0] = node
        if node.op == "placeholder":
            reader.placeholder_bytes[node.name] = _nbytes(node.meta.get("val"))
        elif node.op == "call_function":
            reader.add_op(node)
    current[0] = None
    return reader.graph(name)


class _ProgramReader:
    """The columns of an OpGraph, filled one exported node at a time (:func:`graph_from_program`)."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        sig = ep.graph_signature
        self.params = dict(sig.inputs_to_parameters)
        self.buffers = dict(sig.inputs_to_buffers)
        self.constants = dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
        self.buffers.update(self.constants)
        self.user_inputs = set(sig.user_inputs)
        self.tensor_key = _tensor_keys(ep, list(self.params.values()) + list(self.buffers.values()))
        self.index: dict[str, int] = {}
        self.cols: dict[str, list] = {
            k: []
            for k in (
                "names",
                "op_types",
                "out_shapes",
                "out_dtypes",
                "module_paths",
                "params",
                "out_bytes",
                "flops",
                "param_bytes",
                "buffer_bytes",
                "edge_src",
                "edge_dst",
                "edge_bytes",
                "alias_ops",
                "inplace_ops",
            )
        }
        self.owned: set[str] = set()
        self.input_consumers: dict[str, list[str]] = {}
        self.placeholder_bytes: dict[str, int] = {}

    def add_op(self, node: torch.fx.Node) -> None:
        c = self.cols
        i = len(c["names"])
        self.index[node.name] = i
        tensors = [t for t in tree_flatten(node.meta.get("val"))[0] if isinstance(t, torch.Tensor)]
        c["names"].append(node.name)
        c["op_types"].append(_flops.op_type(node.target))
        c["out_shapes"].append([[int(d) for d in t.shape] for t in tensors])
        c["out_dtypes"].append([str(t.dtype).removeprefix("torch.") for t in tensors])
        c["out_bytes"].append(sum(_nbytes(t) for t in tensors))
        c["module_paths"].append(module_path(node))
        if _flops.is_alias(node.target):
            c["alias_ops"].append(node.name)
        if is_inplace(node.target):
            c["inplace_ops"].append(node.name)
        try:
            c["flops"].append(_node_flops(node))
        except Exception as e:  # a formula that cannot handle this call: name the node
            raise CaptureError(f"capture failed: cannot count FLOPs of node {node.format_node()} ({e})") from None
        own_p = own_b = 0
        fqns: list[str] = []
        for arg in node.all_input_nodes:
            if arg.op != "placeholder":
                if arg.name in self.index:
                    c["edge_src"].append(self.index[arg.name])
                    c["edge_dst"].append(i)
                    c["edge_bytes"].append(_edge_bytes(arg, node))
                continue
            fqn = self.params.get(arg.name) or self.buffers.get(arg.name)
            if fqn is None:
                if arg.name in self.user_inputs:
                    self.input_consumers.setdefault(arg.name, []).append(node.name)
                continue
            fqns.append(fqn)
            if self.tensor_key[fqn] not in self.owned:  # tied weights: one tensor, several FQNs
                self.owned.add(self.tensor_key[fqn])
                if arg.name in self.params:
                    own_p += self.placeholder_bytes[arg.name]
                else:
                    own_b += self.placeholder_bytes[arg.name]
        c["param_bytes"].append(own_p)
        c["buffer_bytes"].append(own_b)
        c["params"].append(fqns)

    def graph(self, name: str) -> OpGraph:
        c = self.cols
        meta = {
            "inputs": [
                {
                    "name": n.name,
                    "shape": [int(d) for d in n.meta["val"].shape]
                    if isinstance(n.meta.get("val"), torch.Tensor)
                    else [],
                    "bytes": self.placeholder_bytes.get(n.name, 0),
                    "consumers": self.input_consumers.get(n.name, []),
                }
                for n in self.ep.graph.nodes
                if n.op == "placeholder" and n.name in self.user_inputs
            ],
            "alias_ops": c["alias_ops"],
            "inplace_ops": c["inplace_ops"],
            "unused_params": sorted(f for f in self.params.values() if self.tensor_key[f] not in self.owned),
            "tied_params": _tied_groups(self.tensor_key),
            "constants": sorted(
                self.constants.values()
            ),  # tensors the program made (torch.tensor(...)), not the model's
            "outputs": self.outputs(),  # what forward returns: a training step's loss is one float scalar
            "capture_version": CAPTURE_VERSION,
            "torch": torch.__version__,
        }
        ints = {
            k: np.asarray(c[k], dtype=np.int64)
            for k in ("out_bytes", "param_bytes", "buffer_bytes", "edge_src", "edge_dst", "edge_bytes")
        }
        return OpGraph(
            names=c["names"],
            op_types=c["op_types"],
            out_shapes=c["out_shapes"],
            out_dtypes=c["out_dtypes"],
            flops=np.asarray(c["flops"], dtype=np.float64),
            module_paths=c["module_paths"],
            params=c["params"],
            name=name,
            meta=meta,
            **ints,
        )

    def outputs(self) -> list[dict[str, Any]]:
        """Shape and dtype of each tensor the model's forward returns (flattened), in order."""
        by_name = {n.name: n for n in self.ep.graph.nodes}
        out = []
        for name in self.ep.graph_signature.user_outputs:
            val = by_name[name].meta.get("val") if name in by_name else None
            if isinstance(val, torch.Tensor):
                out.append({"shape": [int(d) for d in val.shape], "dtype": str(val.dtype).removeprefix("torch.")})
        return out


def _tensor_keys(ep, fqns: list[str]) -> dict[str, str]:
    """FQN -> the first FQN naming the same tensor (tied weights share one key)."""
    first_of: dict[int, str] = {}
    keys = {}
    for fqn in fqns:
        tensor = ep.state_dict.get(fqn, ep.constants.get(fqn))
        keys[fqn] = fqn if tensor is None else first_of.setdefault(id(tensor), fqn)
    return keys


def _tied_groups(tensor_key: dict[str, str]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for fqn, key in tensor_key.items():
        groups.setdefault(key, []).append(fqn)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def _nbytes(val: Any) -> int:
    if isinstance(val, torch.Tensor):
        return int(val.numel()) * val.element_size()
    if isinstance(val, (list, tuple)):
        return sum(_nbytes(v) for v in val)
    return 0


def _edge_bytes(producer: torch.fx.Node, consumer: torch.fx.Node) -> int:
    """Bytes the consumer reads from the producer: one element for ``getitem``."""
    val = producer.meta.get("val")
    if consumer.target is operator.getitem and isinstance(val, (list, tuple)):
        return _nbytes(consumer.meta.get("val"))
    return _nbytes(val)


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


def _node_flops(node: torch.fx.Node) -> float:
    def val(x: Any) -> Any:
        return x.meta.get("val") if isinstance(x, torch.fx.Node) else x

    args, kwargs = tree_map(val, (node.args, node.kwargs))
    return _flops.op_flops(node.target, args, kwargs, node.meta.get("val"))


# ------------------------------------------------------------------ entry points
def capture(model: torch.nn.Module, example_inputs: tuple, *, decompose: bool = False, name: str = "") -> OpGraph:
    """Export one forward of ``model`` on ``example_inputs`` and build its :class:`OpGraph`.

    Raises:
        CaptureError: the model cannot be exported; the message names the cause
            and the user's source line.
    """
    ep = export_program(model, example_inputs, decompose=decompose)
    graph = graph_from_program(ep, name=name or type(model).__name__)
    graph.meta["decomposed"] = bool(decompose)
    graph.invalidate()
    return graph


def capture_pt2(path: str | os.PathLike, *, decompose: bool = False) -> OpGraph:
    """The :class:`OpGraph` of a program saved with ``torch.export.save``.

    The archive is checked first (:mod:`graphs.pt2`): nothing in it is ever
    unpickled or run; a pickled weight, constant or input is refused.
    """
    from graphs.pt2 import load_program

    path = os.fspath(path)
    try:
        with _quiet():
            ep = load_program(path)
    except GraphFormatError:
        raise
    except Exception as e:
        raise GraphFormatError(
            f"{path}: not a loadable torch.export program ({type(e).__name__}: {_first_line(e)})"
        ) from None
    if decompose:
        with _quiet():
            try:
                ep = ep.run_decompositions()
            except Exception as e:
                raise CaptureError(f"{path}: {describe_failure(e, stage='decomposition')}") from None
    graph = graph_from_program(ep, name=os.path.splitext(os.path.basename(path))[0])
    graph.meta["decomposed"] = bool(decompose)
    graph.invalidate()
    return graph


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else "")[:200]
