"""Deprecated alias of bench.table1 (kept until the parallel branches merge)."""

from bench.table1 import (
    MODERN_CLUSTERS,
    NAMED_COLUMNS,
    NOT_A_HEURISTIC,
    PAPER_CLUSTERS,
    PAPER_GRAPHS,
    RL_POLICIES,
    Table1Row,
    markdown_report,
    markdown_table,
    run_table1,
    table1_row,
)

NOT_A_RIVAL = NOT_A_HEURISTIC

__all__ = [
    "MODERN_CLUSTERS",
    "NAMED_COLUMNS",
    "NOT_A_RIVAL",
    "PAPER_CLUSTERS",
    "PAPER_GRAPHS",
    "RL_POLICIES",
    "Table1Row",
    "markdown_report",
    "markdown_table",
    "run_table1",
    "table1_row",
]
