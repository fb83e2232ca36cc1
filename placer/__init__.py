"""placer: the product's front — training, the heuristics, compare, apply, the CLI.

``placer.Placement`` is the plan (:mod:`graphs.plan`); ``placer.train(config)``
learns a placement (:mod:`placer.learn.loop`), ``placer.apply(model, placement,
inputs)`` runs a placement for real, ``placer.methods.place(name, graph,
cluster)`` runs a heuristic (``placer.baselines``: its deprecated name).
"""

from __future__ import annotations

import importlib

__all__ = ["Placement", "train", "apply", "methods", "baselines"]  # noqa: F822 (submodules: __getattr__)


def __getattr__(name: str):
    # Loaded on first use: train and apply import torch (and train TensorBoard); Placement numpy, which the
    # ``placer`` command imports only once its process is the one that runs (placer.console).
    if name == "Placement":
        from graphs.plan import Placement

        return Placement
    if name in ("methods", "baselines", "train", "apply"):
        # placer.train and placer.apply are modules that can be called like their main function
        return importlib.import_module(f"placer.{name}")
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
