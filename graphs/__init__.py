"""Graphs: the op-graph IR, capture from PyTorch, grouping, and the model zoo.

Imports nothing from ``envs``, ``policies`` or ``placer``. torch is imported only
when capture or the zoo is used, so loading and walking graphs stays light.
"""

from __future__ import annotations

from graphs.errors import CaptureError, GraphFormatError, PlacerError
from graphs.io import load, save
from graphs.ir import FORMAT, OpGraph

__all__ = ["OpGraph", "FORMAT", "load", "save", "capture", "zoo", "PlacerError", "GraphFormatError", "CaptureError"]


def capture(model, example_inputs, **options) -> OpGraph:
    """Capture one training step of ``model`` as an :class:`OpGraph` (see graphs.torch_capture)."""
    from graphs.torch_capture import capture as _capture

    return _capture(model, example_inputs, **options)


def __getattr__(name: str):
    if name == "zoo":
        import importlib

        return importlib.import_module("graphs.zoo")
    raise AttributeError(f"module 'graphs' has no attribute {name!r}")
