"""Which blocks a plan checkpoints, chosen by the searches together with the op placement and the homes.

The candidates are the layers of the model's repeated lists of modules
(:func:`candidate_blocks`: ``layers.0``, ``layers.1``, ..., a ``ModuleList``'s
members; an encoder's and a decoder's), checkpointed as :mod:`envs.sim.checkpointing` charges them and
:mod:`envs.real.checkpointing` runs them. A search runs with every candidate on
(:class:`CheckpointScorer`: each placement it scores checkpoints every candidate
it keeps whole on one device, :func:`envs.sim.checkpointing.possible_blocks`), and
:func:`prune_blocks` then turns off, one at a time, the blocks whose second forward
costs more than the memory they free is worth. Every placement simulated counts in
the search's budget.

>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b", "c", "d", "e"], [("a", "b", 4), ("b", "c", 4), ("c", "d", 4), ("d", "e", 4)])
>>> g.module_paths = ["emb", "layers.0.mm", "layers.0.act", "layers.1.mm", "layers.1.act"]
>>> candidate_blocks(g)
['layers.0', 'layers.1']
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from envs.sim.checkpointing import possible_blocks
from graphs import OpGraph
from graphs.plan import checkpoint_blocks, in_module
from placer.learn.search_budget import OOM_FACTOR


def candidate_blocks(graph: OpGraph) -> list[str]:
    """The members (``prefix.k``) of the model's repeated module lists, each list in index order, the lists in the
    order their first op runs: every list of at least 2 members of at least 2 ops each that lies in no member of
    another such list (an encoder's layers and a decoder's, not the experts inside a layer); [] for a model without
    one.

    >>> from graphs import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c", "d", "e", "f", "g", "h"], [])
    >>> g.module_paths = ["enc.0.mm", "enc.0.act", "enc.1.mm", "enc.1.act", "dec.0.mm", "dec.0.act", "dec.1.mm",
    ...                   "dec.1.act"]
    >>> candidate_blocks(g)
    ['enc.0', 'enc.1', 'dec.0', 'dec.1']
    """
    lists: dict[str, Counter] = {}
    first: dict[str, int] = {}
    for i, path in enumerate(graph.module_paths):
        parts = path.split(".")
        for j, part in enumerate(parts):
            if part.isdigit() and j > 0:
                prefix = ".".join(parts[:j])
                lists.setdefault(prefix, Counter())[".".join(parts[: j + 1])] += 1
                first.setdefault(prefix, i)
    kept = {prefix: [m for m, c in members.items() if c >= 2] for prefix, members in lists.items()}
    kept = {prefix: members for prefix, members in kept.items() if len(members) >= 2}
    members_of = [m for members in kept.values() for m in members]
    outer = [prefix for prefix in kept if not any(prefix.startswith(m + ".") for m in members_of)]
    return [
        m
        for prefix in sorted(outer, key=lambda p: first[p])
        for m in sorted(kept[prefix], key=lambda m: int(m.rsplit(".", 1)[1]))
    ]


class CheckpointScorer:
    """A simulator scoring every placement with ``names`` checkpointed where the placement keeps a block whole (the
    module doc); everything else is the simulator's own. Wraps the env under the home codes' scorer
    (:class:`placer.learn.home_moves.HomeCodeScorer`), which passes its homes through :meth:`batch`."""

    def __init__(self, env: Any, graph: OpGraph, names: list[str]) -> None:
        self.env, self.names = env, list(names)
        self.blocks = checkpoint_blocks(graph, self.names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def batch(self, op_devices: np.ndarray, order: Any = None, *, overflow: bool = False, homes: Any = None):
        return self.env.batch(
            op_devices, order, overflow=overflow, homes=homes, checkpoint=self.blocks, checkpoint_where_possible=True
        )

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        step_time_s, failed, _ = self.batch(op_devices, order)
        return step_time_s, failed

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.batch(op_devices, order, overflow=True)


def kept_blocks(env: Any, graph: OpGraph, names: list[str], op_devices: np.ndarray, order: Any = None) -> list[str]:
    """The blocks of ``names`` that placement ``op_devices`` (in issue ``order``; None: node order) can
    checkpoint."""
    if not names:
        return []
    row = possible_blocks(env, op_devices, checkpoint_blocks(graph, names), order)
    return [name for name in names if row[first_op(graph, name)] >= 0]


def first_op(graph: OpGraph, name: str) -> int:
    """The index of the first op that runs in module ``name`` (or below it)."""
    return next(i for i, path in enumerate(graph.module_paths) if in_module(path, name))


def scores(
    env: Any, graph: OpGraph, op_devices: np.ndarray, homes: Any, rows: list[list[str]], order: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(step_time_s, failed)`` of one placement (in issue ``order``; None: node order) with each list of blocks of
    ``rows`` checkpointed: one simulated placement each."""
    ck = np.stack([checkpoint_blocks(graph, names) for names in rows])
    p = np.repeat(np.asarray(op_devices)[None, :], len(rows), axis=0)
    h = None if homes is None else np.repeat(np.asarray(homes)[None, :], len(rows), axis=0)
    t, failed, _ = env.batch(p, order, homes=h, checkpoint=ck)
    return t, failed


def prune_blocks(
    env: Any, graph: OpGraph, op_devices: np.ndarray, homes: Any, names: list[str], evals: int, order: Any = None
) -> tuple[list[str], float, bool, int]:
    """Turn checkpointed blocks off, the one whose removal lowers the search's cost (step time, times ``OOM_FACTOR``
    out of memory) most each round, while one does and ``evals`` placements remain (scored in issue ``order``);
    returns ``(blocks, step time, out of memory, placements simulated)``."""
    names = list(names)
    t, failed = scores(env, graph, op_devices, homes, [names], order)
    current, oom = float(t[0]), bool(failed[0])
    used = 1
    while names and used + len(names) <= evals:
        variants = [names[:k] + names[k + 1 :] for k in range(len(names))]
        t, failed = scores(env, graph, op_devices, homes, variants, order)
        used += len(variants)
        costs = np.where(failed, t * OOM_FACTOR, t)
        k = int(np.argmin(costs))
        if costs[k] >= current * (OOM_FACTOR if oom else 1.0):
            break
        names, current, oom = variants[k], float(t[k]), bool(failed[k])
    return names, current, oom, used


__all__ = ["CheckpointScorer", "candidate_blocks", "first_op", "kept_blocks", "prune_blocks", "scores"]
