"""Scientific and other non-transformer libraries' models, as their users train them (none of us tuned on them; tiny,
built in code, trained), each ``(loss module, inputs)``:

- ``fno``: neuraloperator's Fourier neural operator (``neuralop.models.FNO``) on a 2-D field: FFTs to complex
  spectra, weights mixed there, back; an L2 loss against a target field;
- ``tfno``: the same with Tucker-factorised spectral weights (``TFNO``, tensorly-torch's factorised tensors);
- ``sfno``: torch-harmonics' spherical Fourier neural operator (the FourCastNet v2 model): spherical harmonic
  transforms by Legendre quadrature on an equiangular grid, a weather-like field to the next one;
- ``uno``: neuraloperator's U-shaped neural operator (``UNO``: Fourier layers that resample the field down and up,
  with skips across);
- ``lsno``: torch-harmonics' local spherical neural operator (discrete-continuous convolutions on the sphere beside
  spherical Fourier layers);
- ``s2unet``: torch-harmonics' spherical U-Net (discrete-continuous convolutions down and transposed ones up, drop
  path and dropout in training);
- ``cfc`` and ``ltc``: ncps' liquid time-constant networks, a closed-form CfC and an ODE-unrolled LTC cell, each on
  a sparse neural-circuit wiring (``AutoNCP``), over a sequence, a regression loss on every step;
- ``ft_transformer``: the FT-Transformer of rtdl (Gorishniy et al. 2021) on tabular rows of numeric and categorical
  features, cross-entropy;
- ``esm2``: Meta's ESM-2 protein language model (fair-esm's ``ESM2``: rotary attention, token dropout), masked LM;
- ``dkl``: gpytorch's deep kernel learning: a feature extractor, an exact Gaussian process with an RBF kernel, the
  negative exact marginal log likelihood (a Cholesky factorisation and triangular solves).

``sci:<name>`` with this folder on ``PYTHONPATH``; the conformance probe: ``PYTHONPATH=. python
docs/conformance/others.py --sci``. Needs ``pip install --no-deps neuraloperator tensorly tensorly-torch
opt_einsum torch-harmonics ncps rtdl_revisiting_models fair-esm gpytorch linear_operator jaxtyping wadler_lindig``
(none is a dependency of placer; ``--no-deps`` keeps the CPU torch).
"""

import torch
import torch.nn.functional as F
from torch import nn


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class FieldLoss(nn.Module):
    """A model from fields to fields and its relative L2 loss against the target field."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        out = self.model(x)
        return ((out - y).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1)).mean()


def _field(model: nn.Module, shape: tuple) -> tuple:
    """``model``'s loss, and a batch of 4 fields of ``shape`` with their targets: each shifted by one along its last
    axis, plus noise."""
    g = _gen()
    x = torch.randn(4, *shape, generator=g)
    return FieldLoss(model).train(), (x, x.roll(1, dims=-1) + 0.1 * torch.randn(4, *shape, generator=g))


def fno():
    from neuralop.models import FNO

    torch.manual_seed(0)
    model = FNO(n_modes=(6, 6), in_channels=1, out_channels=1, hidden_channels=8, n_layers=2)
    return _field(model, (1, 16, 16))


def tfno():
    from neuralop.models import TFNO

    torch.manual_seed(0)
    model = TFNO(n_modes=(6, 6), in_channels=1, out_channels=1, hidden_channels=8, n_layers=2, rank=0.5)
    return _field(model, (1, 16, 16))


def sfno():
    from torch_harmonics.examples.models.sfno import SphericalFourierNeuralOperator

    torch.manual_seed(0)
    model = SphericalFourierNeuralOperator(
        img_size=(16, 32), in_chans=2, out_chans=2, embed_dim=8, num_layers=2, scale_factor=2, pos_embed="none"
    )
    return _field(model, (2, 16, 32))


def uno():
    from neuralop.models import UNO

    torch.manual_seed(0)
    model = UNO(
        in_channels=1,
        out_channels=1,
        hidden_channels=8,
        lifting_channels=8,
        projection_channels=8,
        n_layers=3,
        uno_out_channels=[8, 16, 8],
        uno_n_modes=[[4, 4], [3, 3], [4, 4]],
        uno_scalings=[[1.0, 1.0], [0.5, 0.5], [2.0, 2.0]],
        channel_mlp_skip="linear",
    )
    return _field(model, (1, 16, 16))


def lsno():
    from torch_harmonics.examples.models.lsno import LocalSphericalNeuralOperator

    torch.manual_seed(0)
    return _field(
        LocalSphericalNeuralOperator(
            img_size=(16, 32), in_chans=2, out_chans=2, embed_dim=8, num_layers=2, scale_factor=2
        ),
        (2, 16, 32),
    )


def s2unet():
    from torch_harmonics.examples.models.s2unet import SphericalUNet

    torch.manual_seed(0)
    return _field(
        SphericalUNet(img_size=(16, 32), in_chans=2, out_chans=2, embed_dims=[8, 16], depths=[1, 1], scale_factor=2),
        (2, 16, 32),
    )


class SequenceLoss(nn.Module):
    """A sequence model (batch first) whose output at every step is regressed on the target's."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        out, _ = self.model(x)
        return F.mse_loss(out, y)


def _liquid(kind: str):
    from ncps import wirings
    from ncps.torch import LTC, CfC

    torch.manual_seed(0)
    wiring = wirings.AutoNCP(12, 2, seed=0)  # 12 neurons, 2 of them motor (the outputs)
    model = (CfC if kind == "cfc" else LTC)(3, wiring, batch_first=True)
    g = _gen()
    x = torch.randn(4, 8, 3, generator=g)
    return SequenceLoss(model).train(), (x, torch.sin(x[..., :2].cumsum(1)))


def cfc():
    return _liquid("cfc")


def ltc():
    return _liquid("ltc")


class Tabular(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x_num, x_cat, y):
        return F.cross_entropy(self.model(x_num, x_cat), y)


def ft_transformer():
    from rtdl_revisiting_models import FTTransformer

    torch.manual_seed(0)
    kwargs = FTTransformer.get_default_kwargs(2)
    kwargs.update(d_block=16, attention_n_heads=4)
    model = FTTransformer(n_cont_features=5, cat_cardinalities=[3, 7], d_out=3, **kwargs)
    g = _gen()
    x_num = torch.randn(8, 5, generator=g)
    x_cat = torch.stack([torch.randint(0, 3, (8,), generator=g), torch.randint(0, 7, (8,), generator=g)], 1)
    return Tabular(model).train(), (x_num, x_cat, torch.randint(0, 3, (8,), generator=g))


class MaskedProtein(nn.Module):
    """ESM-2's masked language modelling: 15 % of the residues masked, cross-entropy on them."""

    def __init__(self, model: nn.Module, mask_idx: int):
        super().__init__()
        self.model = model
        self.mask_idx = mask_idx

    def forward(self, tokens, masked, targets):
        logits = self.model(tokens.masked_fill(masked, self.mask_idx))["logits"]
        return F.cross_entropy(logits[masked], targets[masked])


def esm2():
    import esm

    torch.manual_seed(0)
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    model = esm.model.esm2.ESM2(num_layers=2, embed_dim=32, attention_heads=4, alphabet=alphabet)
    g = _gen()
    residues = torch.randint(4, 24, (4, 14), generator=g)  # the 20 amino acids' tokens
    tokens = torch.cat([torch.full((4, 1), alphabet.cls_idx), residues, torch.full((4, 1), alphabet.eos_idx)], dim=1)
    masked = torch.zeros_like(tokens, dtype=torch.bool)
    masked[:, 1:-1] = torch.rand(4, 14, generator=g) < 0.15
    masked[:, 3] = True  # at least one per sequence
    return MaskedProtein(model, alphabet.mask_idx).train(), (tokens, masked, tokens.clone())


class DeepKernel(nn.Module):
    """Deep kernel learning (Wilson et al. 2016): an MLP's features into an exact GP with an RBF kernel; the loss is
    the negative exact marginal log likelihood of the training targets."""

    def __init__(self, train_x, train_y):
        super().__init__()
        import gpytorch

        class GP(gpytorch.models.ExactGP):
            def __init__(self, x, y, likelihood, features):
                super().__init__(x, y, likelihood)
                self.features = features
                self.mean = gpytorch.means.ConstantMean()
                self.covar = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

            def forward(self, x):
                z = self.features(x)
                return gpytorch.distributions.MultivariateNormal(self.mean(z), self.covar(z))

        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        features = nn.Sequential(nn.Linear(train_x.shape[1], 16), nn.ReLU(), nn.Linear(16, 2))
        self.gp = GP(train_x, train_y, self.likelihood, features)
        self.mll = gpytorch.mlls.ExactMarginalLogLikelihood(self.likelihood, self.gp)

    def forward(self, x, y):
        return -self.mll(self.gp(x), y)


def dkl():
    torch.manual_seed(0)
    g = _gen()
    x = torch.randn(24, 4, generator=g)
    y = torch.sin(x.sum(1)) + 0.05 * torch.randn(24, generator=g)
    model = DeepKernel(x, y).train()
    return model, (x, y)


MODELS = {
    "fno": fno,
    "tfno": tfno,
    "sfno": sfno,
    "uno": uno,
    "lsno": lsno,
    "s2unet": s2unet,
    "cfc": cfc,
    "ltc": ltc,
    "ft_transformer": ft_transformer,
    "esm2": esm2,
    "dkl": dkl,
}
