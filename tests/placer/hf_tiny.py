"""Tiny Hugging Face models built from configs (no weights, no network) as ``module:callable`` sources.

Each ``build_*`` returns ``(LossOf(model), inputs)``: the wrapper's forward is
the model's training loss, its model is ``self.model`` (so ``--module model``
names it for ``placer export-map``). Dropout is off, so a placed model's outputs
and gradients equal the unplaced one's exactly. ``*_meta`` builds the same model
on the meta device, as one would an LLM that fits no single machine.
transformers is imported inside the builders: it is a test extra only.
"""

from __future__ import annotations

import os

import torch

from graphs.models.corpus import LossOf  # noqa: F401  (the wrapper every builder returns)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, SEQ, BATCH = 96, 12, 2


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def llama_model():
    """A tiny LlamaForCausalLM from its config (tied input and output embeddings)."""
    tf = _quiet_transformers()
    cfg = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attention_dropout=0.0,
    )
    return tf.LlamaForCausalLM(cfg)


def build_llama():
    """A decoder LM (Llama: RMSNorm, rotary buffers, GQA, tied input/output embeddings)."""
    torch.manual_seed(0)
    ids = _ids(1)
    return LossOf(llama_model()), (ids, ids.clone())


def build_llama_meta():
    """The same Llama on the meta device: shapes, no weights."""
    with torch.device("meta"):
        model = llama_model()
    ids = _ids(1)
    return LossOf(model), (ids, ids.clone())


def build_bert():
    """An encoder (BERT masked LM: tied decoder weights, position-id buffers, a padding attention mask as input)."""
    tf = _quiet_transformers()
    torch.manual_seed(0)
    cfg = tf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ids = _ids(2)
    mask = torch.ones_like(ids)
    mask[1, SEQ // 2 :] = 0  # the second sequence is padded
    return LossOf(tf.BertForMaskedLM(cfg), ("input_ids", "attention_mask", "labels")), (ids, mask, ids.clone())


def build_t5():
    """An encoder-decoder (T5: shared embeddings, relative position buckets, decoder inputs shifted from labels)."""
    tf = _quiet_transformers()
    torch.manual_seed(0)
    cfg = tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return LossOf(tf.T5ForConditionalGeneration(cfg)), (_ids(3), _ids(4))


def build_vit():
    """A vision transformer (ViT image classifier: patch convolution, CLS token, position embeddings)."""
    tf = _quiet_transformers()
    torch.manual_seed(0)
    cfg = tf.ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    g = torch.Generator().manual_seed(5)
    return LossOf(tf.ViTForImageClassification(cfg), ("pixel_values", "labels")), (
        torch.randn(BATCH, 3, 32, 32, generator=g),
        torch.randint(0, 10, (BATCH,), generator=g),
    )


def build_gpt2():
    """GPT-2 (library Conv1D layers, tied embeddings) in the README's wrapper: forward returns the loss."""
    model, (ids,) = build_gpt2_raw()
    return LossOf(model), (ids, ids.clone())


def build_gpt2_raw():
    """A bare GPT-2 LM (library Conv1D layers), no wrapper: its output is a ModelOutput (logits; no cache in
    training)."""
    tf = _quiet_transformers()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return tf.GPT2LMHeadModel(cfg), (_ids(6),)
