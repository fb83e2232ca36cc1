"""A model whose training state does not fit the GPU: placer against accelerate's map and FSDP2's offload (issue 34).

The scenario (:mod:`bench.offload`): a Llama-style decoder LM with a 256k vocabulary,
1.54 B parameters, whose fp32 training state does not fit a GPU capped at 24 GiB
(``torch.cuda.set_per_process_memory_fraction``; the same capacity is ``gpu:0``'s
memory in ``OUT/cluster.json``). The commands, each resumable on the same ``--out-dir``
(every measurement is logged as it is taken):

``plan`` (no device, a minute on a CPU): the model captured on the meta device, every rival's
plan and the simulator's table (its graph is this machine's torch's, so the GPU stages make
their own). ``profile``: every op of the exported model timed on the host and the GPU
(``placer profile``'s in-context profiler), so that the stages after it plan and simulate with the
calibrated simulator (without it, the scenario's estimated rates). ``rivals``: builds and exports the
model, makes every rival's plan (accelerate's map at max_memory = the cap and at fractions of it,
every heuristic, placer trained on the simulator), and measures them on the capped GPU with FSDP2's
``CPUOffloadPolicy``, until ``--deadline``. ``finetune``: continues placer's simulator-trained policy with
REINFORCE on measured step times, in this process (no Ray), for ``--budget`` s, and
records the real and simulated curves. ``report``: the table and curves of an
``--out-dir`` (no device; ``--plot`` draws the curves). ``adam``: the host's fp32 Adam
rate (what every plan with parameters on the host pays in its optimizer step).

On one H100 (16 host cores; each command <= 8 minutes; rivals and finetune ran on an H100 on
2026-11-27, the profile stage not yet)::

    bash scripts/gpu_offload.sh profile     # about 2 minutes (estimated): ~10 s steps on the host, 4 of them
    bash scripts/gpu_offload.sh rivals      # about 6 minutes: measurements start until --deadline 300
    bash scripts/gpu_offload.sh finetune    # about 5 minutes: --budget 240 plus the build

On a CPU, ``--tiny`` runs the whole pipeline with a small model and every logical
device on the CPU (a stand-in: the cap is in the cluster file only, and the figures
say nothing about a GPU)::

    python -m bench.gpu_offload rivals --tiny --out-dir /tmp/offload
    python -m bench.gpu_offload finetune --tiny --out-dir /tmp/offload
    python -m bench.gpu_offload report --out-dir /tmp/offload

Progress goes to stderr; the table to stdout (``--json``: the report as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.common import OneLineParser, mode_defaults
from graphs import PlacerError

DEFAULTS = {
    "gpu": dict(
        scenario="llama-256k",
        device_map="cpu:0=cpu,gpu:0=cuda:0",
        warmup=1,
        steps=4,
        measure_timeout=120.0,
        deadline=300.0,
        train_budget=60.0,
        budget=240.0,
    ),
    "tiny": dict(
        scenario="tiny",
        device_map="*=cpu",
        warmup=1,
        steps=3,
        measure_timeout=60.0,
        deadline=120.0,
        train_budget=5.0,
        budget=10.0,
    ),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m bench.gpu_offload", description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=("plan", "profile", "rivals", "finetune", "report", "adam"))
    p.add_argument(
        "--tiny", action="store_true", help="the CPU stand-in: a small model, every logical device on the CPU"
    )
    p.add_argument("--scenario", help="llama-256k (default) or tiny (default with --tiny)")
    p.add_argument(
        "--out-dir", default="runs/offload", help="plans, measurements, runs and the table (default runs/offload)"
    )
    p.add_argument("--device-map", help="logical -> torch devices (default cpu:0=cpu,gpu:0=cuda:0; --tiny: *=cpu)")
    p.add_argument("--warmup", type=int, help="untimed steps per placement (default 1)")
    p.add_argument("--steps", type=int, help="timed steps per placement, median reported (default 4; --tiny: 3)")
    p.add_argument("--measure-timeout", type=float, help="seconds one placement's measurement may take (default 120)")
    p.add_argument("--deadline", type=float, help="rivals: start no measurement after this many seconds (default 300)")
    p.add_argument("--train-budget", type=float, help="rivals: seconds of placer.train on the simulator (default 60)")
    p.add_argument("--budget", type=float, help="finetune: seconds of REINFORCE on measured rewards (default 240)")
    p.add_argument("--samples", type=int, default=8, help="placements sampled per iteration, both runs (default 8)")
    p.add_argument(
        "--exploration",
        type=float,
        default=2.0,
        help="finetune: std of the noise on the policy's logits while sampling (default 2; 0: none)",
    )
    p.add_argument(
        "--profile-repeats",
        type=int,
        default=3,
        help="profile: timed training steps per device, each op's median kept (default 3)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="report: draw the fine-tuning's curves to this PNG (needs matplotlib)")
    p.add_argument("--params", type=int, default=100_000_000, help="adam: parameters updated (default 100 M)")
    p.add_argument("--threads", default="1", help="adam: comma-separated torch thread counts (default 1)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    args = p.parse_args(argv)
    return mode_defaults(args, DEFAULTS)


def options(args: argparse.Namespace) -> "StageOptions":  # noqa: F821  (bench.offload_stages, imported lazily)
    """The stage options, checked (PlacerError naming the option)."""
    from bench.offload import check_scenario
    from bench.offload_stages import StageOptions
    from envs.real.placing import check_available, resolve_devices
    from placer.option_checks import check_float, check_int, check_output_dir, check_seed

    scenario = check_scenario(args.scenario)
    check_int(args.warmup, "--warmup", least=0)
    check_int(args.steps, "--steps", least=1)
    check_int(args.samples, "--samples", least=2, most=64)
    check_int(args.profile_repeats, "--profile-repeats", least=1)
    check_seed(args.seed)
    for name in ("measure_timeout", "deadline", "train_budget", "budget"):
        check_float(getattr(args, name), f"--{name.replace('_', '-')}", above=0)
    check_float(args.exploration, "--exploration", least=0)
    check_output_dir(args.out_dir, "--out-dir")
    if args.stage != "plan":  # the plan stage runs nothing
        check_available(resolve_devices(["cpu:0", "gpu:0"], args.device_map))
    return StageOptions(
        scenario,
        args.out_dir,
        args.device_map,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        measure_timeout_s=args.measure_timeout,
        deadline_s=args.deadline,
        train_budget_s=args.train_budget,
        budget_s=args.budget,
        samples=args.samples,
        seed=args.seed,
        exploration=args.exploration,
        profile_repeats=args.profile_repeats,
    )


def report(args: argparse.Namespace) -> dict:
    from graphs.io import read_json

    path = os.path.join(args.out_dir, "rows.json")
    if not os.path.exists(path):
        raise PlacerError(f"--out-dir {args.out_dir}: no rows.json (run the rivals stage there first)")
    doc = read_json(path)
    curves_path = os.path.join(args.out_dir, "curves.json")
    doc["curves"] = read_json(curves_path) if os.path.exists(curves_path) else None
    if args.plot:
        if doc["curves"] is None:
            raise PlacerError(f"--plot: {args.out_dir} has no curves.json (run the finetune stage first)")
        from bench.measured_rl import plot_curves

        plot_curves(doc["curves"], args.plot, title=f"{doc['scenario']}: REINFORCE on measured step times")
    return doc


def host_adam(args: argparse.Namespace) -> dict:
    """The ``adam`` stage: the host's fp32 Adam rate (:mod:`bench.host_adam`) at each of ``--threads``."""
    from bench.common import machine_line, parse_list
    from bench.host_adam import adam_rate
    from placer.option_checks import check_int

    check_int(args.params, "--params", least=1000)
    threads = [
        check_int(int(t) if t.isdigit() else t, "--threads", least=1) for t in parse_list(args.threads, what="threads")
    ]
    return {
        "machine": machine_line(),
        "parameters": args.params,
        "params_per_s": {str(t): adam_rate(args.params, threads=t) for t in threads},
    }


def text(doc: dict) -> str:
    if "profile" in doc:  # the profile stage
        steps = ", ".join(f"{d} {s:.3f} s" if s else f"{d} -" for d, s in doc["step_s"].items())
        return (
            f"{doc['profile']}: graph {doc['graph_hash']} profiled on {', '.join(doc['devices'])} in "
            f"{doc['seconds']:.0f} s; "
            f"a step with every op on one device: {steps}" + (f"; errors: {doc['errors']}" if doc["errors"] else "")
        )
    if "params_per_s" in doc:  # the adam stage
        return "\n".join(
            f"{t} threads: " + ", ".join(f"{k} {v / 1e6:.0f} M parameters/s" for k, v in r.items())
            for t, r in doc["params_per_s"].items()
        )
    from bench.offload_report import markdown

    s = doc["summary"]
    rates = (
        "the profile.json of this machine"
        if doc.get("simulator") == "profile"
        else "the scenario estimates (no profile)"
    )
    lines = [
        f"{doc['scenario']}: {doc['description']}; GPU cap {doc['cap_gib']:g} GiB; {doc['ops']} ops, "
        f"{doc['parameters'] / 1e6:,.1f} M parameters, {doc['forward_flops'] / 1e9:,.1f} GFLOP forward; simulated with "
        f"{rates}",
        "",
        markdown(doc["rows"]),
        "",
    ]
    for key in ("accelerate_over_placer", "fsdp2_over_placer", "fine_tuned_over_simulator_plan", "noise"):
        value = s.get(key)
        lines.append(f"{key}: {'-' if value is None else f'{value:.3f}'}")
    adam = doc.get("host_adam")
    if adam:
        rate = adam["params_per_s"]["foreach"]
        lines.append(
            f"host Adam: {rate / 1e6:.0f} M parameters/s ({adam['threads']} threads): an Adam step over all "
            f"{doc['parameters'] / 1e6:,.1f} M parameters on the host (FSDP2's) takes >= "
            f"{doc['parameters'] / rate:.3f} s"
        )
    if s.get("over_the_cap"):
        lines.append(f"over the cap: {', '.join(s['over_the_cap'])}")
    c = doc.get("curves")
    if c:
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        lines.append(
            f"fine-tuning: {c['n']} placements measured; Spearman(real, simulated) {fmt(c['spearman'])}; "
            f"median real/simulated {fmt(c['median_real_over_sim'])}; the simulator's pick parts from the real "
            f"best at measurement {'-' if c['parted_at'] is None else c['parted_at'] + 1}; the two disagree on "
            f"fitting at measurements {[i + 1 for i in c['fit_disagreements']] or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.stage == "report":
            doc = report(args)
        elif args.stage == "adam":
            doc = host_adam(args)
        else:
            from bench import offload_stages

            opts = options(args)
            run = {
                "plan": offload_stages.run_plan,
                "profile": offload_stages.run_profile,
                "rivals": offload_stages.run_rivals,
                "finetune": offload_stages.run_finetune,
            }
            doc = run[args.stage](opts)
    except PlacerError as e:
        print(f"gpu_offload: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # timeout --signal=INT: every measurement taken is in the log already
        print(f"gpu_offload: interrupted; what was measured is in {args.out_dir}", file=sys.stderr)
        return 130
    print(json.dumps(doc, indent=1, default=float) if args.json else text(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
