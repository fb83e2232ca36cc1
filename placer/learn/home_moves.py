"""Home moves for the move search: an item sent to a GPU with its parameters homed on the host.

The move search keeps one integer *code* per op. Codes ``0 .. D-1`` are the cluster's
devices, the op's parameters with it; code ``D + k`` is the ``k``-th GPU of the search
with the op's parameters, their gradient and Adam's state homed on the host
(:mod:`envs.sim.homes` charges the copies, the runtime is :mod:`envs.real.homes`).
A move to a code is then one move: sending a layer to the GPU with its weights on the
host is what frees a tight GPU without running the layer on the host. An op whose
parameters cannot live apart (:func:`envs.sim.homes.homeable`) on a home code is
simply on that GPU, as is one whose parameters another op reads on another GPU, or
whose views are read there (:func:`envs.sim.homes.chain_pairs`; co-location keeps a
parameter's views with their reader, so only a code made by hand parts those).

:class:`HomeCodes` decodes codes into ``(op_devices, homes)`` and lists the home
moves of an item level; :class:`HomeCodeScorer` scores codes through the simulator
(:meth:`envs.sim.simulator.SimEnv.batch` with ``homes``), so every home move is
simulated and counted in the search's budget like any other.

>>> import envs
>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], param_bytes=[8, 0])
>>> g.params = [["w"], []]
>>> codes = HomeCodes(g, envs.Cluster.preset("k80x2"), [1, 2])
>>> op_devices, homes = codes.decode(np.array([3, 4]))  # both on the GPUs' home codes: a's weights on cpu:0
>>> op_devices.tolist(), homes.tolist()
([1, 2], [0, -1])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.sim.homes import chain_pairs, homeable, parted
from graphs import OpGraph, PlacerError
from graphs.ops import param_paths


class HomeCodes:
    """The codes of a search over ``gpus`` of ``cluster`` with home moves (see the module docstring)."""

    def __init__(self, graph: OpGraph, cluster: Any, gpus: Any) -> None:
        hosts = cluster.host_indices()
        self.gpus = np.asarray([d for d in np.asarray(gpus).tolist() if cluster.kinds[d] != "cpu"], dtype=np.int64)
        if not hosts or not len(self.gpus):
            raise PlacerError("home moves: the cluster needs a host device and a GPU")
        self.host, self.num_devices = hosts[0], cluster.num_devices
        paths = param_paths(graph)
        self.can_home = homeable(graph, paths) == 1
        self._chains = chain_pairs(graph, paths)  # parameters live apart only with their readers on their GPU
        # a random integer per op: the sum over the ops a move changes names the placement it makes (as MoveFeatures')
        self._op_key = np.random.default_rng(1).integers(0, 1 << 40, size=graph.num_ops).astype(np.float64)

    @property
    def num_codes(self) -> int:
        return self.num_devices + len(self.gpus)

    @property
    def has_homes(self) -> bool:
        """Codes that name homes (:class:`placer.learn.checkpoint_moves.BlockCodes` may not)."""
        return True

    @property
    def has_blocks(self) -> bool:
        """Codes that carry checkpoint bits (:class:`placer.learn.checkpoint_moves.BlockCodes` do)."""
        return False

    def decode(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(op_devices, homes)`` of codes (``[n]`` or ``[K, n]``); ``homes``: the host, -1 for an op's own device."""
        codes = np.asarray(codes, dtype=np.int64)
        apart = codes >= self.num_devices
        op_devices = np.where(apart, self.gpus[np.maximum(codes - self.num_devices, 0)], codes)
        homes = np.where(apart & self.can_home, self.host, -1)
        if len(self._chains[0]):  # a view of a parameter apart from its reader (colocated: only a hand-made code)
            homes[parted(op_devices, self._chains)] = -1
        return op_devices, homes

    def encode(self, op_devices: np.ndarray, homes: np.ndarray) -> np.ndarray | None:
        """The codes of ``op_devices`` with parameter ``homes`` (-1: an op's own device), as :meth:`decode` gives
        them back; None where a home is not one that a code names (not the host, or an op not on a search GPU).

        >>> import envs
        >>> from graphs import OpGraph
        >>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], param_bytes=[8, 0])
        >>> g.params = [["w"], []]
        >>> codes = HomeCodes(g, envs.Cluster.preset("k80x2"), [1, 2])
        >>> codes.encode(np.array([1, 2]), np.array([0, -1])).tolist()  # a on gpu:0 (1), its weights on the host
        [3, 2]
        >>> codes.encode(np.array([0, 2]), np.array([1, -1])) is None  # a home on a GPU: no code names it
        True
        """
        op_devices, homes = np.asarray(op_devices, dtype=np.int64), np.asarray(homes, dtype=np.int64)
        slot = np.full(self.num_devices, -1, dtype=np.int64)  # device -> its place among the search's GPUs
        slot[self.gpus] = np.arange(len(self.gpus))
        apart = homes >= 0
        k = slot[op_devices[apart]]
        if (homes[apart] != self.host).any() or (k < 0).any():
            return None
        codes = op_devices.copy()
        codes[apart] = self.num_devices + k
        return codes

    def moves(
        self, op_group: np.ndarray, num_items: int, codes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(items, codes, keys)`` of every home move of a level from ``codes``: an item that holds parameters sent
        to a GPU with them on the host, and an item (partly) homed on a GPU brought back onto it."""
        C, D = self.num_codes, self.num_devices
        onehot = np.zeros((len(codes), C))
        onehot[np.arange(len(codes)), codes] = 1.0
        member = np.zeros((num_items, len(codes)))
        member[op_group, np.arange(len(codes))] = 1.0
        on = member @ onehot / np.maximum(member.sum(axis=1), 1)[:, None]  # [G, C]: share of its ops on each code
        allowed = np.zeros((num_items, C), dtype=bool)
        allowed[:, D:] = (member @ self.can_home > 0)[:, None]
        allowed[:, self.gpus] = on[:, D:] > 0  # back from a home code to its GPU
        items, targets = np.nonzero(allowed & (on < 1.0 - 1e-9))
        keys = (member @ self._op_key)[items] - (member @ (onehot * self._op_key[:, None]))[items, targets]
        return items, targets, keys * C + targets


class HomeCodeScorer:
    """A simulator scoring codes (:class:`HomeCodes`, or :class:`placer.learn.checkpoint_moves.BlockCodes`):
    ``step_times``/``overflow``/``schedule`` of the decoded placements with their homes (and checkpointed blocks);
    everything else is the simulator's own.

    The incumbent's schedule (the critic's features of ordinary moves) is simulated without its homes.
    """

    def __init__(self, env: Any, codes: HomeCodes) -> None:
        if not hasattr(env, "batch"):
            raise PlacerError("home moves: the move search scores them with the simulator (env 'sim')")
        self.env, self.codes = env, codes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        step_time_s, failed, _ = self._batch(op_devices, order, overflow=False)
        return step_time_s, failed

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._batch(op_devices, order, overflow=True)

    def _batch(self, op_devices: np.ndarray, order: Any, *, overflow: bool):
        decoded, homes = self.codes.decode(op_devices)
        homes = homes if self.codes.has_homes else None
        blocks = {}
        if self.codes.has_blocks:  # codes with checkpoint bits (placer.learn.checkpoint_moves)
            blocks = {"checkpoint": self.codes.checkpoint(op_devices), "checkpoint_where_possible": True}
        return self.env.batch(decoded.astype(np.int32), order, overflow=overflow, homes=homes, **blocks)

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        return self.env.schedule(self.codes.decode(op_devices)[0].astype(np.int32), order)

    def schedule_order(self, op_devices: np.ndarray) -> Any:
        return self.env.schedule_order(self.codes.decode(op_devices)[0].astype(np.int32))
