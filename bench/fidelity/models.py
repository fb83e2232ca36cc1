"""The models the simulator's fidelity is measured on, at the sizes of the CPU and GPU checks.

Zoo architectures (``graphs.models``) at two sizes between the toy ones and the
zoo's own (``small``: CPU calibration, ``medium``: one GPU and its host), and two
Hugging Face architectures of the conformance corpus (``graphs.models.corpus``), Llama and
BERT, built from configs at the same two sizes (nothing downloaded; dropout 0, so a
placed model's gradients can be checked against the unplaced one's).

The simulator was tuned on :data:`TUNED`; the others are held out (:data:`HELD_OUT`):
figures quoted as the simulator's fidelity are the held-out models'.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphs import PlacerError

#: The models the simulator's rules and profiler were tuned on (the H200 runs of 2026-11-26).
TUNED = ("rnnlm", "nmt-2", "resnet50")
#: Held out: two zoo models and two architectures from outside the zoo (graphs.models.corpus families).
HELD_OUT = ("gpt2", "nmt-4", "llama", "bert")


def _nmt_entry(layers: int, vocab: int, hidden: int, batch: int, steps: int) -> tuple:
    """The zoo's NMT, ``layers`` deep, at a size: :func:`build`'s ``(module, class, kwargs, inputs)``."""
    kwargs = dict(num_layers=layers, src_vocab=vocab, tgt_vocab=vocab, hidden_size=hidden)
    return "graphs.models.nmt", "NMT", kwargs, ("tokens", batch, steps, vocab, 3)


def _hf_entry(
    family: str, vocab: int, hidden: int, ffn: int, layers: int, positions: int, batch: int, steps: int, **config: Any
) -> tuple:
    """A Hugging Face Llama or BERT at a size (4 heads; ``config``: the rest of its config): :func:`build`'s entry."""
    sizes = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers)
    config = dict(sizes, num_attention_heads=4, max_position_embeddings=positions, **config)
    return "hf", family, config, ("tokens", batch, steps, vocab, 2)


SMALL = {
    "rnnlm": (
        "graphs.models.rnnlm",
        "RNNLM",
        dict(vocab_size=2000, hidden_size=128, num_layers=2),
        ("tokens", 16, 10, 2000, 2),
    ),
    "nmt-2": _nmt_entry(2, vocab=2000, hidden=128, batch=16, steps=8),
    "nmt-4": _nmt_entry(4, vocab=2000, hidden=128, batch=16, steps=8),
    "gpt2": (
        "graphs.models.gpt2",
        "GPT2",
        dict(vocab_size=2000, context=64, width=128, layers=2, heads=4),
        ("tokens", 8, 64, 2000, 2),
    ),
    "resnet50": ("graphs.models.resnet", "ResNet50", dict(num_classes=100), ("images", 4, 64, 100)),
    "inception-v3": ("graphs.models.inception", "InceptionV3", dict(num_classes=100), ("images", 2, 299, 100)),
    "llama": _hf_entry(
        "llama", vocab=2000, hidden=64, ffn=128, layers=2, positions=64, batch=4, steps=32, num_key_value_heads=2
    ),
    "bert": _hf_entry("bert", vocab=2000, hidden=64, ffn=128, layers=2, positions=64, batch=4, steps=32),
}
# Between the toy sizes and the zoo's: steps of tens of ms on one GPU (host-bound eager launches) and of
# 0.1-0.3 s on a 16-core host, so that a placement's CPU/GPU split moves its step time.
MEDIUM = {
    "rnnlm": (
        "graphs.models.rnnlm",
        "RNNLM",
        dict(vocab_size=8000, hidden_size=512, num_layers=2),
        ("tokens", 32, 20, 8000, 2),
    ),
    "nmt-2": _nmt_entry(2, vocab=8000, hidden=512, batch=32, steps=15),
    "nmt-4": _nmt_entry(4, vocab=8000, hidden=512, batch=32, steps=15),
    "gpt2": (
        "graphs.models.gpt2",
        "GPT2",
        dict(vocab_size=8000, context=128, width=384, layers=4, heads=6),
        ("tokens", 8, 128, 8000, 2),
    ),
    "resnet50": ("graphs.models.resnet", "ResNet50", dict(num_classes=1000), ("images", 8, 128, 1000)),
    "inception-v3": ("graphs.models.inception", "InceptionV3", dict(num_classes=1000), ("images", 4, 299, 1000)),
    "llama": _hf_entry(
        "llama", vocab=8000, hidden=256, ffn=688, layers=4, positions=256, batch=8, steps=128, num_key_value_heads=2
    ),
    "bert": _hf_entry("bert", vocab=8000, hidden=256, ffn=1024, layers=4, positions=256, batch=8, steps=128),
}
SIZES = {"small": SMALL, "medium": MEDIUM}  # and "full": the zoo's own sizes


def _hf(family: str, config: dict[str, Any]) -> Any:
    """A Hugging Face Llama (causal LM) or BERT (masked LM) from a config, its loss as the output (dropout 0)."""
    from graphs.models.corpus import LossOf, load_transformers  # transformers loads only for these two

    tf = load_transformers()
    if family == "llama":
        return LossOf(tf.LlamaForCausalLM(tf.LlamaConfig(**config, attention_dropout=0.0, use_cache=False)))
    cfg = tf.BertConfig(**config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return LossOf(tf.BertForMaskedLM(cfg))


def build(name: str, size: str) -> tuple[Any, tuple]:
    """``(model, example_inputs)``: the zoo model (``size="full"``), or the architecture at a size of :data:`SIZES`."""
    import torch

    if size == "full":
        from graphs import zoo

        return zoo.build(name)
    module, cls, kwargs, spec = SIZES[size][name]
    torch.manual_seed(0)
    model = (_hf(cls, kwargs) if module == "hf" else getattr(importlib.import_module(module), cls)(**kwargs)).train()
    gen = torch.Generator().manual_seed(0)
    if spec[0] == "tokens":
        _, batch, steps, vocab, count = spec
        return model, tuple(torch.randint(0, vocab, (batch, steps), generator=gen) for _ in range(count))
    _, batch, side, classes = spec
    return model, (torch.randn(batch, 3, side, side, generator=gen), torch.randint(0, classes, (batch,), generator=gen))


def model_names(text: str, size: str, option: str = "--models", *, empty_ok: bool = False) -> list[str]:
    """The comma-separated model names of ``option``, each one :func:`build` knows at ``size``; else PlacerError (one
    line)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    known = set(SIZES[size]) if size in SIZES else set(zoo_names())
    unknown = [m for m in names if m not in known]
    if unknown or (not names and not empty_ok):
        raise PlacerError(f"{option}: {', '.join(unknown) or 'none given'}: not one of {', '.join(sorted(known))}")
    return names


def zoo_names() -> list[str]:
    from graphs import zoo

    return list(zoo.names())
