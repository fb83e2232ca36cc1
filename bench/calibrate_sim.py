"""How well does the calibrated simulator rank and predict real step times?

For each model: profile it on the given devices (``envs.real.profiler``), sample random
placements, measure each for real (``envs.MeasuredEnv``: real training steps in
a Ray actor, wall clock; or ``--real local``: in this process, by the thread's CPU
time, for a machine other jobs keep busy) and simulate it (the profiled graph on the calibrated cluster, and,
for reference, the uncalibrated preset), then report Spearman's rank correlation
and the mean absolute percentage error (MAPE) of simulated vs measured step time.

    # CPU only (every logical device runs on the CPU), toy-sized zoo models:
    python -m bench.calibrate_sim --devices cpu --size small
    # one GPU and its host, the zoo's real sizes:
    python -m bench.calibrate_sim --devices cpu,cuda:0 --size full

Placements: half draw each op's device independently with a per-placement bias
(from "all on the CPU" to "all on the GPU"), half cut the op sequence into 2-6
contiguous segments with a random device each (few transfers), so step times
spread over the range a placer explores. Results go to ``--out-dir``
(``calibration.json``, ``calibration.md`` and each model's resumable
``measurements.jsonl``). The measurements are :mod:`bench.fidelity.measuring`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from bench.common import OneLineParser
from bench.fidelity.measuring import measure_local, measure_ray
from bench.fidelity.metrics import mape, spearman
from bench.fidelity.models import SMALL, build, zoo_names
from bench.fidelity.runs import calibrated, random_placements
from graphs import PlacerError


def simulator_executor(requested: str | None) -> tuple[str, dict]:
    """The executor model scored with (default: the simulator's, eager), and the keyword that selects it."""
    from envs.sim.schedule import EXECUTORS

    name = requested or EXECUTORS[0]
    if name not in EXECUTORS:
        raise PlacerError(f"--executor {name}: unknown (known: {', '.join(EXECUTORS)})")
    return name, {"executor": name}


def sim_times(graph, cluster, placements, executor: dict | None = None, orders=None) -> np.ndarray:
    """Simulated step time of each placement (memory ignored for an OOM one); ``orders``: an issue
    order (or None, node order) per placement, which the eager executor follows."""
    import envs

    out = []
    for k, op_devices in enumerate(placements):
        r = envs.simulate(graph, op_devices, cluster, **(executor or {}), order=None if orders is None else orders[k])
        out.append(r.step_time_s if r.ok else r.extra.get("sim_step_time_s", float("inf")))
    return np.asarray(out)


def run_model(name: str, args: argparse.Namespace) -> dict:
    import torch

    import envs
    from envs.real.profiler import profile_model, save_profile
    from graphs.torch_capture import capture

    cluster = envs.resolve_cluster(args.cluster)
    executor, executor_kw = simulator_executor(args.executor)
    model, inputs = build(name, args.size)
    graph = capture(model, inputs, name=name)
    torch.set_num_threads(max(1, args.cpus))  # profile with the threads the measuring actor uses
    t0 = time.time()
    prof = profile_model(
        model, inputs, args.devices.split(","), warmup=1, repeats=args.repeats, method=args.profile_method
    )
    profile_s = time.time() - t0
    run_dir = os.path.join(args.out_dir, name)
    os.makedirs(run_dir, exist_ok=True)
    save_profile(prof, os.path.join(run_dir, "profile.json"))
    graph_p, _, phys, to_phys = calibrated(graph, prof, cluster, args.device_map)
    placements = random_placements(graph.num_ops, cluster.num_devices, args.placements, seed=args.seed)
    t0 = time.time()
    if args.real == "local":
        results = measure_local(name, args, cluster, graph, placements)
    else:
        results = measure_ray(
            name,
            args.size,
            cluster,
            graph,
            placements,
            run_dir,
            device_map=args.device_map,
            warmup=args.warmup,
            steps=args.steps,
            cpus=args.cpus,
            timeout=args.timeout,
        )
    measure_s = time.time() - t0
    ok = np.array([r.ok for r in results])
    real = np.array([r.step_time_s for r in results])[ok]
    sim_cal = sim_times(graph_p, phys, [to_phys[p] for p in placements], executor_kw)[ok]
    sim_raw = sim_times(graph, cluster, placements, executor_kw)[ok]
    # One physical device (CPU only): every placement simulates alike, ranks are undefined (NaN).
    rho_cal = spearman(sim_cal, real)
    rho_raw = spearman(sim_raw, real)
    return {
        "model": name,
        "size": args.size,
        "executor": executor,
        "profile_method": args.profile_method,
        "real": args.real,
        "profile_clock": prof["devices"].get("cpu", {}).get("clock", "wall"),
        "ops": graph.num_ops,
        "placements": len(placements),
        "measured_ok": int(ok.sum()),
        "failed": [f"{r.status}: {r.message}" for r in results if not r.ok][:5],
        "spearman_calibrated": rho_cal,
        "mape_calibrated": mape(sim_cal, real),
        "spearman_uncalibrated": rho_raw,
        "mape_uncalibrated": mape(sim_raw, real),
        "real_step_s": real.tolist(),
        "sim_calibrated_step_s": sim_cal.tolist(),
        "sim_uncalibrated_step_s": sim_raw.tolist(),
        "profile_s": profile_s,
        "measure_s": measure_s,
        "links": [{k: lk[k] for k in ("src", "dst", "latency_s", "bandwidth_bytes_per_s")} for lk in prof["links"]],
    }


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "Calibrated simulator vs real training steps: `python -m bench.calibrate_sim --devices "
        f"{args.devices} --size {args.size} "
        f"--cluster {args.cluster}{' --device-map ' + repr(args.device_map) if args.device_map else ''} "
        f"--placements {args.placements} "
        f"--steps {args.steps} --warmup {args.warmup} --repeats {args.repeats} --cpus {args.cpus} "
        f"--profile-method {args.profile_method} --real {args.real}` "
        f"(median of {args.steps} timed steps after {args.warmup} warm-up, Adam; simulated with the "
        f"{rows[0]['executor'] if rows else '?'} executor).",
        "",
        "| model | ops | placements ok | Spearman (calibrated) | MAPE (calibrated) | Spearman (preset) | MAPE "
        "(preset) | real step time range |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        real = r["real_step_s"] or [float("nan")]
        lines.append(
            f"| {r['model']} ({r['size']}) | {r['ops']} | {r['measured_ok']}/{r['placements']} | "
            f"{r['spearman_calibrated']:.3f} | "
            f"{100 * r['mape_calibrated']:.1f}% | {r['spearman_uncalibrated']:.3f} | "
            f"{100 * r['mape_uncalibrated']:.1f}% | "
            f"{min(real) * 1e3:.1f}-{max(real) * 1e3:.1f} ms |"
        )
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> dict:
    """The ``--json`` document: per model, the calibrated simulator's MAPE and Spearman (null where undefined)."""

    def num(x: float) -> float | None:
        return None if x is None or not np.isfinite(x) else float(x)

    return {
        "models": [
            {
                "model": r["model"],
                "executor": r["executor"],
                "mape": num(r["mape_calibrated"]),
                "spearman": num(r["spearman_calibrated"]),
                "n": r["measured_ok"],
            }
            for r in rows
        ]
    }


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m bench.calibrate_sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="rnnlm,resnet50", help="comma-separated zoo names (default rnnlm,resnet50)")
    p.add_argument("--devices", default="cpu", help="torch devices to profile: cpu, or cpu,cuda:0 (default cpu)")
    p.add_argument("--cluster", default="h200x1", help="cluster whose logical devices placements use (default h200x1)")
    p.add_argument("--device-map", default=None, help="logical -> torch devices (default: *=cpu when --devices is cpu)")
    p.add_argument(
        "--size", choices=("small", "full"), default="small", help="toy-sized architectures or the zoo's sizes"
    )
    p.add_argument("--placements", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5, help="profiler repeats (in-context steps, or runs per op)")
    p.add_argument(
        "--profile-method",
        choices=("context", "isolated"),
        default="context",
        help="time CPU ops inside real training steps (default) or each op alone",
    )
    p.add_argument(
        "--real",
        choices=("ray", "local"),
        default="ray",
        help="measure real steps in a Ray actor, wall clock (default), or in this process by host_clock "
        "(CPU time of the one torch thread: for a machine other jobs keep busy)",
    )
    p.add_argument(
        "--executor", default=None, help="simulator executor model: eager (default, the PyTorch runtime) or dataflow"
    )
    p.add_argument(
        "--json", action="store_true", help='print {"models": [{"model", "executor", "mape", "spearman", "n"}...]}'
    )
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPU threads for the measuring actor")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per measured placement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="runs/calibrate")
    args = p.parse_args(argv)
    try:
        return run(args)
    except PlacerError as e:
        print(f"calibrate_sim: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    if args.device_map is None and "cuda" not in args.devices:
        args.device_map = "*=cpu"
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    known = set(SMALL) if args.size == "small" else set(SMALL) | set(zoo_names())
    unknown = [m for m in names if m not in known]
    if not names or unknown:
        raise PlacerError(f"--models: {', '.join(unknown) or 'none given'}: not one of {', '.join(sorted(known))}")
    for opt in ("placements", "steps", "repeats", "cpus"):
        if getattr(args, opt) < 1:
            raise PlacerError(f"--{opt}: must be at least 1")
    simulator_executor(args.executor)
    if args.real == "local" and "cuda" in args.devices:
        raise PlacerError("--real local: times host CPU work only; measure CUDA placements with --real ray")
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for name in names:
        print(
            f"[{name}] profiling on {args.devices}, measuring {args.placements} placements...",
            file=sys.stderr,
            flush=True,
        )
        rows.append(run_model(name, args))
        r = rows[-1]
        print(
            f"[{name}] spearman {r['spearman_calibrated']:.3f}, MAPE {100 * r['mape_calibrated']:.1f}% "
            f"(preset: {r['spearman_uncalibrated']:.3f}, {100 * r['mape_uncalibrated']:.1f}%); "
            f"profile {r['profile_s']:.0f}s, measure {r['measure_s']:.0f}s",
            file=sys.stderr,
            flush=True,
        )
    with open(os.path.join(args.out_dir, "calibration.json"), "w") as f:
        json.dump({"args": vars(args), "results": rows}, f, indent=1, default=str)
    md = markdown(rows, args)
    with open(os.path.join(args.out_dir, "calibration.md"), "w") as f:
        f.write(md)
    if args.json:
        print(json.dumps(summary(rows), indent=1))
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
