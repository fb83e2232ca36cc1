"""Scoring candidate placements in batches for the search heuristics (random search, module search, annealing)."""

from __future__ import annotations

import numpy as np


def scored_keys(env, idx: np.ndarray, batch: int = 64) -> list[tuple[bool, float]]:
    """(out of memory, step time) of each row of ``idx`` on ``env``, simulated ``batch`` rows at a time.

    Smaller is better: a placement that fits beats one that does not, then the faster wins.
    """
    out: list[tuple[bool, float]] = []
    for s in range(0, len(idx), batch):
        t, oom = env.step_times(idx[s:s + batch])
        out += [(bool(o), float(x) if np.isfinite(x) else float("inf")) for o, x in zip(oom, t)]
    return out
