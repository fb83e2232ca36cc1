"""A fidelity run's figures per model, per group (tuned, held out) and for issue orders: markdown and JSON.

:func:`model_figures` scores one model's rows (:mod:`bench.fidelity.metrics`);
:func:`run_summary` adds the groups and the order-trust record; :func:`markdown`
prints them, held-out models first; :func:`summary_doc` is the ``--json`` document and
:func:`merged_summary` the ``summary.json`` a run keeps (``docs/calibration/README.md``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.fidelity.metrics import (
    EXECUTORS,
    TARGETS,
    group_summary,
    memory,
    order_checks,
    repeatability,
    scores,
    trusted_orders,
)


def model_figures(name: str, group: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One model's figures from its rows: both executors' scores, repeatability, memory, order checks."""
    ok = [r for r in rows if r.get("real_step_s")]
    real = np.array([r["real_step_s"] for r in ok])
    methods = [r["methods"] for r in ok]
    per_exec: dict[str, Any] = {e: None for e in EXECUTORS}
    best = None
    if len(real):
        for e in EXECUTORS:
            s = scores(np.array([r["sim_step_s"][e] for r in ok]), real)
            s["sim_best"] = ", ".join(methods[s["sim_best"]])
            per_exec[e] = s
        best = ", ".join(methods[int(np.argmin(real))])
    gpu = next((r for r in ok if all_on_a_gpu(r["ops_per_device"])), None)
    return {
        "model": name,
        "group": group,
        "placements": len(rows),
        "measured_ok": len(ok),
        "real_step_s_range": [float(real.min()), float(real.max())] if len(real) else None,
        "real_best": best,
        "executors": per_exec,
        "repeatability": repeatability(rows),
        "memory": memory(rows),
        "orders": order_checks(rows, name),
        "all_on_gpu": None if gpu is None else {"sim_s": gpu["sim_step_s"]["eager"], "real_s": gpu["real_step_s"]},
        "failed": [
            f"{', '.join(r['methods'])}: {r['status']}: {r.get('message', '')}"
            for r in rows
            if not r.get("real_step_s")
        ][:10],
    }


def all_on_a_gpu(ops_per_device: Mapping[str, int]) -> bool:
    """Whether a placement puts every op on one GPU (logical names ``gpu:i``).

    >>> all_on_a_gpu({"cpu:0": 0, "gpu:0": 7}), all_on_a_gpu({"cpu:0": 1, "gpu:0": 6})
    (True, False)
    """
    total = sum(ops_per_device.values())
    return any(d.startswith("gpu") and n == total for d, n in ops_per_device.items())


def run_summary(models: Sequence[dict], model_version: int) -> dict[str, Any]:
    """Groups' worst figures, and the order-trust record of the tuned models' checks applied to the held-out ones."""
    tuned = [c for m in models if m["group"] == "tuned" for c in m["orders"]]
    held = [c for m in models if m["group"] != "tuned" for c in m["orders"]]
    return {
        "groups": {g: group_summary(models, g) for g in ("held-out", "tuned") if any(m["group"] == g for m in models)},
        "orders": trusted_orders(tuned, held, model_version),
    }


def _f(x, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x * scale:{spec}}{suffix}"


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def _model_line(m: Mapping[str, Any]) -> str:
    s, rep, mem = m["executors"].get("eager"), m["repeatability"], m["memory"]
    rng = m["real_step_s_range"]
    gpu = m.get("all_on_gpu")
    if s is None:
        return f"| {m['group']} | {m['model']} | {m.get('ops', '?')} | 0 | — | — | — | — | — | — | — |"
    p = s["pass"]
    gpu_s = "—" if gpu is None else f"{gpu['sim_s'] * 1e3:.2f} / {gpu['real_s'] * 1e3:.2f} ms"
    rng_s = "—" if rng is None else f"{rng[0] * 1e3:.1f}-{rng[1] * 1e3:.1f} ms"
    return (
        f"| {m['group']} | {m['model']} | {m.get('ops', '?')} | {s['n']} | {_f(s['spearman'], '.3f')}"
        f"{_mark(p['spearman'] if np.isfinite(s['spearman']) else None)} | "
        f"{_f(s['mape'], '.1f', 100, '%')}{_mark(p['mape'])} | "
        f"{_f(s['best_ratio'], '.3f')}{_mark(p['best_ratio'])} | {_f(rep['median'], '.1f', 100, '%')} / "
        f"{_f(rep['max'], '.1f', 100, '%')} "
        f"(n {rep['n']}){_mark(rep['pass'])}, drift {_f(rep['drift_median'], '.1f', 100, '%')} | "
        f"{_f(mem['median_abs'], '.1f', 100, '%')} / {_f(mem['max_abs'], '.1f', 100, '%')} ({mem['within']} of "
        f"{mem['n']}){_mark(mem['pass'])} | "
        f"{gpu_s} | {rng_s} |"
    )


def markdown(models: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], header: str) -> str:
    """The report: eager figures per model (held-out first), the dataflow model's, orders, the apply checks,
    failures."""
    t = TARGETS
    ordered = sorted(models, key=lambda m: (m["group"] == "tuned", m["model"]))
    lines = [
        header,
        "",
        f"| group | model | ops | n | Spearman (≥ {t['spearman_min']}) | MAPE (≤ {100 * t['mape_max']:.0f}%) | "
        f"sim-best / real-best (≤ {t['best_ratio_max']}) | repeat: median / max (≤ {100 * t['repeat_max']:.0f}%) | "
        f"peak memory error: median / max (≤ {100 * t['memory_max']:.0f}%) | all on the GPU: sim / real | real steps |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    lines += [_model_line(m) for m in ordered]
    lines += [
        "",
        "| group | worst Spearman | worst MAPE | worst sim-best / real-best | worst repeat median | worst "
        "memory error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g, s in summary["groups"].items():
        lines.append(
            f"| {g} ({', '.join(s['models'])}) | {_f(s['spearman_min'], '.3f')} | "
            f"{_f(s['mape_max'], '.1f', 100, '%')} | "
            f"{_f(s['best_ratio_max'], '.3f')} | {_f(s['repeat_median_max'], '.1f', 100, '%')} | "
            f"{_f(s['memory_max_abs'], '.1f', 100, '%')} |"
        )
    lines += [
        "",
        "Dataflow executor (TensorFlow's, for comparison): "
        + "; ".join(
            f"{m['model']} {_f(m['executors']['dataflow']['spearman'], '.3f')} / "
            f"{_f(m['executors']['dataflow']['mape'], '.1f', 100, '%')}"
            for m in ordered
            if m["executors"].get("dataflow")
        ),
    ]
    lines += _order_lines(models, summary["orders"])
    lines += _contention_lines(summary.get("contention"))
    for m in ordered:
        a = (m.get("checks") or {}).get("apply")
        if a is not None and "error" in a:
            lines.append(f"\n{m['model']}: `placer.apply` ({a['placement']}) failed: {a['error']} ✗")
        elif a is not None:
            lines.append(
                f"\n{m['model']}: `placer.apply` ({a['placement']}): loss {a['output_rel_err']:.1e} "
                f"({a['output_cpu32_rel_err']:.1e} float32 on the CPU), worst gradient {a['grad_max_rel_err']:.1e} "
                f"({a['grad_worst_cpu32_rel_err']:.1e}) {a['grad_worst']}{_mark(a['ok'])}"
            )
        if m["failed"]:
            lines.append(f"\n{m['model']}: {len(m['failed'])} placement(s) failed: " + "; ".join(m["failed"]))
    for f in summary.get("failures", []):
        lines.append(f"\nNot reported: {f}")
    return "\n".join(lines) + "\n"


def _contention_lines(fit: Mapping[str, Any] | None) -> list[str]:
    """The host contention the figures above use (:mod:`bench.fidelity.contention`)."""
    if not fit:
        return []
    probes = [v for per in fit["probe"].values() for v in per.values()]
    used = "each model's own probe" if fit["op"] == "probe" else f"`contention_op` {fit['op']:g}"
    return [
        "",
        f"Host contention, fitted on the tuned models ({', '.join(fit['models'])}): {used}, their mean MAPE "
        f"{_f(fit['mape'], '.1f', 100, '%')} (with their own probes, {min(probes):.3g}-{max(probes):.3g}: "
        f"{_f(fit['probe_mape'], '.1f', 100, '%')}). Every model above is scored with it.",
    ]


def _order_lines(models: Sequence[Mapping[str, Any]], orders: Mapping[str, Any]) -> list[str]:
    rec = orders["record"]
    lines = [
        "",
        "Issue orders run for real against node order (interleaved; planned / node, target ≤ "
        f"{1 + TARGETS['order_slack']:g} "
        f"for the orders the planner keeps). Margin from the tuned models' checks: {rec['margin']:.3f} "
        f"(simulator model {rec['model_version']}); on the held-out models it keeps {orders['held_out_kept']} of "
        f"{orders['held_out_checks']} orders, the slowest kept at {_f(orders['held_out_worst_kept'], '.3f')} "
        f"(all planned: {_f(orders['raw_worst'], '.3f')}){_mark(orders['pass'])}.",
        "",
        "| group | model | placement | order | simulated | real | kept |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for m in sorted(models, key=lambda m: (m["group"] == "tuned", m["model"])):
        for c in m["orders"]:
            keep = c["sim_ratio"] < 1 - rec["margin"]
            lines.append(
                f"| {m['group']} | {m['model']} | {c['placement']} | `{c['order']}` | {c['sim_ratio']:.3f} | "
                f"{c['real_ratio']:.3f}{_mark(c['ok'])} | {'yes' if keep else 'no (node order)'} |"
            )
    return lines


def header(args: argparse.Namespace, device: str) -> str:
    how = (
        ""
        if args.rescore
        else f"median of {args.rounds} interleaved rounds x {args.steps} Adam steps after {args.warmup} warm-up "
        f"steps and {args.warmup_s:g} s; {args.cpus} host threads; "
    )
    return (
        f"Calibrated simulator vs real steps on {device} (cluster {args.cluster}, `--device-map "
        f"{args.device_map}`, size {args.size}; "
        f"{how}`{' '.join(args.command)}`)."
    )


def finite(x):
    """``x`` with every NaN and infinity (in dicts and lists too) as None, for JSON."""
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def summary_doc(models: list[dict], summary: dict, args: argparse.Namespace, device: str) -> dict:
    """The ``--json`` document."""
    return finite(
        {
            "device": device,
            "command": " ".join(args.command),
            "targets": TARGETS,
            "groups": summary["groups"],
            "orders": summary["orders"],
            "failures": summary.get("failures", []),
            "contention": summary.get("contention"),
            "models": models,
        }
    )


def merged_summary(path: str, rows: list[dict], args: argparse.Namespace, device: str) -> dict:
    """``summary.json``: this run's models replace their earlier entries; other models' stay (one model per call
    works)."""
    from graphs.io import read_json

    doc = read_json(path) if os.path.exists(path) else {}
    old = [m for m in doc.get("models", []) if isinstance(m, dict) and m.get("model") not in {r["model"] for r in rows}]
    new = [{**r, "device": device, "command": " ".join(args.command), "time_unix": time.time()} for r in rows]
    return finite({"format": "placer-gpu-validation/2", "targets": TARGETS, "models": old + new})
