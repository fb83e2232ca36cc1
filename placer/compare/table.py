"""A comparison as text: the markdown table and the lines under it.

>>> memory_unit(38.6e9), memory_unit(2.5e6), memory_unit(900)
(('GB', 1000000000.0), ('MB', 1000000.0), ('kB', 1000.0))
"""

from __future__ import annotations

from typing import Any

#: A best speed-up over the best single device below this: nothing gains from being split (a tiny model).
SMALL_GAIN = 1.01


def memory_unit(most_bytes: float) -> tuple[str, float]:
    """The unit a table of peaks up to ``most_bytes`` reads best in: GB, MB or kB (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if most_bytes >= scale:
            return unit, scale
    return "kB", 1e3


def label(row: Any) -> str:
    """The row's method, with its plan's microbatches M and in-flight window W when it is pipelined, and the
    schedule its method chose (``stage_search --option schedule=auto``)."""
    parts = [f"M={row.microbatches}"] if row.microbatches != 1 else []
    if row.microbatches != 1 and row.inflight is not None:
        parts.append(f"W={row.inflight}")
    placement = getattr(row, "placement", None)
    if placement is not None and placement.meta.get("schedules"):
        parts.append(str(placement.schedule))
    return f"{row.method} ({', '.join(parts)})" if parts else row.method


def markdown(report: Any) -> str:
    """A markdown table of a :class:`placer.compare.CompareReport`: one row per method, then the lower bound
    (the JSON also has the previous bound).

    Peak memory is in GB (1e9 bytes, as the simulator's out-of-memory messages
    say), or MB / kB when no peak reaches a GB / MB, so a small model's peaks
    are not all 0.0.
    """
    unit, scale = memory_unit(max((v for r in report.rows for v in (r.peak_bytes or {}).values()), default=0))
    head = (
        f"| method | status | step time (ms) | speed-up | place time (s) | peak {unit} "
        f"({', '.join(report.devices)}) |\n"
        "|---|---|---:|---:|---:|---|\n"
    )
    lines = []
    for r in report.rows:
        if r.method == "previous bound":
            continue
        step_time = f"{r.step_time_s * 1e3:.3f}" if r.step_time_s is not None else "—"
        if r.status == "oom" and r.sim_step_time_s is not None:
            step_time = f"({r.sim_step_time_s * 1e3:.3f})"
        speedup = f"{r.speedup:.2f}x" if r.speedup is not None else "—"
        place_time = f"{r.place_time_s:.2f}" if r.place_time_s is not None else "—"
        peaks = (
            "/".join(f"{r.peak_bytes.get(device, 0) / scale:.1f}" for device in report.devices) if r.peak_bytes else "—"
        )
        status = f"{r.status}: {r.message}" if r.status not in ("ok",) and r.message else r.status
        lines.append(f"| {label(r)} | {status.replace('|', '/')} | {step_time} | {speedup} | {place_time} | {peaks} |")
    return head + "\n".join(lines)


def bound_line(report: Any) -> str:
    """The summary's line on the lower bound: one process's (with an earlier, looser one in the JSON), or that of
    ranks (:func:`envs.sim.ranks.ranks_lower_bound`) for plans across processes."""
    if report.lower_bound_s is None:
        return "lower bound: none in this report"
    if report.executor == "ranks":
        return (
            f"lower bound: no plan runs a step faster across these ranks, whatever its stages and schedule "
            f"({report.lower_bound_name}: sends, waits and the pipeline's fill left out)"
        )
    return (
        f"lower bound: no placement runs a step faster on this cluster ({report.lower_bound_name}); "
        "--json also gives the looser bound of earlier releases"
    )


def summary_lines(report: Any) -> list[str]:
    """What ``placer compare`` prints under the table: the best single device and heuristic, the bound, and a line
    when no row gains from splitting the model (every row counts, the given placements too)."""
    best = report.best()
    single = (
        f"best single device: {report.best_single_device} {report.best_single_s * 1e3:.3f} ms; "
        if report.best_single_s is not None
        else "no single device fits the graph; "
    )
    lines = [
        single + (f"best heuristic: {best.method} {best.step_time_s * 1e3:.3f} ms" if best else "no heuristic fits"),
        bound_line(report),
    ]
    speedups = [r.speedup for r in report.rows if r.kind != "bound" and r.status == "ok" and r.speedup is not None]
    if speedups and max(speedups) < SMALL_GAIN:
        lines.append(
            f"no method beats the best single device by {(SMALL_GAIN - 1) * 100:.0f}% or more: this model is too small "
            "to gain from splitting it over devices (copies and launches cost more than the work they spread)"
        )
    return lines
