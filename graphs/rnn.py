"""``nn.LSTM`` and ``nn.GRU`` written out as one op per layer and time step, so a placement can split them.

``torch.export`` keeps a recurrent layer as one ``aten.lstm`` / ``aten.gru`` op:
all its layers and steps on one device. While :func:`written_out` is active,
every ``nn.LSTM`` and ``nn.GRU`` of a model (exactly those classes, not
subclasses with a forward of their own) runs :func:`lstm_forward` /
:func:`gru_forward` instead: per layer and direction, one input projection over
the whole sequence, then per time step the recurrent projection and the gate
arithmetic. The parameters are the module's own, under their own names, so the
program's state dict is the model's; outputs and gradients are the fused
module's (up to float rounding). Packed sequences run the fused module.

>>> import torch
>>> lstm = torch.nn.LSTM(3, 4, num_layers=2, batch_first=True)
>>> x = torch.randn(2, 5, 3)
>>> with written_out(lstm):
...     out, (h, c) = lstm(x)
>>> torch.allclose(out, lstm(x)[0], atol=1e-6), tuple(h.shape)
(True, (2, 2, 4))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _cell_lstm(gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_hr: Any) -> tuple[torch.Tensor, torch.Tensor]:
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if w_hr is None else F.linear(h, w_hr)), c


def _cell_gru(x_gates: torch.Tensor, h_gates: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    x_r, x_z, x_n = x_gates.chunk(3, dim=-1)
    h_r, h_z, h_n = h_gates.chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return (1 - z) * n + z * h


def _weights(rnn: nn.RNNBase, layer: int, direction: int) -> dict[str, Any]:
    suffix = f"_l{layer}{'_reverse' if direction else ''}"
    return {
        name: getattr(rnn, f"{name}{suffix}", None)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
    }


def _run(rnn: nn.RNNBase, x: torch.Tensor, states: list[tuple], step: Callable) -> tuple[torch.Tensor, list[tuple]]:
    """All layers and directions over ``x`` [L, N, H]; ``states[k]``: layer*D+direction's initial state."""
    directions = 2 if rnn.bidirectional else 1
    finals: list[tuple] = []
    for layer in range(rnn.num_layers):
        outputs = []
        for direction in range(directions):
            w = _weights(rnn, layer, direction)
            x_gates = F.linear(x, w["weight_ih"], w["bias_ih"])  # every step's input projection at once
            state = states[layer * directions + direction]
            steps = range(x.shape[0] - 1, -1, -1) if direction else range(x.shape[0])
            out: list[Any] = [None] * x.shape[0]
            for t in steps:
                state = step(x_gates[t], state, w)
                out[t] = state[0]
            outputs.append(torch.stack(out))
            finals.append(state)
        x = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        if rnn.dropout and rnn.training and layer < rnn.num_layers - 1:
            x = F.dropout(x, rnn.dropout, training=True)
    return x, finals


def _lstm_step(x_gates: torch.Tensor, state: tuple, w: dict[str, Any]) -> tuple:
    h, c = state
    return _cell_lstm(x_gates + F.linear(h, w["weight_hh"], w["bias_hh"]), h, c, w["weight_hr"])


def _gru_step(x_gates: torch.Tensor, state: tuple, w: dict[str, Any]) -> tuple:
    (h,) = state
    return (_cell_gru(x_gates, F.linear(h, w["weight_hh"], w["bias_hh"]), h),)


def _sequence(rnn: nn.RNNBase, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``x`` as [L, N, H], and whether it came without a batch dimension."""
    unbatched = x.dim() == 2
    if unbatched:
        x = x.unsqueeze(1)
    elif rnn.batch_first:
        x = x.transpose(0, 1)
    return x, unbatched


def _initial(rnn: nn.RNNBase, x: torch.Tensor, hx: Any, size: int, unbatched: bool) -> torch.Tensor:
    layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
    if hx is None:
        return x.new_zeros(layers, x.shape[1], size)
    return hx.unsqueeze(1) if unbatched else hx


def _output(rnn: nn.RNNBase, y: torch.Tensor, unbatched: bool) -> torch.Tensor:
    if unbatched:
        return y.squeeze(1)
    return y.transpose(0, 1) if rnn.batch_first else y


def lstm_forward(self: nn.LSTM, input: Any, hx: Any = None) -> Any:
    """``nn.LSTM.forward`` written out per layer and step (see the module doc)."""
    if isinstance(input, nn.utils.rnn.PackedSequence):
        return nn.LSTM.forward(self, input, hx)
    x, unbatched = _sequence(self, input)
    out_size = self.proj_size or self.hidden_size
    h0 = _initial(self, x, None if hx is None else hx[0], out_size, unbatched)
    c0 = _initial(self, x, None if hx is None else hx[1], self.hidden_size, unbatched)
    y, finals = _run(self, x, [(h0[k], c0[k]) for k in range(h0.shape[0])], _lstm_step)
    h_n = torch.stack([h for h, _ in finals])
    c_n = torch.stack([c for _, c in finals])
    if unbatched:
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return _output(self, y, unbatched), (h_n, c_n)


def gru_forward(self: nn.GRU, input: Any, hx: Any = None) -> Any:
    """``nn.GRU.forward`` written out per layer and step (see the module doc)."""
    if isinstance(input, nn.utils.rnn.PackedSequence):
        return nn.GRU.forward(self, input, hx)
    x, unbatched = _sequence(self, input)
    h0 = _initial(self, x, hx, self.hidden_size, unbatched)
    y, finals = _run(self, x, [(h0[k],) for k in range(h0.shape[0])], _gru_step)
    h_n = torch.stack([h for (h,) in finals])
    return _output(self, y, unbatched), (h_n.squeeze(1) if unbatched else h_n)


class _WrittenOutLSTM(nn.LSTM):
    forward = lstm_forward


class _WrittenOutGRU(nn.GRU):
    forward = gru_forward


_WRITTEN_OUT = {nn.LSTM: _WrittenOutLSTM, nn.GRU: _WrittenOutGRU}


@contextlib.contextmanager
def written_out(model: nn.Module) -> Iterator[int]:
    """While active, every ``nn.LSTM`` / ``nn.GRU`` of ``model`` runs written out; yields how many there are.

    The modules' classes are swapped for the block and restored after it: nothing
    else about them changes (parameters, names, hooks).
    """
    swapped = [(m, type(m)) for m in model.modules() if type(m) in _WRITTEN_OUT]
    for m, cls in swapped:
        m.__class__ = _WRITTEN_OUT[cls]
    try:
        yield len(swapped)
    finally:
        for m, cls in swapped:
            m.__class__ = cls
