"""Synthetic op graphs with realistic columns, for tests, properties and benchmarks.

>>> g = random_dag(50, seed=0)
>>> g.num_ops, bool((g.edge_src < g.edge_dst).all())
(50, True)
"""

from __future__ import annotations

import numpy as np

from graphs.ir import OpGraph

_OP_TYPES = (
    "aten.mm.default",
    "aten.add.Tensor",
    "aten.relu.default",
    "aten.convolution.default",
    "aten.view.default",
    "aten.mul.Tensor",
    "aten.sigmoid.default",
    "aten.cat.default",
)
_VIEW = _OP_TYPES.index("aten.view.default")
_ADD = _OP_TYPES.index("aten.add.Tensor")


def random_dag(
    num_ops: int,
    *,
    seed: int = 0,
    avg_degree: float = 1.5,
    window: int = 32,
    max_flops: float = 2e9,
    max_bytes: int = 8 << 20,
    param_fraction: float = 0.2,
    name: str = "",
) -> OpGraph:
    """A random DAG shaped like a network: mostly local edges, a chain backbone.

    Op ``i`` always feeds ``i+1`` (so the graph is connected) and has on average
    ``avg_degree - 1`` extra successors within the next ``window`` ops. FLOPs and
    tensor sizes are log-uniform; a ``param_fraction`` of ops own parameters.
    Built entirely with numpy, so 100,000 ops take well under a second.
    """
    rng = np.random.default_rng(seed)
    n = int(num_ops)
    chain_src = np.arange(n - 1, dtype=np.int64)
    extra = max(int(round(n * max(avg_degree - 1.0, 0.0))), 0)
    es = rng.integers(0, max(n - 1, 1), size=extra)
    ed = es + rng.integers(2, window + 2, size=extra)
    keep = ed < n
    es, ed = es[keep], ed[keep]
    src = np.concatenate([chain_src, es])
    dst = np.concatenate([chain_src + 1, ed])
    pairs = np.unique(np.stack([src, dst], axis=1), axis=0) if len(src) else np.zeros((0, 2), dtype=np.int64)
    src, dst = pairs[:, 0], pairs[:, 1]
    out_bytes = np.exp(rng.uniform(np.log(1024), np.log(max_bytes), size=n)).astype(np.int64) // 4 * 4
    flops = np.exp(rng.uniform(np.log(1e5), np.log(max_flops), size=n))
    has_param = rng.random(n) < param_fraction
    param_bytes = np.where(has_param, np.exp(rng.uniform(np.log(4096), np.log(max_bytes), size=n)), 0).astype(np.int64) // 4 * 4
    types = rng.integers(0, len(_OP_TYPES), size=n)
    # A view has exactly one tensor input in ATen: ops drawn as views that have
    # several (or no) inputs become adds, so co-location sees realistic views.
    indeg = np.bincount(dst, minlength=n)
    types[(types == _VIEW) & (indeg != 1)] = _ADD
    names = [f"op{i}" for i in range(n)]
    return OpGraph(
        names=names,
        op_types=[_OP_TYPES[t] for t in types],
        out_shapes=[[[int(b) // 4]] for b in out_bytes],
        out_dtypes=[["float32"] for _ in range(n)],
        out_bytes=out_bytes,
        param_bytes=param_bytes,
        buffer_bytes=np.zeros(n, dtype=np.int64),
        flops=flops,
        module_paths=[f"block{i // 50}.layer{(i // 10) % 5}" for i in range(n)],
        params=[[f"block{i // 50}.w{i}"] if has_param[i] else [] for i in range(n)],
        edge_src=src,
        edge_dst=dst,
        edge_bytes=out_bytes[src],
        name=name or f"random-{n}",
        meta={"synthetic": True, "seed": seed},
    )
