"""The gnn policy's schedule-aware decoder: ops placed one at a time along a list schedule.

Deciding every op independently (the ``independent`` decoder) needs a policy
that already agrees with a good placement on ~80% of the ops before its greedy
placement beats one device: the 20% it gets wrong scatter across devices and
every one of them costs a transfer (``bench/probe_imitation.py``). The
``schedule`` decoder makes each decision see the ones before it, as list
schedulers (HEFT, Baechi's m-ETF/m-SCT) and DOPPLER's placement policy do:

* ops are decided in a canonical topological order (:func:`decode_order`: by
  compute-weighted critical-path start, then hop depth, then name), which does
  not depend on how the graph numbers its ops;
* a :class:`ListSchedule` keeps, for K placements at once, each device's
  finish time, each placed op's finish time and device, and each device's
  bytes in use; for the next op it gives :data:`DYN_DIM` features per device:

  0. how much later the op would finish there than on its earliest-finishing
     device (``log1p(delta / tau)``, ``tau`` the op's fastest time plus the
     graph's mean op time), the quantity m-ETF minimises;
  1. the share of the op's input bytes already on that device (what m-SCT's
     favourite-child colocation keeps together);
  2. the device's memory in use with this op added, over its capacity;
  3. how far the device's queue runs past the least-loaded device's
     (``log1p(delta / tau)``);
  4. 1 for the device(s) where the op would finish first.

The network adds a learned projection of these features to its static
(op, device) scores before the output layer (:class:`policies.gnn.GNNNet`), so
the logits of op ``v`` depend on where ops decided before ``v`` went. The
list schedule is an estimate (each op's forward+backward time run back to back
per device, transfers at the link's bandwidth plus latency); the simulator
still scores the placement.

>>> import envs
>>> from graphs.synthetic import chain_dag
>>> g = chain_dag(6, seed=0)
>>> s = ListSchedule(g, envs.resolve_cluster("k80x2"), k=2)
>>> v = int(s.order[0])
>>> s.features(v).shape
(2, 3, 5)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.sim.cost import activation_bytes, op_times, static_bytes
from graphs import OpGraph
from graphs.dag import top_level

DYN_DIM = 5


def decode_order(graph: OpGraph, top: np.ndarray) -> np.ndarray:
    """A topological order that depends only on the graph's structure and names, not its numbering.

    Sorted by ``top`` (the critical-path start: along an edge it never decreases),
    then hop depth (strictly increases along an edge), then op name.
    """
    depth = top_level(graph, np.ones(graph.num_ops))  # hops: the longest path in edges from a source
    names = graph.names
    return np.asarray(
        sorted(range(graph.num_ops), key=lambda i: (float(top[i]), float(depth[i]), names[i])), dtype=np.int64
    )


class ListSchedule:
    """K partial placements of ``graph`` on ``cluster`` and their list schedules (see the module doc).

    Use: for each op ``v`` of :attr:`order`, ``f = features(v)`` (``[K, D, DYN_DIM]``),
    choose devices ``d`` (``[K]``), then ``place(v, d)``.
    """

    def __init__(
        self, graph: OpGraph, cluster: Any, k: int, *, times: np.ndarray | None = None, order: np.ndarray | None = None
    ) -> None:
        if times is None:
            fwd, bwd = op_times(graph, cluster)
            times = fwd + bwd
        self.t = np.asarray(times, dtype=np.float64)  # [N, D]
        n, d = self.t.shape
        tmin = self.t.min(axis=1) if n else np.zeros(0)
        self.tau = tmin + (float(tmin.sum()) / max(n, 1)) + 1e-12
        if order is None:
            order = decode_order(graph, top_level(graph, tmin))
        self.order = order
        self.k, self.d = int(k), d
        bw = np.asarray(cluster.bandwidth_bytes_per_s, dtype=np.float64)
        eye = np.eye(d, dtype=bool)
        self.inv_bw = np.where(eye, 0.0, 1.0 / np.maximum(bw, 1e-30))
        self.lat = np.where(eye, 0.0, np.asarray(cluster.latency_s, dtype=np.float64))
        self.mem = (static_bytes(graph) + activation_bytes(graph)).astype(np.float64)
        self.cap = np.maximum(np.asarray(cluster.memory_bytes, dtype=np.float64), 1.0)
        self.indptr, self.pred, eid = graph.in_csr
        self.in_bytes = graph.edge_bytes.astype(np.float64)[eid]
        self.ready = np.zeros((self.k, d))
        self.used = np.zeros((self.k, d))
        self.fin = np.zeros((self.k, n))
        self.op_devices = np.zeros((self.k, n), dtype=np.int64)
        self._finish: np.ndarray | None = None
        self._rows = np.arange(self.k)

    def features(self, v: int) -> np.ndarray:
        """``[K, D, DYN_DIM]`` for op ``v`` given the ops placed so far (all of ``v``'s inputs must be placed)."""
        a, b = self.indptr[v], self.indptr[v + 1]
        k, d = self.k, self.d
        share = np.zeros((k, d))
        if b > a:
            p = self.pred[a:b]
            byt = self.in_bytes[a:b]
            src = self.op_devices[:, p]  # [K, P]
            arrive = self.fin[:, p][:, :, None] + self.lat[src] + byt[None, :, None] * self.inv_bw[src]  # [K, P, D]
            data = arrive.max(axis=1)
            tot = float(byt.sum())
            if tot > 0:
                np.add.at(share, (np.repeat(self._rows, len(p)), src.ravel()), np.tile(byt, k))
                share /= tot
        else:
            data = np.zeros((k, d))
        finish = np.maximum(self.ready, data) + self.t[v][None, :]
        self._finish = finish
        tau = self.tau[v]
        late = finish - finish.min(axis=1, keepdims=True)
        load = self.ready - self.ready.min(axis=1, keepdims=True)
        return np.stack(
            [
                np.log1p(late / tau),
                share,
                np.minimum((self.used + self.mem[v]) / self.cap, 2.0),
                np.log1p(load / tau),
                (late <= 0).astype(np.float64),
            ],
            axis=2,
        )

    def place(self, v: int, devices: np.ndarray) -> None:
        """Put op ``v`` on ``devices[k]`` in placement k (after :meth:`features` for ``v``)."""
        dsel = np.asarray(devices, dtype=np.int64)
        f = self._finish[self._rows, dsel]
        self.fin[:, v] = f
        self.op_devices[:, v] = dsel
        self.ready[self._rows, dsel] = f
        self.used[self._rows, dsel] += self.mem[v]


def teacher_forced(
    graph: OpGraph,
    cluster: Any,
    op_devices: np.ndarray,
    *,
    times: np.ndarray | None = None,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """The decoder's features ``[K, N, D, DYN_DIM]`` along the given placements ``[K, N]`` (row order = op index)."""
    op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int64))
    s = ListSchedule(graph, cluster, op_devices.shape[0], times=times, order=order)
    out = np.zeros((op_devices.shape[0], graph.num_ops, s.d, DYN_DIM), dtype=np.float32)
    for v in s.order:
        out[:, v] = s.features(int(v))
        s.place(int(v), op_devices[:, v])
    return out
