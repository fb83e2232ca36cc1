"""Scoring candidate placements in batches for the search heuristics (random search, module search, annealing)."""

from __future__ import annotations

import numpy as np


def scored_keys(env, op_devices: np.ndarray, batch: int = 64) -> list[tuple[bool, float]]:
    """``(out of memory, x)`` of each row of ``op_devices`` on ``env``, simulated ``batch`` rows at a time.

    ``x`` is the step time of a placement that fits, and how far one that does
    not is over capacity (its worst peak / capacity, > 1). Smaller is better: a
    placement that fits beats one that does not, the faster of two that fit
    wins, and of two that do not, the one closer to fitting. Ranking placements
    out of memory by step time instead led a search toward all on one GPU,
    the fastest of them and the furthest from fitting, where a few moves fit.
    """
    out: list[tuple[bool, float]] = []
    for s in range(0, len(op_devices), batch):
        t, oom, over = env.overflow(op_devices[s : s + batch])
        out += [
            (bool(o), float(v) if o else float(x) if np.isfinite(x) else float("inf")) for o, x, v in zip(oom, t, over)
        ]
    return out
