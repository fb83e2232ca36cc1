"""The methods of the equal-budget benchmark (:mod:`bench.budget`), each run from the same start at one budget.

:func:`best_start` is the start: the best of the rule heuristics, each scored once, which the methods that begin
there pay for. :data:`RUNNERS` holds one runner per method (the move search with its critic and its uniform
ablation, ``module_search``, annealing, ilp; on request the move search taking slower moves); each scores
through a :class:`bench.budget_env.BudgetEnv` (ilp through the plain simulator) and returns a :class:`Run`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import envs
from bench.budget_env import Budget, BudgetEnv, BudgetSpent
from graphs import OpGraph, PlacerError
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.methods import get
from placer.methods.registry import HeuristicUnavailable

#: Simulations :meth:`envs.SimEnv.plan_order` makes of one placement (a dataflow schedule, three issue orders).
PLAN_EVALS = 4
#: The start's candidates: rule heuristics that place without searching the simulator.
START_HEURISTICS = ("m_etf", "m_sct", "heft", "m_topo", "expert", "single")
METHODS = ("learned", "uniform", "module_search", "annealing", "ilp")
#: annealing's starting temperature (relative to the start's step time), tuned for this benchmark on nmt-2 and
#: inception-v3 (k80x4): at its default 0.05 it accepted nothing from nmt-2's expert start in 10k proposals;
#: 2e-4 reached 261.4 / 248.0 ms (10k / 100k) there, and 331.2 / 324.7 on inception-v3 (0.05: 373.9 / -)
ANNEALING_T0 = 2e-4
#: The heuristics the learner is compared with ("best rival" in the table).
HEURISTICS = ("module_search", "annealing", "ilp")


def plan_time(env: envs.SimEnv, op_devices: np.ndarray | None, own: float | None = None) -> float | None:
    """The placement's step time in the best issue order ``env.plan_order`` finds (or ``own``, if faster)."""
    if op_devices is None:
        return own
    _, _, step_time_s = env.plan_order(np.asarray(op_devices, dtype=np.int64))
    return min(float(step_time_s), own) if own is not None else float(step_time_s)


@dataclass
class Start:
    """The start every method but module_search begins from, and what it cost."""

    name: str
    op_devices: np.ndarray
    step_time_s: float
    evals: int
    wall_s: float
    plan_step_time_s: float  # in its best issue order: no method that starts from it returns a slower plan


def best_start(graph: OpGraph, cluster: Any, env: envs.SimEnv, order: str | None, seed: int) -> Start:
    """The fastest of :data:`START_HEURISTICS` under ``env`` (in ``order``), each scored once."""
    t0 = time.perf_counter()
    op_devices, names = [], []
    for name in START_HEURISTICS:
        try:
            op_devices.append(np.asarray(get(name)(graph, cluster, seed=seed), dtype=np.int32))
            names.append(name)
        except (PlacerError, HeuristicUnavailable):
            continue
    step_time_s, failed = env.step_times(np.stack(op_devices), **({} if order is None else {"order": order}))
    cost = np.where(failed, np.inf, step_time_s)
    j = int(np.argmin(cost))
    plan_s = plan_time(env, op_devices[j])
    return Start(
        names[j],
        op_devices[j].astype(np.int64),
        float(step_time_s[j]),
        len(op_devices) + PLAN_EVALS,
        time.perf_counter() - t0,
        plan_s,
    )


@dataclass
class Run:
    """One method at one budget: its best simulated step time and what it spent.

    ``step_time_s``: as the method scored it (node order, or the budget's order; ilp: its own plan's order);
    ``plan_step_time_s``: its best placement in the best of the issue orders :meth:`envs.SimEnv.plan_order`
    tries (and, for ilp, its own), which is what a placement file carries and a user runs. The table
    compares plans.
    """

    method: str
    step_time_s: float | None
    evals: int
    wall_s: float
    curve: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""
    plan_step_time_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "step_time_s": self.step_time_s,
            "plan_step_time_s": self.plan_step_time_s,
            "evals": self.evals,
            "wall_s": self.wall_s,
            "curve": self.curve,
            "note": self.note,
        }


def _limits(budget: Budget, start: Start | None) -> tuple[int | None, float | None]:
    """(max evals, seconds) left to a method after its start's share and the timing of its plan's issue orders."""
    spent_evals, spent_s = (start.evals, start.wall_s) if start is not None else (0, 0.0)
    if budget.kind == "evals":
        return max(int(budget.value) - spent_evals - PLAN_EVALS, 0), None
    return None, max(budget.value - spent_s, 0.0)


def _finish(method: str, rec: BudgetEnv, start: Start | None, note: str = "") -> Run:
    evals = rec.evals + (start.evals if start is not None else 0)
    wall = rec.elapsed_s() + (start.wall_s if start is not None else 0.0)
    ok = rec.best_op_devices is not None and not rec.best_key[0]
    plan_s = plan_time(rec.env, rec.best_op_devices) if ok else None
    if start is not None and plan_s is not None:  # it started there: its plan is never slower than the start's
        plan_s = min(plan_s, start.plan_step_time_s)
    return Run(
        method, rec.best_key[1] if ok else None, evals + (PLAN_EVALS if ok else 0), wall, rec.curve, note, plan_s
    )


#: The move search's acceptance temperature for the ``*_accept`` methods (MoveSearchOptions.accept), chosen on
#: moe-400 / k80x4 seeds 0-3 at 10k (0.002 and 0.005 gave the same median).
ACCEPT = 0.003


def run_moves(
    proposals: str,
    accept: float = 0.0,
    *,
    critic: str | None = None,
    fine_tune: bool = True,
    kicks: str = "uniform",
    levels: str | None = None,
    kick_at: str | None = None,
    combine: bool = True,
    name: str = "",
    **more: Any,
) -> Callable[..., Run]:
    """The move search's runner: ``proposals``, acceptance ``accept``, starting from ``critic`` (None: untrained;
    "pretrained": the shipped one), fine-tuned online or not, ``kicks`` uniform or from the policy that imitates its
    local optima, ``levels`` learned or in turn (None: learned with the critic, in turn with uniform proposals),
    ``kick_at`` and ``combine``, and any ``more`` MoveSearchOptions fields (``batch=8``); the method's ``name``
    (default from the proposals)."""
    name = name or ("learned" if proposals == "critic" else "uniform") + ("_accept" if accept else "")
    options = MoveSearchOptions(
        proposals=proposals,
        accept=accept,
        critic=critic,
        fine_tune=fine_tune,
        kicks=kicks,
        levels=levels,
        kick_at=kick_at,
        combine=combine,
        **more,
    )

    def run(
        graph: OpGraph,
        cluster: Any,
        env: envs.SimEnv,
        budget: Budget,
        start: Start,
        seed: int,
        order: str | None,
        **_: Any,
    ) -> Run:
        max_evals, seconds = _limits(budget, start)
        rec = BudgetEnv(env, max_evals=max_evals, order=order)
        search = MoveSearch(graph, cluster, rec, options=options, seed=seed, order=order)
        result = search.run(start.op_devices, max_evals=max_evals, time_budget_s=seconds)
        combined = "{} of {} combinations taken".format(*search.combined[::-1])
        run = _finish(
            name, rec, start, f"{result.rounds} rounds, {result.kicks} kicks, {search.accepted} accepted, {combined}"
        )
        run.evals = result.evals + start.evals + PLAN_EVALS  # its count includes the incumbents' schedules it simulated
        return run

    return run


def run_module_search(
    graph: OpGraph, cluster: Any, env: envs.SimEnv, budget: Budget, start: Start, seed: int, order: str | None, **_: Any
) -> Run:
    max_evals, seconds = _limits(budget, None)
    rec = BudgetEnv(env, max_evals=max_evals, deadline_s=seconds, order=order)
    try:
        get("module_search")(graph, cluster, seed=seed, n=max_evals if max_evals is not None else 10**12, env=rec)
    except BudgetSpent:
        pass
    except HeuristicUnavailable as e:
        return Run("module_search", None, 0, 0.0, note=e.status)
    return _finish("module_search", rec, None)


def _moves_per_s(env: envs.SimEnv, start: Start, order: str | None, seed: int) -> float:
    """Simulated placements per second of single-op moves from the start (sizes annealing's schedule to seconds)."""
    rng = np.random.default_rng(seed)
    op_devices = np.repeat(start.op_devices[None].astype(np.int32), 64, axis=0)
    op_devices[np.arange(64), rng.integers(0, op_devices.shape[1], 64)] = rng.integers(0, env.num_devices, 64)
    kw = {} if order is None else {"order": order}
    env.step_times(op_devices[:1], **kw)
    t0 = time.perf_counter()
    env.step_times(op_devices, **kw)
    return len(op_devices) / max(time.perf_counter() - t0, 1e-9)


def run_annealing(
    graph: OpGraph, cluster: Any, env: envs.SimEnv, budget: Budget, start: Start, seed: int, order: str | None, **_: Any
) -> Run:
    max_evals, seconds = _limits(budget, start)
    steps = max_evals if max_evals is not None else int(0.9 * _moves_per_s(env, start, order, seed) * seconds)
    rec = BudgetEnv(env, max_evals=max_evals, order=order)
    init = () if start.name == "single" else (start.name,)  # every GPU alone is among its starts anyway
    try:
        get("annealing")(
            graph,
            cluster,
            seed=seed,
            steps=max(steps - len(cluster.gpu_indices()) - len(init), 1),
            time_budget_s=seconds,
            init=init,
            env=rec,
            t0=ANNEALING_T0,
        )
    except BudgetSpent:
        pass
    return _finish("annealing", rec, start)


def run_ilp(
    graph: OpGraph,
    cluster: Any,
    env: envs.SimEnv,
    budget: Budget,
    start: Start,
    seed: int,
    order: str | None,
    seconds: float | None = None,
    ilp_workers: int = 1,
    **_: Any,
) -> Run:
    if seconds is None:
        seconds = _limits(budget, start)[1]
    t0 = time.perf_counter()
    try:
        p = get("ilp")(
            graph, cluster, seed=seed, time_limit_s=max(seconds, 1.0), num_workers=ilp_workers, hint=start.name, env=env
        )
    except HeuristicUnavailable as e:
        return Run("ilp", None, 0, 0.0, note=e.status)
    r = env.simulate(p)  # its own plan: the placement and the issue order the solver chose
    wall = time.perf_counter() - t0 + start.wall_s
    note = f"{p.meta.get('solver_status')}, {p.meta.get('windows', p.meta.get('items'))} windows/items"
    own = float(r.step_time_s) if r.ok else None
    return Run(
        "ilp",
        own,
        start.evals,
        wall,
        note=note,
        plan_step_time_s=plan_time(env, p.indices(graph, cluster.device_names), own) if r.ok else None,
    )


RUNNERS: dict[str, Callable[..., Run]] = {
    "learned": run_moves("critic"),
    "uniform": run_moves("uniform"),
    "module_search": run_module_search,
    "annealing": run_annealing,
    "ilp": run_ilp,
    # not in METHODS: the ablation's two halves, the critic with the levels in turn and uniform moves with the levels
    # learned (MoveSearchOptions.levels)
    "learned_cycle": run_moves("critic", levels="cycle", name="learned_cycle"),
    "uniform_levels": run_moves("uniform", levels="learned", name="uniform_levels"),
    # not in METHODS: an untrained critic that is never trained (it ranks by its random initialisation; the levels
    # learned): what a ranking that learned nothing gives
    "untrained_frozen": run_moves("critic", fine_tune=False, name="untrained_frozen"),
    # not in METHODS: the acceptance variant, on request (--methods)
    "learned_accept": run_moves("critic", ACCEPT),
    "uniform_accept": run_moves("uniform", ACCEPT),
    # not in METHODS: the critic pretrained across graphs (policies/pretrained/critic-default.pt), fine-tuned online
    # as "learned"'s untrained critic is, and frozen (the ablation that shows what the online training adds)
    "pretrained": run_moves("critic", critic="pretrained", name="pretrained"),
    # not in METHODS: expert iteration, the kicks drawn from a policy that imitates the search's local optima
    # (MoveSearchOptions.kicks); "learned" is its ablation (the same search, uniform kicks)
    "expert": run_moves("critic", kicks="policy", name="expert"),
    "pretrained_frozen": run_moves("critic", critic="pretrained", fine_tune=False, name="pretrained_frozen"),
    # not in METHODS: the learner as it was before kicks of single ops and faster moves combined
    # (MoveSearchOptions.kick_at, .combine), and the uniform ablation likewise
    "learned_coarse_kicks": run_moves("critic", kick_at="coarse", combine=False, name="learned_coarse_kicks"),
    "uniform_coarse_kicks": run_moves("uniform", kick_at="coarse", combine=False, name="uniform_coarse_kicks"),
}
