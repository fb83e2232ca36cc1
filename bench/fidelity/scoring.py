"""Deprecated alias of bench.fidelity.metrics (kept until the parallel branches merge); ``random_placements`` is
bench.fidelity.runs' now."""

from bench.fidelity.metrics import (
    EXECUTORS,
    TARGETS,
    group_of,
    group_summary,
    mape,
    memory,
    order_checks,
    rel_diff,
    repeatability,
    scores,
    spearman,
    trusted_orders,
)
from bench.fidelity.runs import random_placements

__all__ = [
    "EXECUTORS",
    "TARGETS",
    "group_of",
    "group_summary",
    "mape",
    "memory",
    "order_checks",
    "random_placements",
    "rel_diff",
    "repeatability",
    "scores",
    "spearman",
    "trusted_orders",
]
