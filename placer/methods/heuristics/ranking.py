"""How the search heuristics rank candidate placements: one that fits first, then the faster, or the closer to fitting.

:func:`placement_keys` is the order (random search, module search, annealing's
best placement); :func:`scored_keys` scores candidates with the simulator in
batches and returns their keys.

>>> import numpy as np
>>> placement_keys(np.array([2.0, 1.0, 0.5]), np.array([False, True, True]), np.array([0.0, 1.5, 3.0]))
[(False, 2.0), (True, 1.5), (True, 3.0)]
"""

from __future__ import annotations

import numpy as np


def placement_keys(step_time_s: np.ndarray, oom: np.ndarray, over: np.ndarray) -> list[tuple[bool, float]]:
    """``(out of memory, x)`` per placement: smaller is better.

    ``x`` is the step time of a placement that fits, and how far one that does
    not is over capacity (its worst peak / capacity, > 1). So a placement that
    fits beats one that does not, the faster of two that fit wins, and of two
    that do not, the one closer to fitting. Ranking placements out of memory by
    step time instead led a search toward all on one GPU, the fastest of them
    and the furthest from fitting, where a few moves fit.
    """
    return [
        (bool(o), float(v) if o else float(x) if np.isfinite(x) else float("inf"))
        for x, o, v in zip(step_time_s, oom, over)
    ]


def scored_keys(env, op_devices: np.ndarray, batch: int = 64) -> list[tuple[bool, float]]:
    """:func:`placement_keys` of each row of ``op_devices`` on ``env``, simulated ``batch`` rows at a time."""
    out: list[tuple[bool, float]] = []
    for s in range(0, len(op_devices), batch):
        out += placement_keys(*env.overflow(op_devices[s : s + batch]))
    return out
