"""Compare placement methods on one scorer: every heuristic, learned placements, the bound.

>>> from graphs.synthetic import random_dag
>>> import envs
>>> report = compare(random_dag(30, seed=0), envs.Cluster.preset("k80x2"), methods=["round_robin", "m_topo"])
>>> [r.method for r in report.rows], report.rows[-1].kind
(['round_robin', 'm_topo', 'previous bound', 'lower bound'], 'bound')
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from envs.microbatch import plan_shapes
from envs.sim import SimEnv
from graphs import OpGraph, PlacerError
from graphs.plan import Placement, check_microbatches
from graphs.schema import check_int
from placer.methods import registry
from placer.methods.registry import HeuristicUnavailable, accepts, placement_of

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


@dataclass
class Row:
    """One line of the comparison.

    Attributes:
        method: heuristic name, placement label, or ``"lower bound"``.
        kind: ``"baseline"``, ``"placement"`` (given by the caller) or ``"bound"``.
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
        placement: the placement itself (not serialised).
        meta: what the method reports about its run (a solver's status and bound...).
        simulated: placements simulated for this row: the method's own search (over every M tried)
            and the scoring of its plans (:attr:`envs.SimEnv.simulated`).
    """

    method: str
    kind: str = "baseline"
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
        return out


@dataclass
class CompareReport:
    """The rows of one comparison (heuristics, then given placements, then the bound)."""

    graph: str
    graph_hash: str
    cluster: str
    devices: list[str]
    rows: list[Row]
    lower_bound_s: float
    best_single_s: float | None
    best_single_device: str | None
    seed: int = 0
    executor: str = "eager"
    lower_bound_name: str = ""
    previous_lower_bound_s: float | None = None
    previous_lower_bound_name: str = ""
    score_order: str = "node"

    def best(self, kind: str = "baseline") -> Row | None:
        """The fastest ``ok`` row of a kind (``"baseline"``: the best heuristic)."""
        ok = [r for r in self.rows if r.kind == kind and r.status == "ok" and r.step_time_s is not None]
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

    def table(self) -> str:
        """A markdown table: one row per method, then the lower bound (the JSON also has the previous bound).

        Peak memory is in GB (1e9 bytes, as the simulator's out-of-memory messages
        say), or MB / kB when no peak reaches a GB / MB, so a small model's peaks
        are not all 0.0.
        """
        unit, scale = _memory_unit(max((v for r in self.rows for v in (r.peak_bytes or {}).values()), default=0))
        head = (
            f"| method | status | step time (ms) | speed-up | place time (s) | peak {unit} "
            f"({', '.join(self.devices)}) |\n"
            "|---|---|---:|---:|---:|---|\n"
        )
        lines = []
        for r in self.rows:
            if r.method == "previous bound":
                continue
            step = f"{r.step_time_s * 1e3:.3f}" if r.step_time_s is not None else "—"
            if r.status == "oom" and r.sim_step_time_s is not None:
                step = f"({r.sim_step_time_s * 1e3:.3f})"
            speed = f"{r.speedup:.2f}x" if r.speedup is not None else "—"
            place = f"{r.place_time_s:.2f}" if r.place_time_s is not None else "—"
            peaks = "/".join(f"{r.peak_bytes.get(d, 0) / scale:.1f}" for d in self.devices) if r.peak_bytes else "—"
            status = f"{r.status}: {r.message}" if r.status not in ("ok",) and r.message else r.status
            label = (
                r.method
                if r.microbatches == 1
                else (
                    f"{r.method} (M={r.microbatches})"
                    if r.inflight is None
                    else f"{r.method} (M={r.microbatches}, W={r.inflight})"
                )
            )
            lines.append(f"| {label} | {status.replace('|', '/')} | {step} | {speed} | {place} | {peaks} |")
        return head + "\n".join(lines)


def _memory_unit(most_bytes: float) -> tuple[str, float]:
    """The unit a table of peaks up to ``most_bytes`` reads best in: GB, MB or kB (powers of 1000).

    >>> _memory_unit(38.6e9), _memory_unit(2.5e6), _memory_unit(900)
    (('GB', 1000000000.0), ('MB', 1000000.0), ('kB', 1000.0))
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if most_bytes >= scale:
            return unit, scale
    return "kB", 1e3


#: The issue orders a comparison searches and scores in (see :func:`compare`).
SCORE_ORDERS = ("node", "planned")


def default_methods(exclude: Sequence[str] = ()) -> list[str]:
    """Every registered heuristic in table order (:data:`ORDER`, then the rest), less ``exclude``."""
    known = registry.names()
    return [m for m in [*[m for m in ORDER if m in known], *[m for m in known if m not in ORDER]] if m not in exclude]


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _scored_row(row: Row, env: Any, op_devices: Any, best_single_s: float | None, order: Any = None) -> Row:
    result = env.simulate(op_devices, order=order)  # a Placement brings its own issue order and microbatches
    row.microbatches = int(result.extra.get("microbatches", 1))
    W = int(result.extra.get("inflight", row.microbatches))
    row.inflight = None if W == row.microbatches else W
    row.status = result.status
    row.peak_bytes = dict(result.peak_bytes)
    row.message = result.message
    row.sim_step_time_s = result.extra.get("sim_step_time_s")
    if result.status == "ok":
        row.step_time_s = float(result.step_time_s)
        if best_single_s is not None and row.step_time_s > 0:
            row.speedup = best_single_s / row.step_time_s
    return row


def _label(p: Any, k: int) -> str:
    return p.method or f"placement {k + 1}"


def _microbatch_counts(value: Any, what: str) -> list[int]:
    """One M or several (a list or tuple), each checked; ``what`` names them in errors."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise PlacerError(f"{what}: give at least one number of microbatches")
    return [check_microbatches(v, what) for v in values]


def _plan_shapes(ms: list[int], value: Any, what: str) -> list[tuple[int, int]]:
    """Every ``(M, W)`` to try: each M with each in-flight window of ``value`` (one, several, or None: all)."""
    ws = list(value) if isinstance(value, (list, tuple)) else [value]
    if not ws:
        raise PlacerError(f"{what}: give at least one in-flight window (or None for all)")
    return plan_shapes(ms, [None if w is None else check_int(w, what, least=1) for w in ws])


def _best_single(env: SimEnv, graph: OpGraph, cluster: Any) -> tuple[float | None, str | None]:
    """``(step time, device name)`` of the fastest single device that fits; ``(None, None)`` when none does."""
    singles = env.evaluate([np.full(graph.num_ops, d, dtype=np.int32) for d in range(cluster.num_devices)])
    ok = [(r.step_time_s, d) for d, r in enumerate(singles) if r.status == "ok"]
    return (min(ok)[0], cluster.device_names[min(ok)[1]]) if ok else (None, None)


class _Attempt:
    """One heuristic placed and scored under several plan shapes ``(M, W)``, its output kept when it is blind to M."""

    def __init__(
        self,
        method: str,
        graph: OpGraph,
        cluster: Any,
        env: SimEnv,
        own: dict[str, Any],
        seed: int,
        model: Any,
        best_single_s: float | None,
        order: str | None = None,
    ) -> None:
        self.method, self.graph, self.cluster, self.env = method, graph, cluster, env
        self.own, self.seed, self.model, self.best_single_s = own, seed, model, best_single_s
        self.order = order  # "planned": searched and scored in each placement's planned issue order; None: node order
        self.fn = registry.get(method)
        self.uses_env = accepts(self.fn, "env")
        self.placed: tuple[Any, float] | None = None  # a method blind to M places once for all of them

    def kwargs(self, M: int, W: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"seed": self.seed, **self.own}
        if self.model is not None and accepts(self.fn, "model"):
            kwargs["model"] = self.model
        if self.uses_env:
            kwargs["env"] = self.env.with_microbatches(M, W).in_order(self.order)
        return kwargs

    def row(self, M: int, W: int) -> Row:
        """The row of the plan with M microbatches, W in flight: placed (a failure is the row's status), then scored."""
        row = Row(method=self.method, microbatches=M, inflight=None if W == M else W)
        kwargs = self.kwargs(M, W)
        t0 = time.perf_counter()
        try:
            if self.placed is None or self.uses_env:
                self.placed = (self.fn(self.graph, self.cluster, **kwargs), time.perf_counter() - t0)
            out, row.place_time_s = self.placed
        except HeuristicUnavailable as e:
            row.status, row.message = e.status, str(e)
        except Exception as e:  # one failing method must not sink the table
            row.status, row.message = "error", _one_line(e)
        else:
            row.placement = placement_of(
                out, self.graph, self.cluster, self.method, meta={"seed": self.seed}, microbatches=M, inflight=W
            )
            if isinstance(out, Placement):  # a method that plans its issue order too (ilp): its run's record
                row.meta = dict(out.meta)
            try:
                if self.order == "planned" and row.placement.order is None:  # the order the searches scored in
                    p = row.placement
                    p.order = self.env.with_microbatches(M, W).schedule_order(
                        p.indices(self.graph, self.cluster.device_names)
                    )
                    p.meta["issue_order"] = "schedule"
                _scored_row(row, self.env, row.placement, self.best_single_s)
            except Exception as e:
                row.status, row.message = "error", _one_line(e)
        if row.place_time_s is None and row.status == "error":
            row.place_time_s = time.perf_counter() - t0
        return row

    def best(self, shapes: list[tuple[int, int]]) -> Row:
        """The fastest row over ``shapes`` (the first row if none ran); its place time is the search's, over all of
        them."""
        tried: list[Row] = []
        for M, W in shapes:
            tried.append(self.row(M, W))
            if tried[-1].placement is None:
                break  # the method cannot place here; another M will not change that
        ok = [r for r in tried if r.status == "ok"]
        best = min(ok, key=lambda r: r.step_time_s) if ok else tried[0]
        if len(tried) > 1 and self.uses_env:  # the search over M took all of them
            best.place_time_s = sum(r.place_time_s or 0.0 for r in tried)
        return best


def _bound_rows(lb: float, best_single_s: float | None) -> list[Row]:
    """The previous and the tightest valid lower bound as rows (a :class:`envs.sim.LowerBound` names both)."""
    bound = float(lb)
    name, previous, previous_name = (
        getattr(lb, "name", ""),
        float(getattr(lb, "previous", bound)),
        getattr(lb, "previous_name", ""),
    )
    return [
        Row(
            method="previous bound",
            kind="bound",
            status="bound",
            step_time_s=previous,
            message=previous_name,
            speedup=(best_single_s / previous) if best_single_s and previous > 0 else None,
        ),
        Row(
            method="lower bound",
            kind="bound",
            status="bound",
            step_time_s=bound,
            message=name,
            speedup=(best_single_s / bound) if best_single_s and bound > 0 else None,
        ),
    ]


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
        score_order: ``"node"`` (default): every method searches and is scored in node order;
            ``"planned"``: in each placement's planned issue order (:meth:`envs.SimEnv.schedule_order`,
            what ``placer train`` scores its samples in by default), and each heuristic's placement
            carries that order. Given placements are scored in the order they carry either way.
        bound_s: seconds for the lower bound's block programs (:mod:`envs.sim.blocks`: each stretch of
            the step between two of its cut points placed exactly, copies charged); 0 (default): the
            fast bounds only.

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
    labelled = [p if isinstance(p, tuple) else (_label(p, k), p) for k, p in enumerate(placements)]
    given = [(label, p.indices(graph, cluster.device_names, source=label)) for label, p in labelled]
    default_ms = _microbatch_counts(microbatches, "microbatches")
    default_shapes = _plan_shapes(default_ms, inflight, "inflight")
    env = SimEnv(graph, cluster, executor=executor)
    best_single_s, best_dev = _best_single(env, graph, cluster)

    rows: list[Row] = []
    for m in names:
        own = dict((options or {}).get(m, {}))
        ms = (
            _microbatch_counts(own.pop("microbatches"), f"options[{m!r}]['microbatches']")
            if "microbatches" in own
            else default_ms
        )
        shapes = (
            _plan_shapes(ms, own.pop("inflight"), f"options[{m!r}]['inflight']")
            if "inflight" in own
            else _plan_shapes(ms, inflight, "inflight")
            if ms is not default_ms
            else default_shapes
        )
        before = env.simulated
        rows.append(_Attempt(m, graph, cluster, env, own, seed, model, best_single_s, order).best(shapes))
        rows[-1].simulated = env.simulated - before
        if progress is not None:
            progress(len(rows), m)
    for (label, p), (_, idx) in zip(labelled, given):
        row = Row(method=label, kind="placement", placement=p)
        rows.append(_scored_row(row, env.with_microbatches(p.microbatches, p.inflight), idx, best_single_s, p.order))
    scored_ms = sorted(set(default_ms) | {p.microbatches for _, p in labelled})
    # no plan scored here beats the smallest bound over the Ms scored
    lb = min((env.with_microbatches(M).lower_bound(blocks_s=bound_s) for M in scored_ms), key=float)
    rows += _bound_rows(lb, best_single_s)
    bound, previous = rows[-1], rows[-2]
    return CompareReport(
        graph=graph.name,
        graph_hash=graph.content_hash,
        cluster=getattr(cluster, "name", ""),
        devices=list(cluster.device_names),
        rows=rows,
        lower_bound_s=bound.step_time_s,
        best_single_s=best_single_s,
        best_single_device=best_dev,
        seed=seed,
        executor=executor,
        lower_bound_name=bound.message,
        previous_lower_bound_s=previous.step_time_s,
        previous_lower_bound_name=previous.message,
        score_order=score_order,
    )


def plot(report: CompareReport, path: str) -> None:
    """A horizontal bar chart of step times (ok rows), the lower bound as a line."""
    try:
        import matplotlib  # an optional extra, only for --plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlacerError(f"{path}: --plot needs matplotlib ({registry.install_hint('plot')})") from None
    rows = [r for r in report.rows if r.kind != "bound" and r.status == "ok" and r.step_time_s is not None]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.5))
    y = np.arange(len(rows))
    ax.barh(
        y,
        [r.step_time_s * 1e3 for r in rows],
        color=["tab:orange" if r.kind == "placement" else "tab:blue" for r in rows],
    )
    ax.set_yticks(y, [r.method for r in rows])
    ax.invert_yaxis()
    if math.isfinite(report.lower_bound_s):
        ax.axvline(report.lower_bound_s * 1e3, color="k", linestyle="--", label="lower bound")
        ax.legend(loc="lower right")
    ax.set_xlabel("simulated step time (ms)")
    ax.set_title(f"{report.graph} on {report.cluster}")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise PlacerError(f"{path}: cannot write the plot ({e.strerror})") from None
    finally:
        plt.close(fig)
