"""Models from libraries none of us wrote whose layers are their own ``torch.autograd.Function`` s, each tiny, built
in code (nothing downloaded), trained (``train()``), each ``(loss module, inputs)``. Not tuned on.

- mambapy's Mamba: its selective scan is a parallel scan with a backward written by hand (``PScan``);
- reformer-pytorch's Reformer: reversible layers (a Function whose backward recomputes each layer from its output,
  replaying the random state it noted) around LSH attention, which draws random rotations every step;
- linear-attention-transformer's LMs, plain and reversible (the same idea again);
- revtorch's reversible sequence: the same idea, another library;
- entmax's sparse normalisers (``sparsemax``, ``entmax15``, ``entmax_bisect``) in an attention: Functions with their
  own backward;
- pytorch-tabnet's TabNet: sparsemax attention masks and ghost batch norm;
- zuko's normalising flows (a neural spline flow and a masked autoregressive one): the loss is the negative log
  likelihood;
- pytorch-revgrad's gradient reversal (its Function's ``apply`` bound at import) in a domain-adversarial classifier;
- fairscale's activation checkpointing (``checkpoint_wrapper``: its own Function, given the block's forward);
- memcnn's invertible couplings (its own Function), keeping and freeing their inputs;
- pytorch-crf's linear-chain CRF as a tagger's loss.

``rev:<name>`` with this folder on ``PYTHONPATH`` (``placer train rev:mamba ...``); the conformance probe:
``PYTHONPATH=. python docs/conformance/others.py --rev``. Needs, without their dependencies (which keep the CPU torch):
``pip install --no-deps mambapy reformer-pytorch axial-positional-embedding local-attention product-key-memory
hyper-connections colt5-attention linear-attention-transformer linformer revtorch entmax pytorch-tabnet zuko
pytorch-revgrad memcnn pytorch-crf`` and ``pip install --no-deps --no-build-isolation fairscale``.
"""

import torch
import torch.nn.functional as F
from torch import nn

#: Batch and sequence length of the sequence models.
BATCH, LENGTH, VOCAB = 4, 16, 32


def _tokens(seed: int = 1) -> torch.Tensor:
    """Token ids of LENGTH + 1: the model reads LENGTH of them."""
    return torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(seed))


class NextToken(nn.Module):
    """A model of token ids to logits, and its next-token cross entropy."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        logits = self.model(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class MambaLM(nn.Module):
    """mambapy's Mamba between an embedding and a head."""

    def __init__(self, dim: int = 16, layers: int = 2) -> None:
        from mambapy.mamba import Mamba, MambaConfig

        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.mamba = Mamba(MambaConfig(d_model=dim, n_layers=layers, d_state=8, pscan=True))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        return self.head(self.mamba(self.embed(ids)))


def mamba():
    """Two Mamba layers, the selective scan by mambapy's parallel scan (its own Function)."""
    torch.manual_seed(0)
    return NextToken(MambaLM()).train(), (_tokens(),)


def reformer(dropout: float = 0.0):
    """reformer-pytorch's ReformerLM: two reversible layers of LSH attention (2 hashes, buckets of 4; random rotations
    drawn every step), ``dropout`` in the feed-forward and after the attention."""
    from reformer_pytorch import ReformerLM

    torch.manual_seed(0)
    model = ReformerLM(
        num_tokens=VOCAB,
        dim=16,
        depth=2,
        max_seq_len=LENGTH,
        heads=2,
        dim_head=8,
        bucket_size=4,
        n_hashes=2,
        causal=True,
        ff_dropout=dropout,
        post_attn_dropout=dropout,
    )
    return NextToken(model).train(), (_tokens(),)


def _linear_attention(reversible: bool):
    from linear_attention_transformer import LinearAttentionTransformerLM

    torch.manual_seed(0)
    model = LinearAttentionTransformerLM(
        num_tokens=VOCAB,
        dim=16,
        heads=2,
        depth=2,
        max_seq_len=LENGTH,
        causal=not reversible,
        reversible=reversible,
        n_local_attn_heads=1,
        local_attn_window_size=4,
    )
    return NextToken(model).train(), (_tokens(),)


def linear_attn():
    """linear-attention-transformer's causal LM: one linear-attention head and one local-attention head (windows of
    4) per layer, two layers."""
    return _linear_attention(False)


def linear_attn_rev():
    """The same library's reversible LM (its own reversible Function around the layers), not causal."""
    return _linear_attention(True)


class RevNet(nn.Module):
    """A linear stem, revtorch's reversible sequence of three blocks, each two small MLPs with dropout, on vectors of
    16 features (split into two halves of 8), and a classifier's cross entropy. (The stem gives the sequence an input
    that needs a gradient: without one autograd never calls its backward, which computes the blocks' gradients.)"""

    def __init__(self, dropout: float = 0.0) -> None:
        import revtorch

        super().__init__()

        def half() -> nn.Module:
            return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(dropout), nn.Linear(16, 8))

        self.blocks = revtorch.ReversibleSequence(
            nn.ModuleList([revtorch.ReversibleBlock(half(), half()) for _ in range(3)])
        )
        self.stem, self.head = nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.blocks(self.stem(x))), y)


def revnet(dropout: float = 0.0):
    """revtorch's reversible sequence (its own Function), three blocks, ``dropout`` in each."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return RevNet(dropout).train(), (torch.randn(8, 16, generator=g), torch.randint(0, 3, (8,), generator=g))


class SparseAttention(nn.Module):
    """One self-attention layer whose scores are normalised by ``normalise`` (entmax's), a head, and the next
    token's cross entropy."""

    def __init__(self, normalise, dim: int = 16) -> None:
        super().__init__()
        self.normalise = normalise
        self.embed = nn.Embedding(VOCAB, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        h = self.embed(ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        weights = self.normalise(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return self.head(h + self.out(weights @ v))


def _sparse(name: str):
    import entmax

    torch.manual_seed(0)
    return NextToken(SparseAttention(getattr(entmax, name))).train(), (_tokens(),)


def sparsemax():
    """Attention normalised by entmax's sparsemax (its own Function)."""
    return _sparse("sparsemax")


def entmax15():
    """Attention normalised by entmax 1.5 (its own Function)."""
    return _sparse("entmax15")


def entmax_bisect():
    """Attention normalised by entmax with alpha found by bisection (its own Function, iterating in the forward)."""
    return _sparse("entmax_bisect")


class TabLoss(nn.Module):
    """TabNet's classifier: cross entropy plus its sparsity regulariser (lambda 1e-3, as its trainer adds)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x, y):
        logits, sparsity = self.model(x)
        return F.cross_entropy(logits, y) + 1e-3 * sparsity


def tabnet():
    """pytorch-tabnet's TabNet (3 steps, sparsemax masks, ghost batch norm over virtual batches of 4), batch 8."""
    from pytorch_tabnet.tab_network import TabNet

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = TabNet(
        input_dim=12,
        output_dim=3,
        n_d=8,
        n_a=8,
        n_steps=3,
        virtual_batch_size=4,
        group_attention_matrix=torch.eye(12),  # one group per feature: what its trainer builds for no groups
    )
    return TabLoss(model).train(), (torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g))


class DomainAdversarial(nn.Module):
    """A domain-adversarial classifier (DANN): shared features, a task head, and a domain head behind
    pytorch-revgrad's gradient reversal (``revgrad = RevGrad.apply``, bound once at import); the loss is both
    heads' cross entropies."""

    def __init__(self) -> None:
        from pytorch_revgrad import RevGrad

        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.task = nn.Linear(16, 3)
        self.domain = nn.Sequential(RevGrad(alpha=0.5), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x, y, d):
        h = self.features(x)
        return F.cross_entropy(self.task(h), y) + F.cross_entropy(self.domain(h), d)


def revgrad():
    """pytorch-revgrad's gradient reversal in a domain-adversarial classifier."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y, d = (
        torch.randn(8, 12, generator=g),
        torch.randint(0, 3, (8,), generator=g),
        torch.randint(0, 2, (8,), generator=g),
    )
    return DomainAdversarial().train(), (x, y, d)


class Checkpointed(nn.Module):
    """Four residual MLP blocks, each in fairscale's ``checkpoint_wrapper`` (its own checkpointing Function, given the
    block's forward, which reads the block's weights without being given them), and a regression loss."""

    def __init__(self, dropout: float = 0.0) -> None:
        from fairscale.nn.checkpoint import checkpoint_wrapper

        super().__init__()

        def block() -> nn.Module:
            return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 16))

        self.stem = nn.Linear(12, 16)
        self.blocks = nn.ModuleList([checkpoint_wrapper(block()) for _ in range(4)])
        self.head = nn.Linear(16, 1)

    def forward(self, x, y):
        h = self.stem(x)
        for b in self.blocks:
            h = h + b(h)
        return F.mse_loss(self.head(h), y)


def fairscale_ckpt(dropout: float = 0.0):
    """fairscale's activation checkpointing (``checkpoint_wrapper``) of four blocks, ``dropout`` in each."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Checkpointed(dropout).train(), (torch.randn(8, 12, generator=g), torch.randn(8, 1, generator=g))


class Invertible(nn.Module):
    """memcnn's invertible additive coupling (its own Function, given the coupling's forward and inverse and its
    weights) twice, between a stem and a head; ``keep_input`` keeps the input's memory (memcnn frees it otherwise,
    as its backward recomputes the input from the output)."""

    def __init__(self, keep_input: bool) -> None:
        import memcnn

        super().__init__()
        self.stem, self.head = nn.Linear(12, 16), nn.Linear(16, 3)
        self.couplings = nn.Sequential(
            *[
                memcnn.InvertibleModuleWrapper(
                    memcnn.AdditiveCoupling(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))),
                    keep_input=keep_input,
                    keep_input_inverse=keep_input,
                )
                for _ in range(2)
            ]
        )

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.couplings(self.stem(x))), y)


def memcnn_kept():
    """memcnn's invertible couplings keeping their inputs."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Invertible(True).train(), (torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g))


def memcnn_freed():
    """memcnn's invertible couplings freeing their inputs (its default)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Invertible(False).train(), (torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g))


class Tagger(nn.Module):
    """A sequence tagger: embeddings, a linear layer of emissions, and pytorch-crf's CRF negative log likelihood."""

    def __init__(self) -> None:
        from torchcrf import CRF

        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.emit = nn.Linear(16, 5)
        self.crf = CRF(5, batch_first=True)

    def forward(self, ids, tags):
        return -self.crf(self.emit(self.embed(ids)), tags, reduction="mean")


def crf():
    """pytorch-crf's linear-chain CRF over a tagger's emissions (its forward algorithm in the loss)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Tagger().train(), (_tokens()[:, :LENGTH], torch.randint(0, 5, (BATCH, LENGTH), generator=g))


class FlowNLL(nn.Module):
    """A conditional flow's negative log likelihood of ``x`` given ``c``."""

    def __init__(self, flow: nn.Module) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, x, c):
        return -self.flow(c).log_prob(x).mean()


def _flow(kind: str):
    import zuko

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    flow = getattr(zuko.flows, kind)(features=4, context=2, transforms=2, hidden_features=(16, 16))
    return FlowNLL(flow).train(), (torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g))


def nsf():
    """zuko's neural spline flow (monotonic rational-quadratic splines), two transforms, conditional."""
    return _flow("NSF")


def maf():
    """zuko's masked autoregressive flow (affine), two transforms, conditional."""
    return _flow("MAF")


#: The models as MODELS builds them have no dropout: the conformance check's float64 reference and float32 step draw
#: other masks than a plan's (its microbatches draw theirs apart), so it would compare two draws. With dropout, what
#: a plan must keep is the unplaced step's draw at the same seed: :func:`seeded_check`.
DROPOUT = 0.1


def seeded_check(name: str) -> str:
    """``name`` built with :data:`DROPOUT` (where it has dropout) under each single-batch plan of
    ``bench.conformance`` (one process; the plans of microbatches draw per microbatch, so other numbers): the plan's
    step and the unplaced step at one seed, each on the model itself; their gradients must be equal to float32's
    rounding (the same numbers drawn). The check of a step that draws (reformer's LSH rotations, dropout), which the
    float64 conformance check cannot give a verdict on."""
    import inspect

    import placer
    from bench.conformance import plans
    from graphs.torch_capture import capture

    build = MODELS[name]
    dropout = DROPOUT if "dropout" in inspect.signature(build).parameters else 0.0
    model, inputs = build(dropout) if dropout else build()
    graph = capture(model, inputs)

    def step(module: nn.Module) -> dict[str, torch.Tensor]:
        model.zero_grad()
        torch.manual_seed(5)
        module(*inputs).backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    want = step(model)  # the plans run on the model itself, not on copies (fairscale's wrapper keeps a reference to
    # the module it wraps, which a copy shares: a copy would run the first's weights)
    worst, checked = 0.0, []
    for plan_name, plan in plans(graph).items():
        if plan.microbatches > 1:
            continue
        got = step(placer.apply(model, plan, inputs, device_map="*=cpu"))
        if set(got) != set(want):
            return f"{name}: {plan_name}: gradients for {len(got)} parameters, the unplaced step {len(want)}"
        worst = max([worst] + [float((got[k] - g).norm() / g.norm().clamp_min(1e-12)) for k, g in want.items()])
        checked.append(plan_name)
    return (
        f"{name} (dropout {dropout}): {len(want)} gradients under {len(checked)} plans ({', '.join(checked)}), worst "
        f"relative difference from the unplaced step at one seed {worst:.1e}"
    )


MODELS = {
    f.__name__: f
    for f in (
        mamba,
        reformer,
        linear_attn,
        linear_attn_rev,
        revnet,
        sparsemax,
        entmax15,
        entmax_bisect,
        tabnet,
        nsf,
        maf,
        revgrad,
        fairscale_ckpt,
        memcnn_kept,
        memcnn_freed,
        crf,
    )
}


if __name__ == "__main__":  # PYTHONPATH=. python docs/ranks/zb/rev.py > docs/conformance/rev_seeded.log
    for n in ("reformer", "revnet", "tabnet", "fairscale_ckpt"):
        print(seeded_check(n), flush=True)
