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


class Outputs(nn.Module):
    """A model whose output is several tensors (ControlNet's residuals): the mean of their squares."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, sample, *rest):
        out = self.model(sample, **dict(zip(self.names, rest)), return_dict=False)
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        return sum(t.square().mean() for t in leaves) / len(leaves)


def _video(g, channels: int, frames: int = 2, size: int = 4) -> torch.Tensor:
    return torch.randn(BATCH, channels, frames, size, size, generator=g)


def controlnet():
    """ControlNet: a copy of Stable Diffusion's encoder fed a conditioning image; its residuals are the output."""
    from diffusers import ControlNetModel

    torch.manual_seed(0)
    model = ControlNetModel(
        in_channels=4,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
        conditioning_embedding_out_channels=(8, 16),
    )
    g = _gen()
    x, text = torch.randn(BATCH, 4, 8, 8, generator=g), torch.randn(BATCH, 6, 32, generator=g)
    cond = torch.randn(BATCH, 3, 16, 16, generator=g)  # the conditioning image, 2x the latent
    with torch.no_grad():  # as trained: its zero-initialised output convolutions have moved off zero
        for conv in [*model.controlnet_down_blocks, model.controlnet_mid_block]:
            conv.weight.normal_(0, 0.05, generator=g)
    names = ("timestep", "encoder_hidden_states", "controlnet_cond")
    return Outputs(model.eval(), names), (x, _timesteps(g), text, cond)


def vae_tiny():
    """TAESD, the tiny autoencoder: convolutions and ReLUs, no normalisation."""
    from diffusers import AutoencoderTiny

    torch.manual_seed(0)
    model = AutoencoderTiny(
        encoder_block_out_channels=(16, 16),
        decoder_block_out_channels=(16, 16),
        num_encoder_blocks=(1, 1),
        num_decoder_blocks=(1, 1),
    )
    x = torch.randn(BATCH, 3, 16, 16, generator=_gen())
    return _EncodeDecode(model.eval()), (x,)


class _EncodeDecode(nn.Module):
    """TAESD trained as its authors train it: decoded encoding against the input. (Its ``forward`` rounds the latents
    to bytes, an image's storage, which no gradient crosses and which leaves float64 for float32.)"""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample):
        return F.mse_loss(self.model.decoder(self.model.encoder(sample)), sample)


def pixart():
    """PixArt-alpha: DiT with cross-attention on a caption and one adaptive norm for all blocks."""
    from diffusers import PixArtTransformer2DModel

    torch.manual_seed(0)
    model = PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        cross_attention_dim=16,
        sample_size=8,
        caption_channels=24,
        norm_num_groups=8,
        use_additional_conditions=False,
    )
    g = _gen()
    x, text = torch.randn(BATCH, 4, 8, 8, generator=g), torch.randn(BATCH, 6, 24, generator=g)
    names = ("encoder_hidden_states", "timestep", "added_cond_kwargs")
    return Denoise(model.eval(), names[:2]), (x, torch.randn(x.shape, generator=g), text, _timesteps(g))


def cogvideox():
    """CogVideoX: a video transformer over frame patches and text tokens in one sequence."""
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        time_embed_dim=16,
        text_embed_dim=24,
        num_layers=2,
        sample_width=8,
        sample_height=8,
        sample_frames=5,  # 2 latent frames
        patch_size=2,
        max_text_seq_length=6,
    )
    g = _gen()
    x = torch.randn(BATCH, 2, 4, 8, 8, generator=g)  # (batch, frames, channels, height, width)
    text = torch.randn(BATCH, 6, 24, generator=g)
    names = ("encoder_hidden_states", "timestep")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), text, _timesteps(g))


def wan():
    """Wan 2.1: a video DiT with 3-D rotary positions and cross-attention on text."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        text_dim=24,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
    )
    g = _gen()
    x, text = _video(g, 4), torch.randn(BATCH, 6, 24, generator=g)
    names = ("timestep", "encoder_hidden_states")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), _timesteps(g), text)


def ltx():
    """LTX-Video: a video DiT over flattened latent tokens, its sizes given as arguments."""
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    model = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=2,
        caption_channels=24,
    )
    g = _gen()
    x = torch.randn(BATCH, 2 * 4 * 4, 8, generator=g)  # 2 frames of 4 x 4, flattened
    text, mask = torch.randn(BATCH, 6, 24, generator=g), torch.ones(BATCH, 6)
    model = _Fixed(model, num_frames=2, height=4, width=4)
    names = ("encoder_hidden_states", "timestep", "encoder_attention_mask")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), text, _timesteps(g), mask)


class _Fixed(nn.Module):
    """A model called with some keyword arguments fixed (sizes the export must see as constants)."""

    def __init__(self, model: nn.Module, **fixed) -> None:
        super().__init__()
        self.model, self.fixed = model, fixed

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs, **self.fixed)


def sana():
    """Sana: a linear-attention DiT with a mixed feed-forward of convolutions."""
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    model = SanaTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=8,
        cross_attention_dim=16,
        caption_channels=24,
        sample_size=8,
    )
    g = _gen()
    x, text = torch.randn(BATCH, 4, 8, 8, generator=g), torch.randn(BATCH, 6, 24, generator=g)
    names = ("encoder_hidden_states", "timestep")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), text, _timesteps(g))


def auraflow():
    """AuraFlow: MMDiT blocks, then single-stream DiT blocks, with registers."""
    from diffusers import AuraFlowTransformer2DModel

    torch.manual_seed(0)
    model = AuraFlowTransformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_mmdit_layers=1,
        num_single_dit_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=24,
        caption_projection_dim=16,
        out_channels=4,
        pos_embed_max_size=16,
    )
    g = _gen()
    x, text = torch.randn(BATCH, 4, 8, 8, generator=g), torch.randn(BATCH, 6, 24, generator=g)
    names = ("encoder_hidden_states", "timestep")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), text, _timesteps(g))


def lumina2():
    """Lumina-Image 2.0: a unified next-DiT with refiner blocks for the image and the caption."""
    from diffusers import Lumina2Transformer2DModel

    torch.manual_seed(0)
    model = Lumina2Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        hidden_size=32,
        num_layers=2,
        num_refiner_layers=1,
        num_attention_heads=2,
        num_kv_heads=1,
        multiple_of=16,
        axes_dim_rope=(4, 6, 6),
        axes_lens=(32, 32, 32),
        cap_feat_dim=24,
    )
    g = _gen()
    x, text, mask = (
        torch.randn(BATCH, 4, 8, 8, generator=g),
        torch.randn(BATCH, 6, 24, generator=g),
        torch.ones(BATCH, 6, dtype=torch.bool),
    )
    names = ("timestep", "encoder_hidden_states", "encoder_attention_mask")
    return Denoise(model.eval(), names), (
        x,
        torch.randn(x.shape, generator=g),
        torch.rand(BATCH, generator=g),
        text,
        mask,
    )


def unet3d():
    """A text-to-video U-Net: Stable Diffusion's blocks with temporal convolutions and attention between frames."""
    from diffusers import UNet3DConditionModel

    torch.manual_seed(0)
    model = UNet3DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=32,
        attention_head_dim=8,
    )
    g = _gen()
    x, text = _video(g, 4, size=8), torch.randn(BATCH, 6, 32, generator=g)
    names = ("timestep", "encoder_hidden_states")
    return Denoise(model.eval(), names), (x, torch.randn(x.shape, generator=g), _timesteps(g), text)


def vae_wan():
    """Wan's causal video autoencoder: 3-D convolutions that cache the frames before, RMS norms."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    model = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False])
    x = _video(_gen(), 3, frames=1, size=8)
    return Reconstruct(model.eval()), (x,)


#: Capture refuses it in one line (a size computed from the attention mask's values, used as a key): not in MODELS.
REFUSED = {"lumina2": lumina2}

#: Every model of this file, by name.
MODELS = {
    f.__name__: f
    for f in (
        unet2d,
        sd_unet,
        vae,
        dit,
        sd3,
        flux,
        controlnet,
        vae_tiny,
        pixart,
        cogvideox,
        wan,
        ltx,
        sana,
        auraflow,
        unet3d,
        vae_wan,
    )
}
