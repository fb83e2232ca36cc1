"""``placer train``: learn a placement with the RL placer.

Example:
    placer train nmt-2 --cluster k80x4 --time-budget 300
"""

from __future__ import annotations

import argparse
import sys


# TrainConfig's defaults, repeated here so `placer --help` does not import torch;
# tests/placer/test_train.py checks they agree.
HELP_DEFAULTS = {"lr": 5e-4, "entropy_coef": 0.001, "hidden": 64, "samples": 8, "seed": 0, "policy": "seq2seq",
                 "algo": "reinforce", "env": "sim"}

# The TrainConfig fields a --resume takes from the checkpoint, with the option that sets each. These options
# default to None on the command line, so that an option the user gave can be told from a default.
RESUMED_OPTIONS = {"env": "--env", "policy": "--policy", "algo": "--algo", "samples": "--samples", "seed": "--seed",
                   "max_groups": "--max-groups", "lr": "--lr", "entropy_coef": "--entropy", "hidden": "--hidden",
                   "warm_start": "--warm-start", "profile": "--profile"}


def add_commands(sub: argparse._SubParsersAction) -> None:
    from envs.cluster import CLUSTER_ARG_HELP
    from placer.cli import add_profile_argument
    from envs.simulator import EXECUTOR_ARG_HELP, EXECUTORS

    p = sub.add_parser(
        "train",
        help="learn a placement with the RL placer (seq2seq or hierarchical policy)",
        description="Train a placement policy on SOURCE's graph. Writes TensorBoard logs, a resumable "
        "checkpoint and best_placement.json under --logdir.",
    )
    p.add_argument("source", metavar="SOURCE", help="graph file (.json/.pt2), zoo name or module:callable")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    add_profile_argument(p)
    p.add_argument("--env", default=None, help="scorer: sim (simulator, default) or measured (real training steps "
                   "in Ray actors; needs a zoo name or module:callable)")
    p.add_argument("--executor", metavar="{" + ",".join(EXECUTORS) + "}", default="eager", help="--env sim and the heuristics: " + EXECUTOR_ARG_HELP)
    p.add_argument("--device-map", metavar="MAP", default=None,
                   help="--env measured / --profile: logical -> torch devices, e.g. gpu:0=cuda:1,*=cpu")
    p.add_argument("--workers", type=int, default=None, help="--env measured: Ray workers (default one per machine)")
    p.add_argument("--ray-address", default=None, help="--env measured: join this Ray cluster (default: start a local one)")
    p.add_argument("--measure-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="--env measured: seconds one placement's measurement may take (default 600)")
    p.add_argument("--policy", default=None, help="seq2seq (default; the ICML 2017 policy) or hierarchical (ICLR 2018 grouper-placer)")
    p.add_argument("--algo", default=None, help="reinforce (default) or ppo")
    p.add_argument("--samples", type=int, default=None, help=f"K: placements sampled and scored per iteration (default {HELP_DEFAULTS['samples']})")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--iterations", type=int, default=None, help="stop after N iterations")
    stop.add_argument("--time-budget", type=float, default=None, help="stop after SECONDS (default 300 if neither is given)")
    p.add_argument("--seed", type=int, default=None, help=f"random seed (default {HELP_DEFAULTS['seed']})")
    p.add_argument("--logdir", default=None, help="run directory (default runs/<graph>-<cluster>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from --logdir's checkpoint (its model and "
                   "training options win over those given now, which are reported on stderr)")
    p.add_argument("--max-groups", type=int, default=None, help="items to place (default min(256, 20 x devices))")
    p.add_argument("--lr", type=float, default=None, help=f"Adam learning rate (default {HELP_DEFAULTS['lr']:g}; from scratch try 0.01)")
    p.add_argument("--entropy", type=float, default=None, help=f"entropy bonus weight (default {HELP_DEFAULTS['entropy_coef']:g})")
    p.add_argument("--hidden", type=int, default=None, help=f"LSTM units per direction (default {HELP_DEFAULTS['hidden']}; paper 256)")
    p.add_argument("--warm-start", default=None, help="best (default: first imitate the best heuristic's placement, then RL) or none (pure RL from scratch)")
    p.add_argument("--device", default="cpu", help="torch device for the policy: cpu (default), cuda, cuda:N or auto")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    import envs
    from placer.checks import check_output_dir
    from placer.cli import print_json
    from placer.sources import resolve_graph
    from placer.train import TrainConfig, train

    given = {"env": args.env, "policy": args.policy, "algo": args.algo, "samples": args.samples, "seed": args.seed,
             "max_groups": args.max_groups, "lr": args.lr, "entropy_coef": args.entropy, "hidden": args.hidden,
             "warm_start": args.warm_start, "profile": args.profile}
    given = {k: v for k, v in given.items() if v is not None}
    config = TrainConfig(
        source=args.source, cluster=args.cluster, executor=args.executor, iterations=args.iterations,
        time_budget_s=args.time_budget if args.time_budget is not None or args.iterations is not None else 300.0,
        logdir=args.logdir, resume=args.resume, device=args.device,
        device_map=args.device_map, workers=args.workers, ray_address=args.ray_address,
        measure_timeout_s=args.measure_timeout,
        progress=not args.no_progress and not args.json and sys.stderr.isatty(), **given,
    )
    config.validate()  # before the (possibly slow) capture of SOURCE; checks --logdir too
    if args.logdir is None:
        check_output_dir("runs", "--logdir (default runs/...)")
    if args.resume:
        config = _resumed_config(config, given)
    cluster = envs.resolve_cluster(config.cluster)
    graph = resolve_graph(config.source)
    if config.profile:
        from envs.profiler import with_profile

        graph, cluster = with_profile(graph, cluster, config.profile, device_map=config.device_map)
    result = train(config, graph=graph, cluster=cluster)
    doc = result.to_dict()
    doc["executor"] = config.executor
    if args.json:
        print_json(doc)
    else:
        print(_summary(doc))
    return 130 if result.interrupted else 0


def _resumed_config(config, given: dict | None = None):
    """On --resume, the stopping rule, SOURCE, cluster and run-time options given now win; the model and
    training settings come from the checkpoint's config. Each option in ``given`` (what the command line
    set) that the checkpoint overrides is reported in one line on stderr."""
    import dataclasses

    from graphs import PlacerError
    from placer import checkpoint

    _, saved = checkpoint.load(config.logdir)
    if not isinstance(saved.get("config"), dict):
        raise PlacerError(f"--resume: {config.logdir}/{checkpoint.CHECKPOINT_PT} is not a placer training checkpoint")
    fields = {f.name for f in dataclasses.fields(config)}
    old = {k: v for k, v in saved["config"].items() if k in fields}
    if isinstance(old.get("heuristics"), list):
        old["heuristics"] = tuple(old["heuristics"])
    keep = ("iterations", "time_budget_s", "resume", "logdir", "progress", "device", "device_map", "workers",
            "ray_address", "source", "cluster", "measure_timeout_s")
    ignored = [f"{RESUMED_OPTIONS[k]} {v} (checkpoint: {old[k]})" for k, v in (given or {}).items()
               if k in RESUMED_OPTIONS and k in old and old[k] != v]
    if ignored:
        print(f"placer: note: --resume uses the checkpoint's settings; ignored: {', '.join(ignored)}", file=sys.stderr)
    resumed = dataclasses.replace(config, **{k: v for k, v in old.items() if k not in keep})
    resumed.validate()
    return resumed


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f} ms"


def _summary(doc: dict) -> str:
    found = f"found at {doc['time_to_best_s']:.0f} s" if doc["time_to_best_s"] is not None else "no placement ran"
    lines = [
        f"best step time   {_ms(doc['best_step_time_s'])}  (after {doc['iterations']} iterations, "
        f"{doc['elapsed_s']:.0f} s; {found})",
    ]
    if doc["best_heuristic"]:
        bh, learned = doc["best_heuristic_step_time_s"], doc["best_step_time_s"]
        gain = f"  ({(1 - learned / bh) * 100:+.1f}% vs it)" if bh and learned else ""
        lines.append(f"best heuristic   {_ms(bh)}  ({doc['best_heuristic']}){gain}")
    if doc["expert_step_time_s"] is not None:
        lines.append(f"expert           {_ms(doc['expert_step_time_s'])}")
    if doc["lower_bound_s"] is not None:
        lines.append(f"lower bound      {_ms(doc['lower_bound_s'])}")
    if doc.get("issue_order_step_time_s") is not None and doc["issue_order"] != "node":
        lines.append(f"issue order      {_ms(doc['issue_order_step_time_s'])}  ({doc['issue_order']} order, in the placement file)")
    if doc["best_placement"]:
        lines.append(f"placement        {doc['best_placement']}")
    lines.append(f"logs             {doc['logdir']}  (tensorboard --logdir {doc['logdir']})")
    return "\n".join(lines)
