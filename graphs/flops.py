"""Forward FLOPs and aliasing of one exported ATen op.

FLOPs come from ``torch.utils.flop_counter``'s formula registry where it has one
(``mm``, ``addmm``, ``bmm``, ``convolution``, the fused attention kernels), from
formulas written here for the composite ops an un-decomposed export keeps
(``linear``, ``matmul``, ``conv2d``, ``scaled_dot_product_attention``, ``lstm``,
``lstm_cell``), and from running any other composite op on meta tensors under a
``FlopCounterMode``. Ops none of these count get an elementwise estimate: one
FLOP per element of their largest tensor operand (pointwise ops, reductions,
normalisations), so memory-bound ops are not free. Views, ``getitem`` and pure
data movement (``cat``, ``embedding``, ``clone``, ...) count zero.

Example:
    >>> import torch
    >>> x, w = torch.empty(4, 8, device="meta"), torch.empty(16, 8, device="meta")
    >>> op_flops(torch.ops.aten.linear.default, (x, w), {}, torch.empty(4, 16, device="meta"))
    1024.0
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
from torch.utils import flop_counter as fc
from torch.utils._pytree import tree_flatten, tree_map  # noqa: PLC2701 (torch has no public pytree module)

from graphs.custom_functions import kept_flops
from graphs.ops import VIEW_OPS

# One FLOP per element of a gate input for the pointwise work of an LSTM cell
# per hidden unit: 8 bias adds, 4 gate sums, 3 sigmoid, 2 tanh, 3 mul, 1 add.
LSTM_POINTWISE_PER_UNIT = 21

# Ops that only move or create data: zero FLOPs (their cost is bytes).
_DATA_MOVEMENT = frozenset(
    """embedding cat stack clone _to_copy copy copy_ index index_select index_put index_put_ gather
    scatter slice_scatter select_scatter diagonal_scatter as_strided_scatter zeros zeros_like ones
    ones_like full full_like empty empty_like empty_strided new_zeros new_empty new_ones new_full
    arange repeat constant_pad_nd pad contiguous lift_fresh_copy detach_ _unsafe_view alias
    fill fill_ scalar_tensor sym_size sym_numel sym_stride _assert_tensor_metadata
    _assert_scalar sym_constrain_range_for_size to""".split()
)


def _shape(x: Any) -> Any:
    return tuple(int(d) for d in x.shape) if isinstance(x, torch.Tensor) else x


def _shapes(args: Any) -> Any:
    return tree_map(_shape, args)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# ------------------------------------------------------------------ formulas
def _linear(x, w, bias=None, **_) -> float:
    out_features = w[0] if len(w) == 2 else 1
    return 2.0 * _numel(x[:-1]) * x[-1] * out_features


def _matmul(a, b, out_shape=None, **_) -> float:
    k = a[-1]
    return 2.0 * _numel(out_shape) * k


def _conv(x, w, *_, out_shape=None, **__) -> float:
    return float(fc.conv_flop_count(list(x), list(w), list(out_shape), transposed=False))


def _conv_transpose(x, w, *_, out_shape=None, **__) -> float:
    return float(fc.conv_flop_count(list(x), list(w), list(out_shape), transposed=True))


def _sdpa(q, k, v, *_, **__) -> float:
    return float(fc.sdpa_flop_count(q, k, v))


def _lstm_cell_flops(batch: int, input_size: int, hidden: int) -> float:
    return 2.0 * batch * 4 * hidden * (input_size + hidden) + LSTM_POINTWISE_PER_UNIT * batch * hidden


def _lstm(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, **_) -> float:
    steps, batch = (x[1], x[0]) if batch_first else (x[0], x[1])
    if len(x) == 2:  # unbatched
        steps, batch = x[0], 1
    per_layer = 4 if has_biases else 2
    total = 0.0
    for i in range(0, len(params), per_layer):
        w_ih, w_hh = params[i], params[i + 1]
        total += steps * _lstm_cell_flops(batch, w_ih[1], w_hh[1])
    return total


def _lstm_cell(x, hx, w_ih, w_hh, *_, **__) -> float:
    batch = x[0] if len(x) == 2 else 1
    return _lstm_cell_flops(batch, w_ih[1], w_hh[1])


_FORMULAS: dict[str, Callable[..., float]] = {
    "linear": _linear,
    "matmul": _matmul,
    "conv1d": _conv,
    "conv2d": _conv,
    "conv3d": _conv,
    "conv_transpose1d": _conv_transpose,
    "conv_transpose2d": _conv_transpose,
    "conv_transpose3d": _conv_transpose,
    "scaled_dot_product_attention": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa,
    "lstm": _lstm,
    "lstm_cell": _lstm_cell,
}


# ------------------------------------------------------------------ kinds
def packet_name(target: Any) -> str:
    """``aten.add.Tensor`` -> ``"add"``; ``operator.getitem`` -> ``"getitem"``."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def op_type(target: Any) -> str:
    """The op-type string stored in graphs, e.g. ``"aten.mm.default"``."""
    if isinstance(target, torch._ops.OpOverload):
        ns, name = target._schema.name.split("::")
        return f"{ns}.{name}.{target._overloadname or 'default'}"
    if target is operator.getitem:
        return "getitem"
    mod = getattr(target, "__module__", "") or ""
    return f"{mod}.{getattr(target, '__name__', str(target))}".lstrip(".")


def is_alias(target: Any) -> bool:
    """True when the op's output aliases an input: a view by name (:data:`graphs.ops.VIEW_OPS`,
    which holds ``getitem`` and ``_unsafe_view``), or by its schema (every return an
    unwritten alias of an input)."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if packet_name(target) in VIEW_OPS:
        return True
    rets = target._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


# ------------------------------------------------------------------ counting
def op_flops(target: Any, args: tuple, kwargs: dict, out: Any) -> float:
    """Forward FLOPs of ``target(*args, **kwargs) -> out``; tensors may be fake or meta."""
    if is_alias(target):
        return 0.0
    name = packet_name(target)
    if name in _DATA_MOVEMENT:
        return 0.0
    if name in _FORMULAS:
        return float(_FORMULAS[name](*_shapes(args), out_shape=_shapes(out), **_shapes(kwargs)))
    if isinstance(target, torch._ops.OpOverload):
        packet = target.overloadpacket
        if target._schema.name == "placer::autograd_function":  # a model's own autograd.Function, kept whole: what
            # its forward counts
            counted = kept_flops(*args, count=op_flops)
            if counted is not None:
                return counted
        if packet in fc.flop_registry:
            return float(fc.flop_registry[packet](*args, **kwargs, out_val=out))
        counted = _composite_flops(target, args, kwargs)
        if counted:
            return counted
    return float(_elementwise(args, kwargs, out))


def _elementwise(args: tuple, kwargs: dict, out: Any) -> int:
    leaves, _ = tree_flatten((args, kwargs, out))
    sizes = [t.numel() for t in leaves if isinstance(t, torch.Tensor)]
    return int(max(sizes, default=0))


_composite_cache: dict[tuple, float] = {}


def _composite_flops(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> float:
    """Run a composite (decomposable) op on meta tensors under FlopCounterMode."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
        return 0.0

    def to_meta(x: Any) -> Any:
        return torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x

    key = (target.name(), repr(_shapes((args, kwargs))))
    if key not in _composite_cache:
        try:
            m_args, m_kwargs = tree_map(to_meta, (args, kwargs))
            with fc.FlopCounterMode(display=False) as counter:
                target(*m_args, **m_kwargs)
            _composite_cache[key] = float(counter.get_total_flops())
        except Exception:  # an op meta cannot run: fall back to the estimate
            _composite_cache[key] = 0.0
    return _composite_cache[key]
