"""Deprecated alias of placer.learn.run_scorers (kept until the parallel branches merge).

What a training run scores with lives in :mod:`placer.learn.run_scorers` (the old
name clashed with ``bench/fidelity/scoring.py``); the measured heuristics in
:mod:`placer.learn.run_heuristics`.
"""

from placer.learn.run_heuristics import measured_heuristics
from placer.learn.run_scorers import ENVS, CachedScorer, measured_env, reference_time, sim_env

__all__ = ["ENVS", "CachedScorer", "measured_env", "measured_heuristics", "reference_time", "sim_env"]
