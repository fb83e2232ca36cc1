"""One step of a plan across processes as a timeline: each rank's actions, measured or simulated, and their sums.

An :class:`Event` is one thing a rank did in a step: a stage's forward (``"F"``) or
backward (``"B"``; ``"I"`` and ``"W"``, its input and weight parts where a schedule splits it) of one
microbatch, or the rank's optimizer step (``"O"``). Times are seconds from the step's
start on that rank. Both legs write them: the real runtime's ranks record theirs
(:mod:`envs.real.distributed.trace`), the simulator of ranks its own
(:meth:`envs.sim.ranks.RankSim.timeline`), so the two can be laid side by side.

:func:`phases` sums a rank's events: forward, backward and optimizer seconds, and
``other_s``, the rest of its step: waiting for the other ranks' activations and
gradients (the pipeline's bubbles), the sends, and the runtime's own work between
actions. :func:`chrome_trace` writes steps in the Trace Event Format that
``chrome://tracing`` and https://ui.perfetto.dev open: one row per rank.

>>> events = [Event(0, 0, "F", 0, 0.0, 0.010), Event(0, 0, "B", 0, 0.030, 0.050), Event(0, -1, "O", -1, 0.050, 0.052)]
>>> {k: round(v * 1e3, 3) for k, v in phases(events, 0.060).items()}
{'forward_s': 10.0, 'backward_s': 20.0, 'optimizer_s': 2.0, 'other_s': 28.0, 'step_s': 60.0}
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: What an event's ``kind`` may be, and the phase it counts toward.
KINDS = {"F": "forward_s", "B": "backward_s", "I": "backward_s", "W": "backward_s", "O": "optimizer_s"}
#: The phases of :func:`phases`, in order.
PHASES = ("forward_s", "backward_s", "optimizer_s", "other_s", "step_s")


@dataclass(frozen=True)
class Event:
    """One action of one rank in a step (module doc): ``stage`` and ``microbatch`` are -1 for the optimizer step."""

    rank: int
    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float

    @property
    def name(self) -> str:
        return "optimizer step" if self.kind == "O" else f"{self.kind}{self.stage} mb{self.microbatch}"

    def to_list(self) -> list[Any]:
        return [self.rank, self.stage, self.kind, self.microbatch, self.start_s, self.end_s]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> "Event":
        rank, stage, kind, microbatch, start_s, end_s = row
        return cls(int(rank), int(stage), str(kind), int(microbatch), float(start_s), float(end_s))


def phases(events: Iterable[Event], step_s: float) -> dict[str, float]:
    """One rank's step split into forward, backward, optimizer and the rest (``other_s``), seconds (module doc)."""
    out = dict.fromkeys(PHASES, 0.0)
    for e in events:
        out[KINDS[e.kind]] += e.end_s - e.start_s
    out["step_s"] = float(step_s)
    out["other_s"] = max(0.0, out["step_s"] - out["forward_s"] - out["backward_s"] - out["optimizer_s"])
    return out


def median_phases(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each phase's median over several steps' :func:`phases` (of one rank)."""
    return {k: float(statistics.median(s[k] for s in steps)) for k in PHASES} if steps else dict.fromkeys(PHASES, 0.0)


def by_rank(events: Iterable[Event]) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = {}
    for e in events:
        out.setdefault(e.rank, []).append(e)
    return out


def rank_phases(events: Iterable[Event]) -> dict[int, dict[str, float]]:
    """Each rank's :func:`phases` in a timeline whose every rank's step ends with its last event (a simulated one)."""
    return {r: phases(mine, max(e.end_s for e in mine)) for r, mine in sorted(by_rank(events).items())}


def chrome_trace(rows: Sequence[tuple[str, Sequence[Event]]], meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Trace Event Format document: per ``(label, events)`` of ``rows``, one process row per rank of its events.

    ``label`` names the timeline (``"measured"``, ``"simulated"``); its ranks are listed
    under it in the viewer, in rank order.
    """
    out: list[dict[str, Any]] = []
    for k, (label, events) in enumerate(rows):
        for rank, mine in sorted(by_rank(events).items()):
            pid = k * 1000 + rank
            out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{label} rank {rank}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
            for e in mine:
                out.append(
                    {
                        "ph": "X",
                        "name": e.name,
                        "cat": KINDS[e.kind].removesuffix("_s"),
                        "pid": pid,
                        "tid": 0,
                        "ts": e.start_s * 1e6,
                        "dur": max(0.0, e.end_s - e.start_s) * 1e6,
                        "args": {"stage": e.stage, "microbatch": e.microbatch},
                    }
                )
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def write_chrome_trace(path: str, rows: Sequence[tuple[str, Sequence[Event]]], meta: Mapping[str, Any]) -> None:
    """:func:`chrome_trace` written to ``path`` (whole or not at all: a temporary file, renamed)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(chrome_trace(rows, meta), fh)
    os.replace(tmp, path)


__all__ = [
    "Event",
    "KINDS",
    "PHASES",
    "by_rank",
    "chrome_trace",
    "median_phases",
    "phases",
    "rank_phases",
    "write_chrome_trace",
]
