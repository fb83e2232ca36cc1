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
    param_bytes = (
        np.where(has_param, np.exp(rng.uniform(np.log(4096), np.log(max_bytes), size=n)), 0).astype(np.int64) // 4 * 4
    )
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


# ------------------------------------------------------------------ structured families
class Builder:
    """Appends ops in topological order; each op's FLOPs and bytes come from a matmul-like size model."""

    def __init__(self, rng: np.random.Generator, tokens: float, width: float) -> None:
        self.rng, self.tokens, self.width = rng, float(tokens), float(width)
        self.types: list[str] = []
        self.flops: list[float] = []
        self.out: list[int] = []
        self.param: list[int] = []
        self.reads: list[int] = []  # the op whose weights an op reads: itself, another (shared), or -1
        self.module: list[str] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.scope = ""

    def op(
        self,
        kind: str,
        inputs: list[int],
        *,
        scale: float = 1.0,
        weight: bool = False,
        out_scale: float = 1.0,
        shares: int | None = None,
    ) -> int:
        """A ``kind`` op ("mm", "conv", "ew" for elementwise, "view") reading ``inputs``.

        ``weight``: it owns a weight; ``shares``: it reads the weight op ``shares`` owns
        instead (a recurrent layer at a later time step), so it holds no parameters itself.
        """
        i = len(self.types)
        w = self.width * scale
        out = int(max(4.0, 4.0 * self.tokens * w * out_scale)) // 4 * 4
        jitter = float(self.rng.uniform(0.8, 1.25))
        if kind in ("mm", "conv"):
            flops = 2.0 * self.tokens * w * w * jitter * (9.0 if kind == "conv" else 1.0)
            param = int(4 * w * w * (9 if kind == "conv" else 1)) // 4 * 4 if weight else 0
            op_type = "aten.mm.default" if kind == "mm" else "aten.convolution.default"
        else:
            flops, param = float(self.tokens * w * jitter), 0
            op_type = {
                "ew": "aten.add.Tensor",
                "view": "aten.view.default",
                "act": "aten.relu.default",
                "softmax": "aten._softmax.default",
                "cat": "aten.cat.default",
                "norm": "aten.native_layer_norm.default",
                "bmm": "aten.bmm.default",
            }[kind]
            if kind == "bmm":
                flops = 2.0 * self.tokens * w * 128 * jitter
        self.types.append(op_type)
        self.flops.append(flops)
        self.out.append(out)
        if shares is not None:
            if not self.param[shares]:
                raise ValueError(f"op {shares} owns no weight to share")
            param = 0
        self.param.append(param)
        self.reads.append(i if param else (-1 if shares is None else shares))
        self.module.append(self.scope)
        for j in inputs:
            self.src.append(j)
            self.dst.append(i)
        return i

    def graph(self, name: str, seed: int, family: str) -> OpGraph:
        n = len(self.types)
        # Narrow every layer (width x s) so the model has 50M..1.5B parameters whatever its depth:
        # parameters and FLOPs scale with s^2, activations with s.
        target = float(np.exp(self.rng.uniform(np.log(2e8), np.log(6e9))))
        s = min(1.0, float(np.sqrt(target / max(sum(self.param), 1))))
        self.param = [int(p * s * s) // 4 * 4 for p in self.param]
        self.flops = [f * s * s for f in self.flops]
        self.out = [max(4, int(o * s) // 4 * 4) for o in self.out]
        out = np.asarray(self.out, dtype=np.int64)
        src = np.asarray(self.src, dtype=np.int64)
        dst = np.asarray(self.dst, dtype=np.int64)
        # A view has exactly one tensor input in ATen: other "views" become adds.
        indeg = np.bincount(dst, minlength=n)
        types = [
            "aten.add.Tensor" if t == "aten.view.default" and indeg[i] != 1 else t for i, t in enumerate(self.types)
        ]
        param = np.asarray(self.param, dtype=np.int64)
        return OpGraph(
            names=[f"op{i}" for i in range(n)],
            op_types=types,
            out_shapes=[[[int(b) // 4]] for b in out],
            out_dtypes=[["float32"] for _ in range(n)],
            out_bytes=out,
            param_bytes=param,
            buffer_bytes=np.zeros(n, dtype=np.int64),
            flops=np.asarray(self.flops, dtype=np.float64),
            module_paths=list(self.module),
            params=[[f"w{r}"] if r >= 0 else [] for r in self.reads],
            edge_src=src,
            edge_dst=dst,
            edge_bytes=out[src],
            name=name,
            meta={"synthetic": True, "family": family, "seed": seed},
        )


def _sizes(rng: np.random.Generator) -> tuple[float, float]:
    """(tokens, width): a batch of 512..16,384 rows through layers 256..4,096 wide (log-uniform)."""
    return float(np.exp(rng.uniform(np.log(512), np.log(16384)))), float(np.exp(rng.uniform(np.log(256), np.log(4096))))


def chain_dag(num_ops: int, *, seed: int = 0) -> OpGraph:
    """An MLP-like chain: (matmul with weights, bias add, activation) repeated."""
    rng = np.random.default_rng(seed)
    b = Builder(rng, *_sizes(rng))
    x = b.op("view", [])
    while len(b.types) < num_ops:
        b.scope = f"layer{len(b.types) // 3}"
        x = b.op("act", [b.op("ew", [b.op("mm", [x], weight=True)])])
    return b.graph(f"chain-{num_ops}-s{seed}", seed, "chain")


def branch_dag(num_ops: int, *, seed: int = 0, width: int = 4) -> OpGraph:
    """Inception-like blocks: ``width`` parallel conv branches of different depths, concatenated."""
    rng = np.random.default_rng(seed)
    tokens, w = _sizes(rng)
    b = Builder(rng, tokens / 4, w / 4)
    x = b.op("conv", [], weight=True)
    blk = 0
    while len(b.types) < num_ops:
        b.scope = f"block{blk}"
        ends = []
        for k in range(width):
            y = x
            for _ in range(1 + k % 3):
                y = b.op("act", [b.op("conv", [y], weight=True, scale=0.5)], scale=0.5)
            ends.append(y)
        x = b.op("cat", ends)
        blk += 1
    return b.graph(f"branches-{num_ops}-s{seed}", seed, "branches")


def unet_dag(num_ops: int, *, seed: int = 0, depth: int = 4) -> OpGraph:
    """U-Nets: conv levels down (activations shrink 4x per level), up again, with skips across; stacked."""
    rng = np.random.default_rng(seed)
    tokens, w = _sizes(rng)
    b = Builder(rng, tokens / 4, w / 8)
    x = b.op("conv", [], weight=True)
    net = 0
    while len(b.types) < num_ops:
        skips = []
        for lvl in range(depth):
            b.scope = f"unet{net}.down{lvl}"
            s = 2.0**lvl
            x = b.op(
                "act",
                [b.op("conv", [x], weight=True, scale=s, out_scale=1 / (4**lvl) / s)],
                scale=s,
                out_scale=1 / (4**lvl) / s,
            )
            skips.append(x)
        for lvl in reversed(range(depth)):
            b.scope = f"unet{net}.up{lvl}"
            s = 2.0**lvl
            x = b.op("cat", [x, skips[lvl]], scale=s, out_scale=2 / (4**lvl) / s)
            x = b.op(
                "act",
                [b.op("conv", [x], weight=True, scale=s, out_scale=1 / (4**lvl) / s)],
                scale=s,
                out_scale=1 / (4**lvl) / s,
            )
        net += 1
    return b.graph(f"unet-{num_ops}-s{seed}", seed, "unet")


def moe_dag(num_ops: int, *, seed: int = 0, experts: int = 8) -> OpGraph:
    """Mixture-of-experts layers: a router, ``experts`` parallel two-matmul experts on a slice of the tokens, a sum."""
    rng = np.random.default_rng(seed)
    tokens, w = _sizes(rng)
    b = Builder(rng, tokens, w)
    x = b.op("view", [])
    layer = 0
    while len(b.types) < num_ops:
        b.scope = f"moe{layer}"
        gate = b.op("softmax", [b.op("mm", [x], weight=True, scale=0.05)], scale=0.05)
        outs = []
        for e in range(experts):
            b.scope = f"moe{layer}.expert{e}"
            h = b.op(
                "act",
                [b.op("mm", [x, gate], weight=True, scale=2.0, out_scale=1 / experts)],
                scale=2.0,
                out_scale=1 / experts,
            )
            outs.append(b.op("mm", [h], weight=True, scale=2.0, out_scale=0.5 / experts))
        b.scope = f"moe{layer}"
        x = b.op("norm", [b.op("ew", outs + [x])])
        layer += 1
    return b.graph(f"moe-{num_ops}-s{seed}", seed, "moe")


def attention_dag(num_ops: int, *, seed: int = 0) -> OpGraph:
    """Transformer encoder layers: q/k/v projections, two batched matmuls around a softmax, MLP, residuals."""
    rng = np.random.default_rng(seed)
    b = Builder(rng, *_sizes(rng))
    x = b.op("view", [])
    layer = 0
    while len(b.types) < num_ops:
        b.scope = f"layers.{layer}.attn"
        h = b.op("norm", [x])
        q, k, v = (b.op("mm", [h], weight=True) for _ in range(3))
        a = b.op("softmax", [b.op("bmm", [q, k], out_scale=0.5)], out_scale=0.5)
        y = b.op("ew", [x, b.op("mm", [b.op("bmm", [a, v])], weight=True)])
        b.scope = f"layers.{layer}.mlp"
        m = b.op("mm", [b.op("act", [b.op("mm", [b.op("norm", [y])], weight=True, scale=2.0)], scale=2.0)], weight=True)
        x = b.op("ew", [y, m])
        layer += 1
    return b.graph(f"attention-{num_ops}-s{seed}", seed, "attention")


def recurrent_dag(num_ops: int, *, seed: int = 0) -> OpGraph:
    """Stacked recurrent layers unrolled over time steps, each layer's weights shared by all its steps.

    A grid: the cell of layer ``l`` at step ``t`` reads layer ``l - 1``'s output at
    ``t`` and its own state at ``t - 1``; its two matmuls read the weights the
    layer's first step owns (``params`` names them, so :func:`graphs.ops.param_reads`
    finds the sharing). A graph is either plain (Elman: two matmuls, add, tanh) or
    gated (LSTM-like: four gates per matmul, a cell state carried across steps).
    2 to 6 layers of 1,024..4,096 wide (a recurrent layer's weights are large next
    to one step's activations) over a batch of 16..256 rows; the steps fill
    ``num_ops``; a projection over every step's top output ends it.
    """
    rng = np.random.default_rng(seed)
    rows = float(np.exp(rng.uniform(np.log(16), np.log(256))))
    width = float(np.exp(rng.uniform(np.log(1024), np.log(4096))))
    b = Builder(rng, rows, width)
    layers = int(rng.integers(2, 7))
    gated = bool(rng.integers(0, 2))
    per_cell = 7 if gated else 4
    steps = max(2, (num_ops - 2) // (layers * per_cell + 2))
    g = 2.0 if gated else 1.0  # a gated matmul is 4H x H: 4x the weights and FLOPs, 4x the output (scale 2, out 2)
    b.scope = "embed"
    seq = b.op("view", [], out_scale=steps)
    xs = [b.op("view", [seq]) for _ in range(steps)]
    owners: dict[str, int] = {}

    def tied_mm(key: str, x: int, **kw: float) -> int:
        """A matmul reading the weights ``key`` names: the first one owns them, later ones share them."""
        o = owners.get(key)
        i = b.op("mm", [x], weight=o is None, shares=o, **kw)
        owners.setdefault(key, i)
        return i

    h: list[int | None] = [None] * layers
    c: list[int | None] = [None] * layers
    tops: list[int] = []
    for t in range(steps):
        x = xs[t]
        for layer in range(layers):
            b.scope = f"rnn.layer{layer}"
            gx = tied_mm(f"x{layer}", x, scale=g, out_scale=g)
            pre = (
                gx
                if h[layer] is None
                else b.op("ew", [gx, tied_mm(f"h{layer}", h[layer], scale=g, out_scale=g)], scale=g, out_scale=g)
            )
            if gated:
                gates = b.op("act", [pre], scale=g, out_scale=g)
                cell = b.op("ew", [gates] + ([c[layer]] if c[layer] is not None else []))
                c[layer] = cell
                x = b.op("ew", [b.op("act", [cell]), gates])
            else:
                x = b.op("act", [pre])
            h[layer] = x
        tops.append(x)
    b.scope = "head"  # one projection, its weights shared by every step, and a loss over all of them
    logits = [tied_mm("head", x, scale=2.0, out_scale=2.0) for x in tops]
    b.op("ew", logits, out_scale=1.0 / width)
    return b.graph(f"recurrent-{num_ops}-s{seed}", seed, "recurrent")


#: The structured families: name -> builder ``fn(num_ops, *, seed)``.
FAMILIES = {
    "chain": chain_dag,
    "branches": branch_dag,
    "unet": unet_dag,
    "moe": moe_dag,
    "attention": attention_dag,
    "recurrent": recurrent_dag,
}
