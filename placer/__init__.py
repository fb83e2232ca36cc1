"""placer: the product's front — Placement, training, baselines, compare, apply, CLI."""

from __future__ import annotations

from placer.placement import Placement

__all__ = ["Placement", "train", "apply", "baselines"]


def __getattr__(name: str):
    # Heavy parts (torch, tensorboard) load on first use.
    import importlib

    if name == "baselines":
        return importlib.import_module("placer.baselines")
    if name == "train":
        return importlib.import_module("placer.train").train
    if name == "apply":
        return importlib.import_module("placer.apply").apply
    raise AttributeError(f"module 'placer' has no attribute {name!r}")
