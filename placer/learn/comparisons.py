"""What a training run compares its learner with once it has returned: search at equal budget, a re-measurement.

Run by ``placer train`` after the learner (not after Ctrl-C), outside the budget,
each phase showing its progress with an ETA:

- the equal-budget search (``--env sim``; ``--no-equal-budget-search`` skips it):
  :func:`equal_budget_search`, ``module_search`` given as many simulated
  placements as the whole run used (the heuristics' own included, and every
  session of a resumed run), in the run's issue order, for at most as long as
  the run took. Where its placement is faster than the learner's, it is written
  beside the best as ``equal_budget_placement.json`` (:func:`keep_faster_placement`);
  ``best_placement.json`` stays the learner's. The summary compares the learner
  with the better of it and the best heuristic;
- the rematch (``--env measured``, ``--rematch N``): :func:`rematch`, the best
  placement and the best measured heuristic's measured N more times each, side
  by side. The one with the lower median is the run's best at that median
  (``best_placement.json``, with the side-by-side in its ``meta``; the
  heuristic's placement where it wins): the best placement was judged by its
  fastest measurement, which is biased low.
"""

from __future__ import annotations

import dataclasses
import os
import time
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from envs.cluster import Cluster
from graphs import OpGraph
from placer.learn.measured_search import side_by_side
from placer.learn.move_runner import search_options
from placer.learn.move_search import MoveSearch
from placer.learn.progress import Progress, ms
from placer.learn.run_scorers import CachedScorer
from placer.learn.rundir import EQUAL_BUDGET_NAME, run_placement, save_best
from placer.learn.search_budget import BudgetSpent
from placer.learn.session import RunScorer, Session
from placer.learn.state import TrainResult
from placer.methods import get
from placer.methods.registry import HeuristicUnavailable

#: ``found_by`` of the equal-budget search's placement file.
EQUAL_BUDGET = "equal-budget search"


def compare_after_learning(session: Session, result: TrainResult) -> None:
    """The comparisons the run's options ask for, into ``result`` (``equal_budget_search``, ``rematch``)."""
    c = session.config
    learner_s = session.elapsed()  # the run's own time, before the comparisons add theirs
    if c.equal_budget_search and c.env == "sim":
        # every placement the run simulated: the heuristics' searches and scoring, the scorer's, and the
        # incumbents' schedules the move search read, in every session of the run
        simulated = session.simulated()
        limit = max(session.elapsed(), 1.0)  # never longer than the run itself
        session.progress.phase(
            f"equal budget: module_search given the {simulated:,} placements this run simulated "
            "(outside the budget; --no-equal-budget-search skips it)"
        )
        eq = equal_budget_search(
            session.graph,
            session.cluster,
            session.sim,
            simulated,
            time_limit_s=limit,
            order=session.scorer.order,
            seed=c.seed,
            progress=session.progress,
        )
        if eq is not None:
            eq["heuristics_simulated"] = session.heuristics_simulated()
            keep_faster_placement(session, eq)
        result.equal_budget_search = eq
    if c.ablation and c.env == "sim" and c.algo == "moves" and c.proposals == "critic" and not c.ranks:
        result.ablation = uniform_ablation(session, learner_s)
    if c.env == "measured" and c.rematch:
        result.rematch = rematch(session, c.rematch)
        r = result.rematch
        if r is not None and r["heuristic_s"] is not None and (r["learned_s"] or float("inf")) > r["heuristic_s"]:
            r["chosen"] = "heuristic"
            h = session.heuristics
            session.progress.phase(
                f"side by side, {h.best_name}'s placement is the faster (medians {ms(r['heuristic_s'])} vs "
                f"{ms(r['learned_s'])}): it is the run's best placement"
            )
            session.adopt(h.best_op_devices, r["heuristic_s"], f"heuristic:{h.best_name}", {"rematch": r})
        elif r is not None:
            r["chosen"] = "learned"
            if r["learned_s"] is None:
                return
            # the learner's placement at its median: the run's best was its fastest read, biased low
            session.adopt(session.state.best_indices, r["learned_s"], session.state.best_found_by, {"rematch": r})
        if r is not None:
            s = session.state
            result.best_placement = session.best_placement(prune=True)
            result.best_step_time_s, result.found_by = s.best_step_time_s, s.best_found_by


class Unrecorded(RunScorer):
    """The session's scoring (:class:`placer.learn.session.RunScorer`: the run's scorer, order and codes) for a search
    that is not the run's learner (its ablation), through a cache of its own: its placements are not the run's best,
    and neither they nor its schedules count as the run's."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, "ablation")  # with home moves, overflow too (its own, below), as the run's
        self.scorer = CachedScorer(session.scorer.env, session.scorer.order, overflow=session.scorer.overflows)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        return self.scorer(np.asarray(op_devices, dtype=np.int32))

    def _overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.scorer.scored(np.asarray(op_devices, dtype=np.int32))

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        return self.session.sim.schedule(self.session.op_devices(op_devices), order)


def uniform_ablation(session: Session, time_limit_s: float) -> dict[str, Any] | None:
    """The learner's move search with nothing learned: its moves drawn uniformly and the levels in turn, the run's
    other options, seed and start (the best heuristic's placement, ``--warm-start best``), given as many placements
    as the learner's search simulated in this session, for at most ``time_limit_s`` (the run's). What the learning added
    is the learner's best against its best (``ablation``: ``{evals, simulated, stopped, step_time_s, wall_s}``). None
    on a resumed run (its learner restarted from the run's best) or where the learner simulated nothing."""
    c = session.config
    learner = session.simulated() - session.heuristics_simulated()
    learner -= session.simulated_before - session.heuristics_simulated_before  # earlier sessions', a shape choice's
    if c.resume or learner < 1:
        return None
    limit = max(time_limit_s, 1.0)
    session.progress.phase(
        f"ablation: the same move search with its moves drawn uniformly and the levels in turn, given the "
        f"{learner:,} placements the learner's search simulated (outside the budget; --no-ablation skips it)"
    )
    options = dataclasses.replace(
        search_options(c, homes=session.homes_searched, blocks=session.block_moves), proposals="uniform"
    )
    t0 = time.perf_counter()
    search = MoveSearch(
        session.graph, session.cluster, Unrecorded(session), options=options, seed=c.seed, order=session.scorer.order
    )
    start = session.heuristics.best_op_devices if c.warm_start == "best" else None
    session.progress.start("ablation", total=int(learner), unit="placements", within_s=limit)
    try:
        search.begin(start, max_evals=int(learner), time_budget_s=limit)
        while True:
            search.step()
            session.progress.update(search.budget.evals)
    except BudgetSpent:
        session.progress.update(search.budget.evals)  # its last batch, cut at the budget, shown too
    finally:
        session.progress.close()
    result = search.result()
    return {
        "method": "uniform moves, levels in turn",
        "evals": int(learner),
        "simulated": int(result.evals),
        "stopped": result.evals < learner,
        "step_time_s": None if not np.isfinite(result.step_time_s) else float(result.step_time_s),
        "wall_s": time.perf_counter() - t0,
    }


def equal_budget_search(
    graph: OpGraph,
    cluster: Cluster,
    sim: Any,
    evals: int,
    *,
    order: str | None,
    seed: int,
    time_limit_s: float | None = None,
    progress: Progress | None = None,
) -> dict[str, Any] | None:
    """``module_search`` given ``evals`` simulated placements: search at equal budget, to compare the learner with.

    ``sim``: the run's simulator (:class:`envs.SimEnv`, or across processes :class:`envs.sim.ranks.RankSim`), which
    counts what it simulates (``simulated``).
    It searches in the run's order (``order`` "planned" or None), as the learner did. None where the graph
    records no module paths.
    ``time_limit_s``: no new round of the search starts after this many seconds (the run's own time, so the
    comparison never takes longer than the run); ``simulated`` is then what it had simulated, ``evals`` the
    placements it was given, and ``stopped`` True. ``op_devices``: its placement (device indices).
    ``progress``: where it shows how many placements it has simulated, and its ETA.
    """
    if evals < 1:
        return None
    progress = progress if progress is not None else Progress(enabled=False)
    t0, before = time.perf_counter(), sim.simulated
    env = sim.in_order(order)
    deadline = t0 + time_limit_s if time_limit_s is not None else None
    progress.start("equal budget", total=int(evals), unit="placements", within_s=time_limit_s)
    try:
        op_devices = get("module_search")(
            graph,
            cluster,
            seed=seed,
            n=int(evals),
            env=Reporting(env, lambda: progress.update(sim.simulated - before)),
            deadline=deadline,
        )
    except HeuristicUnavailable:
        return None
    finally:
        progress.close()
    simulated = sim.simulated - before
    op_devices = np.asarray(op_devices, dtype=np.int32)
    step_time_s, oom = env.step_times(op_devices[None])
    return {
        "method": "module_search",
        "evals": int(evals),
        "simulated": simulated,
        "stopped": simulated < evals,
        "step_time_s": None if oom[0] else float(step_time_s[0]),
        "wall_s": time.perf_counter() - t0,
        "op_devices": op_devices,
    }


class Reporting:
    """A simulator (:class:`envs.scorer.Scorer`, with ``overflow``) that calls ``report()`` after every batch."""

    def __init__(self, env: Any, report: Callable[[], None]) -> None:
        self.env, self.report = env, report

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        scored = self.env.step_times(op_devices, order)
        self.report()
        return scored

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scored = self.env.overflow(op_devices, order)
        self.report()
        return scored


def keep_faster_placement(session: Session, eq: dict[str, Any]) -> None:
    """Where the equal-budget search found a placement faster than the run's best, write it beside the best
    (``EQUAL_BUDGET_NAME``, with its issue order; ``eq["placement"]`` its path): the comparison stays as it was, and
    the faster placement is not lost. The run's best is left as the learner's."""
    op_devices = eq.pop("op_devices")
    step_time_s, best = eq.get("step_time_s"), session.state.best_step_time_s
    if step_time_s is None or not (best is None or step_time_s < best * (1 - 1e-12)):
        return
    meta = {"step_time_s": step_time_s, "found_by": EQUAL_BUDGET, "evals": eq["simulated"]}
    path = os.path.join(session.logdir, EQUAL_BUDGET_NAME)
    placement = run_placement(
        session.graph,
        session.devices,
        session.cluster,
        session.config,
        op_devices,
        f"heuristic:{eq['method']}",
        meta,
        session.planner,
    )
    save_best(path, placement)  # a resumed run's earlier, faster one stays
    eq["placement"] = path


def rematch(session: Session, rounds: int) -> dict[str, Any] | None:
    """Measure the best placement and the best measured heuristic's ``rounds`` more times each, the two in one
    batch each round, so they share the workers' conditions: the best placement's time is the least of many
    noisy measurements, the heuristic's a single one, so comparing those two favours the learner. None when
    there is nothing to compare (no heuristic measured, or the best placement is the heuristic's)."""
    s, h = session.state, session.heuristics
    if not h.measured or h.best_op_devices is None or s.best_indices is None or not np.isfinite(h.best_step_time_s):
        return None
    pair = np.stack([np.asarray(s.best_indices, dtype=np.int32), np.asarray(h.best_op_devices, dtype=np.int32)])
    if np.array_equal(pair[0], pair[1]):
        return None
    session.progress.phase(
        f"re-measuring the best placement and {h.best_name}'s side by side, {rounds} times each (--rematch 0 skips it)"
    )
    session.progress.start("rematch", total=rounds, unit="rounds")
    try:
        again = SimpleNamespace(measure_again=session.scorer.fresh)  # past the run's cache and the env's
        learned, heuristic = side_by_side(again, list(pair), rounds, on_round=session.progress.update)
    finally:
        session.progress.close()
    return {
        "heuristic": h.best_name,
        "rounds": rounds,
        "learned_s": _median(learned),
        "heuristic_s": _median(heuristic),
        "learned_times_s": [t if np.isfinite(t) else None for t in learned],
        "heuristic_times_s": [t if np.isfinite(t) else None for t in heuristic],
    }


def _median(step_time_s: list[float]) -> float | None:
    ok = [t for t in step_time_s if np.isfinite(t)]
    return float(np.median(ok)) if ok else None
