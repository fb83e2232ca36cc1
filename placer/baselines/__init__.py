"""Deprecated name of the heuristics' registry (kept for one release): use :mod:`placer.methods`.

``placer.baselines.place(name, graph, cluster)`` and ``placer.baselines.names()``
keep working; "baseline" now means only RL's reward baseline, and the rule and
search placers are *heuristics*.
"""

from __future__ import annotations

import warnings

from placer.methods.registry import VERSION, HeuristicFn, get, names, place, register
from placer.methods.registry import HeuristicUnavailable as BaselineUnavailable

BaselineFn = HeuristicFn

__all__ = ["VERSION", "BaselineFn", "BaselineUnavailable", "get", "names", "place", "register"]

warnings.warn(
    "placer.baselines is deprecated: use placer.methods (the heuristics' registry)", DeprecationWarning, stacklevel=2
)
