"""Graphs: the graph and the plan. The op-graph IR, capture from PyTorch, the Placement, DAG algorithms, grouping, the
model zoo.

The bottom of the import graph: imports nothing from ``envs``, ``policies`` or
``placer``. torch is imported only when capture or the zoo is used, so loading
and walking graphs and plans stays light.
"""

from __future__ import annotations

import importlib

from graphs.errors import CaptureError, GraphFormatError, PlacerError
from graphs.io import load, save
from graphs.ir import FORMAT, OpGraph
from graphs.plan import Placement

__all__ = [
    "OpGraph",
    "FORMAT",
    "Placement",
    "load",
    "save",
    "capture",
    "zoo",  # noqa: F822 (a submodule, module __getattr__ loads it on first use)
    "PlacerError",
    "GraphFormatError",
    "CaptureError",
]


def capture(model, example_inputs, **options) -> OpGraph:
    """Capture one training step of ``model`` as an :class:`OpGraph` (see graphs.torch_capture)."""
    from graphs.torch_capture import capture as _capture  # torch: loaded only to capture

    return _capture(model, example_inputs, **options)


def __getattr__(name: str):
    if name == "zoo":
        return importlib.import_module("graphs.zoo")
    raise AttributeError(f"module 'graphs' has no attribute {name!r}")
