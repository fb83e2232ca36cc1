"""Models with uneven layers for plans across CPU ranks: an LM, an encoder-decoder and a U-Net.

Each builder returns ``(model, example_inputs)``, seeded, with ``forward`` returning the
loss (the last stage of a plan across processes computes it). Sized so that a step
takes tens to hundreds of milliseconds on one CPU core (``lm_b32``, ``encoder_decoder_b32``, ``unet_b32`` and
``convnet_b32``: the same models on a batch of 32, where one of 4 microbatches is the small batch; a pipeline
pays only where a microbatch's ops are large enough to run near their whole-batch rate):

* :func:`lm`: 4 causal transformer layers of width 128 and an 8192-token head (the
  heaviest layer by far, which an equal count of layers ignores);
* :func:`encoder_decoder`: ``nn.Transformer`` with 2 encoder and 4 decoder layers
  (a decoder layer has cross-attention: heavier than an encoder layer), a 4096-token
  vocabulary head;
* :func:`unet`: a U-Net: three convolution blocks down, three up with skip connections
  from the matching block down (a DAG, not a chain); the top blocks at full resolution
  are the heaviest;
* :func:`convnet`: a VGG-like classifier, four convolution blocks then two dense layers
  that hold 12.5 M of its 13.1 M parameters and a few percent of its FLOPs: their
  gradients and Adam step cost far more than their FLOPs say (where a FLOPs-balanced
  split misleads).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, BATCH, SEQ = 4096, 128, 8, 64


class EncoderDecoder(nn.Module):
    """Source and target tokens -> ``nn.Transformer`` -> vocabulary head, next-token loss."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.transformer = nn.Transformer(WIDTH, 4, 2, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1] - 1, device=tgt.device)
        h = self.transformer(self.embed(src), self.embed(tgt[:, :-1]), tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), tgt[:, 1:].flatten())


def encoder_decoder(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (source tokens, target tokens))``: ``batch`` (8) pairs of 64 tokens, seeded."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    src, tgt = (torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(2))
    return EncoderDecoder().eval(), (src, tgt)


def encoder_decoder_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`encoder_decoder` on a batch of 32."""
    return encoder_decoder(32)


class SmallLM(nn.Module):
    """Token embedding, 4 transformer encoder layers (causal), an 8192-token head: the head is the heaviest layer."""

    def __init__(self, vocab: int = 8192, width: int = 128, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.layers = nn.ModuleList([layer] + [copy.deepcopy(layer) for _ in range(layers - 1)])
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def lm(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (tokens, next tokens))``: ``batch`` (8) sequences of 64 tokens, seeded."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 8192, (batch, SEQ), generator=torch.Generator().manual_seed(1))
    return SmallLM().eval(), (tokens, tokens.roll(-1, dims=1))


def lm_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`lm` on a batch of 32: one of 4 microbatches is :func:`lm`'s whole batch."""
    return lm(32)


def block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1), nn.ReLU()
    )


class UNet(nn.Module):
    """Three blocks down (pooling between), three up (upsampling, the matching down block's output concatenated)."""

    def __init__(self, channels: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        c = channels
        self.down = nn.ModuleList([block(3, c[0]), block(c[0], c[1]), block(c[1], c[2])])
        self.up = nn.ModuleList([block(c[2] + c[2], c[1]), block(c[1] + c[1], c[0]), block(c[0] + c[0], c[0])])
        self.bottom = block(c[2], c[2])
        self.out = nn.Conv2d(c[0], 3, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        skips = []
        h = x
        for layer in self.down:
            h = layer(h)
            skips.append(h)
            h = F.max_pool2d(h, 2)
        h = self.bottom(h)
        for layer, skip in zip(self.up, reversed(skips)):
            h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = layer(torch.cat([h, skip], dim=1))
        return F.mse_loss(self.out(h), target)


def unet(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (images, targets))``: ``batch`` (8) images of 3 x 64 x 64, seeded."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 64, 64, generator=g)
    return UNet().eval(), (x, torch.randn(batch, 3, 64, 64, generator=g))


def unet_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`unet` on a batch of 32."""
    return unet(32)


class ConvNet(nn.Module):
    """Four convolution blocks (64 x 64 down to 4 x 4), then dense 2048 -> 4096 -> 1000 and cross-entropy."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.ModuleList([block(3, 32), block(32, 64), block(64, 128), block(128, 128)])
        self.fc1 = nn.Linear(128 * 4 * 4, 4096)
        self.fc2 = nn.Linear(4096, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for layer in self.features:
            x = F.max_pool2d(layer(x), 2)
        return F.cross_entropy(self.fc2(F.relu(self.fc1(x.flatten(1)))), labels)


def convnet(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (images, labels))``: ``batch`` (8) images of 3 x 64 x 64, seeded."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 64, 64, generator=g)
    return ConvNet().eval(), (x, torch.randint(0, 1000, (batch,), generator=g))


def convnet_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`convnet` on a batch of 32."""
    return convnet(32)


__all__ = [
    "ConvNet",
    "EncoderDecoder",
    "SmallLM",
    "UNet",
    "convnet",
    "convnet_b32",
    "encoder_decoder",
    "encoder_decoder_b32",
    "lm",
    "lm_b32",
    "unet",
    "unet_b32",
]
