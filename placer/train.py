"""``placer.train(config)`` and ``from placer.train import TrainConfig``: the training loop's documented names.

The loop lives in :mod:`placer.learn.loop` and its options in
:mod:`placer.learn.config`; this module keeps the names the README documents, and
is callable like its main function (``placer.train(config, graph=...)``).
"""

from __future__ import annotations

from placer._callable import make_module_callable
from placer.learn.config import PRESETS, AlgoOptions, PolicyOptions, RunOptions, TrainConfig
from placer.learn.loop import train
from placer.learn.rundir import BEST_NAME
from placer.learn.state import RunState, TrainResult

__all__ = [
    "train",
    "TrainConfig",
    "RunOptions",
    "AlgoOptions",
    "PolicyOptions",
    "PRESETS",
    "TrainResult",
    "RunState",
    "BEST_NAME",
]

make_module_callable(__name__, train)  # `placer.train(config)` calls train()
