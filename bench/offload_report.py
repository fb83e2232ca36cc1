"""The rival table of the offload scenario (issue 34): each rival's real and simulated step time and peak GPU memory.

A row is a plan (:class:`bench.offload.Plan`) with its measurement, read from the
measurement log by placement key (nothing is measured here), FSDP2's offload, or
placer's fine-tuned plan. :func:`summary` gives the issue's ratios: accelerate's
fastest map that ran over placer's plan (target >= 1.5), FSDP2's offload over
placer's plan (target >= 1.0), and the fine-tuned plan against the simulator's
with the measurements' own spread beside it.

>>> r = row("x", "heuristic",
...         Result(0.5, "ok", peak_bytes={"gpu:0": 3 << 30}, extra={"step_times_s": [0.5, 0.75, 0.25]}),
...         {"status": "ok", "step_time_s": 0.25, "peak_bytes": {"gpu:0": 2 << 30}}, cap_bytes=4 << 30)
>>> r["real_step_time_s"], r["real_peak_gpu_gib"], r["within_cap"], r["spread"]
(0.5, 3.0, True, 1.0)
>>> markdown([r]).splitlines()[2]
'| x | ok | 0.500 | 3.00 | 0.250 | 2.00 | - |'
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from envs.result import Result

GIB = float(1 << 30)


def row(
    label: str,
    kind: str,
    result: Result | None,
    sim: dict[str, Any] | None,
    *,
    cap_bytes: int,
    host_ops: int | None = None,
    note: str = "",
    on_gpu: bool = True,
) -> dict[str, Any]:
    """One line of the table; ``result`` None: not measured (``note`` says why).

    ``on_gpu`` False (the CPU stand-in, ``gpu:0`` mapped to the host): there is no
    GPU peak to report or to hold against the cap.
    """
    gpu = result.peak_bytes.get("gpu:0") if result is not None and on_gpu else None
    times = list(result.extra.get("step_times_s", [])) if result is not None else []
    sim = sim or {}
    sim_gpu = sim.get("peak_bytes", {}).get("gpu:0")
    return {
        "label": label,
        "kind": kind,
        "status": result.status if result is not None else "not measured",
        "real_step_time_s": result.step_time_s if result is not None and result.ok else None,
        "real_step_times_s": times,
        "spread": spread(times),
        "real_peak_gpu_gib": gpu / GIB if gpu is not None and result.ok else None,
        "within_cap": (gpu <= cap_bytes) if gpu is not None and result is not None and result.ok else None,
        "sim_status": sim.get("status"),
        "sim_step_time_s": sim.get("step_time_s"),
        "sim_peak_gpu_gib": sim_gpu / GIB if sim_gpu is not None else None,
        "host_ops": host_ops,
        "message": (note or sim.get("message", "")) if result is None else result.message if not result.ok else "",
    }


def spread(times: list[float]) -> float | None:
    """(max - min) / median of one measurement's timed steps: its own noise."""
    if len(times) < 2:
        return None
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else None


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table: rival, real status, real step (s), real peak GPU (GiB), simulated step (s), simulated peak, host
    ops."""
    lines = [
        "| rival | real | step (s) | peak GPU (GiB) | simulated step (s) | simulated peak GPU (GiB) | ops on "
        "the host |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['message'][:80]}".rstrip(": ")
        sim_step = _fmt(r["sim_step_time_s"]) + ("" if r["sim_status"] in ("ok", None) else f" ({r['sim_status']})")
        lines.append(
            f"| {r['label']} | {status} | {_fmt(r['real_step_time_s'])} | {_fmt(r['real_peak_gpu_gib'], '.2f')} "
            f"| {sim_step} | {_fmt(r['sim_peak_gpu_gib'], '.2f')} | {_fmt(r['host_ops'], 'd')} |"
        )
    return "\n".join(lines)


def _fastest(rows: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    ran = [r for r in rows if r["kind"] == kind and r["real_step_time_s"] is not None]
    return min(ran, key=lambda r: r["real_step_time_s"]) if ran else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets from the rows (None where a side did not run)."""
    by_label = {r["label"]: r for r in rows}
    sim_plan = by_label.get("placer, trained on the simulator")
    tuned = by_label.get("placer, fine-tuned on measured rewards")
    placer = min(
        (r for r in (sim_plan, tuned) if r and r["real_step_time_s"] is not None),
        key=lambda r: r["real_step_time_s"],
        default=None,
    )
    acc, fsdp = _fastest(rows, "accelerate"), _fastest(rows, "fsdp2")

    def ratio(a: dict | None, b: dict | None) -> float | None:
        return a["real_step_time_s"] / b["real_step_time_s"] if a and b else None

    over_cap = [r["label"] for r in rows if r["within_cap"] is False]
    return {
        "placer": placer["label"] if placer else None,
        "placer_step_time_s": placer["real_step_time_s"] if placer else None,
        "accelerate_fastest": acc["label"] if acc else None,
        "accelerate_over_placer": ratio(acc, placer),
        "accelerate_target": 1.5,
        "accelerate_that_ran": [r["label"] for r in rows if r["kind"] == "accelerate" and r["status"] == "ok"],
        "fsdp2_over_placer": ratio(fsdp, placer),
        "fsdp2_target": 1.0,
        "fine_tuned_over_simulator_plan": ratio(tuned, sim_plan),
        "noise": max((r["spread"] for r in (sim_plan, tuned) if r and r["spread"] is not None), default=None),
        "over_the_cap": over_cap,
    }


__all__ = ["markdown", "row", "spread", "summary"]
