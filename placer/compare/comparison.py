"""Compare placement methods on one scorer: every heuristic, given placements, the bound.

>>> from graphs.synthetic import random_dag
>>> import envs
>>> report = compare(random_dag(30, seed=0), envs.Cluster.preset("k80x2"), methods=["round_robin", "m_topo"])
>>> [r.method for r in report.rows], report.rows[-1].kind
(['round_robin', 'm_topo', 'previous bound', 'lower bound'], 'bound')
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from envs.sim import SimEnv
from envs.sim.ranks import RankSim
from graphs import OpGraph, PlacerError
from graphs.plan import Placement
from placer.compare.heuristic_row import HeuristicAttempt, microbatch_counts, plan_shapes, scored_row
from placer.compare.report import CompareReport, Row
from placer.methods import registry

#: Table order for ``methods=None``: naive, practitioners', partitioners, list
#: schedulers, search. Heuristics registered later follow in registration order.
ORDER = (
    "single",
    "round_robin",
    "expert",
    "gpipe",
    "accelerate",
    "accelerate_low_0",
    "accelerate_sequential",
    "scotch",
    "metis",
    "kernighan_lin",
    "heft",
    "m_topo",
    "m_etf",
    "m_sct",
    "random_search",
    "random_modules",
    "module_search",
    "annealing",
    "ilp",
)

#: The issue orders a comparison searches and scores in (see :func:`compare`).
SCORE_ORDERS = ("node", "planned")


def default_methods(exclude: Sequence[str] = ()) -> list[str]:
    """Every registered heuristic in table order (:data:`ORDER`, then the rest), less ``exclude``."""
    known = registry.names()
    return [m for m in [*[m for m in ORDER if m in known], *[m for m in known if m not in ORDER]] if m not in exclude]


def best_single(env: Any, graph: OpGraph, cluster: Any) -> tuple[float | None, str | None]:
    """``(step_time_s, device)`` of the fastest single device that fits; ``(None, None)`` when none does."""
    singles = env.evaluate([np.full(graph.num_ops, d, dtype=np.int32) for d in range(cluster.num_devices)])
    ok = [(r.step_time_s, d) for d, r in enumerate(singles) if r.status == "ok"]
    return (min(ok)[0], cluster.device_names[min(ok)[1]]) if ok else (None, None)


def bound_rows(bound: float, best_single_s: float | None) -> list[Row]:
    """The previous and the tightest valid lower bound as rows (a :class:`envs.sim.LowerBound` names both)."""

    def row(method: str, step_time_s: float, name: str) -> Row:
        speedup = best_single_s / step_time_s if best_single_s and step_time_s > 0 else None
        return Row(method, "bound", "bound", step_time_s=step_time_s, message=name, speedup=speedup)

    step_time_s = float(bound)
    previous = float(getattr(bound, "previous", step_time_s))
    return [
        row("previous bound", previous, getattr(bound, "previous_name", "")),
        row("lower bound", step_time_s, getattr(bound, "name", "")),
    ]


def method_shapes(method: str, own: dict[str, Any], default_ms: list[int], inflight: Any) -> list[tuple[int, int]]:
    """The plan shapes ``(M, W)`` one method searches, from its own ``microbatches`` and ``inflight`` options (taken
    out of ``own``), else the comparison's."""
    ms = (
        microbatch_counts(own.pop("microbatches"), f"options[{method!r}]['microbatches']")
        if "microbatches" in own
        else default_ms
    )
    if "inflight" in own:
        return plan_shapes(ms, own.pop("inflight"), f"options[{method!r}]['inflight']")
    return plan_shapes(ms, inflight, "inflight")


def given_rows(
    env: Any, graph: OpGraph, cluster: Any, labelled: list[tuple[str, Placement]], best_single_s: float | None
) -> list[Row]:
    """A row per given placement, each scored with its own plan: its microbatches, window and issue order (and,
    across processes, its schedule)."""
    rows = []
    for label, placement in labelled:
        placement.indices(graph, cluster.device_names, source=label)  # another graph's plan: said, naming it
        row = Row(method=label, kind="placement", placement=placement)
        if isinstance(env, RankSim):
            rows.append(scored_row(row, env, placement, best_single_s))
            continue
        env_of_plan = env.with_microbatches(placement.microbatches, placement.inflight)
        # the plan whole: its issue order, parameter homes and checkpointed blocks
        rows.append(scored_row(row, env_of_plan, placement, best_single_s, placement.order))
    return rows


def compare(
    graph: OpGraph,
    cluster: Any,
    methods: Sequence[str] | None = None,
    placements: Sequence[Placement | tuple[str, Placement]] = (),
    seed: int = 0,
    model: Any = None,
    options: dict[str, dict[str, Any]] | None = None,
    executor: str = "eager",
    microbatches: int | Sequence[int] = 1,
    inflight: int | None | Sequence[int | None] = None,
    progress: Callable[[int, str], None] | None = None,
    score_order: str = "node",
    bound_s: float = 0.0,
    ranks: bool = False,
    starting: Callable[[int, str], None] | None = None,
) -> CompareReport:
    """Run ``methods`` (default: every heuristic), score them and ``placements`` on one SimEnv.

    Args:
        graph: the op graph.
        cluster: an :class:`envs.Cluster`.
        methods: heuristic names; None for all of them.
        placements: learned placements, bare or as ``(label, placement)``; a
            placement made for another graph raises :class:`PlacerError`.
        seed: passed to every method.
        model: the ``nn.Module`` for methods that need one (accelerate).
        options: per-method keyword options, e.g. ``{"annealing": {"steps": 500}}``.
        executor: the simulator's executor model, ``"eager"`` or ``"dataflow"`` (:mod:`envs.sim.schedule`).
        microbatches: M for every method's plan (:mod:`envs.microbatch`), or several
            to search: each method places (and searches, if it uses the simulator)
            under each M and its row is its fastest plan. A method's own
            ``options[m]["microbatches"]`` (an int or a list) overrides it.
        inflight: W, the most microbatches in flight (None: all M, fill-drain),
            or several to search alongside M: each M is tried with every
            ``min(W, M)``. ``options[m]["inflight"]`` overrides it.
        progress: called with ``(methods done, method name)`` after each method.
        starting: called with ``(methods done, method name)`` before each method (once every name and
            placement is checked): ``placer compare`` says on stderr which method it waits for.
        score_order: ``"node"`` (default): every method searches and is scored in node order;
            ``"planned"``: in each placement's planned issue order (:meth:`envs.SimEnv.schedule_order`,
            what ``placer train`` scores its samples in by default), and each heuristic's placement
            carries that order. Given placements are scored in the order they carry either way.
        bound_s: seconds for the lower bound's block programs (:mod:`envs.sim.blocks`: each stretch of
            the step between two of its cut points placed exactly, copies charged); 0 (default): the
            fast bounds only.
        ranks: score every plan as it runs across processes, one rank per device it uses
            (:class:`envs.sim.ranks.RankSim`: ``placer run --nproc-per-node N``'s runtime, each
            maximal run of ops on one device a pipeline stage, the schedule torch runs); the
            methods that search still search the one-process simulator (``stage_search``
            searches the simulator of ranks); the lower bound is then that of ranks
            (:func:`envs.sim.ranks.ranks_lower_bound`: the one-process bound does not hold across processes).

    Returns:
        A :class:`CompareReport`; a method that cannot run or fails gets a row
        saying so instead of stopping the comparison.
    """
    if score_order not in SCORE_ORDERS:
        raise PlacerError(f"score order {score_order!r}: unknown (known: {', '.join(SCORE_ORDERS)})")
    order = None if score_order == "node" else score_order
    names = default_methods() if methods is None else list(methods)
    for m in names:
        registry.get(m)  # unknown names: PlacerError before any work
    labelled = [p if isinstance(p, tuple) else (p.method or f"placement {k + 1}", p) for k, p in enumerate(placements)]
    for label, placement in labelled:
        placement.indices(graph, cluster.device_names, source=label)  # another graph's placement: before any work
    default_ms = microbatch_counts(microbatches, "microbatches")
    default_shapes = plan_shapes(default_ms, inflight, "inflight")
    env = SimEnv(graph, cluster, executor=executor)
    scorer = RankSim(graph, cluster) if ranks else env
    best_single_s, best_device = best_single(scorer, graph, cluster)

    def spent() -> int:  # placements simulated so far: the searches' and, across processes, the scorer's too
        return env.simulated + (scorer.simulated if scorer is not env else 0)

    rows: list[Row] = []
    for m in names:
        own = dict((options or {}).get(m, {}))
        shapes = (
            method_shapes(m, own, default_ms, inflight) if {"microbatches", "inflight"} & set(own) else default_shapes
        )
        if starting is not None:
            starting(len(rows), m)
        before = spent()
        attempt = HeuristicAttempt(m, graph, cluster, env, own, seed, model, best_single_s, order, scorer=scorer)
        rows.append(attempt.best(shapes))
        rows[-1].simulated = spent() - before
        if progress is not None:
            progress(len(rows), m)
    rows += given_rows(scorer, graph, cluster, labelled, best_single_s)
    scored_ms = sorted(set(default_ms) | {r.microbatches for r in rows if r.microbatches})  # every row's own M
    bound: dict[str, Any]
    if ranks:  # no plan scored here beats the smallest bound of ranks over the Ms scored (no earlier bound)
        lowest = min((scorer.lower_bound(M) for M in scored_ms), key=float)
        rows += bound_rows(lowest, best_single_s)[1:]
        bound = {"executor": "ranks", "lower_bound_s": rows[-1].step_time_s, "lower_bound_name": rows[-1].message}
    else:
        # no plan scored here beats the smallest bound over the Ms scored
        lowest = min((env.with_microbatches(M).lower_bound(blocks_s=bound_s) for M in scored_ms), key=float)
        rows += bound_rows(lowest, best_single_s)
        lower, previous = rows[-1], rows[-2]
        bound = {
            "executor": executor,
            "lower_bound_s": lower.step_time_s,
            "lower_bound_name": lower.message,
            "previous_lower_bound_s": previous.step_time_s,
            "previous_lower_bound_name": previous.message,
        }
    return CompareReport(
        graph=graph.name,
        graph_hash=graph.content_hash,
        cluster=getattr(cluster, "name", ""),
        devices=list(cluster.device_names),
        rows=rows,
        best_single_s=best_single_s,
        best_single_device=best_device,
        seed=seed,
        score_order=score_order,
        **bound,
    )
