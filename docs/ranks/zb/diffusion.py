"""Models from another library none of us wrote: diffusers' denoisers and autoencoder, tiny, built from their
configs (nothing downloaded), each ``(loss module, inputs)``: the denoiser's prediction against a noise target
(mean squared error), the autoencoder's reconstruction against its input. Not tuned on.

``diffusion:<name>`` with this folder on ``PYTHONPATH`` (``placer train diffusion:unet2d ...``); the conformance
probe: ``PYTHONPATH=. python docs/conformance/others.py --diffusers``. Needs ``pip install diffusers`` (not a
dependency of placer).
"""

import torch
import torch.nn.functional as F
from torch import nn

#: The batch every model trains on.
BATCH = 4


class Denoise(nn.Module):
    """A denoiser's training loss: its prediction for ``sample`` (the model's first output) against ``target``.
    ``names``: the keyword of each input after the sample and the target, in order."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, sample, target, *rest):
        out = self.model(sample, **dict(zip(self.names, rest)), return_dict=False)[0]
        return F.mse_loss(out, target)


class Reconstruct(nn.Module):
    """An autoencoder's reconstruction loss: the decoded mean of the encoding (no sampling) against the input."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample):
        return F.mse_loss(self.model(sample, sample_posterior=False, return_dict=False)[0], sample)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)


def _timesteps(g) -> torch.Tensor:
    return torch.randint(0, 1000, (BATCH,), generator=g)


def unet2d():
    """A DDPM-style pixel U-Net: two resolutions, attention at the lower."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    model = UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=8,
    )
    g = _gen()
    x = torch.randn(BATCH, 3, 16, 16, generator=g)
    return Denoise(model.eval(), ("timestep",)), (x, torch.randn(x.shape, generator=g), _timesteps(g))


def sd_unet():
    """Stable Diffusion's latent U-Net: cross-attention on a text encoding."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    g = _gen()
    x = torch.randn(BATCH, 4, 8, 8, generator=g)
    text = torch.randn(BATCH, 6, 32, generator=g)
    return Denoise(model.eval(), ("timestep", "encoder_hidden_states")), (
        x,
        torch.randn(x.shape, generator=g),
        _timesteps(g),
        text,
    )


def vae():
    """The latent diffusion models' KL autoencoder."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    model = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    return Reconstruct(model.eval()), (torch.randn(BATCH, 3, 16, 16, generator=_gen()),)


def dit():
    """DiT: a class-conditioned transformer on latent patches (adaptive layer norm)."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
    )
    g = _gen()
    x = torch.randn(BATCH, 4, 8, 8, generator=g)
    labels = torch.randint(0, 10, (BATCH,), generator=g)
    target = torch.randn(x.shape, generator=g)
    return Denoise(model.eval(), ("timestep", "class_labels")), (x, target, _timesteps(g), labels)


def sd3():
    """Stable Diffusion 3's MMDiT: joint attention over image patches and text tokens."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pooled_projection_dim=16,
        pos_embed_max_size=16,
    )
    g = _gen()
    x = torch.randn(BATCH, 4, 8, 8, generator=g)
    text, pooled = torch.randn(BATCH, 6, 32, generator=g), torch.randn(BATCH, 16, generator=g)
    names = ("encoder_hidden_states", "pooled_projections", "timestep")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), text, pooled, _timesteps(g))


def flux():
    """FLUX's transformer: double-stream then single-stream blocks, rotary positions from ids."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        axes_dims_rope=(2, 2, 4),
    )
    g = _gen()
    tokens = 16  # a 4 x 4 latent, packed
    x = torch.randn(BATCH, tokens, 16, generator=g)
    text, pooled = torch.randn(BATCH, 6, 32, generator=g), torch.randn(BATCH, 16, generator=g)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(4), torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1)
    img_ids = img_ids[0].reshape(tokens, 3)
    txt_ids = torch.zeros(6, 3)
    t = torch.rand(BATCH, generator=g)
    names = ("encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), text, pooled, t, img_ids, txt_ids)


#: Every model of this file, by name.
MODELS = {f.__name__: f for f in (unet2d, sd_unet, vae, dit, sd3, flux)}
