"""Models with uneven layers for plans across CPU ranks: an LM, an encoder-decoder, a U-Net, a convnet, a text
classifier, VGG16, MobileNetV2, a small DeepSeek-V3 (dense layers, then mixture-of-experts ones), and, held out, a T5
shaped as T5-small (:func:`t5`) and a GPT-2 shaped as GPT-2 small (:func:`gpt2`).

Each builder returns ``(model, example_inputs)``, seeded, with ``forward`` returning the
loss (the last stage of a plan across processes computes it). Sized so that a step
takes tens to hundreds of milliseconds on one CPU core. ``lm_b32``, ``encoder_decoder_b32``, ``unet_b32``,
``convnet_b32``, ``text_classifier_b32``, ``vgg16_b32`` and ``mobilenet_v2_b32`` are the same models on a batch
of 32, where one of 4 microbatches is the small batch (a pipeline pays only where a microbatch's ops are large
enough to run near their whole-batch rate):

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
* :func:`text_classifier`: a text classifier with a 65,536-token vocabulary: its embedding holds 8.4 M of its
  9.2 M parameters (91 %; small multilingual encoders hold 80-90 % there, as mT5-small's 87 %) and has no FLOPs,
  yet its dense gradient and its Adam step cost the rank that holds it time that a FLOPs-balanced split does not
  see; 4 transformer layers of width 128, a mean over the tokens, a 4-class head.
* :func:`vgg16`: VGG16 (configuration D, torchvision's layout) on 64 x 64 images: its dense layers hold 89 % of
  its parameters and 9 % of its FLOPs; on a small batch they are memory-bound (see its doc).
* :func:`deepseek_moe`: a small DeepSeek-V3 (transformers' ``DeepseekV3ForCausalLM``, not written here) laid out
  as DeepSeek-V3 is: its first layers dense, the rest mixture-of-experts (16 routed experts of which each token
  takes 2, and a shared one). An expert layer holds 3.6x a dense layer's parameters and 0.4x its FLOPs, and on a
  CPU core it runs at a third of a dense layer's rate per FLOP (its tokens sorted, gathered and scattered; many
  small matrix products): a FLOPs-balanced split gives the rank of the expert layers too much.
* :func:`mobilenet_v2`: MobileNetV2 (Sandler et al. 2018, its standard block table, width 1.0) on Tiny
  ImageNet-sized images (64 x 64, 200 classes). Its depthwise convolutions, batch norms and ReLU6s are
  memory-bound: few FLOPs, much time, and most of it in the early blocks at high resolution, while the FLOPs
  spread evenly over the blocks (what ShuffleNet V2, Ma et al. 2018, calls FLOPs an indirect measure of speed).
  Batch norms in eval mode, as every model here is built (a pipeline's microbatches would otherwise change
  their statistics).
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


def images(model: type[nn.Module], batch: int, classes: int) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model(), (images, labels))`` in eval mode: ``batch`` images of 3 x 64 x 64 and their classes (of
    ``classes``), seeded."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 64, 64, generator=g)
    return model().eval(), (x, torch.randint(0, classes, (batch,), generator=g))


def convnet(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (images, labels))``: ``batch`` (8) images of 3 x 64 x 64, seeded."""
    return images(ConvNet, batch, 1000)


def convnet_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`convnet` on a batch of 32."""
    return convnet(32)


#: VGG16's convolutions (configuration D of Simonyan & Zisserman 2015): output channels, "M" a 2 x 2 max pool.
VGG16_CONVOLUTIONS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16(nn.Module):
    """VGG16 (configuration D) as torchvision lays it out: 13 3x3 convolutions with ReLUs in five pooled blocks, a
    7 x 7 adaptive average pool, then the paper's classifier, dense 25088 -> 4096 -> 4096 -> classes (no dropout: the
    models here are built in eval mode). On 64 x 64 images the convolutions end at 2 x 2 x 512, which the pool
    spreads over 7 x 7, as torchvision's VGG16 does on small images."""

    def __init__(self, classes: int = 200) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in VGG16_CONVOLUTIONS:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU()]
                c = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.classifier(self.avgpool(self.features(x)).flatten(1)), labels)


def vgg16(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (images, labels))``: VGG16 on ``batch`` (8) images of 3 x 64 x 64 (Tiny ImageNet's size) and their
    classes (of 200), seeded.

    The textbook case where FLOPs mislead: its three dense layers hold 120 M of its 135 M parameters (89 %) and 9 %
    of its FLOPs, yet on a small batch each reads its whole weight matrix on every microbatch, forward and
    backward, accumulates its gradient, and steps its Adam state: memory-bound work that a FLOPs-balanced split
    does not see.
    """
    return images(VGG16, batch, 200)


def vgg16_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`vgg16` on a batch of 32 (one of 4 microbatches is ``vgg16``'s whole batch)."""
    return vgg16(32)


class TextClassifier(nn.Module):
    """Token embedding (most of the parameters), 4 transformer encoder layers, layer norm, mean over tokens, a head."""

    def __init__(self, vocab: int = 65536, width: int = 128, layers: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.layers = nn.ModuleList([layer] + [copy.deepcopy(layer) for _ in range(layers - 1)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return F.cross_entropy(self.head(self.norm(h).mean(dim=1)), labels)


def text_classifier(batch: int = BATCH, vocab: int = 65536) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (tokens, labels))``: ``batch`` (8) sequences of 64 tokens of ``vocab`` and their classes, seeded."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, SEQ), generator=g)
    return TextClassifier(vocab=vocab).eval(), (tokens, torch.randint(0, 4, (batch,), generator=g))


def text_classifier_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`text_classifier` on a batch of 32."""
    return text_classifier(32)


def text_classifier_256k() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`text_classifier` (a batch of 8) with a vocabulary of 262,144 tokens (Gemma's, and the offload scenario's).

    The embedding (33.5 M parameters, 97 % of them) has no FLOPs, yet its dense gradient, made anew on every
    microbatch, and its Adam step cost as much as the layers on a small batch: the case where FLOPs mislead.
    """
    return text_classifier(BATCH, 262144)


def text_classifier_256k_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`text_classifier_256k` on a batch of 32."""
    return text_classifier(32, 262144)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion (unless ``expand`` is 1), 3x3 depthwise, 1x1 projection, each with a
    batch norm (ReLU6 after the first two); the input added back where the shape stays."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


#: MobileNetV2's block table (its paper's Table 2): expansion, output channels, repeats, first stride.
MOBILENET_V2_BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    """A 3x3 stem (stride 2), the 17 inverted residual blocks of :data:`MOBILENET_V2_BLOCKS`, a 1x1 convolution
    to 1280 channels, global average pooling, a linear classifier, cross-entropy."""

    def __init__(self, classes: int = 200) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())]
        c = 32
        for expand, c_out, repeats, stride in MOBILENET_V2_BLOCKS:
            for i in range(repeats):
                blocks.append(InvertedResidual(c, c_out, stride if i == 0 else 1, expand))
                c = c_out
        blocks.append(nn.Sequential(nn.Conv2d(c, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()))
        self.features = nn.ModuleList(blocks)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for layer in self.features:
            x = layer(x)
        return F.cross_entropy(self.classifier(x.mean(dim=(2, 3))), labels)


def mobilenet_v2(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (images, labels))``: ``batch`` (8) images of 3 x 64 x 64 and their classes (of 200), seeded."""
    return images(MobileNetV2, batch, 200)


def mobilenet_v2_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`mobilenet_v2` on a batch of 32."""
    return mobilenet_v2(32)


def mobilenet_v2_b128() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`mobilenet_v2` on a batch of 128 (MobileNets train on 96-256 images per device): its ops are small
    (depthwise), and a microbatch of 8 of ``mobilenet_v2_b32``'s 32 images runs at 60 % of the whole batch's rate
    on a CPU core, where one of 4 microbatches of 128 runs at its full rate."""
    return mobilenet_v2(128)


def transformers_model(model: str, config: str, fields: dict) -> nn.Module:
    """transformers' class ``model`` built from its class ``config`` of ``fields`` (no weights downloaded), the
    weights seeded (0), with its loss (:class:`graphs.models.corpus.LossOf`), in eval mode. Needs ``transformers``."""
    from graphs.models.corpus import LossOf, load_transformers

    tf = load_transformers()
    torch.manual_seed(0)
    return LossOf(getattr(tf, model)(getattr(tf, config)(**fields))).eval()


#: The small DeepSeek-V3 of :func:`deepseek_moe`: width 256, 6 layers of which the first 3 dense (DeepSeek-V3 has 3
#: of 61), multi-head latent attention, 16 routed experts of 256 (2 a token) and one shared, an 8192-token head.
DEEPSEEK_MOE = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=1024,
    moe_intermediate_size=256,
    num_hidden_layers=6,
    first_k_dense_replace=3,
    n_routed_experts=16,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=None,
    kv_lora_rank=64,
    qk_rope_head_dim=32,
    qk_nope_head_dim=32,
    v_head_dim=64,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def deepseek_moe(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (tokens, labels))``: :data:`DEEPSEEK_MOE` (transformers' ``DeepseekV3ForCausalLM``, its causal LM
    loss) on ``batch`` (8) sequences of 64 tokens, seeded, in eval mode. Needs ``transformers``."""
    from graphs.models.corpus import token_ids

    tokens = token_ids(1, batch, SEQ, DEEPSEEK_MOE["vocab_size"])
    return transformers_model("DeepseekV3ForCausalLM", "DeepseekV3Config", DEEPSEEK_MOE), (tokens, tokens.clone())


def deepseek_moe_b32() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`deepseek_moe` on a batch of 32."""
    return deepseek_moe(32)


#: T5 (transformers' ``T5ForConditionalGeneration``, not written here) shaped as T5-small is, 6 encoder and 6 decoder
#: layers, a 32,128-token vocabulary shared by the embedding and the head, at half its width (256) so that a step
#: fits a CPU core: the usual encoder-decoder, of equal depths, held out (chosen before any measurement on it).
T5_SMALL_SHAPED = dict(
    vocab_size=32128,
    d_model=256,
    d_kv=64,
    d_ff=1024,
    num_layers=6,
    num_decoder_layers=6,
    num_heads=4,
    dropout_rate=0.0,
    decoder_start_token_id=0,
    pad_token_id=0,
)


def t5(batch: int = BATCH, seq: int = 32) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (source tokens, target tokens))``: :data:`T5_SMALL_SHAPED` with its loss, on ``batch`` (8) pairs of
    ``seq`` (32) tokens, seeded, in eval mode. Needs ``transformers``."""
    from graphs.models.corpus import token_ids

    model = transformers_model("T5ForConditionalGeneration", "T5Config", T5_SMALL_SHAPED)
    vocab = T5_SMALL_SHAPED["vocab_size"]
    return model, (token_ids(1, batch, seq, vocab), token_ids(2, batch, seq, vocab))


#: GPT-2 (transformers' ``GPT2LMHeadModel``, not written here) shaped as GPT-2 small is, 12 layers and its
#: 50,257-token vocabulary shared by the embedding and the head, at a third of its width (256) so that a step fits a
#: CPU core: an LM with a large vocabulary head, held out (chosen before any measurement on it).
GPT2_SMALL_SHAPED = dict(
    vocab_size=50257,
    n_embd=256,
    n_layer=12,
    n_head=4,
    n_positions=1024,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=0,
    eos_token_id=0,
)


def gpt2(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (tokens, labels))``: :data:`GPT2_SMALL_SHAPED` with its causal LM loss, on ``batch`` (8) sequences
    of 64 tokens, seeded, in eval mode. Needs ``transformers``."""
    from graphs.models.corpus import token_ids

    tokens = token_ids(3, batch, SEQ, GPT2_SMALL_SHAPED["vocab_size"])
    return transformers_model("GPT2LMHeadModel", "GPT2Config", GPT2_SMALL_SHAPED), (tokens, tokens.clone())


__all__ = [
    "ConvNet",
    "DEEPSEEK_MOE",
    "EncoderDecoder",
    "GPT2_SMALL_SHAPED",
    "InvertedResidual",
    "MOBILENET_V2_BLOCKS",
    "MobileNetV2",
    "SmallLM",
    "T5_SMALL_SHAPED",
    "TextClassifier",
    "UNet",
    "convnet",
    "convnet_b32",
    "deepseek_moe",
    "deepseek_moe_b32",
    "encoder_decoder",
    "encoder_decoder_b32",
    "gpt2",
    "lm",
    "lm_b32",
    "mobilenet_v2",
    "mobilenet_v2_b128",
    "mobilenet_v2_b32",
    "t5",
    "text_classifier",
    "text_classifier_b32",
    "transformers_model",
    "unet",
    "unet_b32",
]
