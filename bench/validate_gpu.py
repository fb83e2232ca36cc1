"""Does the calibrated simulator rank, predict and size real steps on one GPU and its host, on models it was not tuned
on?

For each model, on the cluster ``h200x1`` (``cpu:0`` + ``gpu:0``, run as ``cpu`` +
``cuda:0``): profile it once on both torch devices (``envs.real.profiler``: kernels,
host issue, the host's staging copy and contention, the issue times fitted so that
the all-on-GPU step simulates as measured), then measure ``--placements`` distinct
placements for real, as ``placer.apply`` runs them: a learned one (a short
``placer.train`` on the calibrated simulator), every heuristic's with the issue
order the planner gives it (``--heuristics``: only those named), both single devices,
random ones.

The measurement repeats (``envs.real.timing``: ``Protocol``, ``measure_interleaved``):
every placed module is built once, the host's threads and cores are fixed, the
garbage collector runs between rounds only, each module warms up, then ``--rounds``
rounds give every module ``--steps`` steps in turn, each round in the other order,
CUDA synchronised around each step; the median is the figure. Beside them, in the
same rounds: a second build of ``--repeat-placements`` placements (the
*repeatability*: the same placement measured twice in one run) and every placement
with a planned issue order run in node order too (the *order check*).

Reported per model and per group, the **held-out** models (``--held-out``, default
``gpt2,nmt-4,llama,bert``: two zoo models and two Hugging Face architectures of the
conformance corpus, built from configs) apart from the **tuned** ones (``--models``,
default ``rnnlm,nmt-2,resnet50``, which the simulator's rules were tuned on):
Spearman's rank correlation, MAPE and the real step of the simulator's best over
the best real one (eager executor; dataflow beside it); repeatability; the
simulated peak memory per GPU against ``torch.cuda.max_memory_allocated``; each
planned order against node order, and the order-trust margin the tuned models'
checks give (``envs.sim.order_trust``), applied to the held-out models' orders.
Targets (held out): Spearman >= 0.95, MAPE <= 10%, best ratio <= 1.03, repeat <= 3%,
memory within 10%, no kept order slower than node order beyond 2%. The
learned placement's ``placer.apply`` is checked against float64 too.

The GPU command (one GPU, 16 host cores; the lent machines have no Ray and bring
back only files under ``$OUT``)::

    DEADLINE=450 bash scripts/gpu_validate.sh

runs ``python3 -m bench.validate_gpu --out-dir $OUT/calibration`` with the
defaults. Copy ``$OUT/calibration/*`` into ``docs/calibration/``. Each model's
profile, learned placement and measured blocks stay under ``--work-dir`` (default
``runs/validate_gpu``), so a run cut short resumes where it stopped while the
machine is warm; ``summary.json`` keeps the models a call did not run.

Without a GPU, ``--tiny`` runs the same pipeline with every logical device on the
CPU (small models, few placements: a smoke test whose figures mean nothing, as every
placement is a single-device run)::

    python -m bench.validate_gpu --tiny --out-dir /tmp/validate

``--rescore DIR`` scores a folder's measurements again with the current simulator
and the folder's profiles (no device). Both a run and a rescore fit the host's
``contention_op`` on the tuned models' measured placements and score every model
with it (:mod:`bench.fidelity.contention`: the profiler's probe overstates it). Output: a markdown report on stdout
(``--json``: JSON), progress on stderr, and under ``--out-dir`` ``<model>.jsonl``,
``<model>.profile.json`` (with the order-trust record), ``order_trust.json`` and
``summary.json`` (``docs/calibration/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

from bench.common import OneLineParser, mode_defaults
from bench.fidelity import contention, runs
from bench.fidelity.apply_check import check_apply
from bench.fidelity.models import HELD_OUT, TUNED, build, model_names
from bench.fidelity.report import finite, header, markdown, merged_summary, model_figures, run_summary, summary_doc
from graphs import PlacerError

log = runs.log
# Per mode, the defaults of the options left unset on the command line.
DEFAULTS = {
    "gpu": dict(
        models=",".join(TUNED),
        held_out=",".join(HELD_OUT),
        size="medium",
        device_map="gpu:0=cuda:0,cpu:0=cpu",
        placements=12,
        train_budget=6.0,
        warmup=2,
        warmup_s=1.0,
        rounds=4,
        steps=2,
        repeat_placements=3,
        repeats=3,
        cpus=os.cpu_count() or 1,
    ),
    "tiny": dict(
        models="rnnlm",
        held_out="gpt2",
        size="small",
        device_map="*=cpu",
        placements=5,
        train_budget=3.0,
        warmup=1,
        warmup_s=0.0,
        rounds=2,
        steps=1,
        repeat_placements=2,
        repeats=2,
        cpus=1,
    ),
}


def run_model(name: str, group: str, args: argparse.Namespace) -> tuple[dict, list[dict], dict, Any]:
    """One model end to end: ``(figures, rows, profile, captured graph)``."""
    import envs
    from graphs.plan import Placement
    from graphs.torch_capture import capture

    times: dict[str, float] = {}
    work = os.path.join(args.work_dir, name)
    os.makedirs(work, exist_ok=True)
    model, inputs = build(name, args.size)
    graph = capture(model, inputs, name=name)
    log(f"[{name}] {group}, {args.size}: {graph.num_ops} ops; profiling on {', '.join(args.torch_devices)}")
    t0 = time.time()
    prof = runs.profiled(name, args, model, inputs, graph, work)
    times["profile_s"] = time.time() - t0
    graph_p, logical, phys, to_phys = runs.calibrated(graph, prof, envs.resolve_cluster(args.cluster), args.device_map)
    t0 = time.time()
    cands = runs.candidates(name, args, graph_p, logical, model, work)
    times["place_s"] = time.time() - t0
    t0 = time.time()
    measured = runs.measure(name, args, graph, logical, cands, work)
    times["measure_s"] = time.time() - t0
    rows = runs.rows(
        name, group, args, logical, cands, measured, runs.simulated(graph_p, phys, to_phys, logical, cands)
    )
    figures = model_figures(name, group, rows)
    t0 = time.time()
    learned = next((c for c in cands if c["kind"] == "learned"), None)
    apply_check = None
    if learned is not None:
        lp = Placement.from_indices(
            graph, logical.device_names, learned["op_devices"], method="learned", order=learned["order"]
        )
        try:
            apply_check = check_apply(name, args, lp, graph)
        except Exception as e:  # noqa: BLE001  (reported as a failed check, the figures stand)
            apply_check = {
                "ok": False,
                "placement": "learned",
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
            }
    times["checks_s"] = time.time() - t0
    figures.update(
        ops=graph.num_ops,
        graph_hash=graph.content_hash,
        size=args.size,
        times_s=times,
        checks={"apply": apply_check},
        kinds={k: sum(c["kind"] == k for c in cands) for k in ("learned", "baseline", "single", "random")},
        profile_fit={
            dev: {k: e.get(k) for k in ("issue_scale", "issue_fit", "staging", "contention") if k in e}
            for dev, e in prof["devices"].items()
        },
    )
    return figures, rows, prof, graph


def rescore_model(name: str, group: str, args: argparse.Namespace) -> dict:
    """An earlier run's measurements scored again with the current simulator and the folder's profile; no device."""
    import envs
    from envs.real.profiler import load_profile
    from graphs.torch_capture import capture

    folder = args.rescore
    rows_path = os.path.join(folder, f"{name}.jsonl")
    prof_path = os.path.join(args.profile_dir or folder, f"{name}.profile.json")
    for path in (rows_path, prof_path):
        if not os.path.exists(path):
            raise PlacerError(f"{path}: not found")
    with open(rows_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    prof = load_profile(prof_path)
    model, inputs = build(name, args.size)
    graph = capture(model, inputs, name=name)
    if prof.get("graph_hash") != graph.content_hash:
        raise PlacerError(
            f"{prof_path}: profiled graph {prof.get('graph_hash')}, not {name} ({args.size}) as captured here "
            f"({graph.content_hash})"
        )
    rows = runs.resimulated(graph, prof, rows, envs.resolve_cluster(args.cluster), args.device_map)
    log(f"[{name}] rescored {len(rows)} measured placements with {prof_path}")
    figures = {
        **model_figures(name, group, rows),
        "ops": graph.num_ops,
        "graph_hash": graph.content_hash,
        "size": args.size,
        "checks": {"apply": None},
    }
    return {"name": name, "group": group, "figures": figures, "rows": rows, "prof": prof, "graph": graph}


def device_name(args: argparse.Namespace) -> str:
    import torch

    gpus = ", ".join(torch.cuda.get_device_name(d) for d in args.torch_devices if d.startswith("cuda"))
    host = f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}, {args.cpus} threads"
    return f"{gpus} + {host}" if gpus else f"CPU only: {host}"


# ------------------------------------------------------------------------ CLI
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m bench.validate_gpu", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tiny", action="store_true", help="CPU-only smoke test: every logical device on the CPU, small models"
    )
    p.add_argument("--models", help=f"tuned models, comma-separated (default {DEFAULTS['gpu']['models']}; '' for none)")
    p.add_argument("--held-out", help=f"held-out models (default {DEFAULTS['gpu']['held_out']}; '' for none)")
    p.add_argument("--size", choices=("small", "medium", "full"), help="model sizes (default medium)")
    p.add_argument("--cluster", default="h200x1", help="cluster whose logical devices placements use (default h200x1)")
    p.add_argument(
        "--device-map", help=f"logical -> torch devices (default {DEFAULTS['gpu']['device_map']}; --tiny: *=cpu)"
    )
    p.add_argument("--placements", type=int, help="distinct placements measured per model, at least (default 12)")
    p.add_argument(
        "--heuristics", help="the heuristics whose plans are measured, comma-separated (default every one but ilp)"
    )
    p.add_argument(
        "--train-budget", "--time-budget", dest="train_budget", type=float, help="seconds of placer.train (default 6)"
    )
    p.add_argument("--warmup", type=int, help="warm-up steps per placed module (default 2)")
    p.add_argument("--warmup-s", type=float, help="the warm-up lasts at least this long in all (default 1)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 4)")
    p.add_argument("--steps", type=int, help="timed steps per module per round (default 2)")
    p.add_argument("--repeat-placements", type=int, help="placements built and measured twice (default 3)")
    p.add_argument("--repeats", type=int, help="profiler repeats (default 3)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="apply check: an error against float64 always allowed, beside twice the float32 CPU model's own "
        "(default 1e-3)",
    )
    p.add_argument(
        "--cpus",
        type=int,
        help="host threads for profiling and measuring; the process is pinned to that many cores (default all)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per block of steps (default 120)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rescore",
        metavar="DIR",
        help="no device: score DIR's measurements (<model>.jsonl) again with the current "
        "simulator and a profile (--profile-dir, default DIR/<model>.profile.json)",
    )
    p.add_argument("--profile-dir", help="with --rescore: the folder of the <model>.profile.json to score with")
    p.add_argument("--json", action="store_true", help="print the JSON summary instead of the markdown report")
    p.add_argument(
        "--out-dir",
        default="docs/calibration",
        help="rows, profiles, order_trust.json, summary.json (default docs/calibration)",
    )
    p.add_argument(
        "--work-dir", default="runs/validate_gpu", help="resumable state: profiles, training runs, measured blocks"
    )
    args = p.parse_args(argv)
    args.command = ["python", "-m", "bench.validate_gpu", *(sys.argv[1:] if argv is None else argv)]
    return mode_defaults(args, DEFAULTS)


def check(args: argparse.Namespace) -> None:
    """PlacerError (one line, naming the option) for a bad option, before any work."""
    import envs
    from envs.real.placing import check_available, resolve_devices
    from placer.option_checks import check_float, check_int, check_output_dir, check_seed

    args.tuned = model_names(args.models, args.size, empty_ok=True)
    args.held = model_names(args.held_out, args.size, "--held-out", empty_ok=True)
    if not args.tuned + args.held:
        raise PlacerError("--models, --held-out: no model to run")
    if set(args.tuned) & set(args.held):
        raise PlacerError(
            f"--held-out: {', '.join(sorted(set(args.tuned) & set(args.held)))} is also in --models (the tuned set)"
        )
    check_int(args.placements, "--placements", least=2)
    args.heuristic_names = heuristic_names(args.heuristics)
    check_int(args.warmup, "--warmup", least=0)
    check_int(args.repeat_placements, "--repeat-placements", least=0)
    for opt in ("rounds", "steps", "repeats", "cpus"):
        check_int(getattr(args, opt), f"--{opt.replace('_', '-')}", least=1)
    check_seed(args.seed)
    for opt, value in (
        ("--train-budget", args.train_budget),
        ("--timeout", args.timeout),
        ("--tolerance", args.tolerance),
    ):
        check_float(value, opt, above=0)
    check_float(args.warmup_s, "--warmup-s", least=0)
    torch_of = resolve_devices(envs.resolve_cluster(args.cluster).device_names, args.device_map)
    args.torch_devices = list(dict.fromkeys(str(d) for d in torch_of.values()))
    if args.rescore:  # scores stored measurements: no device, nothing written
        if not os.path.isdir(args.rescore):
            raise PlacerError(f"--rescore {args.rescore}: not a folder")
        return
    check_available(torch_of)
    check_output_dir(args.out_dir, "--out-dir")
    check_output_dir(args.work_dir, "--work-dir")


def heuristic_names(text: str | None) -> list[str]:
    """``--heuristics``' names (a PlacerError naming the unknown ones); every heuristic but ilp without the option
    (a time-limited solve may give another plan on a rerun, so a resumed run could not reuse its measurements)."""
    from placer.compare import default_methods
    from placer.methods import registry

    if text is None:
        return default_methods(exclude=("ilp",))
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        raise PlacerError(f"--heuristics: unknown {', '.join(unknown)} (known: {', '.join(registry.names())})")
    if not names:
        raise PlacerError("--heuristics: no heuristic named")
    return names


def group_of(name: str, args: argparse.Namespace) -> str:
    return "tuned" if name in args.tuned else "held-out"


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        check(args)
        return run(args)
    except PlacerError as e:  # bad options or a failed run: one line, exit status 2
        print(f"validate_gpu: {e}", file=sys.stderr)
        return 2


def rescore(args: argparse.Namespace, names: list[str]) -> int:
    """``--rescore``: the folder's measurements scored again here, with its profiles; nothing written."""
    import envs
    from envs.sim.simulator import MODEL_VERSION

    names = [n for n in names if os.path.exists(os.path.join(args.rescore, f"{n}.jsonl"))]
    items = [rescore_model(n, group_of(n, args), args) for n in names]
    fitted = contention.refit(items, envs.resolve_cluster(args.cluster), args.device_map)
    models = [i["figures"] for i in items]
    device = f"measurements of {args.rescore}, rescored here"
    summary = {**run_summary(models, MODEL_VERSION), "contention": fitted}
    print(
        json.dumps(summary_doc(models, summary, args, device), indent=1)
        if args.json
        else markdown(models, summary, header(args, device))
    )
    return 0


def run_models(args: argparse.Namespace, names: list[str], device: str, path: str) -> tuple[list[dict], list[str]]:
    """Each model end to end, its rows, profile and ``summary.json`` entry written as it finishes: ``(items,
    failures)``. A model that fails is a failure, the others still run; the deadline stops the run."""
    from envs.real.profiler import save_profile
    from placer.learn.checkpoint import write_json

    items, failures = [], []
    for name in names:
        t0 = time.time()
        try:
            figures, rows, prof, graph = run_model(name, group_of(name, args), args)
        except KeyboardInterrupt:  # the deadline (gpu_validate.sh): keep what is done, write the run's figures
            log(
                f"[{name}] stopped at the deadline after {time.time() - t0:.0f}s; reporting the {len(items)} "
                "model(s) done"
            )
            failures.append(f"{name}: stopped at the deadline")
            break
        except Exception as e:  # noqa: BLE001  (a model that fails on the device is a result; the others still run)
            log(f"[{name}] failed: {type(e).__name__}: {e}")
            failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            continue
        runs.write_rows(os.path.join(args.out_dir, f"{name}.jsonl"), rows)
        save_profile(prof, os.path.join(args.out_dir, f"{name}.profile.json"))
        group = group_of(name, args)
        items.append({"name": name, "group": group, "figures": figures, "rows": rows, "prof": prof, "graph": graph})
        write_json(path, merged_summary(path, [figures], args, device))  # after each model: a run cut short keeps it
        log(f"[{name}] done in {time.time() - t0:.0f}s")
    return items, failures


def run(args: argparse.Namespace) -> int:
    """Every model (held out first: the figures that count), the contention fitted, the summary and report."""
    import envs
    from envs.real.profiler import save_profile
    from envs.sim.simulator import MODEL_VERSION
    from placer.learn.checkpoint import write_json

    names = args.held + args.tuned
    if args.rescore:
        return rescore(args, names)
    os.makedirs(args.out_dir, exist_ok=True)
    device = device_name(args)
    log(
        f"validate_gpu: {device}; held out {', '.join(args.held) or 'none'}; tuned "
        f"{', '.join(args.tuned) or 'none'} ({args.size})"
    )
    path = os.path.join(args.out_dir, "summary.json")
    items, failures = run_models(args, names, device, path)
    if not items:
        raise PlacerError(f"no model finished: {'; '.join(failures)}")
    # the probe's contention, or the tuned models' fit: every model scored with it
    fitted = contention.refit(items, envs.resolve_cluster(args.cluster), args.device_map)
    models = [i["figures"] for i in items]
    summary = {**run_summary(models, MODEL_VERSION), "failures": failures, "contention": fitted}
    kept = finite({k: summary[k] for k in ("groups", "orders", "failures", "contention")})
    write_json(path, {**merged_summary(path, models, args, device), **kept})
    record = summary["orders"]["record"]
    write_json(os.path.join(args.out_dir, "order_trust.json"), record)
    for item in items:  # the planner keeps to the tuned models' margin wherever these profiles are used
        runs.write_rows(os.path.join(args.out_dir, f"{item['name']}.jsonl"), item["rows"])
        save_profile(
            {**item["prof"], "order_trust": {k: record[k] for k in ("format", "model_version", "margin")}},
            os.path.join(args.out_dir, f"{item['name']}.profile.json"),
        )
    print(
        json.dumps(summary_doc(models, summary, args, device), indent=1)
        if args.json
        else markdown(models, summary, header(args, device))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
