"""Placement methods: the heuristics (a registry ``name -> function``) and the pretrained policy.

:mod:`~placer.methods.registry` holds the registry and what every caller of a
heuristic shares (:func:`place`, :func:`placement_of`, :func:`best_heuristic`);
:mod:`~placer.methods.heuristics` the heuristics, one module each;
:mod:`~placer.methods.learned` zero-shot placement with a pretrained graph-network policy.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> p = place("m_etf", random_dag(20, seed=0), envs.Cluster.preset("k80x2"))
>>> p.method, "m_etf" in names()
('m_etf', True)
"""

from __future__ import annotations

from placer.methods.registry import (
    VERSION,
    HeuristicFn,
    HeuristicUnavailable,
    accepts,
    best_heuristic,
    get,
    names,
    place,
    placement_of,
    register,
    require,
)

__all__ = [
    "VERSION",
    "HeuristicFn",
    "HeuristicUnavailable",
    "accepts",
    "best_heuristic",
    "get",
    "names",
    "place",
    "placement_of",
    "register",
    "require",
]
