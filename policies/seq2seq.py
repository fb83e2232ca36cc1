"""The ColocRL policy (Mirhoseini et al., ICML 2017): an attentional seq2seq placer.

Items (co-location groups of ``graphs.grouping.coarsen``, or ops) are read in
topological order by a bidirectional LSTM; an LSTM decoder emits one device per
item. Its input at step t is the embedding of the device chosen at step t-1 (as in
the paper) concatenated with the encoder state of item t (so the decoder knows
which item it places; attention still sees all of them). Logits come from the
decoder state and an attention context, are divided by a temperature and
squashed to ``C * tanh(.)``.

Attention is multiplicative (Luong's "general" form, scaled by 1/sqrt(A)):
``score_g = (W_q h) . (W_k enc_g) / sqrt(A)``. The additive (Bahdanau) form
``v . tanh(W_k enc_g + W_q h)`` needs a ``[K, G, A]`` tensor per decoder step,
which made sampling and scoring linear in K with a large slope (nmt-2, 100 items,
one core: K=256 samples took 54x as long as one); the multiplicative score is
one batched matrix product per step (see BENCHMARKS.md, "Training throughput").

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

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from graphs import OpGraph
from policies.base import ItemPolicy, PolicySample, item_grouping
from policies.features import featurize


class Decoded(NamedTuple):
    """Devices per item for K samples, with their log-probabilities and entropies."""

    actions: torch.Tensor  # [K, G] int64
    log_prob: torch.Tensor  # [K]: sum over items
    entropy: torch.Tensor  # [K]: mean over items


@dataclass(frozen=True)
class DecoderOptions:
    """The seq2seq placer's sizes and logit squashing: the options the seq2seq and hierarchical policies share."""

    hidden: int = 64
    """LSTM units per direction (the paper: 256)."""
    layers: int = 1
    """encoder LSTM layers (the paper: 2)."""
    temperature: float = 10.0
    """logits are divided by this before ``tanh_c * tanh(.)``."""
    tanh_c: float = 5.0
    """C of ``C * tanh(logits / temperature)``."""

    @classmethod
    def pick(cls, options: Mapping[str, Any]) -> "DecoderOptions":
        """The decoder's options among a policy's keyword options (the others are the policy's own)."""
        return cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})


class Seq2SeqPlacer(nn.Module):
    """Encoder-decoder over a sequence of item vectors ``[G, in_dim]``."""

    def __init__(self, in_dim: int, num_devices: int, *, attention_dim: int | None = None, **options: Any) -> None:
        """``options``: the fields of :class:`DecoderOptions`."""
        super().__init__()
        o = DecoderOptions(**options)
        hidden, layers = o.hidden, o.layers
        a = attention_dim or max(hidden // 4, 8)
        self.num_devices = num_devices
        self.temperature = float(o.temperature)
        self.tanh_c = float(o.tanh_c)
        self.logit_noise = 0.0  # std of Gaussian noise on the logits while sampling (set by the trainer)
        self.encoder = nn.LSTM(in_dim, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        self.device_embed = nn.Embedding(num_devices + 1, hidden)  # index num_devices = "start"
        self.init_state = nn.Linear(2 * hidden, 2 * hidden)
        self.decoder = nn.LSTM(hidden + 2 * hidden, hidden, batch_first=True)
        self.attn_keys = nn.Linear(2 * hidden, a, bias=False)
        self.attn_query = nn.Linear(hidden, a)
        self.attn_scale = 1.0 / math.sqrt(a)
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
        """Sample ``k`` device sequences for items ``x`` (or score given ``actions`` [K, G]).

        ``x`` is ``[G, in_dim]``, the items every sample places, or ``[K, G, in_dim]``,
        one item sequence per sample (the hierarchical policy's K groupings): the
        encoder then reads the K sequences as one batch and sample ``k`` attends
        to its own encoding only.

        Sampling is sequential but needs no gradients: it runs without autograd.
        Log-probabilities and entropies are then computed by :meth:`score` in
        one teacher-forced pass (one ``nn.LSTM`` call and a batched attention),
        which is what gradients flow through, so sampled and re-scored
        log-probabilities are the same numbers by construction.
        """
        enc, keys = self._encode(x)
        if actions is None:
            with torch.no_grad():
                actions = self._sample(enc.detach(), keys.detach(), k, greedy, generator)
        logp, ent = self.score(enc, keys, actions)
        return Decoded(actions, logp, ent)

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() == 3:  # one sequence per sample
            enc, _ = self.encoder(x)  # [K, G, 2H]
            return enc, self.attn_keys(enc)  # [K, G, 2H], [K, G, A]
        enc, _ = self.encoder(x.unsqueeze(0))  # [1, G, 2H]
        enc = enc[0]
        return enc, self.attn_keys(enc)  # [G, 2H], [G, A]

    def _init_state(self, enc: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        h0, c0 = torch.tanh(self.init_state(enc.mean(dim=-2))).chunk(2, dim=-1)
        return h0.expand(k, -1).contiguous(), c0.expand(k, -1).contiguous()

    def _logits(self, h: torch.Tensor, enc: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``C * tanh(out([h ; attention context]) / T)`` for decoder states ``h [..., H]``.

        With per-sample items (``enc [K, G, 2H]``) ``h`` is ``[K, T, H]``.
        """
        query = self.attn_query(h) * self.attn_scale  # [..., A]
        score = query @ keys.transpose(-1, -2)  # [..., G] ([K, T, G] for per-sample keys [K, G, A])
        ctx = torch.softmax(score, dim=-1) @ enc  # [..., 2H]
        return self.tanh_c * torch.tanh(self.out(torch.cat([h, ctx], dim=-1)) / self.temperature)

    def _sample(
        self, enc: torch.Tensor, keys: torch.Tensor, k: int, greedy: bool, generator: torch.Generator | None
    ) -> torch.Tensor:
        # The decoder's input is [device embedding ; enc[t]]: both input
        # projections are computed once, outside the sequential loop, and the
        # loop itself is TorchScript (no Python overhead per item).
        hid = self.decoder.hidden_size
        w_dev, w_enc = self.decoder.weight_ih_l0.split([hid, 2 * hid], dim=1)
        enc_gates = enc @ w_enc.t() + self.decoder.bias_ih_l0 + self.decoder.bias_hh_l0  # [(K,) G, 4H]
        dev_gates = self.device_embed.weight @ w_dev.t()  # [D+1, 4H]
        h, c = self._init_state(enc, k)
        # one uniform per (item, sample), drawn up front: inverse-CDF sampling in the loop
        u = torch.rand(enc.shape[-2], k, generator=generator, device=enc.device)
        noisy = (
            self.logit_noise > 0 and not greedy
        )  # exploration noise (drawn only when used: same RNG stream otherwise)
        z = (
            self.logit_noise * torch.randn(enc.shape[-2], k, self.num_devices, generator=generator, device=enc.device)
            if noisy
            else u.new_zeros(0)
        )
        return _sample_loop(
            enc_gates,
            dev_gates,
            self.decoder.weight_hh_l0.t().contiguous(),
            h,
            c,
            enc,
            keys,
            self.attn_query.weight * self.attn_scale,
            self.attn_query.bias * self.attn_scale,
            self.out.weight,
            self.out.bias,
            self.temperature,
            self.tanh_c,
            greedy,
            u,
            z,
        )

    def score(self, enc: torch.Tensor, keys: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced log-probability (sum over items) and mean entropy of ``actions [K, G]``."""
        k, g = actions.shape
        start = torch.full((k, 1), self.num_devices, dtype=torch.long, device=actions.device)
        prev = torch.cat([start, actions[:, :-1]], dim=1)
        inp = torch.cat(
            [self.device_embed(prev), (enc if enc.dim() == 3 else enc.unsqueeze(0)).expand(k, -1, -1)], dim=2
        )
        h0, c0 = self._init_state(enc, k)
        states, _ = self.decoder(inp, (h0.unsqueeze(0), c0.unsqueeze(0)))  # [K, G, H]
        # attention over all steps at once, in chunks of steps to bound the [K, T, G] scores
        chunk = max(1, (1 << 24) // max(1, k * g * g))
        logits = torch.cat([self._logits(states[:, t : t + chunk], enc, keys) for t in range(0, g, chunk)], dim=1)
        logp_all = torch.log_softmax(logits, dim=2)
        logp = logp_all.gather(2, actions.unsqueeze(2)).squeeze(2).sum(dim=1)
        ent = -(logp_all.exp() * logp_all).sum(dim=2).mean(dim=1)
        return logp, ent


@torch.jit.script
def _sample_loop(
    enc_gates: torch.Tensor,
    dev_gates: torch.Tensor,
    w_hh: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    enc: torch.Tensor,
    keys: torch.Tensor,
    w_q: torch.Tensor,
    b_q: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
    temperature: float,
    tanh_c: float,
    greedy: bool,
    u: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """The decoder's sequential sampling loop (same maths as ``Seq2SeqPlacer._logits``).

    ``enc``/``keys``/``enc_gates`` are ``[G, .]`` (items shared by the K samples) or
    ``[K, G, .]`` (one item sequence per sample). ``noise`` is empty or ``[G, K, D]``,
    added to the logits of step t (exploration; the scored log-probabilities stay noise-free).
    """
    num_devices = dev_gates.shape[0] - 1
    per_sample = enc.dim() == 3
    prev = torch.full([h.shape[0]], num_devices, dtype=torch.long, device=h.device)
    chosen = []
    for t in range(enc.shape[-2]):
        if per_sample:
            gates = enc_gates[:, t] + dev_gates[prev] + h @ w_hh
        else:
            gates = enc_gates[t] + dev_gates[prev] + h @ w_hh
        i, f, gg, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        query = h @ w_q.t() + b_q  # [K, A], already scaled by 1/sqrt(A)
        if per_sample:
            score = torch.bmm(keys, query.unsqueeze(2)).squeeze(2)  # [K, G]
            ctx = torch.bmm(torch.softmax(score, dim=1).unsqueeze(1), enc).squeeze(1)
        else:
            score = query @ keys.t()
            ctx = torch.softmax(score, dim=1) @ enc
        logits = tanh_c * torch.tanh((torch.cat([h, ctx], dim=1) @ w_out.t() + b_out) / temperature)
        if noise.numel() > 0:
            logits = logits + noise[t]
        if greedy:
            prev = logits.argmax(dim=1)
        else:
            cdf = torch.softmax(logits, dim=1).cumsum(dim=1)
            prev = (cdf < u[t].unsqueeze(1)).sum(dim=1).clamp(max=num_devices - 1)
        chosen.append(prev)
    return torch.stack(chosen, dim=1)


class ItemEncoder(nn.Module):
    """Op-type embedding plus a linear map of the dense features, per item."""

    def __init__(self, vocab_size: int, dense_dim: int, *, type_dim: int = 16, out_dim: int = 64) -> None:
        super().__init__()
        type_dim = min(type_dim, out_dim // 2)
        self.type_embed = nn.Embedding(max(vocab_size, 1), type_dim)
        self.dense = nn.Linear(dense_dim, out_dim - type_dim)

    def forward(self, type_ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.type_embed(type_ids), torch.relu(self.dense(dense))], dim=1)


class Seq2SeqPolicy(ItemPolicy):
    """The paper's policy over the groups of ``graphs.grouping.coarsen(graph, max_groups)``.

    Args:
        graph: the op graph to place.
        num_devices: number of devices of the cluster.
        max_groups: items to place (co-location inside); 0 places every op.
        refine: optional device per op (the warm-start placement); groups are
            split where it changes device, so it can be imitated exactly.
        options: the decoder's :class:`DecoderOptions` (``hidden``, ``layers``,
            ``temperature``, ``tanh_c``); other keywords (the trainer passes every
            policy the same ones) are ignored.
    """

    name = "seq2seq"

    def __init__(
        self,
        graph: OpGraph,
        num_devices: int,
        *,
        max_groups: int = 256,
        refine: np.ndarray | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        decoder = DecoderOptions.pick(options)
        self.num_ops = graph.num_ops
        self.num_devices = num_devices
        self.grouping = item_grouping(graph, max_groups, refine)
        items = self.grouping.graph if self.grouping is not None else graph
        self.num_items = items.num_ops
        feats = featurize(items)
        self.register_buffer("type_ids", torch.from_numpy(feats.type_ids), persistent=False)
        self.register_buffer("dense", torch.from_numpy(feats.dense), persistent=False)
        self.items = ItemEncoder(len(feats.vocab), feats.dense_dim, out_dim=decoder.hidden)
        self.placer = Seq2SeqPlacer(decoder.hidden, num_devices, **asdict(decoder))

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
