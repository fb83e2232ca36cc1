"""The conformance corpus: architectures people train today, built from configs with nothing downloaded.

Each entry builds ``(model, example_inputs)`` for one training step: the model's
forward returns its scalar loss, it is in ``eval()`` mode (dropout draws nothing,
so a placed model's loss and gradients can be compared with the unplaced one's),
its weights are seeded, and the batch (4) divides into 1, 2 or 4 microbatches.
Sizes are tiny, so the whole corpus runs on a 2-core CPU in a few minutes.

Hugging Face models need ``transformers`` (a test extra), imported only when
one of them is built: :func:`available` says which entries can be built here.
Nothing is downloaded: every model is built from its config class (with
``HF_HUB_OFFLINE=1`` unless it is set). :mod:`placer.gym.datasets` serves the
entries as placement problems (``corpus/<entry>``), and the conformance
benchmarks (:mod:`bench.conformance`, :mod:`bench.dist_conformance`) check them.
:func:`hf_model` builds a Hugging Face entry's bare model with config fields
overridden, and the builders take a batch, a length and such overrides: the
tests' tiny models (``tests/placer/hf_tiny.py``) are these, dropout off.

>>> sorted(FAMILIES)[:3]
['bart', 'bert', 'cnn_bn']
>>> model, inputs = build("rnn")
>>> model(*inputs).dim()
0
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SEQ, VOCAB = 4, 8, 96
Built = tuple[nn.Module, tuple]


class LossOf(nn.Module):
    """``model(**dict(zip(keys, inputs))).loss``: a Hugging Face model's training step (labels among the inputs)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...] = ("input_ids", "labels")) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.keys, inputs))).loss


def token_ids(seed: int, batch: int = BATCH, seq: int = SEQ, vocab: int = VOCAB) -> torch.Tensor:
    """``[batch, seq]`` token ids drawn from their own generator (the global RNG, which seeds the weights, is left
    alone)."""
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def load_transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from configs: nothing to download, nothing to ask the hub
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


# ------------------------------------------------------------- Hugging Face models
# Every entry's size, in the field names most Hugging Face configs share.
_LAYERS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
_TEXT = dict(_LAYERS, vocab_size=VOCAB, max_position_embeddings=64)
_DECODER = dict(_TEXT, num_key_value_heads=2)

#: Each Hugging Face entry's ``(config class, model class, config)``: what :func:`hf_model` builds.
HF_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(_DECODER, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_DECODER, sliding_window=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DECODER),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_DECODER, head_dim=8)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_DECODER, head_dim=8)),
    "phi": (
        "PhiConfig",
        "PhiForCausalLM",
        dict(_TEXT, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0),
    ),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _TEXT),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
            pad_token_id=1,
        ),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            _DECODER,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            decoder_sparse_step=1,
        ),
    ),
    "bert": ("BertConfig", "BertForMaskedLM", _TEXT),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(_TEXT, pad_token_id=1)),
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForMaskedLM",
        dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
    ),
    "vit": (
        "ViTConfig",
        "ViTForImageClassification",
        dict(_LAYERS, image_size=16, patch_size=4, num_channels=3, num_labels=10),
    ),
    "t5": (
        "T5Config",
        "T5ForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
    ),
    "bart": (
        "BartConfig",
        "BartForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
        ),
    ),
}
_CAUSAL_LMS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "gpt2", "gpt_neox", "opt", "mixtral", "qwen2_moe")


def hf_model(name: str, **overrides: Any) -> nn.Module:
    """Hugging Face entry ``name``'s bare model (no loss wrapper), its config's fields replaced by ``overrides``.

    The weights come from the global RNG: seed it first (:func:`build` does). Example: the GPT-2 entry with dropout
    off, for a model left in training mode: ``hf_model("gpt2", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)``.
    """
    config_cls, model_cls, config = HF_MODELS[name]
    tf = load_transformers()
    return getattr(tf, model_cls)(getattr(tf, config_cls)(**{**config, **overrides}))


def build_causal(name: str, batch: int = BATCH, seq: int = SEQ, **overrides: Any) -> Built:
    """Causal LM entry ``name`` (see :func:`hf_model`) with its loss on ``[batch, seq]`` tokens as inputs and
    labels."""
    ids = token_ids(1, batch, seq)
    return LossOf(hf_model(name, **overrides)), (ids, ids.clone())


def _causal(name: str) -> Callable[[], Built]:
    def build() -> Built:
        return build_causal(name)

    config_cls, model_cls, _ = HF_MODELS[name]
    build.__doc__ = f"A {model_cls} from a {config_cls} (causal LM loss on its inputs)."
    return build


_CAUSAL: dict[str, Callable[[], Built]] = {name: _causal(name) for name in _CAUSAL_LMS}


def build_bert(batch: int = BATCH, seq: int = SEQ, **overrides: Any) -> Built:
    """BERT masked LM: tied decoder weights, position-id buffers, a padded attention mask as input."""
    ids = token_ids(2, batch, seq)
    mask = torch.ones_like(ids)
    mask[1, seq // 2 :] = 0  # the second sequence is padded
    model = hf_model("bert", **overrides)
    return LossOf(model, ("input_ids", "attention_mask", "labels")), (ids, mask, ids.clone())


def build_roberta() -> Built:
    """RoBERTa masked LM (position ids from the padding, a learned embedding offset)."""
    ids = token_ids(3).clamp(min=2)
    return LossOf(hf_model("roberta")), (ids, ids.clone())


def build_distilbert() -> Built:
    """DistilBERT masked LM (sinusoidal-free, no token types)."""
    ids = token_ids(4)
    return LossOf(hf_model("distilbert")), (ids, ids.clone())


def build_vit(batch: int = BATCH, **overrides: Any) -> Built:
    """A vision transformer classifier: patch convolution, CLS token, position embeddings."""
    model = hf_model("vit", **overrides)
    side, labels = model.config.image_size, model.config.num_labels
    g = torch.Generator().manual_seed(5)
    pixels = torch.randn(batch, 3, side, side, generator=g)
    return LossOf(model, ("pixel_values", "labels")), (pixels, torch.randint(0, labels, (batch,), generator=g))


def build_t5(batch: int = BATCH, seq: int = SEQ, **overrides: Any) -> Built:
    """T5: shared embeddings, relative position buckets, decoder inputs shifted from the labels."""
    return LossOf(hf_model("t5", **overrides)), (token_ids(6, batch, seq), token_ids(7, batch, seq))


def build_bart() -> Built:
    """BART: learned positions, encoder-decoder cross attention, labels shifted into decoder inputs."""
    return LossOf(hf_model("bart")), (token_ids(8).clamp(min=3), token_ids(9).clamp(min=3))


# ------------------------------------------------------------- torch.nn
class _TokenModel(nn.Module):
    """Embedding -> body -> vocabulary head, cross-entropy against the next tokens."""

    def __init__(self, body: nn.Module, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.body = body
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.body(self.embed(tokens))
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


class _Seq2Seq(nn.Module):
    """``nn.Transformer`` over source and target tokens, a causal target mask, next-token loss."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.transformer = nn.Transformer(d, 4, 2, 2, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1] - 1, device=tgt.device)
        h = self.transformer(self.embed(src), self.embed(tgt[:, :-1]), tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), tgt[:, 1:].flatten())


class _Decoder(nn.Module):
    """``nn.TransformerDecoder`` attending to an encoded memory (a GPT-style stack with cross attention)."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        layer = nn.TransformerDecoderLayer(d, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, memory_tokens: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        h = self.decoder(self.embed(tokens), self.embed(memory_tokens), tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), tokens.roll(-1, dims=1).flatten())


def build_nn_transformer() -> Built:
    """``torch.nn.Transformer`` (encoder and decoder, batch first)."""
    return _Seq2Seq(), (token_ids(10), token_ids(11))


def build_nn_encoder() -> Built:
    """``torch.nn.TransformerEncoder`` (batch first, 2 layers), as in the failure seen on CUDA."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    ids = token_ids(12)
    return _TokenModel(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)), (ids, ids.roll(-1, dims=1))


def build_nn_decoder() -> Built:
    """``torch.nn.TransformerDecoder`` (pre-norm, causal mask, cross attention)."""
    return _Decoder(), (token_ids(13), token_ids(14))


class _ResNetBN(nn.Module):
    """A small residual CNN with batch norm (eval: running statistics), global pooling, a classifier."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
            )
            for _ in range(2)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.stem(images)
        for block in self.blocks:
            h = F.relu(h + block(h))
        return F.cross_entropy(self.head(h.mean(dim=(2, 3))), labels)


def build_cnn_bn() -> Built:
    """A residual CNN with batch norm."""
    g = torch.Generator().manual_seed(15)
    return _ResNetBN(), (torch.randn(BATCH, 3, 16, 16, generator=g), torch.randint(0, 10, (BATCH,), generator=g))


class _Recommender(nn.Module):
    """Embedding-heavy recommender (DLRM-like): sparse features through embedding bags, a dense MLP, dot
    interactions."""

    def __init__(self, tables: tuple[int, ...] = (500, 300, 200), d: int = 16, dense: int = 8) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(n, d, mode="sum") for n in tables)
        self.bottom = nn.Sequential(nn.Linear(dense, 32), nn.ReLU(), nn.Linear(32, d))
        pairs = (len(tables) + 1) * len(tables) // 2
        self.top = nn.Sequential(nn.Linear(d + pairs, 32), nn.ReLU(), nn.Linear(32, 1))
        self.tables = tables

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, clicks: torch.Tensor) -> torch.Tensor:
        feats = [self.bottom(dense)] + [bag(sparse[:, k] % n) for k, (bag, n) in enumerate(zip(self.bags, self.tables))]
        z = torch.stack(feats, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1)
        logit = self.top(torch.cat([feats[0], dots[:, i, j]], dim=1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(logit, clicks)


def build_recommender() -> Built:
    """An embedding-heavy recommender."""
    g = torch.Generator().manual_seed(16)
    dense = torch.randn(BATCH, 8, generator=g)
    sparse = torch.randint(0, 10_000, (BATCH, 3, 5), generator=g)
    clicks = torch.randint(0, 2, (BATCH,), generator=g).float()
    return _Recommender(), (dense, sparse, clicks)


def build_rnn() -> Built:
    """A 2-layer LSTM language model."""
    ids = token_ids(17)
    return _TokenModel(_LSTMBody()), (ids, ids.roll(-1, dims=1))


class _LSTMBody(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d, d, num_layers=2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


_OTHERS: dict[str, Callable[[], Built]] = {
    "bert": build_bert,
    "roberta": build_roberta,
    "distilbert": build_distilbert,
    "vit": build_vit,
    "t5": build_t5,
    "bart": build_bart,
    "nn_transformer": build_nn_transformer,
    "nn_encoder": build_nn_encoder,
    "nn_decoder": build_nn_decoder,
    "cnn_bn": build_cnn_bn,
    "recommender": build_recommender,
    "rnn": build_rnn,
}
FAMILIES: dict[str, Callable[[], Built]] = {**_CAUSAL, **_OTHERS}
#: Entries that need transformers (the rest are plain torch.nn).
NEEDS_TRANSFORMERS = frozenset(_CAUSAL) | {"bert", "roberta", "distilbert", "vit", "t5", "bart"}


def available() -> list[str]:
    """The entries that can be built here (the Hugging Face ones need ``transformers``)."""
    try:
        load_transformers()
        return list(FAMILIES)
    except ImportError:
        return [n for n in FAMILIES if n not in NEEDS_TRANSFORMERS]


def build(name: str) -> Built:
    """``(model, example_inputs)`` of corpus entry ``name``: seeded weights, ``eval()`` mode, float32."""
    if name not in FAMILIES:
        raise KeyError(f"unknown corpus entry {name!r} (known: {', '.join(FAMILIES)})")
    torch.manual_seed(0)
    model, inputs = FAMILIES[name]()
    return model.eval(), inputs
