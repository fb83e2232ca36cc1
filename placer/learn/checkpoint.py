"""Training checkpoints: tensors with ``torch.save``, everything else as JSON.

One checkpoint is ``DIR/checkpoint.pt``: a dict of plain tensors and state dicts
(policy, optimizer, RNG states) plus the run's JSON state as a *string*, so a
single atomic ``os.replace`` makes the whole checkpoint consistent and loading
works with ``torch.load(weights_only=True)`` (nothing user-defined is pickled).
``DIR/checkpoint.json`` is a human-readable copy of the JSON part. Placements are
never pickled: the best placement is a list of device indices in the JSON state
and, separately, ``DIR/best_placement.json`` (a :class:`placer.Placement`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from graphs import PlacerError
from graphs.io import write_atomic, write_text_atomic

CHECKPOINT_PT = "checkpoint.pt"
CHECKPOINT_JSON = "checkpoint.json"


def save(logdir: str, tensors: dict[str, Any], state: dict[str, Any]) -> None:
    """Write the checkpoint atomically (through :func:`graphs.io.write_atomic`)."""
    os.makedirs(logdir, exist_ok=True)
    text = json.dumps(state, indent=1, sort_keys=True)
    blob = {**tensors, "state_json": text}
    write_atomic(os.path.join(logdir, CHECKPOINT_PT), lambda f: torch.save(blob, f))
    write_text_atomic(os.path.join(logdir, CHECKPOINT_JSON), text)


def exists(logdir: str) -> bool:
    return os.path.exists(os.path.join(logdir, CHECKPOINT_PT))


def load(logdir: str, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, state)`` of the checkpoint in ``logdir``; PlacerError if missing or corrupt."""
    path = os.path.join(logdir, CHECKPOINT_PT)
    if not os.path.exists(path):
        raise PlacerError(f"{path}: no checkpoint to resume from (train without --resume first)")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
        state = json.loads(blob.pop("state_json"))
    except Exception as e:  # truncated or foreign file
        raise PlacerError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from None
    return blob, state


def write_json(path: str, doc: Any) -> None:
    """Write a JSON document atomically."""
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True, default=float))
