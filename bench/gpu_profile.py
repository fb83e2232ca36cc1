"""Profile models in context on a GPU, re-measure earlier placements, and check apply's gradients in float64.

The second half of the GPU validation (``python -m bench.validate_gpu`` is the first).
That run found the op-by-op CUDA profile 5-7x too slow against real steps (each
op timed alone pays the autograd engine's start and the launch that a real step
overlaps), so this one collects what a faithful eager model needs, per model
(:mod:`bench.fidelity.models`' sizes):

* **a profile in context** on ``cpu`` and ``cuda:0`` (``envs.real.profiler``, method
  ``context``): on the GPU each op's kernel seconds and host issue seconds,
  forward and backward, measured inside real training steps
  (:func:`envs.real.profiler.profile_device_in_context`), next to the op-by-op
  columns of the old method (``isolated``), written as ``<model>.profile.json``;
* **re-measured placements**: every ``--stride``-th placement of an earlier run's
  ``<model>.jsonl`` (``--from``), measured again as ``validate_gpu`` measures
  them, so figures from two machines of one kind can be compared (the drift);
* **apply's gradients against float64** (``--apply-check``): the model placed
  as the earlier run's learned placement and all on the GPU, each gradient's
  error against a float64 CPU reference next to the float32 CPU model's own
  error, so a gradient whose size is all cancellation is told from a wrong one.

Run on the lent GPU machine from the repository root (files come back from
``$OUT``; at most 8)::

    python3 -m bench.gpu_profile --from docs/calibration --out-dir $OUT

On a machine without CUDA, ``--device-map '*=cpu'`` runs the same pipeline on
the CPU (a smoke test). Output: progress on stderr, a short report on stdout,
``<model>.profile.json`` and ``gpu_profile.json`` (re-measurements and checks)
under ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from bench.common import OneLineParser
from bench.fidelity.apply_check import grad_errors
from bench.fidelity.measuring import measure_here
from bench.fidelity.models import build, model_names
from graphs import PlacerError


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def earlier_rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _profile(
    name: str, args: argparse.Namespace, model: Any, inputs: tuple, torch_devices: list[str], out: dict
) -> None:
    """Profile the model in context (and op by op with --isolated) into ``out``: the file, each device's sums,
    errors."""
    import torch

    from envs.real.profiler import check_profile, profile_model, save_profile

    t0 = time.time()
    torch.set_num_threads(max(1, args.cpus))
    prof = profile_model(model, inputs, torch_devices, warmup=1, repeats=args.repeats)
    check_profile(prof)
    if args.isolated:  # the old op-by-op columns beside the new ones, for the comparison
        iso = profile_model(
            model, inputs, [d for d in torch_devices if d != "cpu"], warmup=1, repeats=args.repeats, method="isolated"
        )
        for dev, entry in iso["devices"].items():
            prof["devices"][dev]["isolated_fwd_s"] = entry["fwd_s"]
            prof["devices"][dev]["isolated_bwd_s"] = entry["bwd_s"]
    save_profile(prof, os.path.join(args.out_dir, f"{name}.profile.json"))
    out["profile_s"] = time.time() - t0
    out["profile_errors"] = dict(list(prof.get("errors", {}).items())[:10])
    if out["profile_errors"]:
        log(f"[{name}] profile errors: {out['profile_errors']}")
    for dev, entry in prof["devices"].items():
        summary = {
            "method": entry.get("method"),
            "fwd_sum_s": float(np.nansum(np.array(entry["fwd_s"], dtype=float))),
            "bwd_sum_s": float(np.nansum(np.array(entry["bwd_s"], dtype=float))),
        }
        for key in ("issue_fwd_s", "issue_bwd_s"):
            if key in entry:
                summary[key.replace("_s", "_sum_s")] = float(np.sum(entry[key]))
        for key in ("step_s", "update_s", "phases_s", "device_phases_s"):
            if key in entry:
                summary[key] = entry[key]
        out.setdefault("devices", {})[dev] = summary
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    log(
        f"[{name}] profiled in {out['profile_s']:.0f}s: "
        + "; ".join(
            f"{d} {s['method']} fwd {s['fwd_sum_s'] * 1e3:.1f} bwd {s['bwd_sum_s'] * 1e3:.1f} ms"
            + (
                f", issue fwd {s['issue_fwd_sum_s'] * 1e3:.1f} bwd {s['issue_bwd_sum_s'] * 1e3:.1f} ms, step "
                f"{s['step_s'] * 1e3:.1f} ms"
                if "issue_fwd_sum_s" in s
                else ""
            )
            for d, s in out["devices"].items()
        )
    )


def _remeasure(name: str, args: argparse.Namespace, cluster: Any, graph: Any, rows: list[dict], out: dict) -> None:
    """Measure every ``--stride``-th earlier placement again (at most ``--remeasure``) and compare with then."""
    from graphs.plan import Placement

    names = list(cluster.device_names)
    chosen = [r for k, r in enumerate(rows) if k % args.stride == 0 and r.get("real_step_s")][: args.remeasure]
    if chosen:
        t0 = time.time()
        placements = [
            Placement.from_indices(
                graph, names, np.array(r["devices"]), order=None if r["order"] is None else np.array(r["order"])
            )
            for r in chosen
        ]
        results = measure_here(
            name,
            args.size,
            cluster,
            graph,
            placements,
            os.path.join(args.work_dir, name),
            device_map=args.device_map,
            warmup=args.warmup,
            steps=args.steps,
            cpus=args.cpus,
            timeout=args.timeout,
        )
        out["remeasured"] = [
            {
                "methods": r["methods"],
                "earlier_s": r["real_step_s"],
                "now_s": res.step_time_s if res.ok else None,
                "status": res.status,
            }
            for r, res in zip(chosen, results)
        ]
        ratios = [m["now_s"] / m["earlier_s"] for m in out["remeasured"] if m["now_s"]]
        out["remeasure_ratio_median"] = float(np.median(ratios)) if ratios else None
        out["remeasure_s"] = time.time() - t0
        log(
            f"[{name}] re-measured {len(ratios)} placements in {out['remeasure_s']:.0f}s: now / earlier median "
            f"{out['remeasure_ratio_median']:.3f}, range {min(ratios):.3f}-{max(ratios):.3f}"
            if ratios
            else f"[{name}] nothing re-measured"
        )


def _apply_checks(
    name: str, args: argparse.Namespace, graph: Any, names: list[str], rows: list[dict], out: dict
) -> None:
    """``placer.apply``'s gradients against float64: the earlier run's learned placement, and all on the GPU."""
    from graphs.plan import Placement

    t0 = time.time()
    checks = {}
    learned = [r for r in rows if r.get("kind") == "learned"]
    cases = [("all on the GPU", np.full(graph.num_ops, names.index(args.gpu_name)))]
    if learned:
        cases.insert(0, ("learned (earlier run)", np.array(learned[0]["devices"])))
    for label, op_devices in cases:
        placement = Placement.from_indices(graph, names, op_devices, method=label)
        try:
            checks[label] = grad_errors(name, args.size, placement, graph, args.device_map)
        except Exception as e:  # a diagnosis: report, go on
            checks[label] = {"error": f"{type(e).__name__}: {e}"}
        c = checks[label]
        if c.get("rows"):
            c["worst"] = c.pop("rows")[:8]
            c["placed_worst_norm_rel"] = max(r["placed_norm_rel"] or 0.0 for r in c["worst"])
            c["cpu32_worst_norm_rel"] = max(r["cpu32_norm_rel"] or 0.0 for r in c["worst"])
            w = c["worst"][0]
            log(
                f"[{name}] apply vs float64, {label}: worst {w['param']} max-rel placed {w['placed_max_rel']:.1e} "
                f"cpu32 {w['cpu32_max_rel']:.1e} (max |grad| {w['max_abs']:.1e}); worst norm-rel placed "
                f"{c['placed_worst_norm_rel']:.1e} cpu32 {c['cpu32_worst_norm_rel']:.1e}"
            )
    out["apply_checks"] = checks
    out["apply_s"] = time.time() - t0


def run_model(name: str, args: argparse.Namespace) -> dict:
    import envs
    from envs.real.placing import resolve_devices
    from graphs.torch_capture import capture

    out: dict = {"model": name, "size": args.size}
    cluster = envs.resolve_cluster(args.cluster)
    model, inputs = build(name, args.size)
    graph = capture(model, inputs, name=name)
    torch_devices = list(dict.fromkeys(str(d) for d in resolve_devices(cluster.device_names, args.device_map).values()))
    out["ops"] = graph.num_ops
    _profile(name, args, model, inputs, torch_devices, out)
    rows = earlier_rows(os.path.join(args.earlier, f"{name}.jsonl"))
    _remeasure(name, args, cluster, graph, rows, out)
    if name in args.apply_check:
        _apply_checks(name, args, graph, list(cluster.device_names), rows, out)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m bench.gpu_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="rnnlm,nmt-2,resnet50", help="comma-separated (default rnnlm,nmt-2,resnet50)")
    p.add_argument("--size", default="medium", choices=("small", "medium", "full"), help="model sizes (default medium)")
    p.add_argument("--cluster", default="h200x1", help="cluster of the earlier placements (default h200x1)")
    p.add_argument(
        "--device-map",
        default="gpu:0=cuda:0,cpu:0=cpu",
        help="logical -> torch devices (default gpu:0=cuda:0,cpu:0=cpu)",
    )
    p.add_argument(
        "--gpu-name", default="gpu:0", help="logical device of 'all on the GPU' in the apply check (default gpu:0)"
    )
    p.add_argument(
        "--from",
        dest="earlier",
        default="docs/calibration",
        help="folder of the earlier run's <model>.jsonl (default docs/calibration)",
    )
    p.add_argument("--stride", type=int, default=3, help="re-measure every STRIDE-th earlier placement (default 3)")
    p.add_argument("--remeasure", type=int, default=10, help="at most this many per model (default 10; 0: none)")
    p.add_argument(
        "--apply-check",
        default="resnet50",
        help="models whose gradients are checked against float64 (default resnet50)",
    )
    p.add_argument(
        "--isolated", action="store_true", help="also time the GPU op by op (the old method) into the profile"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out-dir", default="runs/gpu_profile")
    p.add_argument("--work-dir", default="runs/gpu_profile_work")
    args = p.parse_args(argv)
    return args


def check(args: argparse.Namespace) -> None:
    """PlacerError (one line, naming the option) for a bad option, before any work."""
    import envs
    from envs.real.placing import check_available, resolve_devices
    from placer.option_checks import check_float, check_int

    args.model_names = model_names(args.models, args.size)
    args.apply_check = model_names(args.apply_check, args.size, "--apply-check", empty_ok=True)
    for opt in ("stride", "repeats", "steps", "cpus"):
        check_int(getattr(args, opt), f"--{opt}", least=1)
    check_int(args.remeasure, "--remeasure", least=0)
    check_int(args.warmup, "--warmup", least=0)
    check_float(args.timeout, "--timeout", above=0)
    cluster = envs.resolve_cluster(args.cluster)
    if args.gpu_name not in cluster.device_names:
        raise PlacerError(
            f"--gpu-name {args.gpu_name}: not a device of {args.cluster} ({', '.join(cluster.device_names)})"
        )
    check_available(resolve_devices(cluster.device_names, args.device_map))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        check(args)
    except PlacerError as e:
        print(f"gpu_profile: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "gpu_profile.json")
    done = []
    try:
        for name in args.model_names:
            t0 = time.time()
            try:
                done.append(run_model(name, args))
            except PlacerError as e:
                done.append({"model": name, "error": str(e)})
                log(f"[{name}] {e}")
            with open(path, "w", encoding="utf-8") as f:  # after each model: a run cut short keeps it
                json.dump(done, f, indent=1)
            log(f"[{name}] done in {time.time() - t0:.0f}s")
    finally:
        print(
            json.dumps(
                [
                    {k: v for k, v in d.items() if k in ("model", "ops", "devices", "remeasure_ratio_median", "error")}
                    for d in done
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
