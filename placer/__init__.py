"""placer: the product's front — training, heuristics, compare, apply, the CLI (and ``placer.Placement``, from :mod:`graphs.plan`)."""

from __future__ import annotations

import importlib

from graphs.plan import Placement

__all__ = ["Placement", "train", "apply", "baselines"]


def __getattr__(name: str):
    # Heavy parts (torch, tensorboard) load on first use.

    if name in ("baselines", "train", "apply"):
        # placer.train and placer.apply are modules that can be called like their main function
        return importlib.import_module(f"placer.{name}")
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
