"""Metric-learning losses with weights of their own, implicit networks, Kolmogorov-Arnold networks and image losses,
as their users train them (none of us tuned on them; tiny, built in code, trained), each ``(loss module, inputs)``:

- ``arcface``: an embedding network trained with pytorch-metric-learning's ``ArcFaceLoss`` (the loss holds a
  weight matrix of class centres that trains with the network: additive angular margin, face recognition's loss);
- ``proxy_anchor``: the same network with ``ProxyAnchorLoss`` (trainable proxies, one per class);
- ``triplet``: ``TripletMarginLoss`` with a ``TripletMarginMiner`` choosing the hard triplets of each batch;
- ``siren``: siren-pytorch's ``SirenNet`` (sine activations, Sitzmann et al. 2020) fitting an image from its
  pixel coordinates;
- ``perceiver``: lucidrains' ``Perceiver`` (cross-attention from a latent array to an image's pixels with Fourier
  position features), classification;
- ``perceiver_lm``: lucidrains' ``PerceiverLM`` (Perceiver IO: the latents queried back by every token position),
  next-token cross-entropy;
- ``kan``: pykan's Kolmogorov-Arnold network (B-spline activations on its edges) regressing a function;
- ``ssim_denoiser``: a small convolutional denoiser trained on kornia's ``SSIMLoss`` plus a total-variation term,
  with a kornia Gaussian blur in its forward;
- ``augmented``: a classifier whose training forward augments its batch with kornia (random flips and affine warps
  on the GPU, as kornia is used: ``AugmentationSequential`` in the model; its colour jitter draws the order of its
  steps and is refused: ``data-dependent control flow at kornia/augmentation/_2d/intensity/color_jiggle.py:98``).

``metric:<name>`` with this folder on ``PYTHONPATH``; the conformance probe: ``PYTHONPATH=. python
docs/conformance/others.py --metric``. Needs ``pip install --no-deps pytorch-metric-learning siren-pytorch
perceiver-pytorch pykan scikit-learn joblib threadpoolctl narwhals kornia kornia_rs einops`` (none is a dependency
of placer; ``--no-deps`` keeps the CPU torch).
"""

import torch
import torch.nn.functional as F
from torch import nn


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Embedded(nn.Module):
    """A small embedding network and a metric-learning loss (which may hold weights of its own) on its embeddings."""

    def __init__(self, loss: nn.Module, miner: nn.Module | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.loss = loss
        self.miner = miner

    def forward(self, x, labels):
        z = self.net(x)
        if self.miner is None:
            return self.loss(z, labels)
        return self.loss(z, labels, self.miner(z, labels))


def _rows(n: int = 12, classes: int = 4) -> tuple:
    g = _gen()
    labels = torch.arange(n) % classes
    return torch.randn(n, 16, generator=g) + labels[:, None].float(), labels


def arcface():
    from pytorch_metric_learning.losses import ArcFaceLoss

    torch.manual_seed(0)
    return Embedded(ArcFaceLoss(num_classes=4, embedding_size=8)).train(), _rows()


def proxy_anchor():
    from pytorch_metric_learning.losses import ProxyAnchorLoss

    torch.manual_seed(0)
    return Embedded(ProxyAnchorLoss(num_classes=4, embedding_size=8)).train(), _rows()


def triplet():
    from pytorch_metric_learning.losses import TripletMarginLoss
    from pytorch_metric_learning.miners import TripletMarginMiner

    torch.manual_seed(0)
    model = Embedded(TripletMarginLoss(margin=0.2), TripletMarginMiner(margin=0.2, type_of_triplets="semihard"))
    return model.train(), _rows()


class Fit(nn.Module):
    """A network from coordinates to values and its mean squared error against the target values."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, coords, values):
        return F.mse_loss(self.net(coords), values)


def siren():
    from siren_pytorch import SirenNet

    torch.manual_seed(0)
    net = SirenNet(dim_in=2, dim_hidden=32, dim_out=3, num_layers=3, w0_initial=30.0)
    side = torch.linspace(-1, 1, 8)
    coords = torch.stack(torch.meshgrid(side, side, indexing="ij"), -1).reshape(-1, 2)
    values = torch.stack([torch.sin(3 * coords[:, 0]), torch.cos(2 * coords[:, 1]), coords.prod(1)], 1)
    return Fit(net).train(), (coords, values)


class Classify(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, labels):
        return F.cross_entropy(self.net(x), labels)


def perceiver():
    from perceiver_pytorch import Perceiver

    torch.manual_seed(0)
    net = Perceiver(
        input_channels=3,
        input_axis=2,
        num_freq_bands=4,
        max_freq=8.0,
        depth=2,
        num_latents=8,
        latent_dim=32,
        cross_dim_head=8,
        latent_dim_head=8,
        num_classes=5,
    )
    g = _gen()
    return Classify(net).train(), (torch.randn(4, 8, 8, 3, generator=g), torch.randint(0, 5, (4,), generator=g))


def perceiver_lm():
    from perceiver_pytorch import PerceiverLM

    torch.manual_seed(0)
    net = PerceiverLM(
        num_tokens=64,
        dim=16,
        depth=2,
        max_seq_len=16,
        num_latents=8,
        latent_dim=32,
        cross_dim_head=8,
        latent_dim_head=8,
        latent_heads=2,
    )
    tokens = torch.randint(0, 64, (4, 17), generator=_gen())
    return NextTokenLoss(net).train(), (tokens,)


class NextTokenLoss(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, tokens):
        logits = self.net(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def kan():
    from kan import KAN

    torch.manual_seed(0)
    net = KAN(width=[2, 4, 1], grid=5, k=3, seed=0, auto_save=False, save_act=False, symbolic_enabled=False)
    g = _gen()
    x = torch.rand(16, 2, generator=g) * 2 - 1
    return Fit(net).train(), (x, torch.exp(torch.sin(torch.pi * x[:, :1]) + x[:, 1:] ** 2))


class Denoiser(nn.Module):
    """Convolutions that predict the noise; the loss is kornia's SSIM loss of the denoised image against the clean
    one plus kornia's total variation of the result, after a kornia Gaussian blur of the input."""

    def __init__(self):
        super().__init__()
        import kornia

        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))
        self.ssim = kornia.losses.SSIMLoss(5)

    def forward(self, noisy, clean):
        import kornia

        x = kornia.filters.gaussian_blur2d(noisy, (3, 3), (1.0, 1.0))
        out = (x - self.net(x)).clamp(0, 1)
        return self.ssim(out, clean) + 1e-3 * kornia.losses.total_variation(out).mean()


def ssim_denoiser():
    torch.manual_seed(0)
    g = _gen()
    clean = torch.rand(4, 3, 16, 16, generator=g)
    return Denoiser().train(), ((clean + 0.1 * torch.randn(4, 3, 16, 16, generator=g)).clamp(0, 1), clean)


class Augmented(nn.Module):
    """kornia's augmentations of the batch, then a small convolutional classifier."""

    def __init__(self):
        super().__init__()
        import kornia.augmentation as K

        self.augment = K.AugmentationSequential(
            K.RandomHorizontalFlip(), K.RandomAffine(degrees=10.0, translate=(0.1, 0.1), p=0.8)
        )
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)
        )

    def forward(self, images, labels):
        return F.cross_entropy(self.net(self.augment(images)), labels)


def augmented():
    torch.manual_seed(0)
    g = _gen()
    return Augmented().train(), (torch.rand(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g))


MODELS = {
    "arcface": arcface,
    "proxy_anchor": proxy_anchor,
    "triplet": triplet,
    "siren": siren,
    "perceiver": perceiver,
    "perceiver_lm": perceiver_lm,
    "kan": kan,
    "ssim_denoiser": ssim_denoiser,
    "augmented": augmented,
}
