"""The host's contention fitted on the tuned models' measured mixes, then used to score every model.

The profiler's probe (:func:`envs.real.profiler.host.time_contention`) times host
matrix products beside a thread that issues without pause. A real backward's
autograd worker issues in bursts and waits between them, so the probe overstates
what a host op pays: on an H100's host it read ``contention_op`` 67-103 for five of
seven models (0.6 and 1.6 for the other two), and the simulated host/GPU mixes of
the RNNs came out 2.1-2.5x slower than measured (``docs/calibration/h100-2026-11-27``).

So :func:`fit` picks ``contention_op`` on the **tuned** models only: the value, of
each model's own probe and a fixed grid, whose simulated steps miss that run's
measured ones least (mean eager MAPE over the tuned models). :func:`rescored` then
scores every model, held out too, with it (:func:`refit` does both for a run's models). The probe is kept beside it, as
``contention.op_probe`` in the profiles this writes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.fidelity import runs
from bench.fidelity.report import model_figures

#: ``contention_op`` values tried beside each model's own probe (a host op runs ``1 + op`` times slower while
#: overlapped).
GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0)
PROBE = "probe"


def host_names(prof: Mapping[str, Any]) -> list[str]:
    """The profile's host devices that carry a contention probe."""
    return [d for d, e in prof["devices"].items() if e.get("kind") == "cpu" and isinstance(e.get("contention"), dict)]


def with_contention(prof: Mapping[str, Any], op: float | str) -> dict[str, Any]:
    """A copy of ``prof`` whose hosts' ``contention.op`` is ``op`` (``PROBE``: as probed), the probe kept as
    ``op_probe``."""
    out = copy.deepcopy(dict(prof))
    for d in host_names(out):
        c = out["devices"][d]["contention"]
        c.setdefault("op_probe", c["op"])
        c["op"] = float(c["op_probe"] if op == PROBE else op)
    return out


def rescored(item: Mapping[str, Any], op: float | str, cluster, device_map: str) -> tuple[list[dict], dict]:
    """``item``'s rows (``{"graph", "prof", "rows"}``) simulated again with ``contention_op = op``; and that profile."""
    prof = with_contention(item["prof"], op)
    return runs.resimulated(item["graph"], prof, item["rows"], cluster, device_map), prof


def _mape(name: str, rows: Sequence[Mapping[str, Any]]) -> float | None:
    eager = model_figures(name, "tuned", rows)["executors"]["eager"]
    return None if eager is None else eager["mape"]


def fit(
    tuned: Sequence[Mapping[str, Any]], cluster, device_map: str, grid: Sequence[float] = GRID
) -> dict[str, Any] | None:
    """The ``contention_op`` that fits the tuned models best: ``{"op", "mape", "probe_mape", "by_op", "models"}``.

    ``tuned``: ``{"name", "graph", "prof", "rows"}`` per tuned model. ``op`` is
    ``"probe"`` (each model's own probe) unless a grid value misses the measured steps
    less; ``mape`` is the mean eager MAPE there. ``None`` when no tuned model has a
    host probe and measured rows.
    """
    usable = [t for t in tuned if host_names(t["prof"]) and any(r.get("real_step_s") for r in t["rows"])]
    if not usable:
        return None
    by_op: dict[str, float] = {}
    for op in (PROBE, *grid):
        errs = [_mape(t["name"], rescored(t, op, cluster, device_map)[0]) for t in usable]
        errs = [e for e in errs if e is not None and np.isfinite(e)]
        if errs:
            by_op[str(op)] = float(np.mean(errs))
    if not by_op:
        return None
    best = min(by_op, key=lambda k: (by_op[k], k != PROBE))  # a tie keeps the probe
    return {
        "op": best if best == PROBE else float(best),
        "mape": by_op[best],
        "probe_mape": by_op.get(PROBE),
        "by_op": by_op,
        "models": [t["name"] for t in usable],
        "probe": {
            t["name"]: {
                d: t["prof"]["devices"][d]["contention"].get("op_probe", t["prof"]["devices"][d]["contention"]["op"])
                for d in host_names(t["prof"])
            }
            for t in usable
        },
    }


def refit(items: list[dict], cluster, device_map: str) -> dict | None:
    """The host contention fitted on the tuned items (:func:`fit`); every item rescored with it.

    ``items``: ``{"name", "group", "figures", "rows", "prof", "graph"}``; their rows, profile and figures are replaced
    where the fit is not each model's own probe. Returns the fit (``None``: nothing to fit on)."""
    have = [i for i in items if i.get("graph") is not None]
    fitted = fit([i for i in have if i["group"] == "tuned"], cluster, device_map)
    if fitted is None:
        return None
    runs.log(
        f"host contention fitted on {', '.join(fitted['models'])}: {fitted['op']} (mean MAPE "
        f"{100 * fitted['mape']:.1f}%, "
        f"their probes {100 * (fitted['probe_mape'] or float('nan')):.1f}%)"
    )
    if fitted["op"] != PROBE:
        for item in have:
            item["rows"], item["prof"] = rescored(item, fitted["op"], cluster, device_map)
            item["figures"].update(model_figures(item["name"], item["group"], item["rows"]))
            profile_fit = item["figures"].get("profile_fit") or {}
            for d in host_names(item["prof"]):
                if d in profile_fit:
                    profile_fit[d]["contention"] = item["prof"]["devices"][d]["contention"]
    return fitted
