"""The heuristics' registry: ``name -> function``, and running one into a :class:`graphs.Placement`.

A *heuristic* places by rule or search (list schedulers, partitioners, annealing,
the CP-SAT ``ilp``...). Each lives in its own module of
:mod:`placer.methods.heuristics` and registers itself with :func:`register`;
every module there is imported on first use. A heuristic is
``fn(graph, cluster, **options) -> np.ndarray`` of device indices per op (into
``cluster.device_names``); a pipeline split with two stages on one device (a V, for
torch's ``zbv``) returns a :class:`~envs.real.distributed.cut.StagedSplit`, its op
devices and the ops that begin those stages; a method that plans the issue order as
well (``ilp``) returns the Placement itself. :func:`placement_of` is the one way a heuristic's
result becomes a Placement (:func:`place` and :func:`placer.compare.compare`);
:func:`best_heuristic` the one way to pick the fastest of their step times.

>>> best_heuristic({"single": 2.0, "heft": 1.5, "metis": None, "gpipe": float("inf")})
('heft', 1.5)
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np

import placer.methods.heuristics as _heuristics
from envs.real.distributed.cut import StagedSplit
from envs.sim import SimEnv
from graphs import OpGraph, PlacerError
from graphs.plan import Placement, check_inflight, check_microbatches, check_schedule_name

HeuristicFn = Callable[..., np.ndarray]
#: Bumped when a heuristic's placements change, so results cached by others (imitation labels,
#: :func:`placer.learn.pretrain.imitation_label`) are recomputed. 2: heft, m_etf and m_sct charge the
#: copies of shared parameters (:class:`placer.methods.heuristics.scheduling.ParamCopies`); their copy-blind
#: rule stays as heft_nocopy, m_etf_nocopy and m_sct_nocopy. 3: the module groupings keep a co-location group
#: spanning modules with its first op's module, and the searches rank placements out of memory by how far over
#: they are (random_modules, module_search, annealing).
VERSION = 3
_REGISTRY: dict[str, HeuristicFn] = {}
_loaded = False


class HeuristicUnavailable(PlacerError):
    """A heuristic cannot run here; ``status`` says why ("not installed", "needs a model")."""

    def __init__(self, message: str, status: str = "not installed") -> None:
        super().__init__(message)
        self.status = status


#: The optional extras of setup.cfg and the libraries each installs. The hint names the libraries: placer is
#: installed from its checkout, and ``pip install 'placer[plot]'`` would fetch another project of that name.
EXTRAS = {
    "partition": ("pymetis", "pyscotch"),
    "accelerate": ("accelerate",),
    "plot": ("matplotlib",),
    "ilp": ("ortools",),
    "gym": ("gymnasium",),
    "rllib": ("gymnasium", "ray[rllib]"),
    "deepspeed": ("deepspeed",),  # a rival measured beside placer's plans (bench.deepspeed_offload), not a method
}


def install_hint(extra: str) -> str:
    """How to install an extra's libraries.

    >>> install_hint("plot")
    "pip install matplotlib, or pip install -e '.[plot]' in placer's checkout"
    """
    return f"pip install {' '.join(EXTRAS[extra])}, or pip install -e '.[{extra}]' in placer's checkout"


def require(module: str, method: str, extra: str = "partition") -> Any:
    """Import an optional library or raise :class:`HeuristicUnavailable`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HeuristicUnavailable(
            f"{method}: needs the {module!r} package ({install_hint(extra)})", "not installed"
        ) from None


def register(name: str) -> Callable[[HeuristicFn], HeuristicFn]:
    """Decorator: make ``fn`` available as ``place(name, ...)``."""

    def deco(fn: HeuristicFn) -> HeuristicFn:
        _REGISTRY[name] = fn
        return fn

    return deco


def _load_all() -> None:
    """Import every heuristic module; the registry's order is then theirs (by module name), whoever imported one
    first."""
    global _loaded
    if _loaded:
        return
    modules = [
        f"{_heuristics.__name__}.{info.name}"
        for info in pkgutil.iter_modules(_heuristics.__path__)
        if not info.name.startswith("_")
    ]
    for name in modules:
        importlib.import_module(name)
    rank = {name: k for k, name in enumerate(modules)}
    ordered = sorted(
        _REGISTRY.items(), key=lambda item: rank.get(item[1].__module__, len(rank))
    )  # stable within a module
    _REGISTRY.clear()
    _REGISTRY.update(ordered)
    _loaded = True


def names() -> list[str]:
    """Registered heuristic names, in registration order."""
    _load_all()
    return list(_REGISTRY)


def get(name: str) -> HeuristicFn:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PlacerError(f"unknown placement method {name!r} (known: {', '.join(_REGISTRY)})") from None


def accepts(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes a keyword ``name`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def placement_of(
    out: Any,
    graph: OpGraph,
    cluster: Any,
    method: str,
    *,
    meta: Mapping[str, Any] | None = None,
    plan: SimEnv | None = None,
    microbatches: int = 1,
    inflight: int | None = None,
    schedule: str | None = None,
) -> Placement:
    """A heuristic's result as a Placement: its device indices wrapped, or the Placement of a method that plans its own
    order.

    ``plan``: a simulator that chooses the issue order the file will carry
    (:meth:`envs.sim.order_planner.OrderPlanner.plan`, recorded in ``meta``: ``issue_order``,
    ``step_time_s``, ``executor``); None keeps node order (``compare`` scores
    every heuristic in node order).
    """
    if isinstance(out, Placement):  # a method that plans its issue order too (ilp)
        return out
    starts: tuple[int, ...] = ()
    meta = dict(meta or {})
    if isinstance(out, StagedSplit):  # a split with two stages on one device (a V), or with the schedule it chose
        if out.schedule is not None:
            schedule = out.schedule
            meta.update(schedules=dict(out.tried), margin=out.margin)
        out, starts = out.op_devices, out.starts
    order = None
    if plan is not None:  # the issue order placer.apply will follow
        order, how, step_time_s = plan.planner.plan(out)
        meta.update(issue_order=how, step_time_s=step_time_s, executor="eager")
    return Placement.from_indices(
        graph,
        cluster.device_names,
        np.asarray(out),
        cluster=getattr(cluster, "name", ""),
        method=method,
        meta=meta,
        order=order,
        microbatches=microbatches,
        inflight=inflight,
        schedule=schedule,
        stage_starts=starts,
    )


def place(name: str, graph: OpGraph, cluster: Any, **options: Any) -> Placement:
    """Run heuristic ``name`` on ``graph`` for ``cluster`` and return a Placement with its planned issue order.

    ``microbatches=M`` and ``inflight=W`` (options every method takes): the plan
    runs M microbatches, at most W in flight (default M; :mod:`envs.microbatch`);
    methods that search with the simulator search under them. ``schedule=S`` (every
    method takes it too): across processes the plan runs under torch's schedule S
    (:data:`graphs.plan.SCHEDULES`; default: the one that fits its stages), and a method
    that searches across processes searches under it.
    """
    fn = get(name)
    M = check_microbatches(options.pop("microbatches", 1), "--option microbatches")
    W = check_inflight(options.pop("inflight", None), M, "--option inflight")
    auto = options.get("schedule") == "auto"  # the method chooses (stage_search): its result names the schedule
    if auto and not getattr(fn, "chooses_schedule", False):
        raise PlacerError(f"--option schedule=auto: {name} does not choose a schedule (stage_search does)")
    schedule = None if auto else check_schedule_name(options.get("schedule"), "--option schedule")
    if "schedule" not in inspect.signature(fn).parameters:
        options.pop("schedule", None)
    env = SimEnv(graph, cluster, microbatches=M, inflight=W)
    kwargs = dict(options)
    if M > 1 and "env" in inspect.signature(fn).parameters:
        kwargs["env"] = env
    meta = {k: v for k, v in options.items() if isinstance(v, (int, float, str, bool))}
    return placement_of(
        fn(graph, cluster, **kwargs),
        graph,
        cluster,
        name,
        meta=meta,
        plan=env,
        microbatches=M,
        inflight=W,
        schedule=schedule,
    )


def best_heuristic(times: Mapping[str, float | None], exclude: Sequence[str] = ()) -> tuple[str, float] | None:
    """``(name, step time)`` of the fastest heuristic: the smallest finite time not in ``exclude``; None if none ran.

    Ties keep the first in ``times``' order. A method that failed has ``None`` or ``inf``.
    """
    ok = {m: t for m, t in times.items() if t is not None and math.isfinite(t) and m not in exclude}
    return min(ok.items(), key=lambda kv: kv[1]) if ok else None
