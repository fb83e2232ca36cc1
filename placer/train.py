"""``placer.train(config)`` and ``from placer.train import TrainConfig``: the training run's documented names.

The run lives in :mod:`placer.learn.runners` (the learner picked by ``config.algo``)
and its options in :mod:`placer.learn.config`; this module keeps the names the
README documents, and is callable like its main function
(``placer.train(config, graph=...)``).
"""

from __future__ import annotations

from placer._callable import make_module_callable
from placer.learn.config import PRESETS, AlgoOptions, PolicyOptions, RunOptions, TrainConfig
from placer.learn.rundir import BEST_NAME
from placer.learn.runners import train
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
