"""Fine-tuning with most weights frozen, as users do it: LoRA adapters from peft on models none of us wrote, and a
frozen backbone with a trainable head. Tiny, built from configs (nothing downloaded), each ``(loss module, inputs)``.

peft is not a dependency of placer: ``pip install peft`` to run these. From the repository root, with this folder on
``PYTHONPATH`` (``lora:<name>``)::

    PYTHONPATH=.:docs/lora placer compare lora:llama --cluster k80x4
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ranks", "zb"))
import others as zb  # noqa: E402  (docs/ranks/zb/others.py: tiny Hugging Face models from their configs)

#: Where each architecture's attention and MLP projections are named (peft's ``target_modules``).
TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "mistral": ["q_proj", "v_proj"],
}


def _lora(loss, inputs, targets, rank=4):
    """``loss``'s model wrapped by peft's LoRA on ``targets``: the base weights frozen, the adapters trainable."""
    import peft

    torch.manual_seed(0)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0, bias="none")
    loss.model = peft.get_peft_model(loss.model, config)
    # peft initialises B to zero (the adapted model starts as the base): give B values, so gradients reach A too
    with torch.no_grad():
        for name, p in loss.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    return loss, inputs


def llama():
    """A Llama with LoRA on every projection (q, k, v, o, gate, up, down), rank 4."""
    loss, inputs = zb._lm("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2)
    return _lora(loss, inputs, TARGETS["llama"])


def gpt2():
    """GPT-2 with LoRA on its fused attention, projections and MLP (Conv1D layers)."""
    loss, inputs = zb._lm("GPT2Config", "GPT2LMHeadModel", n_embd=32, n_layer=4, n_head=4, n_positions=64)
    return _lora(loss, inputs, TARGETS["gpt2"])


def mistral():
    """A Mistral with LoRA on the query and value projections only, rank 8 (the LoRA paper's choice)."""
    loss, inputs = zb._lm("MistralConfig", "MistralForCausalLM", num_key_value_heads=2)
    return _lora(loss, inputs, TARGETS["mistral"], rank=8)


def frozen_backbone():
    """A BERT classifier whose embeddings and first two layers are frozen: the rest and the head train."""
    loss, (ids, _) = zb._lm("BertConfig", "BertForSequenceClassification", num_labels=3)
    for module in (loss.model.bert.embeddings, *loss.model.bert.encoder.layer[:2]):
        module.requires_grad_(False)
    return loss, (ids, torch.randint(0, 3, (4,), generator=torch.Generator().manual_seed(2)))


MODELS = ("llama", "gpt2", "mistral", "frozen_backbone")


def _wide_llama(lora_on: bool):
    """A Llama wide enough for its matmuls to take milliseconds on a CPU core (hidden 512, 2 layers, batch 4 x 128),
    with LoRA on every projection or with every weight trainable: what ``placer profile`` times."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(1))
    loss, inputs = zb.Loss(model), (ids, ids.clone())
    return _lora(loss, inputs, TARGETS["llama"], rank=8) if lora_on else (loss, inputs)


def wide_lora():
    return _wide_llama(True)


def wide_full():
    return _wide_llama(False)
