"""Models from another library none of us wrote: x-transformers (lucidrains), tiny, built in code (nothing
downloaded), each ``(loss module, inputs)``. Its layers use einops and einx throughout, and several cache what they
compute on the module itself (ALiBi registers its bias as a buffer on the first call). Not tuned on.

``lucid:<name>`` with this folder on ``PYTHONPATH`` (``placer train lucid:decoder_fancy ...``); the conformance
probe: ``PYTHONPATH=. python docs/conformance/others.py --lucid``. Needs ``pip install x-transformers`` (not a
dependency of placer; ``--no-deps`` with ``einx loguru frozendict torch-einops-utils`` keeps the CPU torch, which
the plain install would replace with a newer one).
"""

import torch
import torch.nn.functional as F
from torch import nn
from x_transformers import (
    AutoregressiveWrapper,
    ContinuousTransformerWrapper,
    Decoder,
    Encoder,
    TransformerWrapper,
    ViTransformerWrapper,
    XTransformer,
)

#: Vocabulary, sequence length and batch of every model.
VOCAB, LENGTH, BATCH = 128, 16, 4


def _tokens(seed: int, length: int = LENGTH) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(seed))


class Loss(nn.Module):
    """``loss(model(x), target)``; ``tokens``: the output is ``[B, L, vocab]`` logits (cross entropy over the last
    dimension)."""

    def __init__(self, model: nn.Module, loss, tokens: bool = False) -> None:
        super().__init__()
        self.model, self.loss, self.tokens = model, loss, tokens

    def forward(self, x, target):
        out = self.model(x)
        return self.loss(out.transpose(1, 2) if self.tokens else out, target)


def decoder_rotary():
    """A causal LM with rotary embeddings (``AutoregressiveWrapper``: the loss of the next token)."""
    torch.manual_seed(0)
    net = TransformerWrapper(
        num_tokens=VOCAB, max_seq_len=64, attn_layers=Decoder(dim=32, depth=3, heads=4, rotary_pos_emb=True)
    )
    return AutoregressiveWrapper(net).eval(), (_tokens(1, LENGTH + 1),)


def decoder_fancy():
    """A causal LM with many of the library's options: ALiBi (its bias cached on the module), GLU feed-forwards,
    RMSNorm, normalised queries and keys, residual attention, memory key/values and macaron layers."""
    torch.manual_seed(0)
    layers = Decoder(
        dim=32,
        depth=3,
        heads=4,
        ff_glu=True,
        use_rmsnorm=True,
        attn_qk_norm=True,
        alibi_pos_bias=True,
        residual_attn=True,
        attn_num_mem_kv=2,
        macaron=True,
    )
    return AutoregressiveWrapper(TransformerWrapper(num_tokens=VOCAB, max_seq_len=64, attn_layers=layers)).eval(), (
        _tokens(1, LENGTH + 1),
    )


def encoder_mlm():
    """A bidirectional encoder with T5's relative position bias and sandwich norms, a loss over every token."""
    torch.manual_seed(0)
    net = TransformerWrapper(
        num_tokens=VOCAB,
        max_seq_len=64,
        attn_layers=Encoder(dim=32, depth=3, heads=4, rel_pos_bias=True, sandwich_norm=True),
    )
    return Loss(net, F.cross_entropy, tokens=True).eval(), (_tokens(1), _tokens(2))


def enc_dec():
    """An encoder-decoder (``XTransformer``) with tied token embeddings: source and target tokens in, loss out."""
    torch.manual_seed(0)
    model = XTransformer(
        dim=32,
        enc_num_tokens=VOCAB,
        enc_depth=2,
        enc_heads=4,
        enc_max_seq_len=64,
        dec_num_tokens=VOCAB,
        dec_depth=2,
        dec_heads=4,
        dec_max_seq_len=64,
        tie_token_emb=True,
    )
    return model.eval(), (_tokens(1), _tokens(2, LENGTH + 1))


def vit():
    """A vision transformer classifying 32 x 32 images (patches of 8)."""
    torch.manual_seed(0)
    model = ViTransformerWrapper(
        image_size=32, patch_size=8, num_classes=10, attn_layers=Encoder(dim=32, depth=3, heads=4)
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    return Loss(model, F.cross_entropy).eval(), (x, y)


def continuous():
    """A causal transformer over continuous vectors (in and out of width 8), a regression loss."""
    torch.manual_seed(0)
    model = ContinuousTransformerWrapper(
        dim_in=8, dim_out=8, max_seq_len=64, attn_layers=Decoder(dim=32, depth=3, heads=4, rotary_pos_emb=True)
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, LENGTH, 8, generator=g), torch.randn(BATCH, LENGTH, 8, generator=g)
    return Loss(model, F.mse_loss).eval(), (x, y)


MODELS = {f.__name__: f for f in (decoder_rotary, decoder_fancy, encoder_mlm, enc_dec, vit, continuous)}
