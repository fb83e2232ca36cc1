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


def will_capture(source: str) -> bool:
    """Whether resolving ``source`` runs ``torch.export`` (a ``module:callable``, or a zoo model not cached yet)."""
    if os.path.exists(source):
        return False
    if source in zoo.names():
        return not zoo.cache_path(source).exists()
    return looks_like_callable(source)


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
    raise PlacerError(f"{source}: not a graph file, zoo name ({', '.join(zoo.names())}) or module:callable")


#: What a model's training step is scored with when its forward does not return a scalar loss.
STAND_IN_LOSS = "the sum of the means of its floating-point outputs"


def describe_outputs(outputs: list[dict[str, Any]]) -> str:
    """What a forward returns, in words, from ``[{"shape": [...], "dtype": ...}, ...]``.

    >>> describe_outputs([{"shape": [4, 16, 1000], "dtype": "float32"}])
    'a float32 tensor of shape [4, 16, 1000]'
    >>> describe_outputs([{"shape": [], "dtype": "float32"}, {"shape": [2, 3], "dtype": "float16"}])
    '2 tensors (float32 [], float16 [2, 3])'
    >>> describe_outputs([])
    'no tensor'
    """
    if not outputs:
        return "no tensor"
    if len(outputs) == 1:
        return f"a {outputs[0]['dtype']} tensor of shape {list(outputs[0]['shape'])}"
    parts = ", ".join(f"{o['dtype']} {list(o['shape'])}" for o in outputs)
    return f"{len(outputs)} tensors ({parts})"


def is_scalar_loss(outputs: list[dict[str, Any]]) -> bool:
    """Whether a forward returning ``outputs`` returns its training loss: one floating-point scalar.

    >>> is_scalar_loss([{"shape": [], "dtype": "float32"}]), is_scalar_loss([{"shape": [2], "dtype": "float32"}])
    (True, False)
    """
    return (
        len(outputs) == 1
        and list(outputs[0]["shape"]) == []
        and str(outputs[0]["dtype"]).startswith(("float", "bfloat", "half", "double"))
    )


def stand_in_loss(graph: OpGraph) -> str | None:
    """None when ``graph``'s model returns a scalar loss (or the graph does not record what it returns), else why not.

    The simulator times the same forward and backward whatever the loss, so a
    model returning logits can be placed and compared; it cannot be trained
    as it is (``placer run``, ``placer train --env measured`` refuse it).
    """
    outputs = graph.meta.get("outputs")
    if not isinstance(outputs, list) or is_scalar_loss(outputs):
        return None
    return f"the model returns {describe_outputs(outputs)}, not a scalar loss"
