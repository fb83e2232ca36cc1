"""What an agent observes: the graph's items, the devices and the placement so far, as padded arrays.

The observation is a :class:`gymnasium.spaces.Dict` of fixed-shape arrays, not a
:class:`gymnasium.spaces.Graph`: Stable-Baselines3 (``MultiInputPolicy``) and
RLlib take Dicts of Box / MultiDiscrete / Discrete / MultiBinary spaces, and
neither takes a Graph space. The item graph is given as an edge list and as
the paper's per-item features, which already hold each item's nearest
neighbours. Arrays are padded to ``max_items`` items and ``max_edges`` edges
(default: this graph's own counts), so one agent can be trained on several
graphs at a common size; ``mask`` marks the real items. ``flatten=True`` gives
the same content as one float32 vector (:func:`gymnasium.spaces.flatten`), for
default networks that take one (RLlib's default model).

===============  ==============================  ====================================================================
key              space                           what
===============  ==============================  ====================================================================
``items``        Box float32 [N, 54 + 2D]        per item: the paper's features (:func:`policies.features.featurize`:
                                                 output shapes, 20 neighbours, standardised log FLOPs and bytes),
                                                 then its forward + backward seconds on each device / ``t_ref``, then
                                                 its static bytes (weights, gradients, Adam state) / each device's
                                                 memory; clipped to +-1e6
``devices``      Box float32 [D, 4]              per device: log10 memory bytes, log10 FLOP/s, log10 memory
                                                 bandwidth, 1 for the host CPU (all in [0, 100])
``edges``        Box int64 [E, 2]                item graph edges (from, to); -1 rows are padding
``edge_bytes``   Box float32 [E]                 log(1 + bytes) of each edge; 0 for padding
``placement``    MultiDiscrete [N] of D + 1      each item's device so far; D: not placed (and padding)
``cursor``       Discrete N + 1                  the item to place next (the sequential view); N: none
``mask``         MultiBinary [N]                 1 for a real item, 0 for padding
===============  ==============================  ====================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from envs.sim import cost
from graphs import PlacerError
from placer.gym.problem import Problem
from policies.features import MAX_NEIGHBOURS, SHAPE_WIDTH, featurize

#: Bounds of the float arrays (finite, as agents' input normalisers expect): item features are clipped to
#: +-FEATURE_BOUND (a standardised column or a ratio of seconds stays far inside it); logs of bytes and rates are
#: below LOG_BOUND.
FEATURE_BOUND, LOG_BOUND = 1e6, 100.0
#: The paper's per-item features (:func:`policies.features.featurize`): shapes, neighbours and 9 cost columns.
PAPER_FEATURES = SHAPE_WIDTH + MAX_NEIGHBOURS + 9


class Observer:
    """The observation space of a problem and its observations (see the module doc)."""

    def __init__(
        self, problem: Problem, *, max_items: int | None = None, max_edges: int | None = None, flatten: bool = False
    ) -> None:
        g, n, d = problem.items_graph, problem.num_items, problem.num_devices
        self.num_items, self.num_devices = n, d
        self.max_items = _at_least(max_items, n, "max_items", "items")
        self.max_edges = _at_least(max_edges, g.num_edges, "max_edges", "item graph edges")
        N, E = self.max_items, self.max_edges
        self.dict_space = spaces.Dict(
            {
                "items": spaces.Box(-FEATURE_BOUND, FEATURE_BOUND, (N, featurize_width(d)), np.float32),
                "devices": spaces.Box(0.0, LOG_BOUND, (d, 4), np.float32),
                "edges": spaces.Box(-1, max(N - 1, 0), (E, 2), np.int64),
                "edge_bytes": spaces.Box(0.0, LOG_BOUND, (E,), np.float32),
                "placement": spaces.MultiDiscrete(np.full(N, d + 1, dtype=np.int64)),
                "cursor": spaces.Discrete(N + 1),
                "mask": spaces.MultiBinary(N),
            }
        )
        self.flatten = flatten
        flat = spaces.flatten_space(self.dict_space)
        self.space = (
            spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32)
            if flatten
            else self.dict_space
        )
        self._static = self._static_arrays(problem)

    def _static_arrays(self, problem: Problem) -> dict[str, np.ndarray]:
        """What does not change within an episode: the items, the devices, the edges, the mask."""
        g, n, N, E = problem.items_graph, self.num_items, self.max_items, self.max_edges
        items = np.zeros((N, featurize_width(self.num_devices)), dtype=np.float32)
        items[:n] = np.clip(item_features(problem), -FEATURE_BOUND, FEATURE_BOUND)
        edges = np.full((E, 2), -1, dtype=np.int64)
        edges[: g.num_edges] = np.stack([g.edge_src, g.edge_dst], axis=1)
        edge_bytes = np.zeros(E, dtype=np.float32)
        edge_bytes[: g.num_edges] = np.log1p(g.edge_bytes.astype(np.float64))
        mask = np.zeros(N, dtype=np.int8)
        mask[:n] = 1
        return {
            "items": items,
            "devices": device_features(problem),
            "edges": edges,
            "edge_bytes": edge_bytes,
            "mask": mask,
        }

    def observe(self, item_devices: np.ndarray | None, cursor: int | None) -> Any:
        """The observation with ``item_devices`` placed (None: nothing; the device count D marks unplaced items)
        and ``cursor`` the next item (None: none)."""
        placement = np.full(self.max_items, self.num_devices, dtype=np.int64)
        if item_devices is not None:
            placement[: self.num_items] = item_devices
        obs = {
            **{key: a.copy() for key, a in self._static.items()},  # each observation its own: users keep them
            "placement": placement,
            "cursor": np.int64(self.max_items if cursor is None else cursor),
        }
        obs = {key: obs[key] for key in self.dict_space}  # the space's key order
        if self.flatten:
            return spaces.flatten(self.dict_space, obs).astype(np.float32)
        return obs


def featurize_width(num_devices: int) -> int:
    """Columns of ``items``: the paper's 54 features, then 2 per device (seconds, memory share)."""
    return PAPER_FEATURES + 2 * num_devices


def item_features(problem: Problem) -> np.ndarray:
    """``[num_items, featurize_width(D)]`` float32: the paper's features, seconds per device / t_ref, memory share."""
    g, graph, cluster = problem.items_graph, problem.graph, problem.cluster
    op_item = problem.grouping.op_group if problem.grouping is not None else np.arange(graph.num_ops)
    fwd_s, bwd_s = cost.op_times(graph, cluster)
    seconds = np.zeros((problem.num_items, problem.num_devices))
    np.add.at(seconds, op_item, fwd_s + bwd_s)
    static = np.bincount(op_item, weights=cost.static_bytes(graph).astype(np.float64), minlength=problem.num_items)
    memory_share = static[:, None] / cluster.memory_bytes[None, :].astype(np.float64)
    paper = featurize(g).dense
    out = np.concatenate([paper, seconds / problem.t_ref, memory_share], axis=1).astype(np.float32)
    if out.shape[1] != featurize_width(problem.num_devices):  # the paper's feature count changed under us
        raise PlacerError(f"observation: {out.shape[1]} item features, expected {featurize_width(problem.num_devices)}")
    return out


def device_features(problem: Problem) -> np.ndarray:
    """``[D, 4]`` float32: log10 memory bytes, log10 FLOP/s, log10 memory bandwidth, 1 for the host."""
    c = problem.cluster
    host = c.host.astype(np.float64)
    cols = [
        np.log10(np.maximum(a.astype(np.float64), 1.0)) for a in (c.memory_bytes, c.flops_per_s, c.mem_bw_bytes_per_s)
    ]
    return np.stack([*cols, host], axis=1).astype(np.float32)


def _at_least(value: int | None, need: int, option: str, what: str) -> int:
    if value is None:
        return need
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < need:
        raise PlacerError(f"{option}={value!r}: the graph has {need} {what}; give at least that many")
    return int(value)
