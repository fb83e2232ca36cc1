"""``placer pretrain``: train one graph-network policy over a corpus of graphs and clusters.

Example (the shipped policy, see README)::

    placer pretrain --corpus zoo,synthetic,library --clusters k80x4,v100x4,h100x8 --time-budget 600 -o policy.pt
"""

from __future__ import annotations

import argparse
import sys

import envs
from graphs import PlacerError
from placer.cli.output import print_json
from placer.option_checks import check_float, check_int, check_output_file, check_seed, parse_group_counts


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pretrain a graph-network policy on many graphs (for --method learned / train --init)",
        description="Train one gnn policy over a corpus of graphs on several clusters: imitation of the best "
        "heuristic per (graph, cluster), then REINFORCE on the simulator. Writes a tensor-only .pt and a JSON sidecar.",
    )
    p.add_argument(
        "--corpus",
        default="zoo,synthetic,library",
        help="a directory of graph files, or a comma list of zoo, synthetic, library and zoo names (default all three)",
    )
    p.add_argument(
        "--clusters",
        default="k80x4,v100x4,h100x8",
        help="comma list of cluster presets or files (default k80x4,v100x4,h100x8)",
    )
    p.add_argument(
        "--exclude",
        default="",
        help="comma list of families (lstm, cnn, transformer, recurrent) or corpus items to hold out",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="training seconds after the corpus is set up (default 600)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--hidden", type=int, default=64, help="embedding width (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="message-passing rounds (default 3)")
    p.add_argument(
        "--decoder",
        choices=("schedule", "independent"),
        default="schedule",
        help="schedule: ops decided one at a time along a list schedule, each seeing where earlier ops went "
        "(default); independent: every op from its own logits in one pass",
    )
    p.add_argument(
        "--dagger",
        type=float,
        default=0.5,
        help="schedule decoder: chance that a pair's imitation step follows the policy's own samples "
        "instead of the label's decisions (corrects exposure bias; default 0.5)",
    )
    p.add_argument(
        "--switch-share",
        type=float,
        default=0.0,
        metavar="S",
        help="schedule decoder: share of the imitation loss on the label's switches, the ops it does not put "
        "where most of their input bytes are (a few percent of the ops, and the placement's structure); "
        "0 weighs every op alike (default 0)",
    )
    p.add_argument("--samples", type=int, default=8, help="K: placements sampled per RL step (default 8)")
    p.add_argument(
        "--imitation-share",
        type=float,
        default=0.6,
        help="share of the budget spent imitating heuristics (default 0.6)",
    )
    p.add_argument(
        "--groups",
        default="0",
        metavar="N[,N...]",
        help="what each policy view places: 0 the ops, N the graph coarsened to N co-location groups, "
        "modules the graph grouped by module at each depth (groups cut where the label changes device); "
        "several make one training pair per (graph, cluster, view) "
        "(default 0; placer place --method learned decodes ops, 128,256,512 groups and modules)",
    )
    p.add_argument(
        "--sizes", default="300,1500,5000", help="op counts of the synthetic graphs (default 300,1500,5000; 100..20000)"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="policy file to write (.pt; the sidecar is FILE with .json)",
    )
    p.add_argument("--json", action="store_true", help="print the per-pair results as JSON")
    p.set_defaults(func=run)


def _list(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, "-o")
    if not args.output.endswith(".pt"):
        raise PlacerError(f"-o {args.output}: a policy file name must end in .pt (the sidecar gets .json)")
    check_seed(args.seed)
    check_float(args.time_budget, "--time-budget", above=0)
    check_int(args.hidden, "--hidden", least=1, most=4096)
    check_int(args.rounds, "--rounds", least=0, most=64)
    check_int(args.samples, "--samples", least=2, most=4096)
    check_float(args.imitation_share, "--imitation-share", least=0, most=1)
    check_float(args.dagger, "--dagger", least=0, most=1)
    check_float(args.switch_share, "--switch-share", least=0, most=0.99)
    try:
        sizes = tuple(int(s) for s in _list(args.sizes))
    except ValueError:
        raise PlacerError(f"--sizes {args.sizes!r}: expected a comma list of op counts") from None
    for s in sizes:
        check_int(s, "--sizes", least=100, most=20000)
    groups = parse_group_counts(args.groups, ops=True, modules=True)
    if not groups:
        raise PlacerError("--groups: give at least one group count (0: the ops)")
    clusters = _list(args.clusters)
    if not clusters:
        raise PlacerError("--clusters: give at least one cluster")
    for c in clusters:
        envs.resolve_cluster(c)  # bad names fail before any work
    # torch: loaded only to pretrain
    from placer.learn.pretrain import PretrainConfig, pretrain, pretrain_algo_options
    from policies import policy_file

    quiet = args.json or not sys.stderr.isatty()
    config = PretrainConfig(
        corpus=args.corpus,
        clusters=clusters,
        exclude=_list(args.exclude),
        time_budget_s=args.time_budget,
        seed=args.seed,
        hidden=args.hidden,
        rounds=args.rounds,
        algo=pretrain_algo_options(samples=args.samples),
        decoder=args.decoder,
        dagger=args.dagger,
        switch_share=args.switch_share,
        groups=groups,
        imitation_share=args.imitation_share,
        synthetic_sizes=sizes or (300,),
        progress=None if quiet else (lambda s: print(s, file=sys.stderr)),
    )
    result = pretrain(config)
    policy_file.save(args.output, result.net, result.sidecar)
    if args.json:
        print_json(
            {
                "policy": args.output,
                "sidecar": policy_file.sidecar_path(args.output),
                "pairs": result.pairs,
                "training": result.sidecar["training"],
            }
        )
        return 0
    for r in result.pairs:
        g = r["greedy_step_time_s"]
        ratio = f"{g / r['label_step_time_s']:.3f}x" if g else "fails"
        print(f"{r['graph']:<24} {r['cluster']:<8} greedy {ratio} of {r['label']}")
    print(
        f"{args.output}: gnn policy ({sum(v.numel() for v in result.net.state_dict().values())} weights), "
        f"sidecar {policy_file.sidecar_path(args.output)}"
    )
    return 0
