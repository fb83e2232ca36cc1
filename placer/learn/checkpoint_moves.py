"""Checkpoint moves for the move search: a layer's activation checkpointing turned on or off, one move.

The move search keeps one integer *code* per op (:mod:`placer.learn.home_moves`: a device,
or a GPU with the op's parameters homed on the host). :class:`BlockCodes` adds one bit to
each code: code ``c + W`` (``W`` the codes without the bit) is code ``c`` with the op's
layer checkpointed. A candidate layer (:func:`placer.learn.checkpoint_choice.candidate_blocks`)
is checkpointed when its first op carries the bit, and where the placement keeps it whole
on one device in one run of the issue order (:func:`envs.sim.checkpointing.possible_blocks`;
a placement that cannot runs the layer without). A move of ops to another device keeps
their bits (the search's ``_apply``): moving a checkpointed layer moves it checkpointed.

The *block level* of the search lists one move per candidate layer: the incumbent with
that layer's bit flipped. Every move is simulated and counted in the search's budget,
so the search decides which layers to checkpoint with the op placement and the homes,
from what each choice costs in the placement it is made in, instead of scoring every
placement with every layer checkpointed and pruning at the end (the older way, which
``placer train`` found no gain with; BENCHMARKS.md, "`placer train` with checkpointed
layers").

>>> import envs
>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)])
>>> g.module_paths = ["layers.0.x", "layers.0.y", "layers.1.x", "layers.1.y"]
>>> codes = BlockCodes(g, ["layers.0", "layers.1"], None, 2)
>>> row = codes.flip(np.array([1, 1, 0, 0]), 1)  # layers.1 checkpointed: its ops' codes + 2
>>> row.tolist(), codes.names(row), codes.checkpoint(row).tolist()
([1, 1, 2, 2], ['layers.1'], [-1, -1, 2, 2])
>>> codes.decode(row)[0].tolist()  # the devices: the codes without the bit
[1, 1, 0, 0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.plan import checkpoint_blocks
from placer.learn.checkpoint_choice import first_op


class BlockCodes:
    """Codes with a checkpoint bit (the module docstring) over ``homes`` (a
    :class:`placer.learn.home_moves.HomeCodes`, or None: codes are devices ``0 .. num_devices - 1``).

    It has :class:`~placer.learn.home_moves.HomeCodes`' interface (``decode``, ``encode``, ``moves``,
    ``num_devices``), so a search, a run and :class:`~placer.learn.home_moves.HomeCodeScorer` take either;
    :meth:`checkpoint` is what the scorer adds."""

    def __init__(self, graph: OpGraph, names: Sequence[str], homes: Any, num_devices: int) -> None:
        if not names:
            raise PlacerError("checkpoint moves: no layer to checkpoint")
        self.names_all, self.homes, self.num_devices = list(names), homes, int(num_devices)
        self.width = homes.num_codes if homes is not None else self.num_devices
        self.block = checkpoint_blocks(graph, self.names_all)  # per op: its layer's first op, -1 for none
        self.first = np.array(sorted(set(self.block[self.block >= 0].tolist())), dtype=np.int64)  # layers, op order
        # names_all[j] -> its layer's place in op order
        self.order = [int(np.searchsorted(self.first, first_op(graph, name))) for name in self.names_all]
        self.index = np.where(self.block >= 0, np.searchsorted(self.first, np.maximum(self.block, 0)), -1)
        self.members = [np.flatnonzero(self.block == f) for f in self.first]

    @property
    def has_homes(self) -> bool:
        return self.homes is not None

    @property
    def has_blocks(self) -> bool:
        """Codes that carry checkpoint bits (:class:`placer.learn.home_moves.HomeCodes` do not)."""
        return True

    @property
    def num_codes(self) -> int:
        return 2 * self.width

    def base(self, codes: np.ndarray) -> np.ndarray:
        """The codes without the bit."""
        codes = np.asarray(codes, dtype=np.int64)
        return np.where(codes >= self.width, codes - self.width, codes)

    def bits(self, codes: np.ndarray) -> np.ndarray:
        return np.asarray(codes, dtype=np.int64) >= self.width

    def keep_bits(self, moved: np.ndarray, before: np.ndarray) -> np.ndarray:
        """``moved``'s codes (without the bit, or with) carrying ``before``'s bits: a move keeps an op's layer's
        choice."""
        return self.base(moved) + self.width * self.bits(before)

    def decode(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(op_devices, homes)`` of codes, as :meth:`placer.learn.home_moves.HomeCodes.decode` gives them."""
        base = self.base(codes)
        if self.homes is not None:
            return self.homes.decode(base)
        return base, np.full(base.shape, -1, dtype=np.int64)

    def on(self, codes: np.ndarray) -> np.ndarray:
        """``[..., B]``: whether each candidate layer (by its first op, in op order) is checkpointed."""
        return self.bits(codes)[..., self.first]

    def checkpoint(self, codes: np.ndarray) -> np.ndarray:
        """Each op's checkpointed layer (its first op), -1 for none: the simulator's ``checkpoint`` rows."""
        on = self.on(codes)
        picked = np.take_along_axis(
            on, np.broadcast_to(np.maximum(self.index, 0), on.shape[:-1] + self.index.shape), axis=-1
        )
        return np.where((self.index >= 0) & picked, self.block, -1)

    def names(self, codes: np.ndarray) -> list[str]:
        """The layers one row of codes checkpoints, in the candidates' order."""
        on = self.on(np.asarray(codes))
        return [name for name, k in zip(self.names_all, self.order) if on[k]]

    def all_on(self, codes: np.ndarray) -> np.ndarray:
        """``codes`` (one row or ``[K, n]``) with every layer turned on."""
        codes = np.asarray(codes, dtype=np.int64)
        return np.where(self.block >= 0, self.base(codes) + self.width, codes)

    def flip(self, codes: np.ndarray, k: int) -> np.ndarray:
        """``codes`` with the ``k``-th layer (in op order) turned on or off: the bit of each of its ops."""
        out = np.array(codes, dtype=np.int64, copy=True)
        ops = self.members[k]
        out[ops] = self.base(out[ops]) + self.width * (~self.bits(out[self.first[k]]))
        return out

    def encode(self, op_devices: np.ndarray, homes: np.ndarray, names: Sequence[str] = ()) -> np.ndarray | None:
        """The codes of ``op_devices`` with ``homes`` and the layers ``names`` checkpointed; None where a home is
        not one a code names, or a name is not a candidate."""
        if self.homes is not None:
            codes = self.homes.encode(op_devices, homes)
            if codes is None:
                return None
        elif (np.asarray(homes) >= 0).any():
            return None
        else:
            codes = np.asarray(op_devices, dtype=np.int64).copy()
        if any(name not in self.names_all for name in names):
            return None
        for name in names:
            codes = self.flip(codes, self.order[self.names_all.index(name)])
        return codes

    def moves(
        self, op_group: np.ndarray, num_items: int, codes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The home moves of a level (:meth:`placer.learn.home_moves.HomeCodes.moves`), on the codes without the
        bit; the targets are codes without it (the search keeps each op's bit)."""
        return self.homes.moves(op_group, num_items, self.base(codes))

    def block_moves(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(items, targets, keys)`` of the block level from ``codes``: item ``k`` (a layer, in op order) flipped;
        the target is its new bit, the key names the placement it makes (one per layer and state)."""
        items = np.arange(len(self.first), dtype=np.int64)
        targets = (~self.on(codes)).astype(np.int64)
        return items, targets, (items * 2 + targets).astype(np.float64)


__all__ = ["BlockCodes"]
