"""``placer run`` (train a placed model for real) and ``placer profile`` (time ops on real devices).

Typical use::

    placer run nmt-2 --placement best_placement.json --cluster h200x1 --steps 10
    placer run mypkg.models:build --placement p.json --cluster k80x2 --device-map '*=cpu'
    placer profile nmt-2 --devices cpu,cuda:0 -o profile.json
    placer simulate nmt-2 p.json --cluster h200x1 --profile profile.json
"""

from __future__ import annotations

import argparse
import sys

from graphs.errors import PlacerError
from placer.checks import check_float, check_int, check_output_file
from placer.cli import print_json

DEVICE_MAP_HELP = "logical -> torch devices, e.g. gpu:0=cuda:1,*=cpu (default gpu:i=cuda:i, cpu:0=cpu)"


def add_commands(sub: argparse._SubParsersAction) -> None:
    from envs.cluster import CLUSTER_ARG_HELP

    p = sub.add_parser(
        "run", help="train a placed model on real devices and time its steps",
        description="Run real training steps (forward, loss, backward, Adam step) of SOURCE with every op on the "
        "device PLACEMENT gives it; print the median step time and the peak memory per device.",
    )
    p.add_argument("source", metavar="SOURCE", help="zoo name or module:callable returning (model, example_inputs)")
    p.add_argument("--placement", required=True, metavar="FILE", help="placement file (from `placer place` or `placer train`)")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--device-map", default=None, metavar="MAP", help=DEVICE_MAP_HELP)
    p.add_argument("--steps", type=int, default=10, help="timed training steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps first (default 2)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--measure-timeout", type=float, default=600.0, metavar="SECONDS", help="seconds the steps may take (default 600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (step_time_s, peak_bytes, ...)")
    p.set_defaults(func=run_run)

    p = sub.add_parser(
        "profile", help="time every op and link on real devices (calibrates the simulator)",
        description="Time the forward and backward of every op of SOURCE on each device, and copies between each "
        "pair of devices; write a placer-profile/1 file for --profile on simulate, compare and train. Each device is "
        "timed inside real training steps with every op on it: on the CPU each op's time; on a GPU each op's kernel "
        "time and the host's time to issue it (an eager step on a GPU is often bound by the latter).",
    )
    p.add_argument("source", metavar="SOURCE", help="zoo name or module:callable returning (model, example_inputs)")
    p.add_argument("--devices", default="cpu", help="comma-separated torch devices (default cpu), e.g. cpu,cuda:0")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="profile file to write (.json)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps of each kind; the median is kept (default 5)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run_profile)


def _check_numbers(args: argparse.Namespace) -> None:
    """Range-check the numeric options of ``run`` and ``profile`` (those the command has)."""
    for name, least in (("steps", 1), ("repeats", 1), ("warmup", 0)):
        if hasattr(args, name):
            check_int(getattr(args, name), f"--{name}", least=least)
    if hasattr(args, "lr"):
        check_float(args.lr, "--lr", above=0, most=1)


def run_run(args: argparse.Namespace) -> int:
    import torch

    import envs
    from envs.real.placing import check_available, resolve_devices
    from envs.real.timing import StepTimeout, failure_status, measure_steps, time_limit
    from placer.apply import apply
    from graphs.plan import Placement
    from placer.sources import resolve_model

    _check_numbers(args)
    cluster = envs.resolve_cluster(args.cluster)
    placement = Placement.load(args.placement)
    unknown = sorted(set(placement.assignment.values()) - set(cluster.device_names))
    if unknown:
        raise PlacerError(f"{args.placement}: uses device {unknown[0]!r}, not in cluster {cluster.name} ({', '.join(cluster.device_names)})")
    devices = resolve_devices(sorted(set(placement.assignment.values())), args.device_map)
    check_available(devices)
    model, inputs = resolve_model(args.source)
    module = apply(model, placement, inputs, device_map=args.device_map)
    opt = torch.optim.Adam(module.parameters(), lr=args.lr)
    try:
        with time_limit(args.measure_timeout):
            m = measure_steps(module, inputs, opt, devices, warmup_steps=args.warmup, timed_steps=args.steps)
        result = envs.Result(m["step_time_s"], "ok", peak_bytes=m["peak_bytes"], source="measured",
                             extra={"step_times_s": m["step_times_s"], "losses": m["losses"], "device_map": {k: str(v) for k, v in devices.items()}})
    except (torch.OutOfMemoryError, MemoryError, StepTimeout) as e:
        status = failure_status(e)
        result = envs.Result(float("inf"), status, f"{'out of memory' if status == 'oom' else 'timeout'}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", source="measured")
    if args.json:
        print_json(result.to_dict())
        return 0 if result.ok else 1
    if not result.ok:
        print(f"{args.source}: {result.status}: {result.message}")
        return 1
    times = result.extra["step_times_s"]
    print(f"{args.source} on {cluster.name} ({placement.method or 'placement'} {args.placement}): "
          f"step time {result.step_time_s * 1e3:.2f} ms (median of {len(times)}; min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f})")
    print(f"{'device':<8} {'torch':<8} {'ops':>6} {'peak memory':>14}")
    counts = placement.device_counts()
    for name, dev in devices.items():
        print(f"{name:<8} {str(dev):<8} {counts.get(name, 0):>6} {result.peak_bytes.get(name, 0) / 1e9:>11.3f} GB")
    print(f"loss {result.extra['losses'][0]:.4f} -> {result.extra['losses'][-1]:.4f}")
    return 0


def run_profile(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from envs.real.profiler import profile_model, save_profile
    from graphs.ir import PROFILE_COLUMNS
    from placer.sources import resolve_model

    _check_numbers(args)
    check_output_file(args.output, "-o")
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if not devices:
        raise PlacerError("--devices: name at least one torch device, e.g. cpu or cpu,cuda:0")
    try:
        import torch

        for d in devices:
            torch.device(d)
    except (RuntimeError, ValueError):
        raise PlacerError(f"--devices {args.devices}: not a list of torch devices") from None
    model, inputs = resolve_model(args.source)
    bar = tqdm(total=0, desc="profiling ops", unit="op", file=sys.stderr, disable=args.json or not sys.stderr.isatty())

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    prof = profile_model(model, inputs, devices, warmup=args.warmup, repeats=args.repeats, progress=progress)
    bar.close()
    save_profile(prof, args.output)
    summary = {
        "output": args.output,
        "graph_hash": prof["graph_hash"],
        "ops": len(prof["ops"]),
        "devices": {d: {k: float(np.nansum(np.array(e[k], dtype=float)))
                        for k in PROFILE_COLUMNS if k in e} for d, e in prof["devices"].items()},
        "links": [{k: lk[k] for k in ("src", "dst", "latency_s", "bandwidth_bytes_per_s")} for lk in prof["links"]],
        "errors": len(prof["errors"]),
    }
    if args.json:
        print_json(summary)
        return 0
    print(f"{args.output}: {summary['ops']} ops of {args.source} (graph {prof['graph_hash']})")
    for d, s in summary["devices"].items():
        print(f"  {d:<8} forward {s['fwd_s'] * 1e3:10.2f} ms   backward {s['bwd_s'] * 1e3:10.2f} ms   (sum over ops)")
        if "issue_fwd_s" in s:  # a GPU profiled in context: the host's time to issue those kernels
            print(f"  {'':<8} issue   {s['issue_fwd_s'] * 1e3:10.2f} ms   issue    {s['issue_bwd_s'] * 1e3:10.2f} ms   (host, sum over ops)")
    for lk in summary["links"]:
        print(f"  {lk['src']} -> {lk['dst']}: {lk['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, latency {lk['latency_s'] * 1e6:.1f} us")
    if summary["errors"]:
        print(f"  {summary['errors']} ops could not run on some device (left unknown): see 'errors' in the file")
    return 0
