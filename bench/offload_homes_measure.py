"""The offload scenario with parameter homes at one GPU cap, measured: one call of a lent GPU machine (issue 50).

For a scenario and a cap, on the machine: the GPU capped for real
(:func:`envs.real.local.cap_cuda_memory`), the model built and captured there, the
plans of :func:`bench.offload_homes.cap_plans` made on that graph (placer's move search
with home moves and without, FSDP2's offload as a plan, accelerate's maps), then
measured in this order until the deadline: placer's plan with homes, FSDP2 itself
(:func:`bench.fsdp2.measure_offload`), FSDP2 with every block checkpointed, DeepSpeed's ZeRO-Offload at stage 2 and
at stage 3 (:func:`bench.deepspeed_offload.measure_zero_offload`; where DeepSpeed is not installed, their rows say
so), the op-only plan, FSDP2's offload as placer runs it, and accelerate's fastest map the simulator says fits.
Each plan runs through :func:`placer.apply` (homes included) with ``torch.optim.Adam`` on the placed module's
parameters (:func:`envs.real.timing.measure_steps`), each row in a
process of its own (``--row``: the plan read back from the JSON file as data), so
no row's memory, allocator cache or CUDA state reaches the next one's peak: on an
H200 FSDP2's offload as a plan peaked at 14.15 GiB measured fourth in one process
and at 6.62 GiB alone in a fresh one. The rows, with
the simulated step and peak beside the real ones, are rewritten to
``OUT/measured-<scenario>-<cap>.json`` after every measurement, so a call stopped at
its deadline keeps what it measured.

    python -m bench.offload_homes_measure --scenario llama-256k --cap 8 --out-dir runs/offload_homes
    python -m bench.offload_homes_measure --scenario llama-256k --cap 8 --out-dir runs/offload_homes \
        --profile runs/offload/profile.json   # planned on this machine's op times (the profile stage)

``--rows rivals`` measures placer's plan with homes and the rivals as themselves only (FSDP2's two rows, DeepSpeed's
two), for a call with less time (``docs/gpu_calls/h200-next-deepspeed.sh``).

``--device-map '*=cpu'`` (and ``--scenario tiny``) is the CPU stand-in: the same
calls with every logical device on the host, the cap in the cluster file only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench import offload, offload_homes
from bench.common import OneLineParser
from bench.offload import Plan
from envs.result import Result
from graphs import PlacerError
from graphs.io import write_text_atomic
from placer.option_checks import check_input_file

GIB = 1 << 30


def measure_plan(
    scenario: Any, plan: Plan, device_map: str, *, warmup_steps: int, timed_steps: int, timeout_s: float
) -> Result:
    """One plan's training steps through :func:`placer.apply` on a fresh model; a Result, never raising."""
    import torch

    import placer
    from envs.real.placing import resolve_devices
    from envs.real.timing import Protocol, failure_status, measure_steps, placed_adam, step_extra, time_limit
    from envs.real.worker import one_line

    p = plan.placement
    try:
        with time_limit(timeout_s):
            model, inputs = offload.build(scenario)
            placed = placer.apply(model, p, inputs, device_map=device_map)
            optimizer = placed_adam(placed, p, lr=1e-3)  # host-homed parameters step on the host, when p says
            names = sorted(set(p.assignment.values()) | set(p.param_homes.values()))
            m = measure_steps(
                placed,
                inputs,
                optimizer,
                resolve_devices(names, device_map),
                warmup_steps=warmup_steps,
                timed_steps=timed_steps,
                protocol=Protocol(),  # as every measurement of placer's: malloc steady, the collector held off
            )
        extra = {**step_extra(m), "protocol": m["protocol"]}
        return Result(m["step_time_s"], "ok", peak_bytes=m["peak_bytes"], source="measured", extra=extra)
    except Exception as e:  # noqa: BLE001  (a plan that fails is its row)
        return Result(float("inf"), failure_status(e), f"{type(e).__name__}: {one_line(e)}", source="measured")
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


FSDP2_MEASURED = "FSDP2, CPUOffloadPolicy (measured: torch's FSDP2)"
FSDP2_AC_MEASURED = "FSDP2, CPUOffloadPolicy, every block checkpointed (measured: torch's FSDP2)"
FSDP2_ROWS = {FSDP2_MEASURED: False, FSDP2_AC_MEASURED: True}  # torch's FSDP2 rows: label -> checkpoint
ZERO_OFFLOAD_MEASURED = "DeepSpeed ZeRO-Offload, stage 2: Adam and gradients on the host (measured: DeepSpeed)"
ZERO3_OFFLOAD_MEASURED = "DeepSpeed ZeRO-3, parameters and Adam on the host (measured: DeepSpeed)"
DEEPSPEED_ROWS = {ZERO_OFFLOAD_MEASURED: 2, ZERO3_OFFLOAD_MEASURED: 3}  # DeepSpeed's rows: label -> ZeRO stage
#: The rivals measured as themselves (no plan of placer's), in the order they are measured after placer's plan.
RIVAL_ROWS = (*FSDP2_ROWS, *DEEPSPEED_ROWS)


def measure_row(args: argparse.Namespace, scenario: Any, cluster: Any, plan: Plan | None, label: str = "") -> Result:
    """One row in this process (its GPU already capped): ``plan`` through :func:`measure_plan`, or (``plan`` None)
    the rival ``label`` names: torch's FSDP2 itself (every block checkpointed in one row), or DeepSpeed's
    ZeRO-Offload at a stage (:mod:`bench.deepspeed_offload`; where DeepSpeed is not installed, the row says so)."""
    from bench.deepspeed_offload import measure_zero_offload
    from bench.fsdp2 import measure_offload
    from envs.real.placing import resolve_devices

    steps = {"warmup_steps": args.warmup, "timed_steps": args.steps, "timeout_s": args.measure_timeout}
    if plan is not None:
        return measure_plan(scenario, plan, args.device_map, **steps)
    device = resolve_devices(["gpu:0"], args.device_map)["gpu:0"]
    builder = offload.builder(scenario)
    if label in DEEPSPEED_ROWS:
        return measure_zero_offload(builder, device, stage=DEEPSPEED_ROWS[label], optimizer=args.zero_adam, **steps)
    if label not in FSDP2_ROWS:
        raise PlacerError(f"no plan and no rival named {label!r}")
    return measure_offload(builder, device, checkpoint=FSDP2_ROWS[label], **steps)


def measure_in_child(args: argparse.Namespace, path: str, label: str) -> Result:
    """Row ``label`` of the document at ``path`` measured by a new process (``--row``); a Result, never raising."""
    cmd = [sys.executable, "-m", "bench.offload_homes_measure", "--row", label, "--out-dir", args.out_dir]
    cmd += ["--scenario", args.scenario, "--cap", repr(args.cap), "--device-map", args.device_map]
    cmd += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--measure-timeout", str(args.measure_timeout)]
    cmd += ["--zero-adam", args.zero_adam]
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: ``bench`` importable
    try:  # the child builds the model before its steps: a minute more than one plan's measurement may take
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=args.measure_timeout + 60)
    except subprocess.TimeoutExpired:
        return Result(float("inf"), "timeout", f"the row's process ran past {args.measure_timeout + 60:.0f} s")
    lines = done.stdout.strip().splitlines()
    try:
        return Result.from_dict(json.loads(lines[-1]))
    except (IndexError, ValueError, TypeError):
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return Result(float("inf"), "error", f"the row's process exited {done.returncode} without a result: {last}")


def child_main(args: argparse.Namespace) -> int:
    """``--row LABEL``: measure one row of ``OUT/measured-<scenario>-<cap>.json`` here, under the GPU cap, print its
    Result as JSON."""
    from envs.real.local import cap_cuda_memory, cuda_caps

    scenario = offload_homes.capped(offload.check_scenario(args.scenario), int(args.cap * GIB))
    with open(row_path(args), encoding="utf-8") as f:
        docs = {d["label"]: d for d in json.load(f)["plans"]}
    if args.row not in RIVAL_ROWS and args.row not in docs:
        raise PlacerError(f"--row {args.row!r}: no such plan in {row_path(args)}")
    plan = offload.plan_from_doc(docs[args.row]) if args.row in docs else None
    cluster = offload.scenario_cluster(scenario)
    cap_cuda_memory(cuda_caps(cluster, args.device_map))
    result = measure_row(args, scenario, cluster, plan, args.row)
    print(json.dumps(result.to_dict(), default=float))
    return 0


def row_path(args: argparse.Namespace) -> str:
    return os.path.join(args.out_dir, f"measured-{args.scenario}-{args.cap:g}.json")


def measure_order(plans: list[Plan]) -> list[Plan]:
    """placer's plan with homes, the same search stepping the homed parameters after the backward where placer's
    steps them during it (the ablation of that), the same search without checkpointing where placer's plan
    checkpoints layers (the ablation), the op-only plan, FSDP2's offload as planned, accelerate's fastest fitting
    map; a plan the simulator puts out of memory after all those it says fit (measured if the deadline leaves
    time: on an H200 the op-only plan's 39 s out of memory at 16 GiB left accelerate's map unmeasured)."""
    by_label = {p.label: p for p in plans}
    fitting = [p for p in plans if p.kind == "accelerate" and offload.sim_fits(p)]
    accel = sorted(fitting, key=lambda p: p.sim["step_time_s"])[:1]
    placer = by_label.get(offload_homes.HOMED)
    checkpoints = placer is not None and bool(getattr(placer.placement, "checkpoint", None))
    during = placer is not None and getattr(placer.placement, "host_step", "after") == "backward"
    first = [placer, by_label.get(offload_homes.STEP_AFTER) if during else None]
    first.append(by_label.get(offload_homes.NO_CHECKPOINT) if checkpoints else None)
    first.append(by_label.get(offload_homes.OPS_ONLY))
    order = [p for p in first + [by_label.get(offload_homes.FSDP2)] + accel if p is not None and p.placement]
    return sorted(order, key=lambda p: not offload.sim_fits(p))  # stable: the fitting ones keep their order


def measured_row(plan_label: str, sim: dict[str, Any] | None, result: Result, cap_bytes: int) -> dict[str, Any]:
    """A measured row: real and simulated step time and peak ``gpu:0`` GiB, and whether the real peak fits the cap."""
    gpu = result.peak_bytes.get("gpu:0") if result.ok else None
    reserved = result.extra.get("peak_reserved_bytes", {}).get("gpu:0") if result.ok else None
    sim_peak = (sim or {}).get("peak_bytes", {}).get("gpu:0")
    return {
        "label": plan_label,
        "status": result.status,
        "real_step_time_s": result.step_time_s if result.ok else None,
        "real_peak_gpu_gib": None if gpu is None else gpu / GIB,
        "real_reserved_gpu_gib": None if reserved is None else reserved / GIB,
        "within_cap": None if gpu is None else gpu <= cap_bytes,
        "sim_step_time_s": (sim or {}).get("step_time_s"),
        "sim_peak_gpu_gib": None if sim_peak is None else sim_peak / GIB,
        "message": result.message,
        "optimizer": result.extra.get("optimizer"),  # a rival's own say (DeepSpeed's CPU Adam, or torch's and why)
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The call (see the module docstring); returns the document it wrote last."""
    import graphs
    from envs.real.local import cap_cuda_memory, cuda_caps

    start = time.monotonic()
    scenario = offload_homes.capped(offload.check_scenario(args.scenario), int(args.cap * GIB))
    cluster = offload.scenario_cluster(scenario)
    fractions = cap_cuda_memory(cuda_caps(cluster, args.device_map))
    model, inputs = offload.build(scenario)
    graph = graphs.capture(model, inputs, name=scenario.name)
    if args.profile:  # this machine's op times and links (refused for another graph)
        from envs.real import profiler

        graph, cluster = profiler.with_profile(graph, cluster, args.profile, device_map=args.device_map)
    plans = offload_homes.cap_plans(graph, cluster, model, evals=args.evals, seed=args.seed)
    del model
    os.makedirs(args.out_dir, exist_ok=True)
    path = row_path(args)
    doc: dict[str, Any] = {
        "scenario": scenario.name,
        "cap_gib": args.cap,
        "device_map": args.device_map,
        "memory_fractions": fractions,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "graph_hash": graph.content_hash,
        "simulator": f"profile {args.profile}" if args.profile else "estimates",
        "simulated": [offload_homes.row(p, graph) for p in plans],
        "measured": [],
        "plans": [offload.plan_doc(p) for p in plans],
    }
    write_text_atomic(path, json.dumps(doc, indent=1, default=float))  # the plans, for the rows' processes
    queue: list[tuple[str, Any]] = [(p.label, p) for p in measure_order(plans)]
    queue[1:1] = [(label, None) for label in RIVAL_ROWS]
    if args.rows == "rivals":  # placer's plan and the rivals as themselves: the rows a short call has time for
        queue = [(label, plan) for label, plan in queue if label == offload_homes.HOMED or label in RIVAL_ROWS]
    for label, plan in queue:
        if time.monotonic() - start > args.deadline:
            doc["measured"].append({"label": label, "status": "not measured: past the deadline"})
            continue
        t0 = time.perf_counter()
        if args.isolate:
            r = measure_in_child(args, path, label)
        else:
            r = measure_row(args, scenario, cluster, plan, label)
        doc["measured"].append(measured_row(label, None if plan is None else plan.sim, r, scenario.gpu_cap_bytes))
        row = doc["measured"][-1]
        said = "" if row["real_peak_gpu_gib"] is None else f", {row['real_peak_gpu_gib']:.2f} GiB allocated"
        said += "" if row["real_reserved_gpu_gib"] is None else f", {row['real_reserved_gpu_gib']:.2f} GiB reserved"
        said += "" if row["optimizer"] is None else f", {row['optimizer']}"
        print(f"  {label}: {r.status} {r.step_time_s:.3f}s{said} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
        write_text_atomic(path, json.dumps(doc, indent=1, default=float))
    write_text_atomic(path, json.dumps(doc, indent=1, default=float))
    return doc


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m bench.offload_homes_measure", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="llama-256k", help="known: " + ", ".join(offload.SCENARIOS))
    p.add_argument("--cap", type=float, default=24.0, help="the GPU cap in GiB (default 24)")
    p.add_argument("--device-map", default="cpu:0=cpu,gpu:0=cuda:0", help="'*=cpu': the CPU stand-in")
    p.add_argument("--evals", type=int, default=2000, help="placements each search simulates (default 2000)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps per plan, median reported (default 3)")
    p.add_argument("--measure-timeout", type=float, default=120.0, help="seconds one plan may take (default 120)")
    p.add_argument("--deadline", type=float, default=400.0, help="start no measurement after this (default 400 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--profile",
        default=None,
        metavar="PROFILE.json",
        help="plan and simulate with this machine's op times and links (the profile stage's profile.json: `bash "
        "scripts/gpu_offload.sh profile`; a GPU run on the host is a CPU, so not on the CPU stand-in); default: "
        "the scenario's estimates",
    )
    p.add_argument(
        "--rows",
        choices=("all", "rivals"),
        default="all",
        help="what is measured: every row (default), or placer's plan with homes and the rivals as themselves "
        "(FSDP2's two rows, DeepSpeed's two) only, for a call with less time",
    )
    p.add_argument(
        "--zero-adam",
        choices=("deepspeed", "torch"),
        default="deepspeed",
        help="the Adam of DeepSpeed's rows: its own CPU Adam, compiled at first use (torch's where that fails; the "
        "default), or torch's (no compiling)",
    )
    p.add_argument("--out-dir", required=True)
    p.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="measure every row in this process (default: each in a new one, so no row's memory reaches the next)",
    )
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # a row's process: measure this plan of the file
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        offload.check_scenario(args.scenario)
        if args.profile:
            check_input_file(args.profile, "--profile")
        if not args.cap > 0 or args.evals < 1 or args.steps < 1 or args.warmup < 0:
            raise PlacerError("--cap must be > 0, --evals and --steps >= 1, --warmup >= 0")
        if args.row is not None:
            return child_main(args)
        doc = run(args)
    except PlacerError as e:
        print(f"python -m bench.offload_homes_measure: {e}", file=sys.stderr)
        return 2
    for r in doc["measured"]:
        step = r.get("real_step_time_s")
        print(f"{r['label']}: {r['status']}" + (f" {step:.3f}s" if step is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
