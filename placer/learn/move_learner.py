"""``placer train --algo moves``: the move search with its learned critic as the training loop's learner.

One training iteration is one round of :class:`placer.learn.moves.MoveSearch`: a
batch of moves from the incumbent, ranked by the critic, simulated, the critic
trained on the outcome. The search starts from the best of the best heuristic's
placement (the run's warm start; no imitation: there is no policy to imitate
with) and what ``module_search`` finds in the first iteration, given the
search's ``module_share`` of the time left (a simulated run with a time budget only); or,
on ``--resume``, from the run's best placement (the critic starts afresh: its
weights and the search's memory are not in the checkpoint). Every placement it
simulates goes through the run's scorer, so the run keeps the best one
(``best_placement.json``) whichever way it was found.

The features of a move read the simulator's schedule of the incumbent, so the
simulator is needed even when the scorer measures real steps (``--env
measured``): it describes the moves, the scorer judges them.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import envs
from placer.learn.moves import MoveSearch, MoveSearchOptions
from placer.methods import get
from placer.methods.registry import HeuristicUnavailable


class RunScorer:
    """``step_times`` through the run's cached scorer, every batch reported to the run; the simulator's schedules."""

    def __init__(
        self,
        score: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
        sim: envs.SimEnv,
        report: Callable[[np.ndarray, np.ndarray, np.ndarray, str], None],
    ) -> None:
        self.score, self.sim, self.report = score, sim, report
        self.source = "move search"  # what found the placements scored now (the run's "found by")

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(op_devices, dtype=np.int32)
        t, failed = self.score(rows)  # in the run's score order
        self.report(rows, t, failed, self.source)
        return t, failed

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        return self.sim.schedule(op_devices, order)

    def schedule_order(self, op_devices: np.ndarray) -> np.ndarray:
        return self.sim.schedule_order(op_devices)


class MoveLearner:
    """The move search as ``placer train``'s learner: :meth:`iterate` is one round, logged to TensorBoard."""

    def __init__(
        self,
        graph: Any,
        cluster: Any,
        scorer: RunScorer,
        start: np.ndarray | None,
        *,
        seed: int,
        proposals: str,
        order: str | None,
        time_left: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.search = MoveSearch(
            graph, cluster, scorer, options=MoveSearchOptions(proposals=proposals), seed=seed, order=order
        )
        self.start = start
        self.time_left = time_left
        self.begun = False

    def module_seconds(self) -> float:
        """module_search's share of the run's time left (0 without a time budget, whose length is unknown, or
        without module paths)."""
        left = self.time_left()
        if left is None or not any(lv.name.startswith("modules ") for lv in self.search.levels):
            return 0.0  # no module paths: nothing for module_search to search
        return self.search.options.module_share * max(left, 0.0)

    def begin(self, module_s: float) -> None:
        """Score the start, after ``module_s`` seconds of module_search (:meth:`module_seconds`; 0: none)."""
        self.search.begin(self.start, time_budget_s=float("inf"), module_s=module_s)
        self.begun = True

    def iterate(self, writer: Any, iteration: int) -> None:
        s = self.search
        if not self.begun:
            self.begin(self.module_seconds())
        s.step()
        ranked, uniform = s.tries[1], s.tries[0]
        scalars = {
            "charts/incumbent_step_time_s": s.cost,
            "charts/level": s.level,
            "charts/kicks": s.kicks,
            "charts/simulated": s.budget.evals,
            "charts/module_search_simulated": s.module_evals,
            "losses/critic_hit_rate": s.hits[1] / ranked if ranked else 0.0,
            "losses/uniform_hit_rate": s.hits[0] / uniform if uniform else 0.0,
        }
        for tag, value in scalars.items():
            writer.add_scalar(tag, float(value), iteration)


def equal_budget_search(
    graph: Any,
    cluster: Any,
    sim: envs.SimEnv,
    evals: int,
    *,
    order: str | None,
    seed: int,
    time_limit_s: float | None = None,
) -> dict[str, Any] | None:
    """``module_search`` given ``evals`` simulated placements: the learner's rival at equal budget, for the summary.

    It searches in the run's order (``order`` "planned" or None), as the learner did. None where the graph
    records no module paths.
    ``time_limit_s``: no new round of the search starts after this many seconds (the run's own time, so the
    comparison never takes longer than the run); ``simulated`` is then what it had simulated, ``evals`` the
    placements it was given, and ``stopped`` True. ``op_devices``: its placement (device indices).
    """
    if evals < 1:
        return None
    t0, before = time.perf_counter(), sim.simulated
    env = sim.in_order(order)
    deadline = t0 + time_limit_s if time_limit_s is not None else None
    try:
        x = get("module_search")(graph, cluster, seed=seed, n=int(evals), env=env, deadline=deadline)
    except HeuristicUnavailable:
        return None
    simulated = sim.simulated - before
    x = np.asarray(x, dtype=np.int32)
    t, oom = env.step_times(x[None])
    return {
        "method": "module_search",
        "evals": int(evals),
        "simulated": simulated,
        "stopped": simulated < evals,
        "step_time_s": None if oom[0] else float(t[0]),
        "wall_s": time.perf_counter() - t0,
        "op_devices": x,
    }
