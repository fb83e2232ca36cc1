"""How far the planner may trust the simulator's issue orders: a margin measured by running orders for real.

The order planner (:meth:`envs.sim.order_planner.OrderPlanner.plan`) keeps an issue order
other than node order only where its predicted gain exceeds the margin. The
margin comes from order checks (``bench/validate_gpu.py``): each planned order
run for real against node order, interleaved. A check whose simulated ratio
(planned / node) is ``s`` and real ratio ``r`` over-predicted the gain by ``r - s``;
the margin is the largest over-prediction (0 if none), so every checked order that
the planner would still keep was faster for real. It is recorded for the
simulator model it was measured with; another model's record is not used.

A record (``"format": "placer-order-trust/1"``)::

    {"format": "placer-order-trust/1", "model_version": 4, "margin": 0.17,
     "checks": [{"model": "nmt-2", "placement": "heft", "order": "devices-first",
                 "sim_ratio": 0.96, "real_ratio": 1.268}, ...]}

A profile carries one as its ``order_trust`` entry (:func:`envs.real.profiler.apply_profile`
puts its margin on the graph's ``meta``, where :class:`~envs.sim.simulator.SimEnv`
reads it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from graphs import schema

FORMAT = "placer-order-trust/1"

#: ``OpGraph.meta`` key of the margin (a relative gain) the planner's order must beat.
ORDER_MARGIN_META = "order_margin"


def order_margin(checks: Iterable[Mapping[str, Any]]) -> float:
    """The largest over-prediction ``real_ratio - sim_ratio`` over ``checks``, at least 0.

    >>> order_margin([{"sim_ratio": 0.97, "real_ratio": 1.143}, {"sim_ratio": 0.83, "real_ratio": 0.80}])
    0.173
    >>> order_margin([])
    0.0
    """
    worst = 0.0
    for c in checks:
        worst = max(worst, float(c["real_ratio"]) - float(c["sim_ratio"]))
    return round(worst, 6)


def trust_record(checks: list[Mapping[str, Any]], model_version: int) -> dict[str, Any]:
    """The ``placer-order-trust/1`` record of ``checks`` (their margin, :func:`order_margin`)."""
    return {
        "format": FORMAT,
        "model_version": int(model_version),
        "margin": order_margin(checks),
        "checks": [dict(c) for c in checks],
    }


#: Relative gains below this are float rounding (the same schedule summed in another order), never a reason to reorder.
TIE = 1e-9


def kept(sim_ratio: float, margin: float) -> bool:
    """Whether the planner keeps an order whose simulated step is ``sim_ratio`` x node order's, under ``margin``.

    >>> kept(0.97, 0.0), kept(0.97, 0.05), kept(0.80, 0.05), kept(1.0, 0.0), kept(1.0 - 1e-12, 0.0)
    (True, False, True, False, False)
    """
    return sim_ratio < 1.0 - margin - TIE


def margin_of(record: Any, model_version: int, *, source: str = "order_trust") -> float | None:
    """The margin of a record measured with ``model_version`` (None for another model's); PlacerError if malformed."""
    schema.document(record, source, FORMAT)
    version = schema.number(record.get("model_version"), source, "model_version", minimum=1)
    margin = schema.number(record.get("margin"), source, "margin", minimum=0.0, maximum=1.0)
    return margin if int(version) == int(model_version) else None
