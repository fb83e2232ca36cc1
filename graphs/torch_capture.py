"""Capture a model's forward pass with ``torch.export`` as an :class:`OpGraph`.

The ops are the ``call_function`` nodes of the exported graph, in graph order (a
topological order), named by their torch.export node names so a placement maps
1:1 onto the program :func:`export_program` returns. Placeholders (parameters,
buffers, user inputs) and the output node are not ops:

- a parameter or buffer is *owned* by the first op that reads it (its bytes go in
  ``param_bytes`` / ``buffer_bytes`` of that op, so the totals equal the model's
  bytes, tied weights once); ``params[i]`` lists every FQN op ``i`` reads. A parameter that takes no gradient
  (``requires_grad=False``: a frozen backbone, LoRA's base weights) has no gradient, no optimizer state and no
  weight gradient to compute: its bytes go in ``buffer_bytes``, and ``meta["frozen_params"]`` names it;
- user inputs are listed in ``meta["inputs"]`` with the ops that consume them.

Views and ``getitem`` keep their logical output size in ``out_bytes`` but have
zero FLOPs; their names are listed in ``meta["alias_ops"]`` (they share memory with
their input), ops that write into an input in ``meta["inplace_ops"]``, ops that read one tensor as two operands
(``x * x``) in ``meta["repeated_inputs"]`` (:func:`graphs.ops.backward_readers`), and where an op writes a
buffer in place (spectral norm's power iteration), which ops write it and which touch it in
``meta["buffer_writes"]`` and ``meta["buffer_readers"]`` (:mod:`graphs.buffer_writes`). FLOPs come
from :mod:`graphs.flops`. One forward is captured: the simulator models backward.

Example:
    >>> import torch
    >>> g = capture(torch.nn.Linear(8, 16), (torch.randn(4, 8),))
    >>> g.op_types, float(g.flops[0]), g.total_param_bytes
    (['aten.linear.default'], 1024.0, 576)
"""

from __future__ import annotations

import operator
import os
import re
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from graphs import flops as _flops
from graphs.buffer_writes import buffer_accesses
from graphs.errors import CaptureError, GraphFormatError
from graphs.export import (  # noqa: F401  (check_runnable, export_program: imported from here by the runtime)
    check_runnable,
    describe_failure,
    export_program,
    first_line,
    input_dims,
    quiet,
    user_line,
)
from graphs.ir import OpGraph
from graphs.ops import dense, is_inplace, is_view_op
from graphs.program_nodes import concrete, module_path, shape_nodes

# Bump when the graph built from the same program changes (invalidates zoo caches).
CAPTURE_VERSION = 1


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
    text = str(exc)
    first = first_line(exc)
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
    return user_line(re.findall(r'File "([^"]+)", line (\d+)', trace))


def _graph_from_program(ep, name: str, current: list) -> OpGraph:
    reader = _ProgramReader(ep)
    shapes = shape_nodes(ep.graph.nodes)
    for node in ep.graph.nodes:
        current[0] = node
        if node.op == "placeholder":
            reader.placeholder_bytes[node.name] = _nbytes(reader.val(node))
        elif node.op == "call_function" and node not in shapes:
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
        # parameters that take no gradient (a frozen backbone, LoRA's base weights): no gradient, no optimizer state,
        # no weight gradient to compute; to the simulator they are resident bytes like a buffer's
        self.frozen = {
            fqn for fqn in self.params.values() if not getattr(ep.state_dict.get(fqn), "requires_grad", True)
        }
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
                "repeated_inputs",
                "strided_views",
            )
        }
        self.owned: set[str] = set()
        self.input_consumers: dict[str, list[str]] = {}
        self.placeholder_bytes: dict[str, int] = {}
        self.values: dict[torch.fx.Node, Any] = {}

    def val(self, node: torch.fx.Node) -> Any:
        """``node``'s value as traced (:func:`concrete`)."""
        if node not in self.values:
            self.values[node] = concrete(node.meta.get("val"))
        return self.values[node]

    def add_op(self, node: torch.fx.Node) -> None:
        c = self.cols
        i = len(c["names"])
        self.index[node.name] = i
        tensors = [t for t in tree_flatten(self.val(node))[0] if isinstance(t, torch.Tensor)]
        c["names"].append(node.name)
        c["op_types"].append(_flops.op_type(node.target))
        c["out_shapes"].append([[int(d) for d in t.shape] for t in tensors])
        c["out_dtypes"].append([str(t.dtype).removeprefix("torch.") for t in tensors])
        c["out_bytes"].append(sum(_nbytes(t) for t in tensors))
        c["module_paths"].append(module_path(node))
        if _flops.is_alias(node.target):
            c["alias_ops"].append(node.name)
        view = _flops.is_alias(node.target) or is_view_op(c["op_types"][-1])
        strided = len(tensors) == 1 and tensors[0].layout == torch.strided
        if view and strided and not dense(tuple(tensors[0].shape), tuple(tensors[0].stride())):
            c["strided_views"].append(node.name)  # a slice with gaps: a parameter's copy for it holds all of it
        if is_inplace(node.target):
            c["inplace_ops"].append(node.name)
        operands = [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, torch.fx.Node)]
        if len(operands) > len(set(operands)):  # x * x: one tensor, two operands (x * 2.0 is one tensor, once)
            c["repeated_inputs"].append(node.name)
        try:
            c["flops"].append(_node_flops(node, self.val))
        except Exception as e:  # a formula that cannot handle this call: name the node
            raise CaptureError(f"capture failed: cannot count FLOPs of node {node.format_node()} ({e})") from None
        own_p = own_b = 0
        fqns: list[str] = []
        for arg in node.all_input_nodes:
            if arg.op != "placeholder":
                if arg.name in self.index:
                    c["edge_src"].append(self.index[arg.name])
                    c["edge_dst"].append(i)
                    c["edge_bytes"].append(_edge_bytes(self.val(arg), node, self.val(node)))
                continue
            fqn = self.params.get(arg.name) or self.buffers.get(arg.name)
            if fqn is None:
                if arg.name in self.user_inputs:
                    self.input_consumers.setdefault(arg.name, []).append(node.name)
                continue
            fqns.append(fqn)
            if self.tensor_key[fqn] not in self.owned:  # tied weights: one tensor, several FQNs
                self.owned.add(self.tensor_key[fqn])
                if arg.name in self.params and fqn not in self.frozen:
                    own_p += self.placeholder_bytes[arg.name]
                else:
                    own_b += self.placeholder_bytes[arg.name]
        c["param_bytes"].append(own_p)
        c["buffer_bytes"].append(own_b)
        c["params"].append(fqns)

    def graph(self, name: str) -> OpGraph:
        c = self.cols
        writes, readers = buffer_accesses(
            self.ep.graph_module,
            lambda n: self.buffers.get(n.name) if n.op == "placeholder" else None,
            ops=set(c["names"]),
        )
        meta = {
            "inputs": [
                {
                    "name": n.name,
                    "shape": [int(d) for d in self.val(n).shape] if isinstance(self.val(n), torch.Tensor) else [],
                    "bytes": self.placeholder_bytes.get(n.name, 0),
                    "consumers": self.input_consumers.get(n.name, []),
                }
                for n in self.ep.graph.nodes
                if n.op == "placeholder" and n.name in self.user_inputs
            ],
            "alias_ops": c["alias_ops"],
            "inplace_ops": c["inplace_ops"],
            "repeated_inputs": c["repeated_inputs"],
            **({"strided_views": c["strided_views"]} if c["strided_views"] else {}),
            "unused_params": sorted(f for f in self.params.values() if self.tensor_key[f] not in self.owned),
            "tied_params": _tied_groups(self.tensor_key),
            **({"frozen_params": sorted(self.frozen)} if self.frozen else {}),
            "constants": sorted(
                self.constants.values()
            ),  # tensors the program made (torch.tensor(...)), not the model's
            "outputs": self.outputs(),  # what forward returns: a training step's loss is one float scalar
            "capture_version": CAPTURE_VERSION,
            "torch": torch.__version__,
            # buffers written in place (spectral norm's power iteration): their ops stay in one stage
            **({"buffer_writes": writes, "buffer_readers": readers} if writes else {}),
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
            val = self.val(by_name[name]) if name in by_name else None
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


def _edge_bytes(produced: Any, consumer: torch.fx.Node, consumed: Any) -> int:
    """Bytes ``consumer`` reads of the value ``produced``: one element (``consumed``, its own value) for ``getitem``."""
    if consumer.target is operator.getitem and isinstance(produced, (list, tuple)):
        return _nbytes(consumed)
    return _nbytes(produced)


def _node_flops(node: torch.fx.Node, val: Any) -> float:
    args, kwargs = tree_map(lambda x: val(x) if isinstance(x, torch.fx.Node) else x, (node.args, node.kwargs))
    return _flops.op_flops(node.target, args, kwargs, val(node))


# ------------------------------------------------------------------ entry points
def capture(
    model: torch.nn.Module,
    example_inputs: tuple,
    *,
    decompose: bool = False,
    unroll_rnn: bool = False,
    dynamic: bool = False,
    name: str = "",
) -> OpGraph:
    """Export one forward of ``model`` on ``example_inputs`` and build its :class:`OpGraph`.

    The graph is that of the program at the example's sizes, whatever ``dynamic``
    says. ``decompose`` and ``unroll_rnn`` (see :func:`graphs.export.export_program`)
    are recorded in ``meta`` (``"decomposed"``, ``"unroll_rnn"``), so
    :func:`placer.apply` exports the same program again. ``dynamic``: also export
    with dynamic dimensions and record, for each input of ``meta["inputs"]``, which
    dimensions the placed program takes at other sizes (``"dynamic"``:
    :func:`graphs.export.input_dims`); ``meta["dynamic_error"]`` says why when none can.

    Raises:
        CaptureError: the model cannot be exported; the message names the cause
            and the user's source line.
    """
    return capture_program(
        model, example_inputs, decompose=decompose, unroll_rnn=unroll_rnn, dynamic=dynamic, name=name
    )[1]


def capture_program(
    model: torch.nn.Module,
    example_inputs: tuple,
    *,
    decompose: bool = False,
    unroll_rnn: bool = False,
    dynamic: bool = False,
    name: str = "",
) -> tuple[Any, OpGraph]:
    """:func:`capture`, and the program it exported: ``(ep, graph)`` (one export where a caller needs both).

    The program is exported without its nodes' stack traces (:func:`graphs.export.without_stack_traces`), which only
    an error message reads: where the program cannot be read into a graph, it is exported again with them, so the
    error names the user's line."""
    name = name or type(model).__name__
    ep = export_program(model, example_inputs, decompose=decompose, unroll_rnn=unroll_rnn, stack_traces=False)
    try:
        graph = graph_from_program(ep, name=name)
    except CaptureError:  # again, with the stack traces the message names the user's line from
        ep = export_program(model, example_inputs, decompose=decompose, unroll_rnn=unroll_rnn)
        graph = graph_from_program(ep, name=name)
    graph.meta["decomposed"] = bool(decompose)
    if unroll_rnn:
        graph.meta["unroll_rnn"] = True
    if dynamic:
        try:
            _record_dims(graph, input_dims(export_program(model, example_inputs, unroll_rnn=unroll_rnn, dynamic=True)))
        except CaptureError as e:
            graph.meta["dynamic_error"] = str(e)
    graph.invalidate()
    return ep, graph


def _record_dims(graph: OpGraph, dims: list[dict[str, Any]]) -> None:
    """Each input of ``graph.meta["inputs"]`` gets the dynamic dimensions of the same input in ``dims``."""
    for entry, found in zip(graph.meta.get("inputs", []), dims):
        entry["dynamic"] = found["dynamic"]


def capture_pt2(path: str | os.PathLike, *, decompose: bool = False) -> OpGraph:
    """The :class:`OpGraph` of a program saved with ``torch.export.save``.

    The archive is checked first (:mod:`graphs.pt2`): nothing in it is ever
    unpickled or run; a pickled weight, constant or input is refused. A program
    saved with dynamic dimensions is read at the sizes it was traced with, and
    its inputs' ``"dynamic"`` dimensions are recorded.
    """
    from graphs.pt2 import load_program

    path = os.fspath(path)
    try:
        with quiet():
            ep = load_program(path)
    except GraphFormatError:
        raise
    except Exception as e:
        raise GraphFormatError(
            f"{path}: not a loadable torch.export program ({type(e).__name__}: {first_line(e)})"
        ) from None
    if decompose:
        with quiet():
            try:
                ep = ep.run_decompositions()
            except Exception as e:
                raise CaptureError(f"{path}: {describe_failure(e, stage='decomposition')}") from None
    graph = graph_from_program(ep, name=os.path.splitext(os.path.basename(path))[0])
    graph.meta["decomposed"] = bool(decompose)
    dims = input_dims(ep)
    if any(d["dynamic"] for d in dims):
        _record_dims(graph, dims)
    graph.invalidate()
    return graph
