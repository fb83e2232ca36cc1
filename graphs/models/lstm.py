"""An LSTM written as explicit per-time-step cells, so its export unrolls over time.

``nn.LSTM`` exports as a single ``aten.lstm`` op; the paper's graphs (TensorFlow,
static unrolling) had one cell per time step and layer, which is what lets a
placement pipeline layers across devices. Steps are passed between layers as a
list, so step ``t`` of layer ``l`` depends only on step ``t`` of layer ``l - 1``
and step ``t - 1`` of layer ``l``.

Example:
    >>> import torch
    >>> layer = LSTMLayer(4, 3)
    >>> hs, (h, c) = layer([torch.zeros(2, 4)] * 5)
    >>> len(hs), tuple(h.shape)
    (5, (2, 3))
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LSTMLayer(nn.Module):
    """One LSTM layer; ``forward`` runs the cell once per step of the input list."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size, bias=False)

    def cell(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        gates = self.ih(x) + self.hh(h)
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c

    def forward(self, steps: list[Tensor], state: tuple[Tensor, Tensor] | None = None):
        if state is None:
            zeros = steps[0].new_zeros(steps[0].shape[0], self.hidden_size)
            state = (zeros, zeros)
        h, c = state
        outputs = []
        for x in steps:
            h, c = self.cell(x, h, c)
            outputs.append(h)
        return outputs, (h, c)


class LSTMStack(nn.Module):
    """``num_layers`` stacked :class:`LSTMLayer`; returns top-layer steps and every layer's final state."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        sizes = [input_size] + [hidden_size] * (num_layers - 1)
        self.layers = nn.ModuleList(LSTMLayer(n, hidden_size) for n in sizes)

    def forward(self, steps: list[Tensor], states: list[tuple[Tensor, Tensor]] | None = None):
        finals = []
        for i, layer in enumerate(self.layers):
            steps, final = layer(steps, None if states is None else states[i])
            finals.append(final)
        return steps, finals
