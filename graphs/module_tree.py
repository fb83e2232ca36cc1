"""Groupings by the model's module tree: one group per module at a depth (``lstm.layers.0``), every distinct depth.

What a practitioner places by (a layer per GPU, as ``device_map`` and the
``expert`` heuristic do); a policy placing these few groups only decides where
each module goes (``placer place --method learned``'s module views,
:mod:`placer.methods.heuristics.module_search`).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from graphs.errors import PlacerError
from graphs.grouping import Grouping, colocate, merge_cycles, renumber_by_first_op
from graphs.ir import OpGraph


def module_grouping(graph: OpGraph, depth: int) -> Grouping:
    """Group ``graph``'s ops by module: one group per module path cut to ``depth`` components.

    Every op whose ``module_paths`` entry starts with the same ``depth`` dotted
    components (``lstm.layers.0.ih`` at depth 3 is ``lstm.layers.0``) joins one
    group, together with its co-location group (:func:`colocate`). A co-location
    group that spans modules (a layer's view of the previous layer's output) goes
    with the module of its first op: joining every module it touches chained the
    layers of a Hugging Face GPT-2 into one group at every depth. Ops recorded at
    the top level (an empty path) keep their co-location groups. Where joining
    makes the group graph cyclic (a module whose output a top-level op turns
    into its own input), each strongly connected component becomes one group
    (``grouping.graph.meta["merged_cycles"]``), so the result is always a DAG.

    >>> from graphs.ir import OpGraph
    >>> g = OpGraph.from_edges(["e", "a0", "a1", "b0", "b1", "out"],
    ...     [("e", "a0", 8), ("a0", "a1", 8), ("a1", "b0", 8), ("b0", "b1", 8), ("a0", "b0", 8), ("b1", "out", 8)],
    ...     module_paths=["emb", "rnn.l0.ih", "rnn.l0.hh", "rnn.l1.ih", "rnn.l1.hh", ""])
    >>> module_grouping(g, 2).op_group.tolist(), module_grouping(g, 1).op_group.tolist()
    ([0, 1, 1, 2, 2, 3], [0, 1, 1, 1, 1, 2])

    A view (``b0``) of one layer's output taken in the next layer stays with the first:

    >>> v = OpGraph.from_edges(["a0", "b0", "b1"], [("a0", "b0", 8), ("b0", "b1", 8)],
    ...     op_types=["aten.mm.default", "aten.view.default", "aten.mm.default"], module_paths=["h.0", "h.1", "h.1"])
    >>> module_grouping(v, 2).op_group.tolist()
    [0, 0, 1]

    A top-level op between two ops of one module would close a cycle; the three become one group:

    >>> h = OpGraph.from_edges(["a", "t", "b", "c"], [("a", "t", 8), ("t", "b", 8), ("b", "c", 8)],
    ...                        module_paths=["m", "", "m", "n"])
    >>> grouping = module_grouping(h, 1)
    >>> grouping.op_group.tolist(), grouping.graph.meta["merged_cycles"]
    ([0, 0, 0, 1], 1)
    """
    if int(depth) < 1:
        raise PlacerError(f"module_grouping: depth must be >= 1, got {depth}")
    return _module_grouping(graph, int(depth), colocate(graph).astype(np.int64))


def _module_grouping(graph: OpGraph, depth: int, unit: np.ndarray) -> Grouping:
    """:func:`module_grouping` given the co-location group of each op (``unit``, int64)."""
    n = graph.num_ops
    key_of_unit: dict[int, str] = {}  # a unit's module: that of its first op recorded in one
    for i, path in enumerate(graph.module_paths):
        if path and int(unit[i]) not in key_of_unit:
            key_of_unit[int(unit[i])] = ".".join(path.split(".")[:depth])
    first: dict[str, int] = {}
    a, b = [], []
    for u, key in key_of_unit.items():
        j = first.setdefault(key, u)
        if j != u:
            a.append(j)
            b.append(u)
    num_units = int(unit.max()) + 1 if n else 0
    if a:
        adj = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(num_units, num_units)).tocsr()
        _, labels = connected_components(adj, directed=False)
        unit = renumber_by_first_op(labels[unit])
    unit, merged_cycles = merge_cycles(graph, unit)
    return Grouping.from_assignment(graph, unit, meta={"module_depth": depth, "merged_cycles": merged_cycles})


def module_levels(graph: OpGraph, max_groups: int = 512) -> list[Grouping]:
    """The distinct :func:`module_grouping` partitions of ``graph``, shallowest first.

    One per module depth from 1 to the deepest path, skipping a depth that
    groups the ops exactly as a shallower one did, and any with fewer than 2 or
    more than ``max_groups`` groups. Empty when the graph records no module
    paths (a synthetic graph or a file without them).

    >>> from graphs.ir import OpGraph
    >>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("b", "c", 8)], module_paths=["m.x", "m.y", "n"])
    >>> [(lv.graph.meta["module_depth"], lv.op_group.tolist()) for lv in module_levels(g)]
    [(1, [0, 0, 1])]
    """
    deepest = max((p.count(".") + 1 for p in graph.module_paths if p), default=0)
    unit = colocate(graph).astype(np.int64)
    units = int(unit.max()) + 1 if graph.num_ops else 0
    levels, seen = [], set()
    for depth in range(1, deepest + 1):
        grouping = _module_grouping(graph, depth, unit)
        key = grouping.op_group.tobytes()
        if key not in seen and grouping.num_groups != units and 2 <= grouping.num_groups <= max_groups:
            levels.append(grouping)
        seen.add(key)
    return levels
