"""NMT: an attentional encoder-decoder LSTM translation model (the paper's NMT).

Encoder and decoder are unrolled LSTM stacks of the same depth; the decoder
starts from the encoder's final states. At every target step the top decoder
output attends (Luong "general" attention) over all encoder outputs; the
attentional state goes through the output softmax over the target vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from graphs.models.lstm import LSTMStack


class Attention(nn.Module):
    """Luong attention: ``score(h, e) = h . W e``; returns ``tanh(W_c [context; h])``."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.key = nn.Linear(hidden_size, hidden_size, bias=False)
        self.combine = nn.Linear(2 * hidden_size, hidden_size, bias=False)

    def forward(self, queries: list[Tensor], memory: Tensor) -> list[Tensor]:
        keys = self.key(memory)  # [batch, src, hidden], once per sentence
        out = []
        for h in queries:
            scores = torch.bmm(keys, h.unsqueeze(2))  # [batch, src, 1]
            weights = torch.softmax(scores, dim=1)
            context = torch.bmm(weights.transpose(1, 2), memory).squeeze(1)
            out.append(torch.tanh(self.combine(torch.cat([context, h], dim=1))))
        return out


class NMT(nn.Module):
    def __init__(
        self,
        num_layers: int = 2,
        src_vocab: int = 40_000,
        tgt_vocab: int = 40_000,
        hidden_size: int = 1024,
    ) -> None:
        super().__init__()
        self.src_embedding = nn.Embedding(src_vocab, hidden_size)
        self.tgt_embedding = nn.Embedding(tgt_vocab, hidden_size)
        self.encoder = LSTMStack(hidden_size, hidden_size, num_layers)
        self.decoder = LSTMStack(hidden_size, hidden_size, num_layers)
        self.attention = Attention(hidden_size)
        self.softmax = nn.Linear(hidden_size, tgt_vocab)

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """``src`` [batch, src_len], ``tgt_in``/``tgt_out`` [batch, tgt_len] int64 -> mean loss."""
        enc_steps, states = self.encoder(list(self.src_embedding(src).unbind(1)))
        dec_steps, _ = self.decoder(list(self.tgt_embedding(tgt_in).unbind(1)), states)
        attended = self.attention(dec_steps, torch.stack(enc_steps, dim=1))
        logits = self.softmax(torch.stack(attended, dim=1))
        return nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())
