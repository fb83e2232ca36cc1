"""Tiny Hugging Face models built from configs (no weights, no network) as ``module:callable`` sources.

The models are the conformance corpus's (:mod:`graphs.models.corpus`) at this file's batch and length, with
dropout off: each ``build_*`` returns ``(LossOf(model), inputs)``, left in training mode, so a placed model's
outputs and gradients equal the unplaced one's exactly. The wrapper's forward is the model's training loss, its
model is ``self.model`` (so ``--module model`` names it for ``placer export-map``). ``*_meta`` builds the same
model on the meta device, as one would an LLM that fits no single machine. transformers is imported inside the
builders: it is a test extra only.
"""

from __future__ import annotations

import torch

from graphs.models import corpus
from graphs.models.corpus import LossOf  # noqa: F401  (the wrapper every builder returns)

VOCAB, SEQ, BATCH = corpus.VOCAB, 12, 2
# The corpus's models are meant for eval(); these stay in training mode, so their dropout is set to 0.
_NO_DROPOUT = {
    "llama": dict(attention_dropout=0.0),
    "bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "t5": dict(dropout_rate=0.0),
    "vit": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}


def llama_model():
    """A tiny LlamaForCausalLM from its config (tied input and output embeddings)."""
    return corpus.hf_model("llama", **_NO_DROPOUT["llama"])


def build_llama():
    """A decoder LM (Llama: RMSNorm, rotary buffers, GQA, tied input/output embeddings)."""
    torch.manual_seed(0)
    return corpus.build_causal("llama", BATCH, SEQ, **_NO_DROPOUT["llama"])


def build_llama_meta():
    """The same Llama on the meta device: shapes, no weights."""
    with torch.device("meta"):
        model = llama_model()
    ids = corpus.token_ids(1, BATCH, SEQ)
    return LossOf(model), (ids, ids.clone())


def build_bert():
    """An encoder (BERT masked LM: tied decoder weights, position-id buffers, a padding attention mask as input)."""
    torch.manual_seed(0)
    return corpus.build_bert(BATCH, SEQ, **_NO_DROPOUT["bert"])


def build_t5():
    """An encoder-decoder (T5: shared embeddings, relative position buckets, decoder inputs shifted from labels)."""
    torch.manual_seed(0)
    return corpus.build_t5(BATCH, SEQ, **_NO_DROPOUT["t5"])


def build_vit():
    """A vision transformer (ViT image classifier: patch convolution, CLS token, position embeddings)."""
    torch.manual_seed(0)
    return corpus.build_vit(BATCH, image_size=32, patch_size=8, **_NO_DROPOUT["vit"])


def build_gpt2():
    """GPT-2 (library Conv1D layers, tied embeddings) in the README's wrapper: forward returns the loss."""
    model, (ids,) = build_gpt2_raw()
    return LossOf(model), (ids, ids.clone())


def build_gpt2_raw():
    """A bare GPT-2 LM (library Conv1D layers), no wrapper: its output is a ModelOutput (logits; no cache in
    training)."""
    torch.manual_seed(0)
    return corpus.hf_model("gpt2", **_NO_DROPOUT["gpt2"]), (corpus.token_ids(6, BATCH, SEQ),)
