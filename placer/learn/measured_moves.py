"""The measured loop's ablation: the move search whose every placement is measured, with no model of the simulator.

This is what ``placer train --env measured --algo moves`` does: the simulator's schedule describes the moves, the
measurements judge them. With a few dozen measurements it tries a few dozen moves from its start. Beside
:class:`placer.learn.measured_search.CorrectedSearch` at the same number of measurements it shows what the
correction adds (BENCHMARKS.md, "Learning from measurements").

Where the simulator scores one stage per rank only (``RankSim`` with ``one_stage_per_rank``: a contiguous split
across processes), moving an item almost always makes more stages than ranks. There the ablation moves cuts
instead, as the corrected loop does (:func:`measured_cut_search`): a pattern search, each cut a step either way,
measured, the step halved when no cut moves.

With ``confirm`` (the corrected loop's option of that name; off by default), a placement that measures faster than
the best so far is measured once more before the search takes it (unless it won by over three noise widths), and
the search sees that second measurement: the first was the lowest of many noisy ones, the second was not chosen.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

import envs
from envs.cluster import Cluster
from envs.real.distributed.cut import split_sequence
from envs.scorer import measure_again
from graphs import OpGraph
from placer.learn.measured_search import choose, finalists_of, noise_width, worth_confirming
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.search_budget import BudgetSpent
from placer.methods.heuristics.stage_search import cut_range, cuts_of, split_of, stages_of


class MeasuredMoves:
    """A scorer for the move search: each new placement measured by ``real`` until ``measurements`` are spent (then
    :class:`BudgetSpent`), the schedules the search reads simulated by ``sim``. Keeps the best measured and the
    curve of the best after each measurement. ``confirm``: a new fastest is measured again first (module doc)."""

    def __init__(self, real: Any, sim: Any, measurements: int, confirm: bool = False) -> None:
        self.real, self.sim, self.measurements, self.confirm = real, sim, measurements, confirm
        self.seen: dict[bytes, tuple[float, bool]] = {}
        self.best_s, self.best_op_devices = float("inf"), None
        self.curve: list[float] = []
        self.repeats: list[list[float]] = []  # the placements measured twice: both measurements
        self.placements: dict[bytes, np.ndarray] = {}  # every placement measured, by its key in ``seen``
        self.rematched: dict[str, list[float]] = {}  # the side-by-side at the end (:meth:`rematch`)
        self.chosen, self.chosen_op_devices = "best", None

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int32))
        keys = [hashlib.blake2b(p.tobytes(), digest_size=16).digest() for p in op_devices]
        new = [k for k, key in enumerate(keys) if key not in self.seen]
        left = self.measurements - len(self.curve)
        take = new[: max(left, 0)]
        if take:
            step_time_s, failed = self.real.step_times(op_devices[take])
            for j, k in enumerate(take):
                t, f = float(step_time_s[j]), bool(failed[j])
                self.curve.append(self.best_s)
                spent = len(self.curve) + len(take) - j - 1  # this batch's others are measured already
                if not f and t < self.best_s and self.confirm and spent < self.measurements:
                    if worth_confirming(t, self.best_s, noise_width(self.repeats)):
                        t, f = self._again(op_devices[k], t)
                if not f and t < self.best_s:
                    self.best_s, self.best_op_devices = t, op_devices[k].copy()
                self.seen[keys[k]] = (t if not f else float("inf"), f)
                self.placements[keys[k]] = op_devices[k].copy()
                self.curve[-1] = self.best_s
        if len(take) < len(new):
            raise BudgetSpent
        out = [self.seen[key] for key in keys]
        return np.array([t for t, _ in out]), np.array([f for _, f in out])

    def _again(self, op_devices: np.ndarray, first_s: float) -> tuple[float, bool]:
        """``op_devices`` measured once more (a measurement of the budget): what the search sees of it from now."""
        step_time_s, failed = measure_again(self.real, op_devices[None])
        t, f = float(step_time_s[0]), bool(failed[0])
        self.repeats.append([first_s, t if not f else float("inf")])
        self.curve.append(self.best_s)  # (made the best after it, where it is)
        return t, f

    def rematch(self, start: np.ndarray, rounds: int, finalists: int = 2) -> None:
        """The side-by-side at the end, as the corrected loop's (:meth:`CorrectedSearch.rematch`): the ``finalists``
        fastest placements measured and ``start`` (the simulator's best), measured again ``rounds`` times each; the
        one with the lowest median is the search's plan (:attr:`plan`)."""
        ranked = sorted((t, key) for key, (t, f) in self.seen.items() if not f and np.isfinite(t))
        if not rounds or not ranked:
            return
        fastest = [self.placements[key] for _, key in ranked[: max(finalists, 1)]]
        self.rematched, self.chosen, self.chosen_op_devices = choose(self.real, *finalists_of(fastest, start), rounds)

    @property
    def plan(self) -> np.ndarray | None:
        """The search's plan: the side-by-side's winner, or without one the fastest measured (None: none)."""
        return self.chosen_op_devices if self.chosen_op_devices is not None else self.best_op_devices

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        return self.sim.schedule(op_devices, order)

    def schedule_order(self, op_devices: np.ndarray) -> np.ndarray:
        return self.sim.schedule_order(op_devices)


def measured_move_search(
    graph: OpGraph,
    cluster: Cluster,
    real: Any,
    start: np.ndarray,
    *,
    measurements: int,
    sim: Any = None,
    seed: int = 0,
    options: MoveSearchOptions | None = None,
    confirm: bool = False,
    rematch: int = 0,
    finalists: int = 2,
    merge: bool = True,
) -> MeasuredMoves:
    """The move search from ``start`` (no uniform draws, no module_search share: each would cost a measurement)
    with every placement measured, until ``measurements`` are spent; the scorer, holding the best and the curve.
    ``rematch``: then the side-by-side of :meth:`MeasuredMoves.rematch` (the ``finalists`` fastest and ``start``),
    ``rematch`` rounds; its winner is the scorer's :attr:`~MeasuredMoves.plan`. ``merge``: the cut search may merge
    a stage into its neighbour (:func:`measured_cut_search`)."""
    sim = sim if sim is not None else envs.SimEnv(graph, cluster)
    scorer = MeasuredMoves(real, sim, measurements, confirm=confirm)
    if getattr(sim, "one_stage_per_rank", False):
        order, spans = split_sequence(graph)  # node order unless ops write a buffer in place
        measured_cut_search(scorer, np.asarray(start, dtype=np.int32), merge=merge, order=order if spans else None)
    else:
        o = options or MoveSearchOptions()  # the levels in turn, as the corrected loop's searches (CorrectedSearch)
        o = dataclasses.replace(o, starts=0, module_share=0.0, levels=o.levels or "cycle")
        search = MoveSearch(graph, cluster, scorer, options=o, seed=seed)
        search.run(np.asarray(start, dtype=np.int64), max_evals=1 << 40)
    scorer.rematch(start, rematch, finalists)
    return scorer


def measured_cut_search(
    scorer: MeasuredMoves, start: np.ndarray, merge: bool = True, order: np.ndarray | None = None
) -> None:
    """A pattern search on ``start``'s cuts, every split measured through ``scorer`` until its budget is spent: each
    cut in turn a step later, else a step earlier (within its neighbours), the first that measures faster kept; when
    no cut moves, the step halves (from a sixteenth of the ops), down to one op. Where no cut moves one op either way
    and measurements are left, the search looks further: the step starts again from twice the last widest, and so
    on until a step would span the whole sequence (a split measured before costs nothing: it ends where every split
    within reach is measured). Without that, a sequence of few items ended after three or four measurements, its
    rivals' budget unspent. ``merge``: a step that would pass a neighbouring cut (or the sequence's end) lands on it
    instead, leaving the stage between them empty: its ops join the neighbour's device, a plan on one rank fewer
    (:func:`~placer.methods.heuristics.stage_search.cut_range`). ``order``: the sequence the cuts move in
    (:func:`~envs.real.distributed.cut.split_sequence`; None: node order)."""
    order = np.arange(len(start)) if order is None else np.asarray(order)
    position = np.argsort(order)
    start = np.asarray(start)[order]  # by position in the sequence
    n, cuts = len(start), cuts_of(start)
    sequence = start[[0, *cuts]]

    def measure(c: list[int]) -> float:
        t, failed = scorer.step_times(sequence[stages_of(c, n)][position][None].astype(np.int32))
        return float("inf") if failed[0] else float(t[0])

    step = widest = max(n // 16, 1)
    try:
        best_s = measure(cuts)
        while cuts:
            moved = merged = False
            for k in range(len(cuts)):
                lo, hi = cut_range(cuts, k, n, merge=merge)
                for c in (cuts[k] + step, cuts[k] - step):
                    if merge:  # past a neighbour: onto it
                        c = min(max(c, lo), hi)
                    if lo <= c <= hi and c != cuts[k]:
                        tried = cuts[:k] + [c] + cuts[k + 1 :]
                        t = measure(tried)
                        if t < best_s:
                            _, sequence, cuts = split_of(sequence, tried, n)
                            best_s, moved, merged = t, True, len(cuts) < len(tried)
                            break
                if merged:  # a stage merged away: a new pass over the cuts left
                    break
            if not moved:
                if step > 1:
                    step //= 2
                elif 2 * widest < n:
                    step = widest = 2 * widest
                else:
                    return
    except BudgetSpent:
        return
