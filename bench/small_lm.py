"""A small GPT-2 for plans across processes on CPU ranks: the zoo's GPT-2 (tied head) at 4 layers, width 256.

Batch 8 of 128 tokens, vocabulary 8192: a step takes tens to hundreds of milliseconds
on one CPU core, so two gloo ranks show what a pipeline split costs and gains::

    placer place bench.small_lm:build --cluster k80x2 --method gpipe -o lm.json
    placer run bench.small_lm:build --placement lm.json --cluster k80x2 --nproc-per-node 2 --json
"""

from __future__ import annotations

import torch

from graphs.models.gpt2 import GPT2

BATCH, STEPS, VOCAB = 8, 128, 8192


def build() -> tuple[GPT2, tuple[torch.Tensor, torch.Tensor]]:
    """``(model, (tokens, targets))``, seeded."""
    torch.manual_seed(0)
    model = GPT2(vocab_size=VOCAB, context=STEPS, width=256, layers=4, heads=4)
    tokens = torch.randint(0, VOCAB, (BATCH, STEPS), generator=torch.Generator().manual_seed(1))
    return model, (tokens, tokens.roll(-1, dims=1))
