"""The fidelity figures of measured placements: ranks, errors, repeatability, memory, issue orders, held-out groups.

Everything here reads the rows ``python -m bench.validate_gpu`` writes (one per measured
placement, ``docs/calibration/README.md``), so a folder of rows is scored again with
another simulator or profile without a device (``--rescore``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.sim.order_trust import kept, trust_record

EXECUTORS = ("eager", "dataflow")
#: The issue's targets on held-out models, on one GPU and its host.
TARGETS = {
    "spearman_min": 0.95,
    "mape_max": 0.10,
    "best_ratio_max": 1.03,
    "repeat_max": 0.03,
    "memory_max": 0.10,
    "order_slack": 0.02,
}


def mape(sim: np.ndarray, real: np.ndarray) -> float:
    return float(np.mean(np.abs(sim - real) / real))


def spearman(sim: np.ndarray, real: np.ndarray) -> float:
    """Spearman's rank correlation of simulated and real step times; NaN where ranks are undefined
    (two or fewer points, or every placement simulated alike, e.g. one physical device)."""
    from scipy.stats import spearmanr

    if len(real) <= 2 or np.ptp(sim) == 0:
        return float("nan")
    return float(spearmanr(sim, real).statistic)


def scores(sim: np.ndarray, real: np.ndarray) -> dict[str, Any]:
    """Spearman, MAPE, n and the best ratio of one executor's simulated times against the real ones."""
    best = int(np.argmin(sim))  # ties: the first in measuring order (learned, baselines, singles, random)
    rho, err, ratio = spearman(sim, real), mape(sim, real), float(real[best] / real.min())
    return {
        "spearman": rho,
        "mape": err,
        "n": int(len(real)),
        "best_ratio": ratio,
        "sim_best": best,
        "sim_best_ties": int(np.sum(sim == sim[best])),
        "pass": {
            "spearman": bool(rho >= TARGETS["spearman_min"]),
            "mape": bool(err <= TARGETS["mape_max"]),
            "best_ratio": bool(ratio <= TARGETS["best_ratio_max"]),
        },
    }


def rel_diff(a: float, b: float) -> float:
    """``|a - b|`` over their mean.

    >>> rel_diff(100.0, 104.0)
    0.0392156862745098
    """
    return abs(a - b) / ((a + b) / 2)


def repeatability(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The same placement measured twice in one run (a second build, ``row["repeat"]``): median and worst relative
    difference; and the drift, each placement's first half of rounds against its second half."""
    pairs = [
        (r["methods"], r["real_step_s"], r["repeat"]["real_step_s"])
        for r in rows
        if r.get("real_step_s") and (r.get("repeat") or {}).get("real_step_s")
    ]
    diffs = [rel_diff(a, b) for _, a, b in pairs]
    drift = []
    for r in rows:
        rounds = r.get("round_medians_s") or []
        if r.get("real_step_s") and len(rounds) >= 2:
            half = len(rounds) // 2
            drift.append(rel_diff(statistics.median(rounds[:half]), statistics.median(rounds[half:])))
    return {
        "n": len(pairs),
        "median": float(np.median(diffs)) if diffs else None,
        "max": max(diffs) if diffs else None,
        "pairs": [
            {"placement": ", ".join(m), "first_s": a, "second_s": b, "rel_diff": d}
            for (m, a, b), d in zip(pairs, diffs)
        ],
        "drift_median": float(np.median(drift)) if drift else None,
        "drift_n": len(drift),
        "pass": None if not diffs else bool(np.median(diffs) <= TARGETS["repeat_max"]),
    }


def memory(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Simulated peak bytes against the measured ones (``torch.cuda.max_memory_allocated``), per placement and device.

    Only devices with a measured peak count (the CUDA ones; a host's resident set is not the allocator's peak).
    """
    errs = []
    for r in rows:
        real, sim = r.get("real_peak_bytes") or {}, r.get("sim_peak_bytes") or {}
        for dev, b in real.items():
            if r.get("real_step_s") and b and dev in sim:
                errs.append(
                    {
                        "placement": ", ".join(r["methods"]),
                        "device": dev,
                        "sim_bytes": int(sim[dev]),
                        "real_bytes": int(b),
                        "error": sim[dev] / b - 1.0,
                    }
                )
    abs_err = [abs(e["error"]) for e in errs]
    return {
        "n": len(errs),
        "median_abs": float(np.median(abs_err)) if errs else None,
        "max_abs": max(abs_err) if errs else None,
        "within": sum(a <= TARGETS["memory_max"] for a in abs_err),
        "worst": sorted(errs, key=lambda e: -abs(e["error"]))[:5],
        "pass": None if not errs else bool(max(abs_err) <= TARGETS["memory_max"]),
    }


def order_checks(rows: Sequence[Mapping[str, Any]], model: str) -> list[dict[str, Any]]:
    """Each placement measured in its planned issue order and in node order: simulated and real ratios (planned /
    node)."""
    out = []
    for r in rows:
        node = r.get("node_order") or {}
        if not (r.get("real_step_s") and node.get("real_step_s") and r.get("sim_node_step_s")):
            continue
        real_ratio = r["real_step_s"] / node["real_step_s"]
        out.append(
            {
                "model": model,
                "placement": ", ".join(r["methods"]),
                "order": r["issue_order"],
                "sim_ratio": r["sim_step_s"]["eager"] / r["sim_node_step_s"],
                "real_ratio": real_ratio,
                "real_planned_s": r["real_step_s"],
                "real_node_s": node["real_step_s"],
                "ok": bool(real_ratio <= 1 + TARGETS["order_slack"]),
            }
        )
    return out


def trusted_orders(tuned: list[dict], held_out: list[dict], model_version: int) -> dict[str, Any]:
    """The order-trust record of the tuned models' checks, and what it keeps of the held-out models' orders.

    The target (no planned order slower than node order beyond the slack) applies to the orders the planner
    keeps under the record's margin: on the held-out checks, out of sample.
    """
    record = trust_record(tuned, model_version)
    keep = [c for c in held_out if kept(c["sim_ratio"], record["margin"])]
    worst = max((c["real_ratio"] for c in keep), default=None)
    return {
        "record": record,
        "held_out_checks": len(held_out),
        "held_out_kept": len(keep),
        "held_out_worst_kept": worst,
        "raw_worst": max((c["real_ratio"] for c in held_out), default=None),
        "pass": None if not held_out else bool(worst is None or worst <= 1 + TARGETS["order_slack"]),
    }


def group_of(model: str, tuned: Sequence[str]) -> str:
    return "tuned" if model in tuned else "held-out"


def group_summary(models: Sequence[Mapping[str, Any]], group: str) -> dict[str, Any]:
    """The worst of each figure over a group's models (every model must meet a target)."""
    rows = [m for m in models if m["group"] == group]
    eager = [m["executors"]["eager"] for m in rows if m["executors"].get("eager")]

    def worst(values, fn):
        values = [v for v in values if v is not None and np.isfinite(v)]
        return fn(values) if values else None

    return {
        "models": [m["model"] for m in rows],
        "spearman_min": worst([e["spearman"] for e in eager], min),
        "mape_max": worst([e["mape"] for e in eager], max),
        "best_ratio_max": worst([e["best_ratio"] for e in eager], max),
        "repeat_median_max": worst([m["repeatability"]["median"] for m in rows], max),
        "memory_max_abs": worst([m["memory"]["max_abs"] for m in rows], max),
    }
