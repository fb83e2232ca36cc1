"""Heuristic placement baselines: a registry ``name -> function``.

Each baseline lives in its own module of this package and registers itself with
:func:`register`; every module here is imported on first use. A baseline is
``fn(graph, cluster, **options) -> np.ndarray`` of device indices per op (into
``cluster.device_names``); :func:`place` wraps it into a :class:`placer.Placement`.
A method that plans the issue order as well (``ilp``) returns the Placement itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.plan import Placement, check_inflight, check_microbatches

BaselineFn = Callable[..., np.ndarray]
#: Bumped when a baseline's placements change, so results cached by others (imitation labels,
#: :func:`placer.pretrain.best_heuristic`) are recomputed. 2: heft, m_etf and m_sct charge the
#: copies of shared parameters (:class:`placer.baselines._common.ParamCopies`); their copy-blind
#: rule stays as heft_nocopy, m_etf_nocopy and m_sct_nocopy.
VERSION = 2
_REGISTRY: dict[str, BaselineFn] = {}
_loaded = False


def register(name: str) -> Callable[[BaselineFn], BaselineFn]:
    """Decorator: make ``fn`` available as ``place(name, ...)``."""

    def deco(fn: BaselineFn) -> BaselineFn:
        _REGISTRY[name] = fn
        return fn

    return deco


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def names() -> list[str]:
    """Registered baseline names, in registration order."""
    _load_all()
    return list(_REGISTRY)


def get(name: str) -> BaselineFn:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PlacerError(f"unknown placement method {name!r} (known: {', '.join(_REGISTRY)})") from None


def place(name: str, graph: OpGraph, cluster: Any, **options: Any) -> Placement:
    """Run baseline ``name`` on ``graph`` for ``cluster`` and return a Placement.

    ``microbatches=M`` and ``inflight=W`` (options every method takes): the plan
    runs M microbatches, at most W in flight (default M; :mod:`envs.microbatch`);
    methods that search with the simulator search under them.
    """
    import inspect

    from envs.sim.simulator import SimEnv

    fn = get(name)
    M = check_microbatches(options.pop("microbatches", 1), "--option microbatches")
    W = check_inflight(options.pop("inflight", None), M, "--option inflight")
    env = SimEnv(graph, cluster, microbatches=M, inflight=W)
    kwargs = dict(options)
    if M > 1 and "env" in inspect.signature(fn).parameters:
        kwargs["env"] = env
    idx = fn(graph, cluster, **kwargs)
    if isinstance(idx, Placement):  # a method that plans its own issue order (ilp)
        return idx
    order, how, step_s = env.plan_order(idx)  # the issue order placer.apply will follow
    meta = {k: v for k, v in options.items() if isinstance(v, (int, float, str, bool))}
    return Placement.from_indices(
        graph, cluster.device_names, idx, cluster=getattr(cluster, "name", ""), method=name,
        meta={**meta, "issue_order": how, "step_time_s": step_s, "executor": "eager"}, order=order, microbatches=M,
        inflight=W,
    )
