"""The graphs and clusters a benchmark's ``--graphs`` and ``--clusters`` name, synthetic families included.

>>> resolve("moe-40").name, resolve("moe-40").num_ops > 0
('moe-40', True)
"""

from __future__ import annotations

from typing import Any

import envs
from bench.common import parse_list
from graphs import OpGraph
from graphs.sources import resolve_graph
from graphs.synthetic import FAMILIES


def resolve(source: str) -> OpGraph:
    """A zoo name, graph file or ``module:callable``, or a synthetic family as ``family-ops[-seed]`` (``moe-400``)."""
    family, _, rest = source.partition("-")
    if family in FAMILIES and rest:
        size, _, seed = rest.partition("-")
        if size.isdigit() and (not seed or seed.isdigit()):
            graph = FAMILIES[family](int(size), seed=int(seed or 0))
            graph.name = source
            return graph
    graph = resolve_graph(source)
    graph.name = graph.name or source
    return graph


def graphs_and_clusters(graphs: str, clusters: str) -> tuple[list[OpGraph], list[Any]]:
    """The ``--graphs`` and ``--clusters`` comma lists, resolved (:func:`resolve`; presets or files); PlacerError
    names the first bad one."""
    return (
        [resolve(g) for g in parse_list(graphs, what="graphs")],
        [envs.resolve_cluster(c) for c in parse_list(clusters, what="clusters")],
    )
