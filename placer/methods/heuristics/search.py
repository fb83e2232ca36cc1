"""Scoring candidate placements in batches for the search heuristics (random search, module search, annealing)."""

from __future__ import annotations

import numpy as np


def scored_keys(env, op_devices: np.ndarray, batch: int = 64) -> list[tuple[bool, float]]:
    """(out of memory, step time) of each row of ``op_devices`` on ``env``, simulated ``batch`` rows at a time.

    Smaller is better: a placement that fits beats one that does not, then the faster wins.
    """
    out: list[tuple[bool, float]] = []
    for s in range(0, len(op_devices), batch):
        t, oom = env.step_times(op_devices[s:s + batch])
        out += [(bool(o), float(x) if np.isfinite(x) else float("inf")) for o, x in zip(oom, t)]
    return out
