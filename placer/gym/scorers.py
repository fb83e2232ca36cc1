"""What scores an environment's placements: a scorer by name, or any object of the scorer protocol.

``scorer="sim"`` (the default) is the simulator (:class:`envs.SimEnv`);
``"measured"`` real training steps on Ray actors (:class:`envs.MeasuredEnv`),
``"local"`` the same measurements in this process without Ray
(:class:`envs.real.local.LocalEnv`); both need a runnable SOURCE (a zoo name or
a ``module:callable``). Any other object with the protocol of
:mod:`envs.scorer` (``evaluate`` and ``step_times``: a multi-process runner, a
test's fake) is taken as it is, so the environments never know what scores them.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> sim = make_scorer("sim", random_dag(8, seed=0), envs.resolve_cluster("k80x2"), source="")
>>> type(sim).__name__
'SimEnv'
"""

from __future__ import annotations

from typing import Any, Callable

import envs
from envs.scorer import Scorer
from graphs import OpGraph, PlacerError, sources, zoo

#: What a scorer factory takes: the graph, the cluster, the SOURCE it came from ("" for a graph object), options.
ScorerFactory = Callable[..., Scorer]


def sim_scorer(graph: OpGraph, cluster: envs.Cluster, source: str, **options: Any) -> Scorer:
    """The simulator; ``options`` are :class:`envs.SimEnv`'s (``executor``, ``microbatches``, ``inflight``)."""
    return envs.SimEnv(graph, cluster, **options)


def _runnable(source: str, name: str) -> str:
    if not (source in zoo.names() or sources.looks_like_callable(source)):
        raise PlacerError(
            f"scorer={name!r}: graph {source or '(a graph object)'!r} is not runnable: real training steps need a "
            "zoo name or a module:callable"
        )
    return source


def measured_scorer(graph: OpGraph, cluster: envs.Cluster, source: str, **options: Any) -> Scorer:
    """Real training steps on Ray actors; ``options`` are :class:`envs.MeasuredEnv`'s (``ray_address``...)."""
    from envs.real.measured import MeasuredEnv  # ray and torch: only for real steps

    return MeasuredEnv(_runnable(source, "measured"), cluster, graph=graph, **options)


def local_scorer(graph: OpGraph, cluster: envs.Cluster, source: str, **options: Any) -> Scorer:
    """Real training steps in this process; ``options`` are :class:`envs.real.local.LocalEnv`'s."""
    from envs.real.local import LocalEnv  # torch: only for real steps

    return LocalEnv(_runnable(source, "local"), cluster, graph=graph, **options)


#: ``scorer=`` names -> the factory of that scorer.
SCORERS: dict[str, ScorerFactory] = {"sim": sim_scorer, "measured": measured_scorer, "local": local_scorer}


def make_scorer(scorer: Any, graph: OpGraph, cluster: envs.Cluster, *, source: str, **options: Any) -> Scorer:
    """The scorer ``scorer`` names (:data:`SCORERS`), or ``scorer`` itself when it has the scorer protocol."""
    if isinstance(scorer, str):
        if scorer not in SCORERS:
            raise PlacerError(f"scorer={scorer!r}: unknown (known: {', '.join(SCORERS)}, or a Scorer object)")
        return SCORERS[scorer](graph, cluster, source, **options)
    if options:
        raise PlacerError(f"scorer_options: only for a scorer given by name, not for a {type(scorer).__name__}")
    if not isinstance(scorer, Scorer):
        raise PlacerError(
            f"scorer: a {type(scorer).__name__} is not a scorer (it needs evaluate(placements) and "
            "step_times(op_devices, order=None); see envs.scorer)"
        )
    return scorer
