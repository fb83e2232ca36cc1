"""The HDP policy (Mirhoseini et al., ICLR 2018): a learned grouper feeding a seq2seq placer.

The grouper is a feed-forward network (one hidden layer of 64 ELU units) that maps
each op's features to a softmax over ``num_groups`` groups. Each of the K
samples of a training step draws its own grouping and then its own placement of
that grouping's groups: each group is embedded as (op-type fractions, summed
output bytes / FLOPs / size, bytes sent to every other group), groups are read
in the order of their mean topological position (empty groups last), and the
seq2seq placer decodes the K group sequences as one batch. The joint
log-probability of a sample is ``log p(grouping_k) + log p(devices_k | grouping_k)``:
grouper and placer are trained together by the same policy gradient.

Why one grouping per sample: with one grouping shared by the K samples, its
log-probability is the same term in all K joint log-probabilities, so under a
reward baseline whose advantages sum to zero over the batch (leave-one-out, the
default) the grouper's policy gradient is exactly zero and the grouping never
learns. With K groupings each one is credited with its own sample's advantage.

Why ELU, not ReLU: the grouper's outputs are raw logits (no temperature), so its
early policy-gradient steps are large; on a two-chain graph with two groups all
16 ReLU units of the hidden layer died within 300 REINFORCE iterations (Adam,
lr 0.01), leaving a bias-only grouper that gives every op the same distribution
and cannot learn a grouping. ELU units cannot die (same graph: 5 of 5 seeds find
the optimal grouping within 400 iterations, against 2 of 5 with ReLU).

>>> from graphs.synthetic import random_dag
>>> p = HierarchicalPolicy(random_dag(40, seed=0), 3, num_groups=8, hidden=16)
>>> p.sample(2).op_devices.shape
(2, 40)
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import nn

from graphs import OpGraph
from graphs.grouping import default_num_groups, vote
from policies.base import PolicySample
from policies.features import featurize, group_features
from policies.seq2seq import DecoderOptions, Seq2SeqPlacer


class HierarchicalPolicy(nn.Module):
    """Grouper (per-op MLP -> softmax over groups) + seq2seq placer over groups.

    Args:
        graph: the op graph to place.
        num_devices: number of devices of the cluster.
        num_groups: groups the grouper may use (HDP's code default:
            :func:`graphs.grouping.default_num_groups`; ``max_groups`` is accepted as an alias).
        grouper_hidden: hidden (ELU) units of the grouper (64 in the paper).
        refine: optional device per op (the warm-start placement), given to the
            grouper as a one-hot feature per op (zeros without one). The grouper
            is a per-op network: from the graph features alone it could not tell
            which device a heuristic chose for an op (nmt-2, m_etf's placement:
            after 600 imitation steps the argmax grouping still put 214 of 2,383
            ops in a group of another device, and a sampled grouping ~270), so
            the imitated placement was lost; with the incumbent's device as an
            input it can group by it and learn to move ops away from it.
        options: the placer's :class:`policies.seq2seq.DecoderOptions` (``hidden``, ``layers``,
            ``temperature``, ``tanh_c``), as in ``Seq2SeqPolicy``; other keywords are ignored.
    """

    name = "hierarchical"

    def __init__(
        self,
        graph: OpGraph,
        num_devices: int,
        *,
        num_groups: int | None = None,
        max_groups: int | None = None,
        grouper_hidden: int = 64,
        refine: np.ndarray | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        g = num_groups or max_groups or default_num_groups(num_devices)
        self.num_groups = max(1, min(int(g), graph.num_ops))
        self.num_items = self.num_groups
        self.num_ops = graph.num_ops
        self.num_devices = num_devices
        self.graph = graph
        feats = featurize(graph)
        self.vocab_size = len(feats.vocab)
        self._type_ids_np = feats.type_ids
        self.register_buffer("type_ids", torch.from_numpy(feats.type_ids), persistent=False)
        incumbent = np.zeros((graph.num_ops, num_devices), dtype=np.float32)
        if refine is not None:
            incumbent[np.arange(graph.num_ops), np.asarray(refine, dtype=np.int64)] = 1.0
        self._incumbent = np.asarray(refine, dtype=np.int64) if refine is not None else None
        dense = np.concatenate([feats.dense, incumbent], axis=1)
        self.register_buffer("dense", torch.from_numpy(dense), persistent=False)
        self.type_embed = nn.Embedding(max(self.vocab_size, 1), 16)
        self.grouper = nn.Sequential(
            nn.Linear(16 + dense.shape[1], grouper_hidden), nn.ELU(), nn.Linear(grouper_hidden, self.num_groups)
        )
        in_dim = self.vocab_size + 3 + self.num_groups + num_devices  # + the incumbent's device shares per group
        self.placer = Seq2SeqPlacer(in_dim, num_devices, **asdict(DecoderOptions.pick(options)))

    # ---------------------------------------------------------------- helpers
    def _group_logp(self) -> torch.Tensor:
        x = torch.cat([self.type_embed(self.type_ids), self.dense], dim=1)
        return torch.log_softmax(self.grouper(x), dim=1)  # [N, G]

    def _group_inputs(self, groups: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Placer input rows (in placement order) and that order (group ids).

        ``groups`` is one grouping ``[N]`` (rows ``[G, F]``, order ``[G]``) or K
        groupings ``[K, N]`` (rows ``[K, G, F]``, orders ``[K, G]``).
        """
        if groups.ndim == 1:
            x, order = self._group_inputs(groups[None])
            return x[0], order[0]
        k, n = groups.shape
        gcount = self.num_groups
        flat = (groups + (np.arange(k, dtype=np.int64) * gcount)[:, None]).ravel()
        pos = np.bincount(flat, weights=np.tile(np.arange(n, dtype=np.float64), k), minlength=k * gcount).reshape(
            k, gcount
        )
        size = np.bincount(flat, minlength=k * gcount).reshape(k, gcount)
        mean_pos = np.where(size > 0, pos / np.maximum(size, 1), n + np.arange(gcount))  # empty groups last
        order = np.argsort(mean_pos, axis=1, kind="stable")
        feats = group_features(self.graph, groups, gcount, self._type_ids_np, self.vocab_size)  # [K, G, F]
        shares = np.zeros(
            (k, gcount, self.num_devices), dtype=np.float32
        )  # fraction of each group's ops per incumbent device
        if self._incumbent is not None:
            cell = flat * self.num_devices + np.tile(self._incumbent, k)
            shares = np.bincount(cell, minlength=k * gcount * self.num_devices).reshape(k, gcount, self.num_devices)
            shares = (shares / np.maximum(size, 1)[:, :, None]).astype(np.float32)
        feats = np.concatenate([feats, shares], axis=2)
        feats = np.take_along_axis(feats, order[:, :, None], axis=1)
        return torch.from_numpy(feats).to(self.dense.device), order

    @staticmethod
    def _to_ops(groups: np.ndarray, order: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """Devices in placement order [K, G] -> devices per op [K, N] (groupings [K, N], orders [K, G])."""
        k = len(order)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), axis=1)
        return np.asarray(devices, dtype=np.int32)[np.arange(k)[:, None], np.take_along_axis(rank, groups, axis=1)]

    def _joint(
        self, groups_t: torch.Tensor, devices: torch.Tensor | None, k: int, generator: torch.Generator | None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, np.ndarray]:
        """Score (or, with ``devices`` None, sample) placements of groupings ``groups_t [K, N]``."""
        logp_g = self._group_logp()  # [N, G]
        groups = groups_t.cpu().numpy()
        x, order = self._group_inputs(groups)
        d = self.placer.decode(x, k, actions=devices, generator=generator)
        grouping_logp = logp_g.gather(1, groups_t.t()).sum(dim=0)  # [K]: log p(grouping_k)
        grouping_ent = -(logp_g.exp() * logp_g).sum(dim=1).mean()  # mean per-op entropy (same for every k)
        actions = {"groups": groups_t, "devices": d.actions}
        return (
            actions,
            d.log_prob + grouping_logp,
            d.entropy + grouping_ent,
            self._to_ops(groups, order, d.actions.cpu().numpy()),
        )

    # ------------------------------------------------------------- interface
    def sample(self, k: int, *, generator: torch.Generator | None = None) -> PolicySample:
        """K (grouping, placement) samples, a grouping per sample; log-probs are joint.

        ``actions["groups"]`` is ``[K, num_ops]``, ``actions["devices"]`` ``[K, G]``
        (devices of the groups in sample k's placement order).
        """
        with torch.no_grad():
            probs = self._group_logp().exp()
            groups_t = torch.multinomial(probs, k, replacement=True, generator=generator).t().contiguous()  # [K, N]
        actions, logp, ent, op_devices = self._joint(groups_t, None, k, generator)
        return PolicySample(actions, logp, ent, op_devices)

    def log_prob(self, actions: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint log-probability and entropy of given groupings + placements (as ``sample`` returns them).

        ``actions["groups"]`` may also be one grouping ``[num_ops]`` shared by every row of ``devices``.
        """
        devices = actions["devices"]
        groups_t = actions["groups"]
        if groups_t.dim() == 1:
            groups_t = groups_t.unsqueeze(0).expand(devices.shape[0], -1)
        _, logp, ent, _ = self._joint(groups_t, devices, devices.shape[0], None)
        return logp, ent

    @torch.no_grad()
    def greedy(self) -> np.ndarray:
        """Most likely grouping, then the most likely placement of its groups."""
        groups = self._group_logp().argmax(dim=1).cpu().numpy()
        x, order = self._group_inputs(groups)
        d = self.placer.decode(x, 1, greedy=True)
        return self._to_ops(groups[None], order[None], d.actions.cpu().numpy())[0]

    def imitation_target(self, op_devices: np.ndarray) -> np.ndarray:
        """A grouping ``[num_ops]`` that expresses ``op_devices`` exactly: every group on one device.

        Each device gets a share of the ``num_groups`` groups proportional to its
        op count (at least one per used device); its ops, in topological order, are
        cut into that many contiguous chunks. (Chunking the topological order
        across devices, as before, put ops of several devices in one group, and
        the majority vote moved the rest: on nmt-2 the imitated m_etf placement
        lost about 30% of its quality, the reason the hierarchical warm start
        trailed seq2seq's.)
        """
        op_devices = np.asarray(op_devices, dtype=np.int64)
        counts = np.bincount(op_devices, minlength=self.num_devices)
        used = np.flatnonzero(counts)
        share = counts[used] * self.num_groups / max(len(op_devices), 1)
        alloc = np.maximum(1, np.floor(share).astype(np.int64))
        while alloc.sum() > self.num_groups:  # more used devices than groups can only happen with tiny num_groups
            alloc[np.argmax(alloc)] -= 1
        for j in np.argsort(-(share - np.floor(share)), kind="stable"):  # largest remainders first
            if alloc.sum() >= self.num_groups:
                break
            alloc[j] += 1
        alloc = np.minimum(alloc, counts[used])
        groups = np.empty(len(op_devices), dtype=np.int64)
        offset = 0
        for d, n_d in zip(used, alloc):
            ops = np.flatnonzero(op_devices == d)
            n_d = max(int(n_d), 1)
            groups[ops] = offset + (np.arange(len(ops)) * n_d) // len(ops)
            offset += n_d
        return np.minimum(groups, self.num_groups - 1)

    def imitation_loss(self, op_devices: np.ndarray, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """NLL of a target placement: the grouper's of :meth:`imitation_target`, the placer's of each group's device.

        The placer is fitted on two groupings, the target one and one the grouper
        samples now, each group labelled with the majority target device of its
        ops: fitted on the target grouping alone it mislabelled a quarter of the
        groups of the (slightly different) groupings the grouper then produced.
        """
        dev = np.asarray(op_devices, dtype=np.int64)
        key = dev.tobytes()
        if getattr(self, "_imitation", (None,))[0] != key:  # the same target every step: build it once
            target = self.imitation_target(dev)
            dev_of_group = np.full(self.num_groups, -1, dtype=np.int64)
            dev_of_group[target] = dev
            on_device = torch.as_tensor(dev_of_group[None, :] == dev[:, None], device=self.dense.device)  # [N, G]
            self._imitation = (key, torch.as_tensor(target, device=self.dense.device), on_device)
        groups_t, on_device = self._imitation[1], self._imitation[2]
        logp_g = self._group_logp()
        # what the placement needs: each op in a group of its target device (-> 0 once imitated); the exact
        # chunk's NLL shapes the gradient (contiguous chunks, not a random split of a device's ops) but is
        # left out of the value, so that imitate()'s "loss < warm_start_nll" test measures the placement's fit
        grouper_nll = -torch.logsumexp(logp_g.masked_fill(~on_device, float("-inf")), dim=1).mean()
        chunk_nll = -logp_g.gather(1, groups_t.unsqueeze(1)).mean()
        grouper_nll = grouper_nll + (chunk_nll - chunk_nll.detach())
        with torch.no_grad():
            drawn = torch.multinomial(logp_g.exp(), 1, generator=generator).t()
        groups = torch.cat([groups_t.unsqueeze(0), drawn]).cpu().numpy()  # [2, N]
        x, order = self._group_inputs(groups)
        target = np.take_along_axis(
            vote(groups, np.tile(dev, (2, 1)), self.num_groups, self.num_devices), order, axis=1
        )
        target_t = torch.as_tensor(target, device=self.dense.device)
        placer_nll = -self.placer.decode(x, 2, actions=target_t).log_prob.mean() / self.num_groups
        return grouper_nll + placer_nll
