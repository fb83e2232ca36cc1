"""Resolve a SOURCE argument: graph file, zoo name, ``module:callable`` or ``.pt2``.

>>> looks_like_callable("mypkg.models:build")
True
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from graphs import OpGraph, PlacerError


def looks_like_callable(source: str) -> bool:
    mod, sep, attr = source.partition(":")
    return bool(sep and mod and attr and not os.path.exists(source) and "/" not in mod)


def load_callable(source: str) -> tuple[Any, tuple]:
    """Import ``module:callable`` and call it; it must return ``(model, example_inputs)``."""
    mod_name, _, attr = source.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the user's own modules in cwd
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or any error raised while importing the user's module
        raise PlacerError(f"{source}: cannot import module {mod_name!r} ({type(e).__name__}: {e})") from None
    fn = mod
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise PlacerError(f"{source}: module {mod_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise PlacerError(f"{source}: {attr!r} is not callable")
    try:
        out = fn()
    except Exception as e:
        raise PlacerError(f"{source}: calling {attr}() failed ({type(e).__name__}: {e})") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise PlacerError(f"{source}: {attr}() must return (model, example_inputs), got {type(out).__name__}")
    model, inputs = out
    if not isinstance(inputs, tuple):
        inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
    return model, inputs


def resolve_model(source: str) -> tuple[Any, tuple]:
    """A runnable ``(model, example_inputs)`` from a zoo name or ``module:callable``."""
    from graphs import zoo

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
    import graphs

    if os.path.exists(source):
        return graphs.load(source), None
    from graphs import zoo

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
