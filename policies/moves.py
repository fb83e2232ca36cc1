"""A move-proposing policy: item levels, the features of a move, and the critic that ranks moves before they are
simulated.

A *move* sends one item (a group of ops) of one *level* to one device. The levels
(:func:`item_levels`) are groupings of the ops from coarse to fine: the model's
modules at every depth (:func:`graphs.module_tree.module_levels`), each module
cut into contiguous runs of the topological order (``module x chunk``: the
time steps of a recurrent layer, the blocks of a stage), plain contiguous runs,
and the co-location groups. Any placement is reachable, and moving an item keeps
every other op where it is, so the incumbent is never coarsened away.

:class:`MoveFeatures` describes every candidate move of a level from the
incumbent placement: the item's compute time on its device and the target, the
loads of both, the bytes it exchanges with ops on each, the target's memory,
the item's size and place in the order, and the change the simulator reported
the last time the same move was tried (``MoveMemory``). :class:`MoveCritic`, a
small network, predicts from them the relative change of the step time; the
search loop (:mod:`placer.learn.move_search`) simulates the moves it ranks best and
trains it on what the simulator returns, in :class:`CriticFit`'s Adam steps.

>>> from graphs.synthetic import random_dag
>>> import envs
>>> g = random_dag(40, seed=1)
>>> levels = item_levels(g)
>>> levels[-1].name, [lv.num_items for lv in levels] == sorted(lv.num_items for lv in levels)
('ops', True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse
from torch import nn

from envs.cluster import Cluster
from envs.sim import cost
from envs.sim.schedule import Schedule
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph
from graphs.grouping import coarsen, colocate, renumber_by_first_op
from graphs.module_tree import module_levels

#: Contiguous runs per module (``module x chunk`` levels) and per graph (``chunks`` levels).
CHUNKS = (8, 16, 32, 64)
#: Module levels with at most this many modules are also cut into chunks.
MAX_CHUNKED_MODULES = 32
#: Columns of :meth:`MoveFeatures.features`.
NUM_FEATURES = 26
#: What the columns mean; a critic file records it with :data:`NUM_FEATURES` (:func:`feature_spec`), and a critic
#: trained on other columns is refused. Change it whenever a column changes meaning.
FEATURES_VERSION = "move-features/1"


def feature_spec() -> dict[str, int | str]:
    """The move features a critic reads: their version and width (a critic file's ``features``)."""
    return {"version": FEATURES_VERSION, "num_features": NUM_FEATURES}


class BusyTimeline:
    """Seconds each device is busy before time ``x`` in a simulated schedule (its tasks never overlap).

    >>> tl = BusyTimeline(np.array([0, 0, 1]), np.array([0.0, 2.0, 0.0]), np.array([1.0, 3.0, 5.0]), 2)
    >>> tl.busy(np.array([0, 1]), np.array([0.5, 0.0]), np.array([2.5, 10.0])).tolist()
    [1.0, 5.0]
    """

    def __init__(self, devices: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, num_devices: int) -> None:
        self.starts, self.lengths, self.prefix = [], [], []
        for d in range(num_devices):
            on = devices == d
            order = np.argsort(start_s[on], kind="stable")
            s, e = start_s[on][order], end_s[on][order]
            self.starts.append(s)
            self.lengths.append(np.maximum(e - s, 0.0))
            self.prefix.append(np.concatenate([[0.0], np.cumsum(self.lengths[-1])]))

    def _before(self, d: int, x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.starts[d], x, side="right")  # tasks started by x
        last = np.maximum(k - 1, 0)
        part = np.where(
            k > 0,
            np.clip(
                x - self.starts[d][last] if len(self.starts[d]) else 0.0,
                0.0,
                self.lengths[d][last] if len(self.lengths[d]) else 0.0,
            ),
            0.0,
        )
        return self.prefix[d][last] * (k > 0) + part

    def busy(self, devices: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Busy seconds of ``devices[j]`` within ``[a[j], b[j]]``."""
        out = np.zeros(len(devices))
        for d in np.unique(devices):
            j = devices == d
            out[j] = self._before(int(d), b[j]) - self._before(int(d), a[j])
        return out


@dataclass(frozen=True)
class ItemLevel:
    """One grouping of the ops into items: ``op_group[i]`` is op i's item (dense, numbered by first op)."""

    name: str
    op_group: np.ndarray

    @property
    def num_items(self) -> int:
        return int(self.op_group.max()) + 1 if len(self.op_group) else 0


def _intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The grouping whose items are the non-empty intersections of ``a``'s and ``b``'s."""
    key = a.astype(np.int64) * (int(b.max()) + 1) + b
    return renumber_by_first_op(np.unique(key, return_inverse=True)[1].reshape(-1)).astype(np.int64)


def item_levels(graph: OpGraph, chunks: tuple[int, ...] = CHUNKS) -> list[ItemLevel]:
    """The levels a move may act on, coarse to fine, each grouping distinct (see the module docstring)."""
    sim = schedule_graph(graph)
    unit = colocate(graph).astype(np.int64)
    runs = {k: coarsen(graph, k).op_group.astype(np.int64) for k in chunks if k < graph.num_ops}
    found: list[ItemLevel] = []
    for lv in module_levels(sim):
        op_group = lv.op_group.astype(np.int64)
        depth = lv.graph.meta.get("module_depth")
        found.append(ItemLevel(f"modules {depth}", op_group))
        if lv.num_groups <= MAX_CHUNKED_MODULES:
            found += [ItemLevel(f"modules {depth} x chunks {k}", _intersect(op_group, r)) for k, r in runs.items()]
    found += [ItemLevel(f"chunks {k}", r) for k, r in runs.items()]
    found.append(ItemLevel("ops", renumber_by_first_op(unit).astype(np.int64)))
    levels, seen = [], set()
    for lv in sorted(found, key=lambda lv: lv.num_items):  # stable: modules before chunks of the same size
        key = lv.op_group.tobytes()
        if key not in seen and lv.num_items >= 2:
            seen.add(key)
            levels.append(lv)
    return levels


class MoveMemory:
    """The relative step-time change last seen for each (level, item, device), and the round it was seen in."""

    def __init__(self, levels: list[ItemLevel], num_devices: int) -> None:
        self.delta = [np.zeros((lv.num_items, num_devices), dtype=np.float32) for lv in levels]
        self.seen = [np.full((lv.num_items, num_devices), -1, dtype=np.int64) for lv in levels]

    def record(self, level: int, items: np.ndarray, devices: np.ndarray, deltas: np.ndarray, round_: int) -> None:
        self.delta[level][items, devices] = deltas
        self.seen[level][items, devices] = round_

    def lookup(self, level: int, items: np.ndarray, devices: np.ndarray, round_: int) -> np.ndarray:
        """``[m, 3]``: last change (0 if never), whether seen, rounds since (scaled to at most 1; 1 if never)."""
        seen = self.seen[level][items, devices]
        hit = seen >= 0
        age = np.where(hit, np.minimum((round_ - seen) / 50.0, 1.0), 1.0)
        return np.stack([np.where(hit, self.delta[level][items, devices], 0.0), hit, age], axis=1).astype(np.float32)


class MoveFeatures:
    """The features of every candidate move of a level from an incumbent placement (``[m, NUM_FEATURES]``)."""

    def __init__(self, graph: OpGraph, cluster: Cluster, levels: list[ItemLevel]) -> None:
        sim = schedule_graph(graph)
        n, D = graph.num_ops, cluster.num_devices
        fwd, bwd = cost.op_times(graph, cluster)
        self.work = fwd + bwd  # [n, D]
        self.mem = (cost.static_bytes(graph) + cost.activation_bytes(graph)).astype(np.float64)
        self.capacity = np.asarray(cluster.memory_bytes, dtype=np.float64)
        self.host = cluster.host.astype(np.float32)
        bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)
        self.mean_bw = float(np.mean(bw[~np.eye(D, dtype=bool)])) if D > 1 else 1.0
        self.levels = levels
        self.num_devices = D
        # a random integer per op: the sum over the ops a move changes names the placement it makes (exact in float64
        # up to 2^13 ops; beyond, two moves may rarely fail to be recognised as the same, which only costs a repeat)
        self._op_key = np.random.default_rng(0).integers(0, 1 << 40, size=n).astype(np.float64)
        src, dst = sim.edge_src.astype(np.int64), sim.edge_dst.astype(np.int64)
        nbytes = sim.edge_bytes.astype(np.float64)
        self._member, self._neighbours, self._size, self._position = [], [], [], []
        for lv in levels:
            g = lv.op_group
            G = lv.num_items
            self._member.append(sparse.csr_matrix((np.ones(n), (g, np.arange(n))), shape=(G, n)))
            cross = g[src] != g[dst]
            rows = np.concatenate([g[src[cross]], g[dst[cross]]])
            cols = np.concatenate([dst[cross], src[cross]])
            self._neighbours.append(
                sparse.csr_matrix((np.concatenate([nbytes[cross]] * 2), (rows, cols)), shape=(G, n))
            )
            size = np.bincount(g, minlength=G).astype(np.float64)
            self._size.append(np.log1p(size) / np.log1p(max(n, 2)))
            self._position.append(
                np.bincount(g, weights=np.arange(n, dtype=np.float64), minlength=G) / size / max(n - 1, 1)
            )

    def features(
        self,
        level: int,
        op_devices: np.ndarray,
        step_time_s: float,
        schedule: Schedule,
        memory: MoveMemory,
        round_: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(items [m], devices [m], features [m, NUM_FEATURES], keys [m])`` of every move that changes ``op_devices``.

        ``schedule``: the incumbent's simulated schedule (when each item runs, how busy each device is then).
        ``keys``: one number per resulting placement (moves of two levels that change the same ops the same
        way get the same key).
        """
        D, T = self.num_devices, max(step_time_s, 1e-12)
        onehot = np.zeros((len(op_devices), D))
        onehot[np.arange(len(op_devices)), op_devices] = 1.0
        member = self._member[level]
        placed_work = member @ (onehot * self.work)  # [G, D]: the item's work done on each device now
        item_work = member @ self.work  # [G, D]: the item's work were it all on d
        load = (onehot * self.work).sum(axis=0)  # [D]
        mem = onehot.T @ self.mem  # [D]
        item_mem = member @ self.mem  # [G]
        near = self._neighbours[level] @ onehot  # [G, D]: bytes exchanged with ops on each device
        near_total = near.sum(axis=1)
        on = (member @ onehot) / np.maximum(member.sum(axis=1).A1, 1)[:, None]  # [G, D]: share of its ops on d
        items, devices = np.nonzero(on < 1.0 - 1e-9)
        now = placed_work.sum(axis=1)[items]
        src = np.argmax(placed_work + 1e-30 * on, axis=1)[items]
        f = np.empty((len(items), NUM_FEATURES), dtype=np.float32)
        f[:, 0] = item_work[items, devices] / T
        f[:, 1] = now / T
        f[:, 2] = load[devices] / T
        f[:, 3] = (load[devices] + item_work[items, devices]) / T
        f[:, 4] = load[src] / T
        f[:, 5] = load.max() / T
        f[:, 6] = near[items, devices] / (near_total[items] + 1.0)
        f[:, 7] = near[items, src] / (near_total[items] + 1.0)
        f[:, 8] = (near_total[items] - near[items, devices]) / self.mean_bw / T
        f[:, 9] = (near_total[items] - near[items, src]) / self.mean_bw / T
        f[:, 10] = self.host[devices]
        f[:, 11] = on[items, devices]
        f[:, 12] = np.minimum((mem[devices] + item_mem[items]) / self.capacity[devices], 4.0)
        f[:, 13] = self._size[level][items]
        f[:, 14] = self._position[level][items]
        f[:, 15] = level / max(len(self.levels) - 1, 1)
        f[:, 16:19] = memory.lookup(level, items, devices, round_)
        f[:, 19] = (devices == np.argmax(near, axis=1)[items]) & (near_total[items] > 0)
        f[:, 20:] = self._schedule_features(level, schedule, items, devices, src, T)
        keys = (member @ self._op_key)[items] - (member @ (onehot * self._op_key[:, None]))[items, devices]
        return items, devices, f, keys * D + devices

    def _schedule_features(
        self, level: int, schedule: Schedule, items: np.ndarray, devices: np.ndarray, src: np.ndarray, T: float
    ) -> np.ndarray:
        """How busy the target and the source are while the item runs (forward and backward), and when it runs."""
        g, G = self.levels[level].op_group, self.levels[level].num_items
        n = len(g)
        fa, fb, ba, bb = np.full(G, np.inf), np.zeros(G), np.full(G, np.inf), np.zeros(G)
        np.minimum.at(fa, g, schedule.fwd_start_s[:n])
        np.maximum.at(fb, g, schedule.fwd_end_s[:n])
        np.minimum.at(ba, g, schedule.bwd_start_s[:n])
        np.maximum.at(bb, g, schedule.bwd_end_s[:n])
        op_devices = schedule.op_devices[:n]
        timeline = BusyTimeline(
            np.concatenate([op_devices, op_devices]),
            np.concatenate([schedule.fwd_start_s[:n], schedule.bwd_start_s[:n]]),
            np.concatenate([schedule.fwd_end_s[:n], schedule.bwd_end_s[:n]]),
            self.num_devices,
        )
        fwin, bwin = np.maximum(fb - fa, 1e-12)[items], np.maximum(bb - ba, 1e-12)[items]
        out = np.empty((len(items), 6), dtype=np.float32)
        out[:, 0] = timeline.busy(devices, fa[items], fb[items]) / fwin
        out[:, 1] = timeline.busy(devices, ba[items], bb[items]) / bwin
        out[:, 2] = timeline.busy(src, fa[items], fb[items]) / fwin
        out[:, 3] = fwin / T
        out[:, 4] = fb[items] / T
        total = np.array([timeline.prefix[d][-1] for d in range(self.num_devices)])
        out[:, 5] = 1.0 - total[devices] / T
        return out


class MoveCritic(nn.Module):
    """The logit of the probability that a move makes the step faster, from its features (higher is better).

    Trained as a classifier, not as a regression of the change: on nmt-2 and inception-v3
    (k80x4) 0.2-0.8% of moves are faster, and a regression of their change fits the many slower
    moves (AUC of the held-out improving moves 0.76-0.82, against 0.85-0.92 as a classifier).
    """

    def __init__(self, hidden: int = 64, num_features: int = NUM_FEATURES) -> None:
        super().__init__()
        self.hidden = hidden
        self.net = nn.Sequential(
            nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        # rank()'s workspaces: its input rows and each linear layer's output, grown to the most rows ranked so far
        self._x = np.empty((0, num_features), dtype=np.float32)
        self._h: list[torch.Tensor] = []

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    @torch.no_grad()
    def rank(self, features: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The logits of ``features[rows]`` (``[m]``), equal to ``forward``'s, computed into workspaces kept between
        calls (a view of them: read it before the next call).

        A search ranks thousands of moves a round. Fresh activations of that size each layer cost more than the
        layer (the allocator hands megabytes back to the kernel and faults them in again); reused, they do not.
        """
        m = len(rows)
        if m > len(self._x):
            size = max(m, 2 * len(self._x))
            self._x = np.empty((size, self._x.shape[1]), dtype=np.float32)
            self._h = [torch.empty(size, layer.out_features) for layer in self.net if isinstance(layer, nn.Linear)]
        x = np.take(features, rows, axis=0, out=self._x[:m])
        h, k = torch.from_numpy(x), 0
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                h = torch.addmm(layer.bias, h, layer.weight.t(), out=self._h[k][:m])
                k += 1
            elif isinstance(layer, nn.ReLU):
                h.relu_()
            else:
                raise TypeError(f"MoveCritic.rank: no workspace for {type(layer).__name__}")
        return h.numpy()[:, 0]


class CriticFit:
    """Adam steps of logistic regression on "was it faster" for a :class:`MoveCritic`: each step's weights equal, to
    the bit, those of ``binary_cross_entropy_with_logits(critic(x), y)``, ``loss.backward()`` and
    ``torch.optim.Adam(critic.parameters(), lr).step()``, in about half their time.

    A search trains its critic on a batch of 128 every round of a few milliseconds. For a network this small, the
    autograd graph and Adam's loop over six tensors cost more than the arithmetic. Here the gradients are written
    by hand, layer by layer, with the operations autograd's backward runs (so the same bits). The critic's
    parameters become views of one flat tensor, and Adam steps that one tensor, which is the same elementwise
    arithmetic.

    The critic stays an ordinary module (its ``state_dict``, :meth:`MoveCritic.rank` and ``forward`` are unchanged).
    A critic belongs to one fit: a second fit of the same critic would leave the first stepping a copy.
    """

    def __init__(self, critic: MoveCritic, lr: float) -> None:
        self.critic = critic
        self.linears = [m for m in critic.net if isinstance(m, nn.Linear)]
        if [type(m) for m in critic.net] != [nn.Linear, nn.ReLU] * (len(self.linears) - 1) + [nn.Linear]:
            raise TypeError("CriticFit: the critic must be linear layers with a ReLU between each two")
        params = [p for lin in self.linears for p in (lin.weight, lin.bias)]
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
        grad = torch.zeros_like(flat)
        self.grads: list[torch.Tensor] = []  # each parameter's gradient: a view of the flat tensor's
        at = 0
        for p in params:
            n = p.numel()
            p.data = flat[at : at + n].view_as(p)
            self.grads.append(grad[at : at + n].view_as(p))
            at += n
        self.flat = nn.Parameter(flat)  # shares flat's storage: Adam's in-place step updates the critic's weights
        self.flat.grad = grad
        self.optimizer = torch.optim.Adam([self.flat], lr=lr)

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One Adam step on the batch ``x`` ``[B, features]``, ``y`` ``[B]`` (1.0 where the move was faster)."""
        if self.linears[0].weight.data_ptr() != self.flat.data_ptr():
            raise RuntimeError("CriticFit: the critic's weights were replaced since the fit began")
        inputs, h = [], x  # each linear layer's input
        for k, lin in enumerate(self.linears):
            inputs.append(h)
            h = torch.addmm(lin.bias, h, lin.weight.t())
            if k < len(self.linears) - 1:
                h = h.relu_()
        # the loss's backward as autograd computes it: (sigmoid(z) - y) * 1, then divided by the batch (the mean)
        g = (h[:, 0].sigmoid() - y).div_(len(y)).unsqueeze(1)
        for k in range(len(self.linears) - 1, -1, -1):
            lin, inp = self.linears[k], inputs[k]
            torch.mm(g.t(), inp, out=self.grads[2 * k])
            torch.sum(g, 0, out=self.grads[2 * k + 1])
            if k:  # through the layer and the ReLU before it (inp is that ReLU's output), as ReLU's backward does
                g = torch.ops.aten.threshold_backward(torch.mm(g, lin.weight), inp, 0)
        self.optimizer.step()
