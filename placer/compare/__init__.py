"""Compare placement methods on one scorer: every heuristic, given placements, the lower bound.

:func:`compare` runs the comparison (:mod:`~placer.compare.comparison`; each heuristic's row from
:mod:`~placer.compare.heuristic_row`) into a :class:`CompareReport` (:mod:`~placer.compare.report`),
which :mod:`~placer.compare.table` writes as text and :mod:`~placer.compare.chart` draws.
"""

from __future__ import annotations

from placer.compare.chart import bars, plot
from placer.compare.comparison import ORDER, SCORE_ORDERS, compare, default_methods
from placer.compare.report import KINDS, CompareReport, Row

__all__ = ["compare", "default_methods", "plot", "bars", "CompareReport", "Row", "KINDS", "ORDER", "SCORE_ORDERS"]
