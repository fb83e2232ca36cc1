"""Deprecated alias of placer.learn.move_search (kept until the parallel branches merge).

The move search lives in :mod:`placer.learn.move_search` and its budget in
:mod:`placer.learn.search_budget` (the old name clashed with ``policies/moves.py``,
the critic and the move features).
"""

from placer.learn.move_search import (
    MODULE_MIN_EVALS,
    PROPOSALS,
    MoveSearch,
    MoveSearchOptions,
    MoveSearchResult,
    ProposalName,
    Replay,
)
from placer.learn.search_budget import OOM_FACTOR, BudgetSpent, SearchCurve

__all__ = [
    "MODULE_MIN_EVALS",
    "OOM_FACTOR",
    "PROPOSALS",
    "BudgetSpent",
    "MoveSearch",
    "MoveSearchOptions",
    "MoveSearchResult",
    "ProposalName",
    "Replay",
    "SearchCurve",
]
