"""The ColocRL policy (Mirhoseini et al., ICML 2017): an attentional seq2seq placer.

Items (co-location groups of ``graphs.grouping.coarsen``, or ops) are read in
topological order by a bidirectional LSTM; an LSTM decoder emits one device per
item. Its input at step t is the embedding of the device chosen at step t-1 (as in
the paper) concatenated with the encoder state of item t (so the decoder knows
which item it places; attention still sees all of them). Logits come from the
decoder state and a Bahdanau attention context, are divided by a temperature and
squashed to ``C * tanh(.)``.

Sizes: the paper used 2 x 256 LSTM units. The default here is one layer of 64
units per direction: on a 2-core CPU a 256-item decode with K=8 samples then takes
tens of milliseconds, and the simulator is the cheap part of an iteration, so a
small network gets several times more policy updates per second; pass
``hidden=256, layers=2`` for the paper's size (sensible on a GPU).

>>> import torch
>>> p = Seq2SeqPlacer(in_dim=4, num_devices=3, hidden=8)
>>> s = p.decode(torch.zeros(5, 4), k=2)
>>> s.actions.shape, s.log_prob.shape
(torch.Size([2, 5]), torch.Size([2]))
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from graphs import OpGraph
from policies.features import featurize


class Decoded(NamedTuple):
    """Devices per item for K samples, with their log-probabilities and entropies."""

    actions: torch.Tensor  # [K, G] int64
    log_prob: torch.Tensor  # [K]: sum over items
    entropy: torch.Tensor  # [K]: mean over items


class PolicySample(NamedTuple):
    """What a policy's ``sample`` returns.

    ``actions`` is everything ``log_prob`` needs to re-score the same samples;
    ``op_devices`` is the device index of every op, ``[K, num_ops]`` int32.
    """

    actions: dict[str, torch.Tensor]
    log_prob: torch.Tensor
    entropy: torch.Tensor
    op_devices: np.ndarray


class Seq2SeqPlacer(nn.Module):
    """Encoder-decoder over a sequence of item vectors ``[G, in_dim]``."""

    def __init__(
        self,
        in_dim: int,
        num_devices: int,
        *,
        hidden: int = 64,
        layers: int = 1,
        attention_dim: int | None = None,
        temperature: float = 10.0,
        tanh_c: float = 5.0,
    ) -> None:
        super().__init__()
        a = attention_dim or max(hidden // 2, 8)
        self.num_devices = num_devices
        self.temperature = float(temperature)
        self.tanh_c = float(tanh_c)
        self.encoder = nn.LSTM(in_dim, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        self.device_embed = nn.Embedding(num_devices + 1, hidden)  # index num_devices = "start"
        self.init_state = nn.Linear(2 * hidden, 2 * hidden)
        self.decoder = nn.LSTMCell(hidden + 2 * hidden, hidden)
        self.attn_keys = nn.Linear(2 * hidden, a, bias=False)
        self.attn_query = nn.Linear(hidden, a)
        self.attn_v = nn.Linear(a, 1, bias=False)
        self.out = nn.Linear(hidden + 2 * hidden, num_devices)

    def decode(
        self,
        x: torch.Tensor,
        k: int = 1,
        *,
        actions: torch.Tensor | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Decoded:
        """Sample ``k`` device sequences for items ``x`` (or score given ``actions`` [K, G])."""
        if actions is not None:
            k = actions.shape[0]
        g = x.shape[0]
        enc, _ = self.encoder(x.unsqueeze(0))  # [1, G, 2H]
        enc = enc[0]
        keys = self.attn_keys(enc)  # [G, A]
        # The decoder cell's input is [device embedding ; enc[t]]: both input
        # projections are computed once, outside the sequential loop.
        hid = self.decoder.hidden_size
        w_dev, w_enc = self.decoder.weight_ih.split([hid, 2 * hid], dim=1)
        enc_gates = enc @ w_enc.t() + self.decoder.bias_ih + self.decoder.bias_hh  # [G, 4H]
        dev_gates = self.device_embed.weight @ w_dev.t()  # [D+1, 4H]
        w_hh = self.decoder.weight_hh.t()
        h0, c0 = torch.tanh(self.init_state(enc.mean(dim=0))).chunk(2)
        h = h0.expand(k, -1)
        c = c0.expand(k, -1)
        prev = torch.full((k,), self.num_devices, dtype=torch.long, device=x.device)
        chosen, logps, ents = [], [], []
        for t in range(g):
            gates = enc_gates[t] + dev_gates[prev] + h @ w_hh
            i, f, gg, o = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
            h = torch.sigmoid(o) * torch.tanh(c)
            score = self.attn_v(torch.tanh(keys.unsqueeze(0) + self.attn_query(h).unsqueeze(1))).squeeze(2)  # [K, G]
            ctx = torch.softmax(score, dim=1) @ enc  # [K, 2H]
            logits = self.tanh_c * torch.tanh(self.out(torch.cat([h, ctx], dim=1)) / self.temperature)
            logp_all = torch.log_softmax(logits, dim=1)
            if actions is not None:
                a = actions[:, t]
            elif greedy:
                a = logits.argmax(dim=1)
            else:
                a = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
            chosen.append(a)
            logps.append(logp_all.gather(1, a.unsqueeze(1)).squeeze(1))
            ents.append(-(logp_all.exp() * logp_all).sum(dim=1))
            prev = a
        return Decoded(torch.stack(chosen, dim=1), torch.stack(logps, dim=1).sum(dim=1), torch.stack(ents, dim=1).mean(dim=1))


class ItemEncoder(nn.Module):
    """Op-type embedding plus a linear map of the dense features, per item."""

    def __init__(self, vocab_size: int, dense_dim: int, *, type_dim: int = 16, out_dim: int = 64) -> None:
        super().__init__()
        type_dim = min(type_dim, out_dim // 2)
        self.type_embed = nn.Embedding(max(vocab_size, 1), type_dim)
        self.dense = nn.Linear(dense_dim, out_dim - type_dim)

    def forward(self, type_ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.type_embed(type_ids), torch.relu(self.dense(dense))], dim=1)


def _grouping(graph: OpGraph, max_groups: int):
    """Co-location groups coarsened to at most ``max_groups`` (0: one item per op)."""
    if max_groups <= 0 or graph.num_ops <= 1:
        return None
    from graphs.grouping import coarsen

    return coarsen(graph, max_groups)


class Seq2SeqPolicy(nn.Module):
    """The paper's policy over the groups of ``graphs.grouping.coarsen(graph, max_groups)``.

    Args:
        graph: the op graph to place.
        num_devices: number of devices of the cluster.
        max_groups: items to place (co-location inside); 0 places every op.
        hidden: LSTM units per direction; layers: encoder layers.
        temperature, tanh_c: logits become ``tanh_c * tanh(logits / temperature)``.
    """

    name = "seq2seq"

    def __init__(
        self,
        graph: OpGraph,
        num_devices: int,
        *,
        max_groups: int = 256,
        hidden: int = 64,
        layers: int = 1,
        temperature: float = 10.0,
        tanh_c: float = 5.0,
        **_: Any,
    ) -> None:
        super().__init__()
        self.num_ops = graph.num_ops
        self.num_devices = num_devices
        self.grouping = _grouping(graph, max_groups)
        items = self.grouping.graph if self.grouping is not None else graph
        self.num_items = items.num_ops
        feats = featurize(items)
        self.register_buffer("type_ids", torch.from_numpy(feats.type_ids), persistent=False)
        self.register_buffer("dense", torch.from_numpy(feats.dense), persistent=False)
        self.items = ItemEncoder(len(feats.vocab), feats.dense_dim, out_dim=hidden)
        self.placer = Seq2SeqPlacer(hidden, num_devices, hidden=hidden, layers=layers, temperature=temperature, tanh_c=tanh_c)

    # ---------------------------------------------------------------- helpers
    def expand(self, item_devices: np.ndarray) -> np.ndarray:
        """Item devices ``[..., G]`` -> op devices ``[..., num_ops]`` (int32)."""
        if self.grouping is None:
            return np.asarray(item_devices, dtype=np.int32)
        return np.asarray(self.grouping.expand(np.asarray(item_devices)), dtype=np.int32)

    def contract(self, op_devices: np.ndarray) -> np.ndarray:
        """Op devices -> item devices, by majority vote inside each item."""
        op_devices = np.asarray(op_devices, dtype=np.int64)
        if self.grouping is None:
            return op_devices
        votes = np.zeros((self.num_items, self.num_devices))
        np.add.at(votes, (np.asarray(self.grouping.op_group, dtype=np.int64), op_devices), 1.0)
        return votes.argmax(axis=1)

    def _x(self) -> torch.Tensor:
        return self.items(self.type_ids, self.dense)

    # ------------------------------------------------------------- interface
    def sample(self, k: int, *, generator: torch.Generator | None = None) -> PolicySample:
        """K placements with their log-probabilities (differentiable) and entropies."""
        d = self.placer.decode(self._x(), k, generator=generator)
        return PolicySample({"devices": d.actions}, d.log_prob, d.entropy, self.expand(d.actions.cpu().numpy()))

    def log_prob(self, actions: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of given ``actions`` under the current parameters."""
        d = self.placer.decode(self._x(), actions=actions["devices"])
        return d.log_prob, d.entropy

    @torch.no_grad()
    def greedy(self) -> np.ndarray:
        """The most likely placement (argmax decoding), per op."""
        d = self.placer.decode(self._x(), 1, greedy=True)
        return self.expand(d.actions.cpu().numpy())[0]

    def imitation_loss(self, op_devices: np.ndarray) -> torch.Tensor:
        """Mean negative log-likelihood per item of a target placement (for a warm start)."""
        target = torch.as_tensor(self.contract(op_devices), device=self.dense.device).unsqueeze(0)
        return -self.log_prob({"devices": target})[0].mean() / self.num_items
