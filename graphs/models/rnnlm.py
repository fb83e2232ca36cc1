"""RNNLM: a 2-layer LSTM language model (the paper's RNNLM benchmark).

Embedding -> 2 unrolled LSTM layers -> softmax over the vocabulary, trained
with next-token cross entropy.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from graphs.models.lstm import LSTMStack


class RNNLM(nn.Module):
    def __init__(self, vocab_size: int = 50_000, hidden_size: int = 2048, num_layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.lstm = LSTMStack(hidden_size, hidden_size, num_layers)
        self.softmax = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """``tokens``, ``targets``: [batch, steps] int64; returns the mean loss."""
        steps = list(self.embedding(tokens).unbind(1))
        outputs, _ = self.lstm(steps)
        logits = self.softmax(torch.stack(outputs, dim=1))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
