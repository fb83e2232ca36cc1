"""Models from another library none of us wrote: vector-quantize-pytorch's quantizers (lucidrains), each inside a
tiny autoencoder built in code (nothing downloaded), trained (``train()``: a codebook updated by exponential moving
averages is written in place in the forward, as in a real training step), each ``(loss module, inputs)``: the
reconstruction's squared error plus the quantizer's own loss (commitment, entropy), on a batch of 8 sequences of 16
vectors. Not tuned on.

``vq:<name>`` with this folder on ``PYTHONPATH`` (``placer train vq:vq_ema ...``); the conformance probe:
``PYTHONPATH=. python docs/conformance/others.py --vq``. Needs vector-quantize-pytorch (not a dependency of placer):
``pip install --no-deps vector-quantize-pytorch einops einx loguru torch-einops-utils`` keeps the CPU torch.
"""

import torch
import torch.nn.functional as F
from torch import nn

#: Batch, sequence length, input width and the quantized width.
BATCH, LENGTH, WIDTH, DIM = 8, 16, 12, 8


class AutoEncoder(nn.Module):
    """Encode, quantize, decode; the loss is the reconstruction's squared error plus the quantizer's loss (where it
    returns one)."""

    def __init__(self, quantizer: nn.Module, dim: int = DIM) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(WIDTH, 32), nn.GELU(), nn.Linear(32, dim))
        self.quantizer = quantizer
        self.decode = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, WIDTH))

    def forward(self, x):
        out = self.quantizer(self.encode(x))
        quantized, aux = out[0], out[-1]
        loss = F.mse_loss(self.decode(quantized), x)
        if isinstance(aux, torch.Tensor) and aux.is_floating_point():
            loss = loss + aux.sum()
        return loss


def _built(quantizer: nn.Module, dim: int = DIM) -> tuple[nn.Module, tuple]:
    model = AutoEncoder(quantizer, dim).train()
    x = torch.randn(BATCH, LENGTH, WIDTH, generator=torch.Generator().manual_seed(1))
    return model, (x,)


def vq_ema():
    """VectorQuantize with its default codebook, updated by moving averages in the forward."""
    from vector_quantize_pytorch import VectorQuantize

    torch.manual_seed(0)
    return _built(VectorQuantize(dim=DIM, codebook_size=32, decay=0.9, commitment_weight=0.25))


def vq_learned():
    """VectorQuantize whose codebook is a parameter learnt by gradient (no moving average)."""
    from vector_quantize_pytorch import VectorQuantize

    torch.manual_seed(0)
    q = VectorQuantize(
        dim=DIM,
        codebook_size=32,
        learnable_codebook=True,
        ema_update=False,
        commitment_weight=0.25,
    )
    return _built(q)


def residual_vq():
    """ResidualVQ: three quantizers, each of what the last left (moving averages)."""
    from vector_quantize_pytorch import ResidualVQ

    torch.manual_seed(0)
    return _built(ResidualVQ(dim=DIM, num_quantizers=3, codebook_size=32, decay=0.9, commitment_weight=0.25))


def fsq():
    """Finite scalar quantization: no codebook, a rounding with a straight-through gradient."""
    from vector_quantize_pytorch import FSQ

    torch.manual_seed(0)
    return _built(FSQ(levels=[8, 5, 5, 5], dim=DIM))


def lfq():
    """Lookup-free quantization with its entropy loss."""
    from vector_quantize_pytorch import LFQ

    torch.manual_seed(0)
    return _built(LFQ(dim=DIM, codebook_size=2**DIM, entropy_loss_weight=0.1))


def sim_vq():
    """SimVQ: a frozen codebook through a learnt linear map."""
    from vector_quantize_pytorch import SimVQ

    torch.manual_seed(0)
    return _built(SimVQ(dim=DIM, codebook_size=32))


MODELS = {f.__name__: f for f in (vq_ema, vq_learned, residual_vq, fsq, lfq, sim_vq)}
