"""``placer profile``: per-op forward and backward times and link speeds on real devices (calibrates the simulator).

Typical use::

    placer profile nmt-2 --devices cpu,cuda:0 -o profile.json
    placer simulate nmt-2 p.json --cluster h200x1 --profile profile.json

With ``--ranks N`` it measures this machine's gloo ranks instead (one thread each: compute
calibrated on SOURCE run as a real pipeline across the N ranks, point-to-point latency and
bandwidth by a ping-pong; :mod:`envs.real.distributed.profile_ranks`) and writes a cluster
file::

    placer profile bench.small_lm:build --ranks 2 -o ranks.json
    placer compare bench.small_lm:build --cluster ranks.json

``--ops ops.json`` beside ``--ranks`` also times every op in this process on one thread, as a rank runs it (on the
whole batch and on one of 4 microbatches), for ``--profile`` with that cluster: plans of more stages than ranks
are priced far better with per-op times than by the roofline alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np
from tqdm import tqdm

from graphs import sources
from graphs.errors import PlacerError
from graphs.ir import PROFILE_COLUMNS
from placer.cli.args import check_step_counts, measure_here
from placer.cli.output import print_json
from placer.option_checks import check_int, check_output_file


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="time every op and link on real devices (calibrates the simulator)",
        description="Time the forward and backward of every op of SOURCE on each device, and copies between each "
        "pair of devices; write a placer-profile/1 file for --profile on simulate, compare and train. Each device is "
        "timed inside real training steps with every op on it: on the CPU each op's time; on a GPU each op's kernel "
        "time and the host's time to issue it (an eager step on a GPU is often bound by the latter).",
    )
    p.add_argument("source", metavar="SOURCE", help="zoo name or module:callable returning (model, example_inputs)")
    p.add_argument("--devices", default="cpu", help="comma-separated torch devices (default cpu), e.g. cpu,cuda:0")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="profile file to write (.json)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps (default 1)")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed steps of each kind; the median is kept (default 5). The host's contention probe takes the best "
        "of this many 0.2 s windows, at most 3",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        metavar="N",
        help="measure N gloo ranks of this machine and write a placer-cluster/1 file for --cluster, instead of a "
        "profile: one thread each, compute fitted to SOURCE run as a real pipeline across the N ranks (1 and 8 "
        "microbatches), links by a p2p ping-pong",
    )
    p.add_argument(
        "--ops",
        default=None,
        metavar="FILE",
        help="with --ranks: also time every op of SOURCE in this process on one thread, as each rank runs, and write "
        "that profile (.json) for --profile on place, compare and train --ranks (with --microbatches K, 4 when not "
        "given): plans of more stages than ranks are priced far better with per-op times than by the roofline",
    )
    p.add_argument(
        "--microbatches",
        type=int,
        default=None,
        metavar="K",
        help="also time every op on one of K microbatches of SOURCE's inputs (cut along dimension 0, as a pipelined "
        "plan cuts them): the simulator then prices an op on one of M microbatches between the two sizes measured, "
        "which the whole batch's time over M is not for a dense layer on a small batch (default 1: the whole batch "
        "only; with --ranks --ops, 4)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the real runtime (torch): loaded only to profile
    import torch

    check_step_counts(args)
    check_output_file(args.output, "-o")
    if args.ops is not None and args.ranks is None:
        raise PlacerError("--ops: only with --ranks (without it, -o is the profile of op times)")
    if args.microbatches is None:
        args.microbatches = OPS_MICROBATCHES if args.ops is not None else 1
    check_int(args.microbatches, "--microbatches", least=1, most=1024)
    if args.ranks is not None:
        if args.microbatches != 1 and args.ops is None:
            raise PlacerError(
                "--microbatches: a profile of op times only (with --ranks, that of --ops); --ranks fits its own "
                "(1 and 8 microbatches)"
            )
        return run_ranks(args)
    torch_devices = [name.strip() for name in args.devices.split(",") if name.strip()]
    if not torch_devices:
        raise PlacerError("--devices: name at least one torch device, e.g. cpu or cpu,cuda:0")
    try:
        for torch_device in torch_devices:
            torch.device(torch_device)
    except (RuntimeError, ValueError):
        raise PlacerError(f"--devices {args.devices}: not a list of torch devices") from None
    measure_here()
    prof = profile_ops(args, torch_devices, args.output)
    summary = {
        "output": args.output,
        "graph_hash": prof["graph_hash"],
        "ops": len(prof["ops"]),
        "devices": {d: column_sums(e) for d, e in prof["devices"].items()},
        "links": [{k: lk[k] for k in ("src", "dst", "latency_s", "bandwidth_bytes_per_s")} for lk in prof["links"]],
        "errors": len(prof["errors"]),
    }
    if args.json:
        print_json(summary)
        return 0
    print(f"{args.output}: {summary['ops']} ops of {args.source} (graph {prof['graph_hash']})")
    for d, s in summary["devices"].items():
        print(f"  {d:<8} forward {s['fwd_s'] * 1e3:10.2f} ms   backward {s['bwd_s'] * 1e3:10.2f} ms   (sum over ops)")
        if "micro_fwd_s" in s:  # --microbatches K: one of K microbatches
            print(
                f"  {'':<8} forward {s['micro_fwd_s'] * 1e3:10.2f} ms   backward {s['micro_bwd_s'] * 1e3:10.2f} ms   "
                f"(one of {args.microbatches} microbatches)"
            )
        if "issue_fwd_s" in s:  # a GPU profiled in context: the host's time to issue those kernels
            print(
                f"  {'':<8} issue   {s['issue_fwd_s'] * 1e3:10.2f} ms   issue    "
                f"{s['issue_bwd_s'] * 1e3:10.2f} ms   (host, sum over ops)"
            )
    for lk in summary["links"]:
        print(
            f"  {lk['src']} -> {lk['dst']}: {lk['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, latency "
            f"{lk['latency_s'] * 1e6:.1f} us"
        )
    if summary["errors"]:
        print(f"  {summary['errors']} ops could not run on some device (left unknown): see 'errors' in the file")
    return 0


def column_sums(entry: dict[str, Any]) -> dict[str, float]:
    """A profile device entry's time columns, each summed over the ops (unknown ops left out)."""
    return {
        k: float(np.nansum(np.array(entry[k], dtype=float))) for k in PROFILE_COLUMNS if k in entry and k != "micro_m"
    }


def profile_ops(args: argparse.Namespace, torch_devices: list[str], output: str) -> dict[str, Any]:
    """Time every op of ``args.source`` on ``torch_devices`` in this process (``args.microbatches``, ``warmup``,
    ``repeats``), with a progress bar on a terminal, and write the profile to ``output``; returns it."""
    from envs.real import profiler

    model, inputs = sources.resolve_model(args.source)
    bar = tqdm(total=0, desc="profiling ops", unit="op", file=sys.stderr, disable=args.json or not sys.stderr.isatty())

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    prof = profiler.profile_model(
        model,
        inputs,
        torch_devices,
        microbatches=args.microbatches,
        warmup=args.warmup,
        repeats=args.repeats,
        progress=progress,
    )
    bar.close()
    profiler.save_profile(prof, output)
    return prof


def run_ranks(args: argparse.Namespace) -> int:
    """``--ranks N``: measure this machine's ranks into a cluster file (module doc); with ``--ops``, then every op
    in this process on one thread, as a rank runs it."""
    import torch

    from envs.real.distributed.profile_ranks import LOOPED_SCHEDULE, profile_ranks

    check_int(args.ranks, "--ranks", least=2)
    if args.devices != "cpu":
        raise PlacerError("--ranks: measures gloo ranks on this machine's CPU cores; leave --devices out")
    if args.ops is not None:
        check_output_file(args.ops, "--ops")
        if os.path.abspath(args.ops) == os.path.abspath(args.output):
            raise PlacerError(f"--ops {args.ops}: the same file as -o (one is a cluster, the other a profile)")
        measure_here()  # this process times the ops
    cluster, parts = profile_ranks(args.source, args.ranks, repeats=args.repeats, warmup=args.warmup)
    with open(args.output, "w") as f:
        json.dump(cluster.to_dict(), f, indent=1)
    summary: dict[str, Any] = {"output": args.output, "cluster": cluster.to_dict(), "measured": parts}
    if args.ops is not None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as each rank runs
        try:
            prof = profile_ops(args, ["cpu"], args.ops)
        finally:
            torch.set_num_threads(threads)
        summary["ops"] = {
            "output": args.ops,
            "graph_hash": prof["graph_hash"],
            "ops": len(prof["ops"]),
            "microbatches": args.microbatches,
            "errors": len(prof["errors"]),
            **column_sums(prof["devices"]["cpu"]),
        }
    if args.json:
        print_json(summary)
        return 0
    print(f"{args.output}: {args.ranks} gloo ranks of this machine, one thread each, calibrated on {args.source}")
    print(f"  {cluster.description}")
    for d, part in zip(cluster.devices, parts):
        runs = [
            f"M={run['microbatches']} {(run['phases']['forward_s'] + run['phases']['backward_s']) * 1e3:.1f} ms"
            for run in part.get("pipelines", [])
            if "phases" in run
        ]
        print(
            f"  {d.name:<6} step {part['step_s'] * 1e3:8.1f} ms   {d.flops_per_s / 1e9:6.2f} GFLOP/s   "
            f"{d.mem_bw_bytes_per_s / 1e9:6.2f} GB/s   {d.launch_overhead_s * 1e6:6.1f} us per op"
            + (f"   {d.action_overhead_s * 1e3:.2f} ms per pipeline action" if d.action_overhead_s else "")
            + (f"   optimizer step at {d.update_bw_bytes_per_s / 1e9:.2f} GB/s" if d.update_bw_bytes_per_s else "")
            + (f"   {d.handoff_s * 1e3:.2f} ms hand-off per message received" if d.handoff_s else "")
            + (f"   pipeline compute {', '.join(runs)}" if runs else "")
        )
    for why in sorted({run["error"] for part in parts for run in part.get("pipelines", []) if "error" in run}):
        print(f"  the calibration pipeline did not run ({why}): fitted to one-process steps")
    looped = [part["looped"] for part in parts if isinstance(part.get("looped"), dict)]
    for why in sorted({run["error"] for run in looped if "error" in run}):
        print(f"  the looped calibration pipeline did not run ({why}): no hand-off fitted")
    if looped and all("phases" in run for run in looped):
        step_s = max(run["phases"]["step_s"] for run in looped)
        print(
            f"  a looped pipeline (2 stages per rank, {LOOPED_SCHEDULE}, M={looped[0]['microbatches']}) measured "
            f"{step_s * 1e3:.1f} ms: each message's hand-off fitted to it"
        )
    splits = [p["split_backward"] for p in parts if isinstance(p.get("split_backward"), dict)]
    timed = [s for s in splits if "whole_s" in s]
    if timed:
        factor = cluster.devices[0].split_backward_factor
        each = ", ".join(f"{s['whole_s'] * 1e3:.1f} -> {s['split_s'] * 1e3:.1f} ms" for s in timed)
        print(f"  a backward split into its input and weight parts (zero-bubble schedules): {factor:.2f}x ({each})")
    for why in sorted({s["error"] for s in splits if "error" in s}):
        print(f"  the split backward could not be timed ({why}): taken as long as the whole one")
    for (a, b), link in cluster.links.items():
        if a < b:
            print(f"  {a} <-> {b}: {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s, latency {link.latency_s * 1e6:.1f} us")
    if args.ops is not None:
        o = summary["ops"]
        micro = (
            f", one of {o['microbatches']} microbatches {o['micro_fwd_s'] * 1e3:.2f} + {o['micro_bwd_s'] * 1e3:.2f} ms"
            if "micro_fwd_s" in o
            else ""
        )
        print(
            f"{args.ops}: {o['ops']} ops timed on one thread (forward + backward {o['fwd_s'] * 1e3:.2f} + "
            f"{o['bwd_s'] * 1e3:.2f} ms{micro}): give it as --profile with --cluster {args.output}"
        )
        if o["errors"]:
            print(f"  {o['errors']} ops could not run (left unknown): see 'errors' in {args.ops}")
    return 0


#: ``--ranks --ops``: the microbatches the op times are also taken at, when ``--microbatches`` is not given (the M
#: of the plans measured on two CPU ranks, BENCHMARKS.md "Looped and V plans against the simulator").
OPS_MICROBATCHES = 4
