"""Deprecated alias of bench.time_to_placement (kept until the parallel branches merge).

``placer.methods.heuristics.search`` is the heuristics' search; this is the time-to-placement benchmark.
"""

from bench.time_to_placement import (
    METHODS,
    RUNNERS,
    RecordingEnv,
    SearchBudgetExhausted,
    evals_per_s,
    markdown_table,
    reference_lines,
    search_curves,
)

__all__ = [
    "METHODS",
    "RUNNERS",
    "RecordingEnv",
    "SearchBudgetExhausted",
    "evals_per_s",
    "markdown_table",
    "reference_lines",
    "search_curves",
]
