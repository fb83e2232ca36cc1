"""Resolve a SOURCE argument: graph file, zoo name, ``module:callable`` or ``.pt2``.

>>> looks_like_callable("mypkg.models:build")
True
"""

from __future__ import annotations

import os
from typing import Any

import graphs
from graphs import OpGraph, PlacerError, zoo
from graphs.sources import load_callable, looks_like_callable  # noqa: F401  (the one loader; re-exported)


def resolve_model(source: str) -> tuple[Any, tuple]:
    """A runnable ``(model, example_inputs)`` from a zoo name or ``module:callable``."""
    if source in zoo.names():
        return zoo.build(source)
    if looks_like_callable(source):
        return load_callable(source)
    raise PlacerError(
        f"{source}: not a runnable model source (need a zoo name: {', '.join(zoo.names())}; or module:callable)"
    )


def resolve_graph(source: str, **capture_options: Any) -> OpGraph:
    """An :class:`OpGraph` from any SOURCE."""
    return resolve_graph_and_model(source, **capture_options)[0]


def resolve_graph_and_model(source: str, **capture_options: Any) -> tuple[OpGraph, Any]:
    """The :class:`OpGraph` of any SOURCE and, for a ``module:callable``, its model (else None).

    The model is for the methods that need one (accelerate's device maps); a
    graph captured from a callable records it in ``meta["source"]``, so a saved
    graph file can say where its model comes from (``meta`` is outside the hash).
    """
    if os.path.exists(source):
        return graphs.load(source), None

    if source in zoo.names():
        return zoo.graph(source, **capture_options), None
    if looks_like_callable(source):
        model, inputs = load_callable(source)
        graph = graphs.capture(model, inputs, **capture_options)
        graph.meta["source"] = source
        return graph, model
    if source.endswith((".json", ".gz", ".pt2")):
        raise PlacerError(f"{source}: no such file")
    raise PlacerError(
        f"{source}: not a graph file, zoo name ({', '.join(zoo.names())}) or module:callable"
    )
