"""Models whose forward updates state it keeps in buffers, as people write them (none of us tuned on them; tiny,
built in code or from configs, trained), each ``(loss module, inputs)``:

- ``simclr``: SimCLR's step: one Hugging Face ResNet encoder (batch norm) applied to two views, a projection head,
  the NT-Xent contrastive loss;
- ``siamese``: a Siamese network (one convolutional encoder with batch norm on two images) and a contrastive
  margin loss on their distance, as signature or face verification trains it;
- ``obs_norm``: a PPO-style actor-critic whose observation normaliser updates its running mean, variance and count
  in its forward (in place, under ``no_grad``), then the clipped policy loss and the value loss;
- ``vq_ema``: a VQ-VAE whose codebook follows exponential moving averages updated in the forward (in place, as
  VQ-VAE-2 and Sonnet's ``VectorQuantizerEMA`` do), with the straight-through estimator and commitment loss;
- ``old_sn``: a GAN discriminator with torch.nn.utils.spectral_norm, the older hook-based API (a pre-forward hook
  runs the power iteration and writes ``weight_u`` in place), applied to a real and a fake batch.

``state:<name>`` with this folder on ``PYTHONPATH``; the conformance probe: ``PYTHONPATH=. python
docs/conformance/others.py --state``.
"""

import torch
import torch.nn.functional as F
from torch import nn


def _views(n: int, shape: tuple, seed: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g)
    return x, x.flip(-1) + 0.1 * torch.randn(n, *shape, generator=g)  # two "augmentations" of one batch


class SimCLR(nn.Module):
    """A ResNet encoder on two views, a projection head, NT-Xent (temperature 0.5)."""

    def __init__(self):
        super().__init__()
        from transformers import ResNetConfig, ResNetModel

        config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
        self.encoder = ResNetModel(config)
        self.head = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, a, b):
        z = torch.cat([self.head(self.encoder(v).pooler_output.flatten(1)) for v in (a, b)])
        z = F.normalize(z, dim=1)
        n = a.shape[0]
        sim = z @ z.T / 0.5
        sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
        return F.cross_entropy(sim, target)


def simclr():
    torch.manual_seed(0)
    return SimCLR().train(), _views(4, (3, 16, 16))


class Siamese(nn.Module):
    """One encoder (convolutions with batch norm) on two images; a contrastive margin loss on their distance."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 8),
        )

    def forward(self, a, b, same):
        d = (self.encoder(a) - self.encoder(b)).pow(2).sum(1).add(1e-6).sqrt()
        return (same * d.pow(2) + (1 - same) * F.relu(1.0 - d).pow(2)).mean()


def siamese():
    torch.manual_seed(0)
    a, b = _views(6, (1, 12, 12))
    return Siamese().train(), (a, b, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]))


class RunningNorm(nn.Module):
    """An observation normaliser: running mean and variance (Welford's parallel update) and count, updated in the
    forward in training, as PPO implementations keep one in their policy."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                n = x.shape[0]
                mean, var = x.mean(0), x.var(0, unbiased=False)
                delta, total = mean - self.mean, self.count + n
                m2 = self.var * self.count + var * n + delta.pow(2) * self.count * n / total
                self.mean.add_(delta * n / total)
                self.var.copy_(m2 / total)
                self.count.add_(n)
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-5, 5)


class ActorCritic(nn.Module):
    """PPO's step: normalised observations, a policy and a value head, the clipped surrogate and the value loss."""

    def __init__(self):
        super().__init__()
        self.norm = RunningNorm(6)
        self.body = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, 4), nn.Linear(32, 1)

    def forward(self, obs, actions, old_logp, advantages, returns):
        h = self.body(self.norm(obs))
        logp = torch.log_softmax(self.pi(h), -1).gather(1, actions[:, None]).squeeze(1)
        ratio = (logp - old_logp).exp()
        policy = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
        return policy + 0.5 * (self.v(h).squeeze(1) - returns).pow(2).mean()


def obs_norm():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    n = 8
    return ActorCritic().train(), (
        torch.randn(n, 6, generator=g) * 3 + 1,
        torch.randint(0, 4, (n,), generator=g),
        torch.log(torch.full((n,), 0.25)),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
    )


class EMAQuantizer(nn.Module):
    """Vector quantisation with a codebook of exponential moving averages (decay 0.9), updated in the forward."""

    def __init__(self, codes: int = 16, dim: int = 8, decay: float = 0.9):
        super().__init__()
        self.decay = decay
        embed = torch.randn(codes, dim)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.ones(codes))
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, z):
        flat = z.reshape(-1, z.shape[-1])
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embed.T + self.embed.pow(2).sum(1)
        idx = dist.argmin(1)
        onehot = F.one_hot(idx, self.embed.shape[0]).type(flat.dtype)
        quant = (onehot @ self.embed).view_as(z)
        if self.training:
            with torch.no_grad():
                self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
                self.embed_avg.mul_(self.decay).add_(onehot.T @ flat, alpha=1 - self.decay)
                n = self.cluster_size.sum()
                size = (self.cluster_size + 1e-5) / (n + self.embed.shape[0] * 1e-5) * n
                self.embed.copy_(self.embed_avg / size[:, None])
        commit = (z - quant.detach()).pow(2).mean()
        return z + (quant - z).detach(), commit


class VQVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv1d(2, 16, 4, stride=2, padding=1), nn.ReLU(), nn.Conv1d(16, 8, 3, padding=1))
        self.vq = EMAQuantizer()
        self.dec = nn.Sequential(
            nn.ConvTranspose1d(8, 16, 4, stride=2, padding=1), nn.ReLU(), nn.Conv1d(16, 2, 3, padding=1)
        )

    def forward(self, x):
        z = self.enc(x).transpose(1, 2)
        q, commit = self.vq(z)
        return (self.dec(q.transpose(1, 2)) - x).pow(2).mean() + 0.25 * commit


def vq_ema():
    torch.manual_seed(0)
    return VQVAE().train(), (torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(1)),)


class OldSNDisc(nn.Module):
    """A discriminator with torch.nn.utils.spectral_norm (the hook-based API), on a real and a fake batch."""

    def __init__(self):
        super().__init__()
        sn = nn.utils.spectral_norm
        self.net = nn.Sequential(
            sn(nn.Conv2d(3, 8, 3, padding=1)),
            nn.LeakyReLU(0.2),
            sn(nn.Conv2d(8, 16, 4, stride=2, padding=1)),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            sn(nn.Linear(16 * 4 * 4, 1)),
        )

    def forward(self, real, fake):
        return F.softplus(-self.net(real)).mean() + F.softplus(self.net(fake)).mean()


def old_sn():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return OldSNDisc().train(), (torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 3, 8, 8, generator=g))


MODELS = {"simclr": simclr, "siamese": siamese, "obs_norm": obs_norm, "vq_ema": vq_ema, "old_sn": old_sn}
