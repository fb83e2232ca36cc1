"""What an op type string says about the op: its base name, whether it is a view.

The one definition of "view op" used by the cost model (:mod:`envs.sim.cost`: views
cost no time and allocate nothing), co-location (:mod:`graphs.grouping`: a view
runs where its input lives), capture (:mod:`graphs.flops`: views count zero
FLOPs and are listed in ``meta["alias_ops"]``), ``placer inspect`` and the
heuristics.

Which ops are views, and why this set (:data:`VIEW_OPS`): an op is a view when
its output shares its input's storage *always*: no kernel, no new memory, and a
backward that is another view. torch's op schemas are the ground truth for
"shares storage" (a return annotated ``Tensor(a)``, read-only), and every name
here except ``getitem`` (Python's, on a tuple of tensors) and ``_unsafe_view``
(a view in practice; its schema says "new tensor" only to skip autograd's view
tracking) has such a schema (checked in ``tests/graphs/test_ops.py``). Schema
aliasing alone is not enough: ``to``, ``contiguous``, ``cpu``, ``cuda`` and
``pin_memory`` are annotated as *possibly* returning their input but copy
whenever they do real work, so they are not listed (a capture's
``meta["alias_ops"]``, which :func:`view_mask` also honours, may still name one
that did alias in that program). ``reshape``/``flatten`` may copy a
non-contiguous input; they are listed because an exported program's
intermediate tensors are contiguous, where they are views.

Ops that only read a tensor's metadata (``sym_size``...: :data:`SHAPE_OPS`)
return numbers, not tensors: free like views (:func:`free_mask`), but nothing
to co-locate.

>>> base_op_name("aten.view.default"), base_op_name("torch.ops.aten.t.default"), base_op_name("_operator.getitem")
('view', 't', 'getitem')
>>> is_view_op("aten.t.default"), is_view_op("aten.mm.default"), is_view_op("aten.sym_size.int")
(True, False, False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from graphs.ir import OpGraph

#: Base names (see :func:`base_op_name`) of ops whose output always aliases an input.
VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "view_as",
        "flatten",
        "unflatten",
        "t",
        "transpose",
        "permute",
        "adjoint",
        "mT",
        "mH",
        "numpy_T",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "expand",
        "expand_as",
        "broadcast_to",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
        "narrow",
        "as_strided",
        "diagonal",
        "unfold",
        "split",
        "split_with_sizes",
        "tensor_split",
        "chunk",
        "unbind",
        "hsplit",
        "vsplit",
        "dsplit",
        "alias",
        "detach",
        "lift_fresh",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "getitem",
    }
)

#: Ops that read only a tensor's metadata and return a number: no kernel, no memory.
SHAPE_OPS = frozenset({"sym_size", "sym_numel", "sym_stride", "sym_storage_offset"})

# Namespaces of operator overloads, written "ns.name.overload" by graphs.flops.op_type.
_NOT_OP_NAMESPACES = frozenset({"torch", "_operator", "operator", "builtins", "math"})


def base_op_name(op_type: str) -> str:
    """The op's name without namespace and overload.

    ``"aten.add_.Tensor"`` -> ``"add_"``; ``"torch.ops.aten.t.default"`` ->
    ``"t"``; ``"aten.view"`` -> ``"view"``; a Python callable's
    ``"_operator.getitem"`` or ``"torch.nn.functional.relu"`` -> the last part.

    >>> [base_op_name(t) for t in ("aten.add_.Tensor", "ops.aten.t.default", "getitem", "torch.functional.split")]
    ['add_', 't', 'getitem', 'split']
    """
    parts = op_type.split(".")
    if parts[:2] == ["torch", "ops"]:
        parts = parts[2:]
    elif parts[0] == "ops":
        parts = parts[1:]
    if not parts:
        return op_type
    if len(parts) == 3 and parts[0] not in _NOT_OP_NAMESPACES:  # ns.name.overload
        return parts[1]
    if len(parts) == 2 and parts[0] in ("aten", "prims"):  # an overload packet
        return parts[1]
    return parts[-1]


def is_view_op(op_type: str) -> bool:
    """True for ops whose output aliases an input (see :data:`VIEW_OPS`)."""
    return base_op_name(op_type) in VIEW_OPS


# ---------------------------------------------------------------- in-place writes
#: Composite ops that write into arguments their schema does not mark as written: schema name ->
#: positions of those arguments. ``batch_norm`` and ``instance_norm`` update their running statistics
#: (arguments 3 and 4) when training, which a captured training step does; the placed program treats
#: them as written whenever the op runs (a write-back into the master buffer costs nothing more in eval).
HIDDEN_WRITES: dict[str, tuple[int, ...]] = {
    "aten::batch_norm": (3, 4),
    "aten::instance_norm": (3, 4),
}


def written_arguments(target: Any, *, hidden: bool = True) -> list[tuple[int, str]]:
    """``(position, name)`` of every argument the op ``target`` writes in place: *the* answer to "writes its input".

    From torch's op schema: the arguments annotated as written (``Tensor(a!)``:
    ``add_``'s ``self``, ``copy_``'s destination, the running statistics of
    ``_native_batch_norm_legit``), then, with ``hidden``, those of :data:`HIDDEN_WRITES`
    (``batch_norm``'s running statistics). A target without a schema (a Python
    callable such as ``operator.getitem``) writes nothing. Its two readers:

    * :func:`is_inplace` (``hidden=False``): capture's ``meta["inplace_ops"]``, so
      co-location keeps an op with the *op output* it writes (:func:`inplace_mask`).
      Hidden writes go to buffers, which no op produces, so they join nothing;
    * the placed program (:mod:`envs.real.placing`): every written argument, buffers
      included, is written back into its master copy and ordered against its readers.

    >>> import torch
    >>> written_arguments(torch.ops.aten.add_.Tensor), written_arguments(torch.ops.aten.add.Tensor)
    ([(0, 'self')], [])
    >>> bn = torch.ops.aten.batch_norm.default
    >>> written_arguments(bn), written_arguments(bn, hidden=False)
    ([(3, 'running_mean'), (4, 'running_var')], [])
    """
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    args = schema.arguments
    written = [(i, a.name) for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    if hidden:
        written += [(i, args[i].name) for i in HIDDEN_WRITES.get(schema.name, ()) if i < len(args)]
    return written


def is_inplace(target: Any) -> bool:
    """True when the op's schema says it writes into an input (``add_``, ``copy_``): see :func:`written_arguments`."""
    return bool(written_arguments(target, hidden=False))


def is_inplace_op(op_type: str) -> bool:
    """True for ATen in-place ops by their type string: the base name ends in ``_`` (``add_``, ``copy_``), dunders
    excluded.

    For graphs without capture's record (:func:`is_inplace` of each target, in
    ``meta["inplace_ops"]``); :func:`inplace_mask` takes either.

    >>> is_inplace_op("aten.add_.Tensor"), is_inplace_op("aten.add.Tensor"), is_inplace_op("aten.__and__.Tensor")
    (True, False, False)
    """
    base = base_op_name(op_type)
    return base.endswith("_") and not base.startswith("__")


def _type_mask(graph: "OpGraph", test) -> np.ndarray:
    verdict = {t: bool(test(t)) for t in set(graph.op_types)}
    return np.fromiter((verdict[t] for t in graph.op_types), dtype=bool, count=graph.num_ops)


def _listed(graph: "OpGraph", key: str) -> np.ndarray:
    mask = np.zeros(graph.num_ops, dtype=bool)
    listed = [graph.index[x] for x in graph.meta.get(key) or () if x in graph.index]
    mask[listed] = True
    return mask


def strided_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: a view whose elements do not fill a run of memory (``meta["strided_views"]``, by capture: a
    slice with gaps, ``w[:, :-2]``), so a copy of a parameter it reads holds all of the parameter, not the part."""
    return _listed(graph, "strided_views")


def dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether a layout's elements fill a run of memory, each once (``torch.empty_strided(size, stride)`` then holds
    exactly its elements).

    >>> dense((4, 2), (2, 1)), dense((2, 4), (1, 2)), dense((4, 2), (4, 1)), dense((3, 2), (0, 1))
    (True, True, False, False)
    """
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(size, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def view_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: a view by its type (:func:`is_view_op`) or by capture (``meta["alias_ops"]``)."""
    return _type_mask(graph, is_view_op) | _listed(graph, "alias_ops")


def inplace_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: in-place by its type (:func:`is_inplace_op`) or by capture (``meta["inplace_ops"]``)."""
    return _type_mask(graph, is_inplace_op) | _listed(graph, "inplace_ops")


def free_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: no kernel and no new memory (views and :data:`SHAPE_OPS`)."""
    return view_mask(graph) | _type_mask(graph, lambda t: base_op_name(t) in SHAPE_OPS)


# What autograd keeps of an op for its backward, by the op's name (eager PyTorch's derivative formulas).
#: The backward reads the op's own output (``result`` in the formula).
SAVES_OUTPUT = frozenset(
    {
        "relu",
        "relu_",
        "sigmoid",
        "sigmoid_",
        "tanh",
        "tanh_",
        "softmax",
        "_softmax",
        "log_softmax",
        "_log_softmax",
        "exp",
        "sqrt",
        "rsqrt",
        "scaled_dot_product_attention",
    }
)
#: The backward reads the op's tensor inputs.
SAVES_INPUTS = frozenset(
    {
        "linear",
        "mm",
        "bmm",
        "matmul",
        "addmm",
        "baddbmm",
        "conv1d",
        "conv2d",
        "conv3d",
        "convolution",
        "batch_norm",
        "layer_norm",
        "group_norm",
        "rms_norm",
        "gelu",
        "silu",
        "mul",
        "mul_",
        "div",
        "div_",
        "pow",
        "embedding",
        "cross_entropy_loss",
        "nll_loss",
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "masked_fill",
        "where",
        "index_select",
        "gather",
        "scaled_dot_product_attention",
    }
)
#: Of :data:`SAVES_INPUTS`, the products: an operand's gradient reads the other operands, not itself (``x @ W``:
#: ``x``'s gradient reads ``W``, ``W``'s reads ``x``), so autograd keeps an input only for another operand that takes a
#: gradient (:func:`backward_readers`): a frozen linear layer or norm weight keeps no activation, nor does ``q * sin``
#: with a rotary table that takes none.
PRODUCTS = frozenset(
    {"linear", "mm", "addmm", "matmul", "bmm", "baddbmm", "conv1d", "conv2d", "conv3d", "convolution", "mul"}
)
#: The backward reads no tensor of the op's (shapes, a scalar at most).
SAVES_NOTHING = frozenset(
    {
        "add",
        "add_",
        "sub",
        "sub_",
        "neg",
        "cat",
        "stack",
        "sum",
        "mean",
        "clone",
        "contiguous",
        "_to_copy",
        "to",
        "copy",
        "copy_",
        "dropout",
        "new_zeros",
        "new_ones",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "arange",
        "fill_",
        "zero_",
        "flatten",
    }
)


def saved_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: autograd keeps its output until backward (else it is freed once its consumers have run).

    An output is kept when the op's own backward reads it (:data:`SAVES_OUTPUT`) or a
    consumer's backward reads its inputs, through views too: a ``linear`` saves its
    input (:data:`SAVES_INPUTS`), a ``relu`` its output, an ``add`` nothing
    (:data:`SAVES_NOTHING`). An op of any other type is taken to save its inputs and
    its output, as if every activation were kept: it errs towards more memory. Views (:func:`free_mask`) take no memory
    of their own and are reported kept; what they alias is kept when they are needed. An op nothing consumes (the loss,
    an output) is kept.

    >>> from graphs.ir import OpGraph
    >>> g = OpGraph.from_edges(["mm", "add", "relu", "lin"], [("mm", "add", 4), ("add", "relu", 4), ("relu", "lin", 4)],
    ...     op_types=["aten.mm.default", "aten.add.Tensor", "aten.relu.default", "aten.linear.default"])
    >>> saved_mask(g).tolist()  # add's output: only relu reads it, and relu's backward reads relu's output
    [False, False, True, True]

    An op without a backward (:func:`grad_mask`: nothing it reads takes a gradient, as in a frozen backbone's first
    layers) is not recorded by autograd: it saves nothing, so its inputs and output are kept only for a backward that
    reads them. A product keeps an input only for another operand that takes a gradient (:data:`PRODUCTS`): a
    linear layer whose weights are all frozen (LoRA's base layers) keeps none.
    """
    return kept_mask(backward_readers(graph, grad_mask(graph), weight_reads(graph), repeated_input_mask(graph)))


def repeated_input_mask(graph: "OpGraph") -> np.ndarray | None:
    """Boolean per op: it reads one tensor as two operands (``x * x``; ``meta["repeated_inputs"]``, which a capture
    records); None for a graph that does not say (built by hand, or captured before the key was recorded)."""
    names = graph.meta.get("repeated_inputs")
    if names is None:
        return None
    return np.isin(np.asarray(graph.names, dtype=object), list(names)) if names else np.zeros(graph.num_ops, bool)


def weight_reads(graph: "OpGraph") -> np.ndarray | None:
    """Per op (int8): 1 where it reads a parameter that takes a gradient (:func:`trainable_names`), 0 where it reads
    only frozen parameters or buffers, -1 where it reads none; None for a graph that does not say (no ``params``).

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["base", "lora", "add"], [("base", "add", 4), ("lora", "add", 4)], param_bytes=[0, 8, 0])
    >>> g.params = [["base.weight"], ["lora.weight"], []]
    >>> g.meta["frozen_params"] = ["base.weight"]
    >>> weight_reads(g).tolist()
    [0, 1, -1]
    """
    if graph.params is None:
        return None
    trainable = trainable_names(graph)
    return np.fromiter(
        (1 if trainable.intersection(r) else (0 if r else -1) for r in graph.params), dtype=np.int8, count=graph.num_ops
    )


def kept_mask(readers: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """:func:`saved_mask` from :func:`backward_readers`' ``(own, ptr, idx)``: its own backward reads the output, or
    another backward does."""
    own, ptr, _ = readers
    return own | (np.diff(ptr) > 0)


def backward_readers(
    graph: "OpGraph",
    grad: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    repeated: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Who holds each kept output (:func:`saved_mask`) in the backward: ``(own, ptr, idx)``; ``grad``: which ops have
    a backward (:func:`grad_mask`; default all): one without saves nothing, neither its output nor its inputs;
    ``weights``: what each op reads of the model's tensors (:func:`weight_reads`; default: not known): a product
    (:data:`PRODUCTS`) keeps an input only where it reads a parameter that takes a gradient or another of its inputs
    takes one (with grad); one with a single input and nothing of the model's keeps it where it reads it twice
    (``x * x``; ``repeated``: :func:`repeated_input_mask`), not where its other operand is a number (``x * 2.0``),
    and where the graph does not say which (``repeated`` None), keeps it.

    ``own``: the op's own backward reads its output (:data:`SAVES_OUTPUT`, an op of
    another type, a program output; views too, which take no memory): it lives
    until that backward ends. For the others, ``idx[ptr[u]:ptr[u + 1]]`` lists the
    ops whose backward reads ``u``'s output, directly or through views: autograd
    frees a saved tensor once the last of them has run backward, before ``u``'s own
    backward. (On an H200, the 0.98 GiB logits of a 256k-token head, read by the
    loss's backward through ``to`` and ``view``, were freed there, not at the
    head's backward, where the simulator had held them.)

    >>> from graphs.ir import OpGraph
    >>> g = OpGraph.from_edges(["mm", "t", "lin", "relu"], [("mm", "t", 4), ("t", "lin", 4), ("lin", "relu", 4)],
    ...     op_types=["aten.mm.default", "aten.t.default", "aten.linear.default", "aten.relu.default"])
    >>> own, ptr, idx = backward_readers(g)
    >>> own.tolist(), [idx[ptr[u]:ptr[u + 1]].tolist() for u in range(4)]  # lin reads mm's output through the view t
    ([False, True, False, True], [[2], [2], [], []])
    """
    n = graph.num_ops
    names = [base_op_name(t) for t in graph.op_types]
    free = free_mask(graph)
    known = SAVES_OUTPUT | SAVES_INPUTS | SAVES_NOTHING | METADATA_OPS  # a metadata check reads no data
    has = np.ones(n, dtype=bool) if grad is None else np.asarray(grad, dtype=bool)
    saves_inputs = [h and not f and (b in SAVES_INPUTS or b not in known) for b, f, h in zip(names, free, has)]
    out_ptr, out_dst, _ = graph.out_csr
    in_ptr, in_src, _ = graph.in_csr
    product = [weights is not None and grad is not None and b in PRODUCTS for b in names]

    def keeps(u: int, v: int) -> bool:
        """Whether ``v``'s backward reads its input ``u``."""
        if not saves_inputs[v]:
            return False
        if not product[v] or weights[v] == 1:
            return True
        others = [w for w in in_src[in_ptr[v] : in_ptr[v + 1]].tolist() if w != u]
        if not others:  # a single input: x * x keeps it, x * 2.0 and x * a frozen weight not
            return bool(weights[v] < 0 and (repeated is None or repeated[v]))
        return any(has[w] for w in others)

    own = np.array([f or b in SAVES_OUTPUT or b not in known for b, f in zip(names, free)], dtype=bool) & has
    own |= np.diff(out_ptr) == 0
    readers: list[list[int]] = [[] for _ in range(n)]
    for u in range(n - 1, -1, -1):  # consumers come later in the order: their readers are known
        found: set[int] = set()
        for v in out_dst[out_ptr[u] : out_ptr[u + 1]].tolist():
            if keeps(u, v):
                found.add(v)
            if free[v]:
                found.update(readers[v])
        readers[u] = sorted(found)
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(r) for r in readers])
    idx = np.array([v for r in readers for v in r], dtype=np.int64)
    return own, ptr, idx


def input_free_mask(graph: "OpGraph") -> np.ndarray | None:
    """Boolean per op: its value does not depend on the model's inputs; None when the graph does not say.

    The model's inputs are ``meta["inputs"]`` (a capture lists each with the ops that
    consume it); an op is input-free when no path leads to it from one of those
    consumers: a causal mask or rotary table built from ``arange`` and the shapes,
    a positional embedding looked up at ``arange`` positions, anything computed from
    parameters and constants alone. Under a pipelined plan every microbatch
    computes these same values, and a model typically computes them once and hands
    them to every block, so each stage receives them from wherever they were placed.
    A graph without ``meta["inputs"]`` (built by hand, or with no tensor input listed)
    gives None: nothing is known.
    """
    inputs = graph.meta.get("inputs")
    if not inputs:
        return None
    reached = np.zeros(graph.num_ops, dtype=bool)
    stack = [graph.index[name] for item in inputs for name in item.get("consumers", ()) if name in graph.index]
    out_ptr, out_dst, _ = graph.out_csr
    while stack:
        i = stack.pop()
        if reached[i]:
            continue
        reached[i] = True
        stack.extend(int(j) for j in out_dst[out_ptr[i] : out_ptr[i + 1]] if not reached[j])
    return ~reached


#: Dtype names whose tensors carry gradients.
_GRAD_DTYPES = ("float", "bfloat", "complex")


def _reads(graph: "OpGraph") -> list[list[str]]:
    """The parameter and buffer names each op reads (none for a graph without ``params``)."""
    return graph.params if graph.params is not None else [[] for _ in range(graph.num_ops)]


def _floating(dtypes) -> bool:
    """True unless every output dtype is known and none is floating (no dtype known: True)."""
    known = [str(d) for d in dtypes or () if d]
    return not known or any(d.removeprefix("torch.").startswith(_GRAD_DTYPES) for d in known)


def frozen_names(graph: "OpGraph") -> set[str]:
    """The names of ``graph``'s frozen parameters (``meta["frozen_params"]``: ``requires_grad=False``)."""
    return set(graph.meta.get("frozen_params") or ())


def trainable_names(graph: "OpGraph") -> set[str]:
    """The names of the parameters ``graph``'s ops read that take a gradient (:func:`grad_mask` says which).

    A name read by an op that owns parameter bytes, and every name tied to one; never a frozen parameter's
    (``meta["frozen_params"]``: ``requires_grad=False``, counted in ``buffer_bytes``)."""
    reads = _reads(graph)
    names = {name for i in np.flatnonzero(graph.param_bytes > 0) for name in reads[i]}
    for group in graph.meta.get("tied_params") or ():
        if names.intersection(group):
            names.update(group)
    return names - frozen_names(graph)


def frozen_weight_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: it reads a frozen parameter (``meta["frozen_params"]``) and none that takes a gradient.

    Its backward, where it has one (:func:`grad_mask`: its input takes a gradient), computes the input's gradient
    alone: a frozen linear layer's backward is one matmul, not two.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["base", "lora", "add"], [("base", "add", 4), ("lora", "add", 4)], param_bytes=[0, 8, 0])
    >>> g.params = [["base.weight"], ["lora.weight"], []]
    >>> g.meta["frozen_params"] = ["base.weight"]
    >>> frozen_weight_mask(g).tolist()
    [True, False, False]
    """
    frozen = frozen_names(graph)
    if not frozen:
        return np.zeros(graph.num_ops, dtype=bool)
    trainable = trainable_names(graph)
    return np.fromiter(
        (bool(frozen.intersection(r)) and not trainable.intersection(r) for r in _reads(graph)),
        dtype=bool,
        count=graph.num_ops,
    )


def frozen_home_bytes(graph: "OpGraph") -> np.ndarray:
    """Per op (int64), the bytes of the frozen parameters it owns where they are all it owns (its ``buffer_bytes``):
    what can live on a home apart from it (:mod:`envs.sim.homes`: copied to it, with no gradient and no optimizer
    state); 0 for every other op. An op owning buffers or trainable parameters beside frozen ones (a frozen batch
    norm's running statistics) keeps its frozen bytes with it: the capture counts bytes per op, not per tensor.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["base", "lora", "bn"], [("base", "lora", 4), ("lora", "bn", 4)],
    ...                        param_bytes=[0, 8, 0], buffer_bytes=[64, 0, 24])
    >>> g.params = [["base.weight"], ["lora.weight"], ["bn.weight", "bn.running_mean"]]
    >>> g.meta["frozen_params"] = ["base.weight", "bn.weight"]
    >>> frozen_home_bytes(g).tolist()
    [64, 0, 0]
    """
    frozen = frozen_names(graph)
    out = np.zeros(graph.num_ops, dtype=np.int64)
    if not frozen:
        return out
    owned: dict[int, list[str]] = {}
    for name, i in param_owners(graph).items():
        owned.setdefault(i, []).append(name)
    for i, names in owned.items():
        if graph.param_bytes[i] == 0 and graph.buffer_bytes[i] > 0 and frozen.issuperset(names):
            out[i] = int(graph.buffer_bytes[i])
    return out


def home_bytes(graph: "OpGraph") -> np.ndarray:
    """Per op (int64), the bytes that live on its parameters' home where the plan gives them one apart
    (:mod:`envs.sim.homes`): its trainable parameters (``param_bytes``), or the frozen parameters it owns
    (:func:`frozen_home_bytes`). Equal to ``param_bytes`` for a graph that freezes nothing."""
    return graph.param_bytes.astype(np.int64) + frozen_home_bytes(graph)


def staying_buffer_bytes(graph: "OpGraph", held: np.ndarray | None = None) -> np.ndarray:
    """Per op (int64), the ``buffer_bytes`` that stay with it where its parameters live apart: all but the frozen
    parameters it can home (``held``: :func:`home_bytes`, computed when not given)."""
    held = home_bytes(graph) if held is None else held
    return graph.buffer_bytes.astype(np.int64) - (held - graph.param_bytes)


def grad_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: its output takes part in backward (autograd records it and sends it a gradient).

    In a captured program (``meta["capture_version"]``) an op's output requires a
    gradient when it is floating point and the op reads a parameter or an input
    that requires one; the model's inputs do not (token ids, images, labels). An
    integer or boolean op (positions, masks, indices, a batch-norm counter) and a
    floating op computed from constants and buffers alone (a rotary table, an
    additive mask) then have no backward: no gradient is computed for them and
    none is copied back to them. A graph built by hand says nothing of this and
    gets all True (every op differentiable).

    Which tensors an op reads that are parameters: a capture lists every tensor an
    op reads (``params``), parameters and buffers alike, and charges each tensor's
    bytes to its first reader (``param_bytes`` / ``buffer_bytes``). A name read by
    an op that owns parameter bytes is taken for a parameter (so is every name
    tied to one, ``meta["tied_params"]``): a buffer read beside a parameter (batch
    norm's running statistics) is then counted as one, which errs on the side of
    a backward.
    """
    n = graph.num_ops
    if not graph.meta.get("capture_version"):
        return np.ones(n, dtype=bool)
    reads = _reads(graph)
    param_names = trainable_names(graph)
    floating = np.fromiter((_floating(d) for d in graph.out_dtypes), dtype=bool, count=n)
    grad = np.zeros(n, dtype=bool)
    in_ptr, in_src, _ = graph.in_csr
    for i in range(n):  # node order is topological
        if floating[i]:
            grad[i] = (
                graph.param_bytes[i] > 0
                or any(name in param_names for name in reads[i])
                or bool(grad[in_src[in_ptr[i] : in_ptr[i + 1]]].any())
            )
    return grad


def _tied_alias(graph: "OpGraph") -> dict[str, str]:
    """Each name tied to others (``meta["tied_params"]``) -> the first of its group, sorted: one tensor, one key."""
    alias: dict[str, str] = {}
    for group in graph.meta.get("tied_params") or ():
        names = sorted(group)
        for name in names:
            alias[name] = names[0]
    return alias


def param_owners(graph: "OpGraph") -> dict[str, int]:
    """Every parameter or buffer name an op reads -> its *owner*, the first op (node order) that reads that tensor.

    Names tied to one tensor (``meta["tied_params"]``) share their owner. What
    ``param_bytes`` and ``buffer_bytes`` are charged to, and what a plan's parameter
    homes (:attr:`graphs.plan.Placement.param_homes`) are decided per.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], param_bytes=[64, 8])
    >>> g.params = [["w"], ["w", "v"]]
    >>> param_owners(g)
    {'w': 0, 'v': 1}
    """
    reads = _reads(graph)
    alias = _tied_alias(graph)
    by_key: dict[str, int] = {}
    owners: dict[str, int] = {}
    for i in range(graph.num_ops):
        for name in reads[i]:
            owners.setdefault(name, by_key.setdefault(alias.get(name, name), i))
    return owners


def param_reads(graph: "OpGraph") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(owner, reader, bytes)``: ops that read a parameter or buffer another op owns.

    A capture charges every tensor an op reads (``params``) to its first reader
    in node order, its *owner* (``param_bytes`` / ``buffer_bytes``); names tied
    to one tensor (``meta["tied_params"]``) are one tensor. Any later reader reads
    that same tensor: a recurrent layer's weights at every time step, a tied
    embedding in the output head, a block applied twice. :func:`placer.apply`
    keeps each tensor on its owner's device and gives a reader on another device
    a copy (one per device, made before its first reader there), whose gradient
    flows back; the simulator charges those copies (:class:`envs.SimEnv`).

    One row per (owner, reader) pair, ``owner < reader``; ``bytes`` is the
    owner's ``param_bytes + buffer_bytes`` times the share of the owner's tensors
    the reader reads (a capture records bytes per op, not per tensor: exact when a
    reader reads all of them, as a reused module does). A graph without
    ``params`` (built by hand) has no rows.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], param_bytes=[64, 0, 0])
    >>> g.params = [["w", "bias"], [], ["w", "bias"]]
    >>> [x.tolist() for x in param_reads(g)]
    [[0], [2], [64]]
    """
    n = graph.num_ops
    reads = _reads(graph)
    alias = _tied_alias(graph)
    owner: dict[str, int] = {}
    owned = np.zeros(n, dtype=np.int64)  # tensors each op owns
    for name, i in param_owners(graph).items():
        key = alias.get(name, name)
        if key not in owner:
            owner[key] = i
            owned[i] += 1
    held = (graph.param_bytes + graph.buffer_bytes).astype(np.float64)
    shares: dict[tuple[int, int], int] = {}
    for i in range(n):
        keys = {alias.get(name, name) for name in reads[i]}
        for key in keys:
            u = owner[key]
            if u != i and held[u] > 0:
                shares[(u, i)] = shares.get((u, i), 0) + 1
    if not shares:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    pairs = sorted(shares)
    src = np.fromiter((u for u, _ in pairs), dtype=np.int64, count=len(pairs))
    dst = np.fromiter((v for _, v in pairs), dtype=np.int64, count=len(pairs))
    count = np.fromiter((shares[p] for p in pairs), dtype=np.float64, count=len(pairs))
    nbytes = np.ceil(held[src] * count / owned[src]).astype(np.int64)
    return src, dst, nbytes


#: Ops that read a tensor's metadata only: a parameter they read first is read by the op after them.
METADATA_OPS = frozenset({"_assert_tensor_metadata"})


def metadata_mask(graph: "OpGraph") -> np.ndarray:
    """Boolean per op: it reads its inputs' metadata only (:data:`METADATA_OPS`)."""
    return _type_mask(graph, lambda t: base_op_name(t) in METADATA_OPS)


def param_paths(graph: "OpGraph") -> dict[int, list[list[int]]]:
    """Per owner of parameters whose data can be copied to the ops that read it (a home apart,
    :mod:`envs.sim.homes`), its *paths*: for each op reading the data, the views it reads it through (then the checks
    of their metadata, :data:`METADATA_OPS`), then that op (the last).

    The owner's own path is ``[owner]`` where it reads the data itself; a view of the parameters (``x @ w.T``) or a
    metadata check (``w.to(dtype)`` exports one) does not, and its path starts after it. Every other reader
    (:func:`param_reads`: a tied head, a layer applied twice) has a path of its own, and so has every op reading a
    view that several ops read (``nn.MultiheadAttention``'s packed weight split into the query's part and the keys'
    and values'): each such path repeats the views it shares with the others. An owner is an op holding
    :func:`home_bytes`: trainable parameters, or frozen ones alone. Owners left out: a path that ends in an in-place
    op (:func:`inplace_mask`), a view no op reads, or several paths to an owner that also holds buffers (they stay
    with their op).

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["t", "x", "mm"], [("t", "mm", 8), ("x", "mm", 8)], param_bytes=[8, 0, 0],
    ...                        op_types=["aten.t.default", "aten.relu.default", "aten.mm.default"])
    >>> param_paths(g)
    {0: [[2]]}
    >>> g = OpGraph.from_edges(["t", "u", "mm", "bmm"], [("t", "u", 8), ("t", "mm", 8), ("u", "bmm", 8)],
    ...                        param_bytes=[8, 0, 0, 0], op_types=["aten.t.default", "aten.unsqueeze.default",
    ...                                                            "aten.mm.default", "aten.bmm.default"])
    >>> param_paths(g)  # w.T read by mm, and through w.T.unsqueeze(0) by bmm
    {0: [[1, 3], [2]]}
    """
    held = home_bytes(graph)  # a frozen weight's bytes are held like a buffer's, and may live apart
    owners = np.flatnonzero(held > 0)
    if not len(owners):
        return {}
    buffers = staying_buffer_bytes(graph, held)
    view, check, inplace = view_mask(graph), metadata_mask(graph), inplace_mask(graph)
    indptr, dst, _ = graph.out_csr
    others: dict[int, list[int]] = {}
    src_r, dst_r, _ = param_reads(graph)
    for u, v in zip(src_r.tolist(), dst_r.tolist()):
        others.setdefault(u, []).append(v)

    def walk(succ: np.ndarray, before: list[int]) -> list[list[int]] | None:
        """The paths from ops ``succ`` (the consumers of what is read through the views ``before``): None where one
        ends in an in-place op or reaches another owner's view, or a view has no reader."""
        checks = succ[check[succ]].tolist()
        succ = succ[~check[succ]]
        if not len(succ):
            return None
        found: list[list[int]] = []
        for u in succ.tolist():
            if held[u] > 0 and view[u]:  # another owner's view
                return None
            if not view[u]:
                if inplace[u]:
                    return None
                found.append(before + checks + [u])
                continue
            below = walk(np.unique(dst[indptr[u] : indptr[u + 1]]), before + checks + [u])
            if below is None:
                return None
            found += below
        return found

    out: dict[int, list[list[int]]] = {}
    for i in owners.tolist():
        found: list[list[list[int]] | None] = []
        if view[i]:
            found.append(walk(np.unique(dst[indptr[i] : indptr[i + 1]]), []))
        elif not check[i]:
            found.append([[i]])
        for v in others.get(i, ()):
            if not check[v]:
                found.append(walk(np.array([v]), []))
        if not found or any(each is None for each in found):
            continue
        paths = [path for each in found for path in each]  # type: ignore[union-attr]
        if len(paths) > 1 and buffers[i] > 0:
            continue
        out[i] = paths  # type: ignore[assignment]
    return out
