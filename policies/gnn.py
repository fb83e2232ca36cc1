"""A graph-network placement policy (``--policy gnn``): one set of weights for any graph and cluster.

The seq2seq and hierarchical policies have an output layer of ``num_devices``
logits and an op-type vocabulary built from the graph at hand, so their weights
only fit the graph and cluster they were trained on. This policy's weights fit
every graph and every cluster, which is what pretraining (``placer pretrain``)
and zero-shot placement (``placer place --method learned``) need:

* **Nodes** are described by size-independent features: the per-op output
  shapes and standardised log FLOPs/bytes/degree columns of
  :mod:`policies.features`, an op-type bucket (a stable hash of the base op name,
  so unseen op types still get an embedding), and cluster-relative columns: the
  op's share of the graph's compute and memory, where it starts and ends on the
  compute-weighted critical path (0..1), how long its output takes to send
  compared with computing it, and how the whole graph's memory compares with one
  GPU's. Nothing depends on the order of the ops (tested): the topological
  position features of :mod:`policies.features` are left out.
* **Message passing** over the op DAG in both directions: per round, forward
  messages ``relu(W_f [h_src ; e])`` are averaged at the consumer and backward
  messages ``relu(W_b [h_dst ; e])`` at the producer, where ``e`` describes the
  edge's bytes (log bytes and transfer-vs-compute time); a residual update with
  the graph's mean embedding and a LayerNorm follows.
* **Devices** are rows of features, not output indices: kind, log compute rate,
  memory bandwidth, memory, launch overhead, mean link bandwidth/latency to the
  other devices, the device's rank among devices of its kind (0..1) and how
  many there are, and how the graph's memory and compute compare with it. The
  rank is what lets identical GPUs be told apart; because it is normalised, a
  policy trained on 4 GPUs maps "first quarter of the critical path -> first
  GPU" onto 2 or 8 GPUs as well.
* **Logits** ``[num_ops, num_devices]``: an MLP over node embedding + device
  embedding + per-(op, device) features (the op's time on that device relative
  to its fastest, and the op's critical-path position minus the device's rank),
  capped at ``logit_cap * tanh(x / logit_cap)``.
* **Decoders** (``decoder``, recorded in a policy file's architecture):

  - ``schedule`` (the default): the ops are decided one at a time in a
    canonical topological order, K placements side by side, and the output
    layer also sees where the earlier decisions went: per device, how much
    later the op would finish there than on its best device in a list schedule
    of the ops placed so far, the share of its input bytes already there, the
    memory in use and the queue length (:mod:`policies.list_schedule`). One
    wrong decision no longer scatters: the next ops see where their inputs went.
    Sampling is a numpy loop over the ops; one batched pass then recomputes the
    log-probabilities of the K placements with gradients. Imitation uses
    teacher forcing along the label and, for a share of steps, along the
    policy's own samples (DAgger), without which greedy decoding follows its
    first mistake to the end (``bench/probe_imitation.py --decoder``).
  - ``independent``: every op from its own logits, K placements in one
    vectorised draw. Measured on inception-v3/k80x4 and nmt-2/k80x4 by
    imitation of one label: a greedy placement that agrees with the label on
    62% of the ops is slower than one GPU, and on nmt-2 it never gets closer
    than 13% to the label, where the schedule decoder reaches it
    (BENCHMARKS.md, "What one graph needs").

**Items.** By default every op is an item (``placer pretrain`` and ``placer place
--method learned``). With ``max_groups`` the policy places the groups of
``graphs.grouping.coarsen`` instead, reading the group graph as it would any
graph, and its placements are expanded to the ops; ``placer train`` does this
(``--max-groups``, default ``min(256, 20 x devices)``). On nmt-2 (2,383 ops,
k80x4) a decode of 8 samples then takes 0.06 s instead of 0.8 s, and a 300 s
fine-tune from a pretrained policy (no warm start) makes 4,487 iterations
instead of 356 (BENCHMARKS.md, "Fine-tuning from the pretrained policy").
Zero-shot placement decodes both (:func:`placer.methods.learned.place_learned`).

Why plain torch and not torch_geometric: one message-passing round is two
``index_add_`` calls over an edge list (a mean aggregation), and that is all
this policy needs. torch_geometric is not installed here; as a dependency it
would bring compiled companion wheels (torch-scatter/torch-sparse) pinned to
exact torch versions, for no speed gain on graphs of 100-20,000 ops on a CPU
(one forward on nmt-4, 4,425 ops, takes tens of milliseconds either way).

>>> import envs
>>> from graphs.synthetic import random_dag
>>> p = GNNPolicy(random_dag(30, seed=0), 3, cluster=envs.resolve_cluster("k80x2"), hidden=16)
>>> s = p.sample(4)
>>> s.op_devices.shape, s.log_prob.shape
((4, 30), torch.Size([4]))
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import nn

from envs.sim.cost import op_times
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph, PlacerError
from graphs.dag import top_level
from policies.base import ItemPolicy, PolicySample, item_grouping
from policies.gnn_features import (
    DEVICE_DIM,
    EDGE_DIM,
    FEATURE_VERSION,
    NODE_DIM,
    PAIR_DIM,
    TYPE_BUCKETS,
    TYPE_DIM,
    feature_spec,
    graph_inputs,
)
from policies.list_schedule import DYN_DIM, ListSchedule, decode_order, teacher_forced

__all__ = ["DECODERS", "FEATURE_VERSION", "GNNNet", "GNNPolicy", "feature_spec", "switch_weights", "switches"]

#: Placement decoders: every op independently given its logits, or one op at a time along a list schedule.
DECODERS = ("independent", "schedule")


def switches(share: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``[K, N]``: the items that have inputs and whose ``target`` device holds fewer of their bytes than another.

    ``share`` ``[K, N, D]``: the share of each item's input bytes already on each device where it is decided.
    """
    share = np.asarray(share, dtype=np.float64)
    at_target = share[:, np.arange(share.shape[1]), np.asarray(target)]  # [K, N]
    return (share.sum(axis=2) > 0) & (at_target < share.max(axis=2))


def switch_weights(switch: np.ndarray, switch_share: float) -> np.ndarray:
    """Per-item loss weights ``[K, N]`` that give the switches ``switch`` ``[K, N]`` ``switch_share`` of each row's
    weight.

    A *switch* (:func:`switches`) is an item that has inputs and whose target device is not
    the one holding most of them: the decisions that make a placement what it is, where
    following the data would be wrong. Switches are weighted up, never down: a row with
    few enough of them, or none, keeps equal weights.

    >>> share = np.array([[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])  # item 3 has no inputs
    >>> switch_weights(switches(share, np.array([0, 0, 1, 1])), 0.5).tolist()  # item 2 is the only switch
    [[1.0, 1.0, 3.0, 1.0]]
    """
    switch = np.asarray(switch, dtype=bool)
    n_s = switch.sum(axis=1, keepdims=True).astype(np.float64)
    n_o = switch.shape[1] - n_s
    s = min(max(float(switch_share), 0.0), 0.99)
    scale = np.where(n_s > 0, s * n_o / ((1.0 - s) * np.maximum(n_s, 1.0)), 1.0)
    return np.where(switch, np.maximum(scale, 1.0), 1.0)


class GNNNet(nn.Module):
    """The weights: node encoder, ``rounds`` of bidirectional message passing, device encoder, pair scorer."""

    def __init__(
        self, *, hidden: int = 64, rounds: int = 3, logit_cap: float = 10.0, decoder: str = "schedule"
    ) -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise PlacerError(f"--policy gnn: unknown decoder {decoder!r} (one of {', '.join(DECODERS)})")
        h = hidden
        self.logit_cap = float(logit_cap)
        self.decoder = decoder
        self.type_embed = nn.Embedding(TYPE_BUCKETS, TYPE_DIM)
        self.node_in = nn.Sequential(nn.Linear(NODE_DIM + TYPE_DIM, h), nn.ReLU(), nn.Linear(h, h))
        self.fwd_msg = nn.ModuleList(nn.Linear(h + EDGE_DIM, h) for _ in range(rounds))
        self.bwd_msg = nn.ModuleList(nn.Linear(h + EDGE_DIM, h) for _ in range(rounds))
        self.update = nn.ModuleList(nn.Linear(4 * h, h) for _ in range(rounds))
        self.norm = nn.ModuleList(nn.LayerNorm(h) for _ in range(rounds))
        self.dev_in = nn.Sequential(nn.Linear(DEVICE_DIM + h, h), nn.ReLU(), nn.Linear(h, h))
        self.score_node = nn.Linear(h, h)
        self.score_dev = nn.Linear(h, h, bias=False)
        self.score_pair = nn.Linear(PAIR_DIM, h, bias=False)
        self.score_out = nn.Linear(h, 1)
        if decoder == "schedule":
            self.score_dyn = nn.Linear(DYN_DIM, h, bias=False)

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits ``[num_ops, num_devices]`` of the independent decoder (no decoding-state features)."""
        return self.head(self.static_scores(x))

    def head(self, a: torch.Tensor, dyn: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from static scores ``a`` ``[..., D, h]`` plus, for the schedule decoder, features ``dyn`` ``[..., D,
        DYN_DIM]``."""
        if dyn is not None:
            a = a + self.score_dyn(dyn)
        logits = self.score_out(torch.relu(a)).squeeze(-1)
        return self.logit_cap * torch.tanh(logits / self.logit_cap)

    def static_scores(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        """The (op, device) scores before the output layer, ``[num_ops, num_devices, hidden]``."""
        h = self.node_in(torch.cat([x["node"], self.type_embed(x["type_ids"])], dim=1))
        src, dst, e = x["edge_src"], x["edge_dst"], x["edge"]
        n = h.shape[0]
        indeg = (
            torch.zeros(n, device=h.device)
            .index_add_(0, dst, torch.ones_like(dst, dtype=h.dtype))
            .clamp(min=1)[:, None]
        )
        outdeg = (
            torch.zeros(n, device=h.device)
            .index_add_(0, src, torch.ones_like(src, dtype=h.dtype))
            .clamp(min=1)[:, None]
        )
        for fwd, bwd, upd, norm in zip(self.fwd_msg, self.bwd_msg, self.update, self.norm):
            m_f = torch.relu(fwd(torch.cat([h[src], e], dim=1)))
            m_b = torch.relu(bwd(torch.cat([h[dst], e], dim=1)))
            agg_f = torch.zeros_like(h).index_add_(0, dst, m_f) / indeg
            agg_b = torch.zeros_like(h).index_add_(0, src, m_b) / outdeg
            g = h.mean(dim=0, keepdim=True).expand(n, -1)
            h = norm(h + torch.relu(upd(torch.cat([h, agg_f, agg_b, g], dim=1))))
        pooled = h.mean(dim=0, keepdim=True)
        dev = self.dev_in(torch.cat([x["device"], pooled.expand(x["device"].shape[0], -1)], dim=1))
        return self.score_node(h)[:, None, :] + self.score_dev(dev)[None, :, :] + self.score_pair(x["pair"])


class GNNPolicy(ItemPolicy):
    """The trainer's policy interface (see :class:`policies.seq2seq.Seq2SeqPolicy`) over a :class:`GNNNet`.

    Args:
        graph: the op graph to place. The network reads it with every parameter read by
            several ops as an edge from its owner to each other reader
            (:func:`envs.sim.sim_graph.schedule_graph`): splitting them costs a copy.
        num_devices: must equal ``cluster.num_devices``.
        cluster: the :class:`envs.Cluster` (required: devices are described by its features).
        max_groups: 0 (the default): every op is an item. Otherwise the items are the
            groups of ``graphs.grouping.coarsen(graph, max_groups)``, and the network
            runs on the group graph, which it reads like any other graph: its
            features do not depend on the graph's size. ``placer train`` places
            groups (``--max-groups``), which makes a decode tens of times
            faster on a graph of thousands of ops.
        grouping: a :class:`graphs.grouping.Grouping` of ``envs.sim.sim_graph.schedule_graph(graph)``
            whose groups are the items instead (``max_groups`` is then ignored), such as
            :func:`graphs.module_tree.module_grouping`'s.
        refine: with ``max_groups`` or ``grouping``, a device per op (the warm-start placement);
            groups are split where it changes device, so it can be imitated exactly.
        hidden, rounds, logit_cap, decoder: the network's architecture (ignored when ``net`` is given).
        net: an existing :class:`GNNNet` to share (pretraining builds one policy per graph and cluster over one net).

    With ``decoder="schedule"`` (:mod:`policies.list_schedule`) the ops are decided
    one at a time, K placements side by side: sampling is a loop over the ops in
    numpy (no autograd), then one batched pass recomputes the log-probabilities of
    the sampled placements from the recorded decoding features, with gradients.
    """

    name = "gnn"

    def __init__(
        self,
        graph: OpGraph,
        num_devices: int,
        *,
        cluster: Any = None,
        max_groups: int = 0,
        grouping: Any = None,
        refine: np.ndarray | None = None,
        hidden: int = 64,
        rounds: int = 3,
        logit_cap: float = 10.0,
        decoder: str = "schedule",
        net: GNNNet | None = None,
        **_: Any,
    ) -> None:
        super().__init__()

        if cluster is None:
            raise PlacerError("--policy gnn: needs the cluster (its devices are described by their features)")
        if cluster.num_devices != num_devices:
            raise PlacerError(
                f"--policy gnn: {num_devices} devices, but cluster {cluster.name} has {cluster.num_devices}"
            )
        # the network reads the graph the simulator schedules: a parameter read by several ops is an edge
        # from its owner to each other reader (placing them apart copies it), as it is a cost
        graph = schedule_graph(graph)
        if grouping is None:
            self.grouping = item_grouping(graph, int(max_groups or 0), refine)
        else:
            if grouping.source_hash != graph.content_hash:
                raise PlacerError("--policy gnn: the grouping was not built on this graph's schedule_graph")
            self.grouping = grouping.refined(graph, refine) if refine is not None else grouping
        items = self.grouping.graph if self.grouping is not None else graph
        self.num_ops, self.num_items = graph.num_ops, items.num_ops
        self.num_devices = num_devices
        self.net = (
            net if net is not None else GNNNet(hidden=hidden, rounds=rounds, logit_cap=logit_cap, decoder=decoder)
        )
        self.graph, self.cluster = items, cluster  # the graph the network reads and decodes: ops, or groups
        self._forced: dict[bytes, torch.Tensor] = {}  # decoding features along given placements (labels, samples)
        for key, arr in graph_inputs(self.graph, cluster).items():
            self.register_buffer(f"x_{key}", torch.from_numpy(arr), persistent=False)

    @property
    def sequential(self) -> bool:
        return self.net.decoder == "schedule"

    def _inputs(self) -> dict[str, torch.Tensor]:
        return {k[2:]: v for k, v in self.named_buffers() if k.startswith("x_")}

    def log_probs(self) -> torch.Tensor:
        """Per-item log-probabilities over devices, ``[num_items, num_devices]`` (independent decoder only)."""
        if self.sequential:
            raise PlacerError("the schedule decoder's probabilities depend on the ops decided before; use log_prob")
        return torch.log_softmax(self.net(self._inputs()), dim=1)

    def _dyn(self, op_devices: np.ndarray) -> torch.Tensor:
        """Decoding features along placements ``[K, N]`` (cached: labels and samples are scored again)."""
        arr = np.ascontiguousarray(np.atleast_2d(op_devices), dtype=np.int64)
        hit = self._forced.get(self._key(arr))
        if hit is None:
            hit = torch.from_numpy(teacher_forced(self.graph, self.cluster, arr, times=self._times, order=self._order))
            hit = hit.to(self.x_node.device)
            self._remember(arr, hit)
        return hit

    @functools.cached_property
    def _times(self) -> np.ndarray:
        """Forward + backward seconds of every op on every device (the list schedule's op times)."""
        fwd, bwd = op_times(self.graph, self.cluster)
        return fwd + bwd

    @functools.cached_property
    def _order(self) -> np.ndarray:
        """The schedule decoder's op order (:func:`policies.list_schedule.decode_order`)."""
        return decode_order(self.graph, top_level(self.graph, self._times.min(axis=1)))

    def _logp_along(self, op_devices: np.ndarray) -> torch.Tensor:
        """``[K, N, D]`` log-probabilities each op had, given the placements' earlier decisions."""
        if not self.sequential:
            return self.log_probs()[None]
        logits = self.net.head(self.net.static_scores(self._inputs())[None], self._dyn(op_devices))
        return torch.log_softmax(logits, dim=2)

    def _score(self, logp: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of each placement ``[K]`` and the mean per-op entropy, from ``logp`` ``[K or 1, N, D]``."""
        k = actions.shape[0]
        logp = logp.expand(k, -1, -1)
        lp = logp.gather(2, actions[:, :, None]).squeeze(2).sum(dim=1)  # [K]
        ent = -(logp.exp() * logp).sum(dim=2).mean(dim=1)
        return lp, ent

    @torch.no_grad()
    def _decode(self, k: int, noise: np.ndarray | None) -> np.ndarray:
        """The schedule decoder's loop: K placements (argmax of logits + Gumbel ``noise`` ``[K, N, D]``, or greedy).

        The decoding features it saw are cached, so scoring the placements again does not rerun the loop.
        """
        net = self.net
        a = net.static_scores(self._inputs()).cpu().numpy().astype(np.float64)  # [N, D, h]
        w_dyn = net.score_dyn.weight.detach().cpu().numpy().astype(np.float64).T  # [DYN, h]
        w_out = net.score_out.weight.detach().cpu().numpy().astype(np.float64)[0]  # [h]
        b_out = float(net.score_out.bias.detach())
        cap = net.logit_cap
        sched = ListSchedule(self.graph, self.cluster, k, times=self._times, order=self._order)
        out = np.zeros((k, self.num_items), dtype=np.int64)
        feats = np.zeros((k, self.num_items, self.num_devices, DYN_DIM), dtype=np.float32)
        for v in sched.order:
            v = int(v)
            feats[:, v] = sched.features(v)
            f = feats[:, v].astype(np.float64)
            z = np.maximum(a[v][None] + f @ w_dyn, 0.0) @ w_out + b_out  # [K, D]
            z = cap * np.tanh(z / cap)
            if noise is not None:
                z = z + noise[:, v]
            d = z.argmax(axis=1)
            sched.place(v, d)
            out[:, v] = d
        self._remember(out, torch.from_numpy(feats).to(self.x_node.device))
        return out

    def _remember(self, op_devices: np.ndarray, feats: torch.Tensor) -> None:
        if len(self._forced) > 64:
            self._forced.clear()
        self._forced[self._key(op_devices)] = feats

    @staticmethod
    def _key(op_devices: np.ndarray) -> bytes:
        arr = np.ascontiguousarray(np.atleast_2d(op_devices), dtype=np.int64)
        return arr.tobytes() + bytes(str(arr.shape), "ascii")

    def sample(self, k: int, *, generator: torch.Generator | None = None) -> PolicySample:
        """K placements in one batched pass, with differentiable log-probabilities."""
        if not self.sequential:
            logp = self.log_probs()
            with torch.no_grad():
                cdf = logp.exp().cumsum(dim=1)  # [N, D]
                u = torch.rand(k, self.num_items, 1, generator=generator, device=logp.device)
                actions = (cdf.unsqueeze(0) < u).sum(dim=2).clamp(max=self.num_devices - 1)  # [K, N]
            lp, ent = self._score(logp[None], actions)
            return PolicySample({"devices": actions}, lp, ent, self.expand(actions.cpu().numpy()))
        idx = self._decode(k, self._gumbel(k, generator))
        actions = torch.as_tensor(idx, device=self.x_node.device)
        lp, ent = self._score(self._logp_along(idx), actions)
        return PolicySample({"devices": actions}, lp, ent, self.expand(idx))

    def log_prob(self, actions: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        acts = actions["devices"]
        return self._score(self._logp_along(acts.cpu().numpy()), acts)

    def _gumbel(self, k: int, generator: torch.Generator | None) -> np.ndarray:
        """Gumbel noise ``[K, items, devices]`` (float64) from ``generator``: the draws of :meth:`sample` and
        :meth:`decode`."""
        u = (
            torch.rand(
                k, self.num_items, self.num_devices, generator=generator, dtype=torch.float64, device=self.x_node.device
            )
            .cpu()
            .numpy()
        )
        return -np.log(-np.log(np.clip(u, 1e-12, 1 - 1e-12)))

    @torch.no_grad()
    def decode(self, k: int, *, temperature: float = 1.0, generator: torch.Generator | None = None) -> np.ndarray:
        """K placements ``[K, num_ops]`` drawn from the policy with its logits divided by ``temperature``.

        No log-probabilities (zero-shot placement only keeps the placements): at 1 this draws what
        :meth:`sample` draws; above 1 the draws spread over more devices. For each decision the schedule
        decoder takes the argmax of logits + ``temperature`` x Gumbel noise, which samples softmax(logits / T).
        """
        if not temperature > 0:
            raise PlacerError(f"--policy gnn: temperature must be > 0, got {temperature}")
        gumbel = self._gumbel(k, generator)
        if self.sequential:
            idx = self._decode(k, temperature * gumbel)
        else:
            logits = self.log_probs().double().cpu().numpy()
            idx = (logits[None] + temperature * gumbel).argmax(axis=2)
        return self.expand(idx)

    @torch.no_grad()
    def greedy(self) -> np.ndarray:
        if self.sequential:
            return self.expand(self._decode(1, None)[0])
        return self.expand(self.log_probs().argmax(dim=1).cpu().numpy())

    def imitation_loss(
        self, op_devices: np.ndarray, *, along: np.ndarray | None = None, switch_share: float = 0.0
    ) -> torch.Tensor:
        """Mean negative log-likelihood per item of a target placement (a device per op; per group by majority).

        Schedule decoder: each item's decoding features are those of the target's own
        earlier decisions, or of ``along``'s (``[K, num_ops]`` placements, e.g. the policy's
        own samples: the target device is then the one to go back to from wherever
        the policy's earlier decisions led, DAgger's correction of exposure bias).

        ``switch_share`` (schedule decoder; 0 = a plain mean): the share of the loss given to
        the *switches*, the items whose target is not the device holding most of their
        input bytes (:func:`switch_weights`). They are a few percent of the items, and the
        placement's structure: on a synthetic recurrent graph of 1,494 ops, 41 switches
        (39 of them reads of a weight every time step shares) had a mean loss of 2.26 nats against 0.02 for the
        others, so a plain mean looked fit while the greedy placement took 1.7x the label.
        Weighting them did not pay: on that graph alone (``bench/probe_imitation.py
        --switch-share 0.5``) the greedy placement got slower, and a policy pretrained with
        it placed the held-out LSTMs worse (BENCHMARKS.md), so ``placer pretrain`` defaults to 0.
        """
        target = self.contract(op_devices)
        t = torch.as_tensor(target, device=self.x_node.device)
        rows = target[None] if along is None else self.contract(np.atleast_2d(along))
        logp = self._logp_along(rows)  # [K or 1, N, D]
        nll = -logp.gather(2, t[None, :, None].expand(logp.shape[0], -1, 1)).squeeze(2)  # [K or 1, N]
        if not (switch_share > 0 and self.sequential):
            return nll.mean()
        w = switch_weights(self.switch_mask(op_devices, along=along), switch_share)
        w = torch.as_tensor(w, dtype=nll.dtype, device=nll.device)
        return (nll * w).sum() / w.sum()

    def switch_mask(self, op_devices: np.ndarray, *, along: np.ndarray | None = None) -> np.ndarray:
        """``[K or 1, num_items]``: the target's switches (:func:`switches`), decided along ``along`` or the target
        itself.

        Schedule decoder only (the switches are read from its decoding features).
        """
        if not self.sequential:
            raise PlacerError(
                "switches are defined by the schedule decoder's features; this policy decodes independently"
            )
        target = self.contract(op_devices)
        rows = target[None] if along is None else self.contract(np.atleast_2d(along))
        with torch.no_grad():
            share = self._dyn(rows)[..., 1].cpu().numpy()  # [K, N, D]: input bytes already on each device
        return switches(share, target)
