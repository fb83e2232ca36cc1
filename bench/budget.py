"""Every method at equal budgets: simulated placements or seconds, every placement counted, from the same start.

Behind ``scripts/bench_budget.py``. For each graph, cluster, budget and seed:

* **start**: the best of the rule heuristics (:data:`START_HEURISTICS`: list
  schedulers, the expert, one GPU; none searches with the simulator), each
  scored once. Whoever starts from it pays for it: its simulated placements
  and its seconds count against the learner's, the ablation's, annealing's and
  ilp's budgets;
* **learned**: the move search with the learned critic
  (:class:`placer.learn.moves.MoveSearch`), from the best of the start and
  what ``module_search`` finds on the search's ``module_share`` of the budget
  (run first, counted; the same seed as the rival below, so it is the rival's
  first share);
* **uniform**: the same loop with uniform proposals (the ablation);
* **module_search**: ``module_search(n)`` from its own uniform draws;
* **annealing**: annealing started from the start's heuristic, the same n
  (its cooling schedule sized to the budget);
* **ilp**: the CP-SAT model given the same seconds (at a budget of placements,
  the seconds the learner took), hinted with the start.

Every method but ilp scores through one :class:`BudgetEnv`, which counts every
row simulated, stops the method when its budget is spent (a method's result is
the best placement it had simulated by then, as the method itself would
return it) and records its best-so-far curve. Every method's best placement
is then timed in the best issue order :meth:`envs.SimEnv.plan_order` finds
(four more simulations of it, counted, for every method alike; ilp keeps its
own order where that is faster; a method that began at the start keeps the
start's plan where that is faster): the plan a placement file carries, and
what the table compares. All figures are simulated step times and hold inside the simulator
only.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

import envs
from bench.common import Progress
from graphs import OpGraph, PlacerError
from graphs.synthetic import FAMILIES
from placer.learn.moves import MoveSearch, MoveSearchOptions
from placer.methods import get
from placer.methods.registry import HeuristicUnavailable
from placer.sources import resolve_graph

#: Simulations :meth:`envs.SimEnv.plan_order` makes of one placement (a dataflow schedule, three issue orders).
PLAN_EVALS = 4
#: The start's candidates: rule heuristics that place without searching the simulator.
START_HEURISTICS = ("m_etf", "m_sct", "heft", "m_topo", "expert", "single")
METHODS = ("learned", "uniform", "module_search", "annealing", "ilp")
#: annealing's starting temperature (relative to the start's step time), tuned for the rival on nmt-2 and
#: inception-v3 (k80x4): at its default 0.05 it accepted nothing from nmt-2's expert start in 10k proposals;
#: 2e-4 reached 261.4 / 248.0 ms (10k / 100k) there, and 331.2 / 324.7 on inception-v3 (0.05: 373.9 / -)
ANNEALING_T0 = 2e-4
RIVALS = ("module_search", "annealing", "ilp")


class BudgetSpent(Exception):
    """Raised by :class:`BudgetEnv` once its budget is used up."""


@dataclass
class Budget:
    """``kind`` "evals" (simulated placements) or "seconds", and how many."""

    kind: str
    value: float

    @property
    def label(self) -> str:
        return f"{self.value / 1000:g}k placements" if self.kind == "evals" else f"{self.value:g} s"


class BudgetEnv:
    """``env.step_times`` for one method: counts rows, enforces the budget, keeps the best row and its curve.

    ``order`` ("planned" or None) is applied to every call, whatever the method asks.
    A batch that would overrun ``max_evals`` is cut: its first rows are scored
    (and count), then :class:`BudgetSpent` is raised.
    """

    def __init__(
        self,
        env: envs.SimEnv,
        *,
        max_evals: int | None = None,
        deadline_s: float | None = None,
        order: str | None = None,
    ) -> None:
        self.env, self.max_evals, self.deadline_s, self.order = env, max_evals, deadline_s, order
        self.t0 = time.perf_counter()
        self.evals = 0
        self.best_key: tuple[bool, float] = (True, math.inf)
        self.best_row: np.ndarray | None = None
        self.curve: dict[str, list[float]] = {"evals": [], "wall_s": [], "best_s": []}

    def __getattr__(self, name: str) -> Any:  # graph, cluster, microbatches... of the wrapped env
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        t, oom, _ = self._scored(op_devices, order, overflow=False)
        return t, oom

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._scored(op_devices, order, overflow=True)

    def _scored(self, op_devices: np.ndarray, order: Any, *, overflow: bool):
        if self.deadline_s is not None and self.elapsed_s() >= self.deadline_s:
            raise BudgetSpent
        rows = np.asarray(op_devices, dtype=np.int32)
        left = len(rows) if self.max_evals is None else self.max_evals - self.evals
        if left <= 0:
            raise BudgetSpent
        cut = rows[:left]
        kw = {} if self.order is None else {"order": self.order}
        if order is not None:
            kw = {"order": order}
        out = self.env.overflow(cut, **kw) if overflow else (*self.env.step_times(cut, **kw), None)
        self._record(cut, out[0], out[1])
        self.evals += len(cut)
        if len(cut) < len(rows):
            raise BudgetSpent
        return out

    def _record(self, rows: np.ndarray, times: np.ndarray, oom: np.ndarray) -> None:
        for k, (row, t, bad) in enumerate(zip(rows, np.asarray(times, dtype=float), np.asarray(oom, dtype=bool))):
            key = (bool(bad) or not math.isfinite(t), float(t) if math.isfinite(t) else math.inf)
            if key < self.best_key:
                self.best_key, self.best_row = key, row.copy()
                if not key[0]:
                    self.curve["evals"].append(self.evals + k + 1)
                    self.curve["wall_s"].append(self.elapsed_s())
                    self.curve["best_s"].append(key[1])


def resolve(source: str) -> OpGraph:
    """A zoo name, graph file or ``module:callable``, or a synthetic family as ``family-ops[-seed]`` (``moe-400``)."""
    family, _, rest = source.partition("-")
    if family in FAMILIES and rest:
        size, _, seed = rest.partition("-")
        if size.isdigit() and (not seed or seed.isdigit()):
            graph = FAMILIES[family](int(size), seed=int(seed or 0))
            graph.name = source
            return graph
    graph = resolve_graph(source)
    graph.name = graph.name or source
    return graph


def graphs_and_clusters(graphs: str, clusters: str) -> tuple[list[OpGraph], list[Any]]:
    """The scripts' ``--graphs`` and ``--clusters`` comma lists, resolved (:func:`resolve`; presets or files);
    PlacerError names the first bad one."""
    from bench.common import parse_list

    return (
        [resolve(g) for g in parse_list(graphs, what="graphs")],
        [envs.resolve_cluster(c) for c in parse_list(clusters, what="clusters")],
    )


def plan_time(env: envs.SimEnv, op_devices: np.ndarray | None, own: float | None = None) -> float | None:
    """The placement's step time in the best issue order ``env.plan_order`` finds (or ``own``, if faster)."""
    if op_devices is None:
        return own
    _, _, t = env.plan_order(np.asarray(op_devices, dtype=np.int64))
    return min(float(t), own) if own is not None else float(t)


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
    rows, names = [], []
    for name in START_HEURISTICS:
        try:
            rows.append(np.asarray(get(name)(graph, cluster, seed=seed), dtype=np.int32))
            names.append(name)
        except (PlacerError, HeuristicUnavailable):
            continue
    t, oom = env.step_times(np.stack(rows), **({} if order is None else {"order": order}))
    cost = np.where(oom, np.inf, t)
    j = int(np.argmin(cost))
    plan_s = plan_time(env, rows[j])
    return Start(
        names[j], rows[j].astype(np.int64), float(t[j]), len(rows) + PLAN_EVALS, time.perf_counter() - t0, plan_s
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
    ok = rec.best_row is not None and not rec.best_key[0]
    plan_s = plan_time(rec.env, rec.best_row) if ok else None
    if start is not None and plan_s is not None:  # it started there: its plan is never slower than the start's
        plan_s = min(plan_s, start.plan_step_time_s)
    return Run(
        method, rec.best_key[1] if ok else None, evals + (PLAN_EVALS if ok else 0), wall, rec.curve, note, plan_s
    )


#: The move search's acceptance temperature for the ``*_accept`` methods (MoveSearchOptions.accept), chosen on
#: moe-400 / k80x4 seeds 0-3 at 10k (0.002 and 0.005 gave the same median).
ACCEPT = 0.003


def run_moves(proposals: str, accept: float = 0.0) -> Callable[..., Run]:
    name = ("learned" if proposals == "critic" else "uniform") + ("_accept" if accept else "")

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
        search = MoveSearch(
            graph, cluster, rec, options=MoveSearchOptions(proposals=proposals, accept=accept), seed=seed, order=order
        )
        result = search.run(start.op_devices, max_evals=max_evals, time_budget_s=seconds)
        run = _finish(name, rec, start, f"{result.rounds} rounds, {result.kicks} kicks, {search.accepted} accepted")
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
    rows = np.repeat(start.op_devices[None].astype(np.int32), 64, axis=0)
    rows[np.arange(64), rng.integers(0, rows.shape[1], 64)] = rng.integers(0, env.num_devices, 64)
    kw = {} if order is None else {"order": order}
    env.step_times(rows[:1], **kw)
    t0 = time.perf_counter()
    env.step_times(rows, **kw)
    return len(rows) / max(time.perf_counter() - t0, 1e-9)


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
    # not in METHODS: the acceptance variant, on request (--methods)
    "learned_accept": run_moves("critic", ACCEPT),
    "uniform_accept": run_moves("uniform", ACCEPT),
}


def budget_cell(
    graph: OpGraph,
    cluster: Any,
    budgets: Sequence[Budget],
    *,
    methods: Sequence[str] = METHODS,
    seeds: Sequence[int] = (0,),
    order: str | None = None,
    ilp_workers: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every method at every budget and seed on one graph and cluster (see the module docstring)."""
    bad = [m for m in methods if m not in RUNNERS]
    if bad:
        raise PlacerError(f"--methods: unknown {', '.join(bad)} (known: {', '.join(RUNNERS)})")
    say = progress or (lambda line: None)
    env = envs.SimEnv(graph, cluster)
    bound = env.lower_bound()
    out: dict[str, Any] = {
        "graph": graph.name,
        "cluster": cluster.name,
        "num_ops": graph.num_ops,
        "score_order": order or "node",
        "lower_bound_s": float(bound),
        "lower_bound_name": getattr(bound, "name", ""),
        "runs": [],
    }
    for budget in budgets:
        for seed in seeds:
            start = best_start(graph, cluster, env, order, seed)
            out.setdefault("start", {"method": start.name, "step_time_s": start.step_time_s, "evals": start.evals})
            learner_s = None
            for method in methods:
                seconds = learner_s if (method == "ilp" and budget.kind == "evals") else None
                run = RUNNERS[method](
                    graph, cluster, env, budget, start, seed, order, seconds=seconds, ilp_workers=ilp_workers
                )
                if method == "learned":
                    learner_s = run.wall_s
                best = f"{run.step_time_s * 1e3:.2f} ms" if run.step_time_s is not None else run.note or "none"
                say(
                    f"  {graph.name}/{cluster.name} {budget.label} seed {seed} {method}: {best} "
                    f"({run.evals:,} placements, {run.wall_s:.1f} s)"
                )
                out["runs"].append(
                    {"budget": {"kind": budget.kind, "value": budget.value}, "seed": seed, **run.to_dict()}
                )
    return out


def medians(
    cell: dict[str, Any], time_key: str = "plan_step_time_s"
) -> dict[tuple[str, float], dict[str, float | None]]:
    """(budget kind, value) -> method -> median over the seeds of ``time_key`` (None if it never placed)."""
    found: dict[tuple[str, float], dict[str, list[float]]] = {}
    for r in cell["runs"]:
        key = (r["budget"]["kind"], r["budget"]["value"])
        found.setdefault(key, {}).setdefault(r["method"], [])
        if r.get(time_key) is not None:
            found[key][r["method"]].append(r[time_key])
    return {k: {m: (statistics.median(v) if v else None) for m, v in by.items()} for k, by in found.items()}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a is not None and b else "–"


def markdown_table(cells: Sequence[dict[str, Any]]) -> str:
    """One row per graph, cluster and budget: each method's median plan, learned over the best rival and over
    uniform."""
    extra = [m for m in RUNNERS if m not in METHODS and any(r["method"] == m for c in cells for r in c["runs"])]
    accept = "learned_accept" in extra  # the acceptance variant and its own ablation, when run
    head = [
        "graph",
        "cluster",
        "budget",
        *METHODS,
        *extra,
        "best rival",
        "learned / best rival",
        "learned / uniform",
        *(["learned_accept / best rival", "learned_accept / uniform_accept"] if accept else []),
        "best / bound (bound)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for cell in cells:
        for (kind, value), by in medians(cell).items():
            rivals = {m: by[m] for m in RIVALS if by.get(m) is not None}
            rival = min(rivals.items(), key=lambda kv: kv[1]) if rivals else None
            best = min(v for v in by.values() if v is not None) if any(v is not None for v in by.values()) else None
            budget = Budget(kind, value).label
            cols = [f"{by[m] * 1e3:.2f}" if by.get(m) is not None else "–" for m in (*METHODS, *extra)]
            ratios = (
                [
                    _ratio(by.get("learned_accept"), rival[1] if rival else None),
                    _ratio(by.get("learned_accept"), by.get("uniform_accept")),
                ]
                if accept
                else []
            )
            lines.append(
                "| "
                + " | ".join(
                    [
                        cell["graph"],
                        cell["cluster"],
                        budget,
                        *cols,
                        f"{rival[0]} {rival[1] * 1e3:.2f}" if rival else "–",
                        _ratio(by.get("learned"), rival[1] if rival else None),
                        _ratio(by.get("learned"), by.get("uniform")),
                        *ratios,
                        f"{_ratio(best, cell['lower_bound_s'])} ({cell['lower_bound_name']})",
                    ]
                )
                + " |"
            )
    return "\n".join(lines)
