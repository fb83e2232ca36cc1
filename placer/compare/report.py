"""The report of a comparison: its rows, the best of a kind, and its JSON (written, and read back).

A row's ``kind`` is ``"heuristic"``, ``"placement"`` (given by the caller) or ``"bound"``. Reports
written before heuristics were called heuristics say ``"baseline"``; they read as ``"heuristic"``.

>>> doc = {"method": "m_etf", "kind": "baseline", "status": "ok", "step_time_s": 0.2}
>>> Row.from_dict(doc).kind
'heuristic'
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from graphs.plan import Placement
from placer.compare.table import markdown

#: The kinds of row, in table order.
KINDS = ("heuristic", "placement", "bound")
#: The kind a heuristic's row had in the JSON of earlier releases.
OLD_HEURISTIC_KIND = "baseline"


@dataclass
class Row:
    """One line of the comparison.

    Attributes:
        method: heuristic name, placement label, or ``"lower bound"``.
        kind: ``"heuristic"``, ``"placement"`` (given by the caller) or ``"bound"``.
        status: the scorer's status (``ok``, ``oom``...) or why there is no
            placement: ``not installed``, ``needs a model``, ``error``.
        step_time_s: simulated step time (None unless ``ok``, or the bound).
        speedup: best single device step time / step_time_s.
        peak_bytes: device name -> simulated peak bytes.
        place_time_s: seconds the method took to produce the placement.
        message: the scorer's or the method's message for a non-ok row.
        sim_step_time_s: step time ignoring memory (for ``oom`` rows).
        microbatches: M of the plan scored (the best of those searched).
        inflight: W, its most microbatches in flight (None: all M, fill-drain).
        placement: the placement itself (not serialised; its issue order is).
        order: the issue order of a row read back from JSON (:meth:`from_dict`), which has no placement.
        meta: what the method reports about its run (a solver's status and bound...).
        simulated: placements simulated for this row: the method's own search (over every M tried)
            and the scoring of its plans (:attr:`envs.SimEnv.simulated`).
    """

    method: str
    kind: str = "heuristic"
    status: str = "ok"
    step_time_s: float | None = None
    speedup: float | None = None
    peak_bytes: dict[str, int] = field(default_factory=dict)
    place_time_s: float | None = None
    message: str = ""
    sim_step_time_s: float | None = None
    microbatches: int = 1
    inflight: int | None = None
    placement: Placement | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    simulated: int = 0
    order: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "method": self.method,
            "kind": self.kind,
            "status": self.status,
            "step_time_s": self.step_time_s,
            "speedup": self.speedup,
            "peak_bytes": self.peak_bytes,
            "place_time_s": self.place_time_s,
            "message": self.message,
            "sim_step_time_s": self.sim_step_time_s,
            "microbatches": self.microbatches,
            "inflight": self.inflight,
            "simulated": self.simulated,
        }
        if self.meta:
            out["meta"] = self.meta
        if self.placement is not None and self.placement.order is not None:
            out["order"] = self.placement.order.tolist()
        elif self.order is not None:
            out["order"] = list(self.order)
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Row":
        """A row from its JSON (:meth:`to_dict`; an earlier release's ``"baseline"`` kind reads as ``"heuristic"``).

        The JSON has no placement; the issue order it carried is :attr:`order`.
        """
        known = {f.name for f in fields(cls)} - {"placement"}
        row = cls(**{k: v for k, v in doc.items() if k in known})
        if row.kind == OLD_HEURISTIC_KIND:
            row.kind = "heuristic"
        return row


@dataclass
class CompareReport:
    """The rows of one comparison (heuristics, then given placements, then the bound)."""

    graph: str
    graph_hash: str
    cluster: str
    devices: list[str]
    rows: list[Row]
    lower_bound_s: float | None  # None: no bound (a report read back from before either bound was given)
    best_single_s: float | None
    best_single_device: str | None
    seed: int = 0
    executor: str = "eager"
    lower_bound_name: str = ""
    previous_lower_bound_s: float | None = None
    previous_lower_bound_name: str = ""
    score_order: str = "node"

    def best(self, kind: str | None = "heuristic") -> Row | None:
        """The fastest ``ok`` row of a kind (``"heuristic"``: the best heuristic; None: of every row but the bound)."""
        ok = [
            r
            for r in self.rows
            if (r.kind == kind if kind is not None else r.kind != "bound")
            and r.status == "ok"
            and r.step_time_s is not None
        ]
        return min(ok, key=lambda r: r.step_time_s) if ok else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        return {
            "graph": self.graph,
            "graph_hash": self.graph_hash,
            "cluster": self.cluster,
            "devices": self.devices,
            "seed": self.seed,
            "executor": self.executor,
            "score_order": self.score_order,
            "best_single_s": self.best_single_s,
            "best_single_device": self.best_single_device,
            "best_heuristic": best.method if best else None,
            "lower_bound_s": self.lower_bound_s,
            "lower_bound_name": self.lower_bound_name,
            "previous_lower_bound_s": self.previous_lower_bound_s,
            "previous_lower_bound_name": self.previous_lower_bound_name,
            "rows": [r.to_dict() for r in self.rows],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "CompareReport":
        """A report from its JSON (``placer compare --json``, this release's or an earlier one's)."""
        known = {f.name for f in fields(cls)} - {"rows"}
        return cls(**{k: v for k, v in doc.items() if k in known}, rows=[Row.from_dict(r) for r in doc.get("rows", [])])

    def table(self) -> str:
        """A markdown table: one row per method, then the lower bound (:func:`placer.compare.table.markdown`)."""
        return markdown(self)
