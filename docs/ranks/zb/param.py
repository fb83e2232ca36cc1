"""Models whose weights are torch.nn parametrizations, as GANs, vocoders and orthogonal RNNs are written (none of us
wrote them; tiny, built in code, trained, not tuned on), each ``(loss module, inputs)``:

- an SNGAN discriminator's step: spectral-normed layers (``parametrizations.spectral_norm``: a power iteration that
  updates two buffers at every forward in training), a hinge loss on a real and a fake batch;
- a HiFi-GAN-like vocoder: weight-normed 1-D convolutions and a transposed one (``parametrizations.weight_norm``);
- an RNN written by hand whose recurrent matrix is kept orthogonal (``parametrizations.orthogonal``, by the matrix
  exponential), its first state ``torch.zeros(batch, hidden)`` made without a dtype.

``param:<name>`` with this folder on ``PYTHONPATH``; the conformance probe: ``PYTHONPATH=. python
docs/conformance/others.py --param``.
"""

import torch
from torch import nn
from torch.nn.utils import parametrizations as P


class Disc(nn.Module):
    """An SNGAN-style discriminator's step: spectral-normed convolutions, a hinge loss on real and fake batches."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            P.spectral_norm(nn.Conv2d(3, 16, 3, padding=1)),
            nn.LeakyReLU(0.1),
            P.spectral_norm(nn.Conv2d(16, 32, 4, stride=2, padding=1)),
            nn.LeakyReLU(0.1),
            nn.Flatten(),
            P.spectral_norm(nn.Linear(32 * 8 * 8, 1)),
        )

    def forward(self, real, fake):
        return torch.relu(1 - self.net(real)).mean() + torch.relu(1 + self.net(fake)).mean()


def sngan():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Disc().train(), (torch.randn(4, 3, 16, 16, generator=g), torch.randn(4, 3, 16, 16, generator=g))


class Vocoder(nn.Module):
    """HiFi-GAN-like stack of weight-normed 1-D convolutions, an L1 loss on the waveform."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            P.weight_norm(nn.Conv1d(8, 16, 7, padding=3)),
            nn.LeakyReLU(0.1),
            P.weight_norm(nn.ConvTranspose1d(16, 8, 4, stride=2, padding=1)),
            nn.LeakyReLU(0.1),
            P.weight_norm(nn.Conv1d(8, 1, 7, padding=3)),
            nn.Tanh(),
        )

    def forward(self, mel, wave):
        return (self.net(mel) - wave).abs().mean()


def vocoder():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Vocoder().train(), (torch.randn(4, 8, 32, generator=g), torch.randn(4, 1, 64, generator=g))


class OrthoRNN(nn.Module):
    """An RNN whose recurrent matrix is kept orthogonal (a parametrization by the matrix exponential)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.rec = P.orthogonal(nn.Linear(16, 16, bias=False), orthogonal_map="matrix_exp")
        self.out = nn.Linear(16, 3)

    def forward(self, x, y):
        h = torch.zeros(x.shape[0], 16)
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
        return nn.functional.cross_entropy(self.out(h), y)


def ortho_rnn():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return OrthoRNN().train(), (torch.randn(4, 5, 6, generator=g), torch.randint(0, 3, (4,), generator=g))


MODELS = {"sngan": sngan, "vocoder": vocoder, "ortho_rnn": ortho_rnn}
