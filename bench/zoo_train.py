"""Benchmark ``placer train`` on the zoo: learned vs best heuristic vs expert vs lower bound.

Runs training on each zoo graph (or those named) on a cluster (default k80x4)
with a time budget, one after another, and prints one row per graph: the learned
step time, the best heuristic of ``placer compare`` (and which), the expert
placement, the lower bound, the time to first match the best heuristic and to the
best, and the setup time (capture + heuristics, not in the budget).

The fair comparison for a warm-started learner is local search from the same start with
the same budget: the "annealing from best" column is
``placer.methods.get("annealing")(g, c, steps=10**9, time_budget_s=B, t0=0.002,
init=(best,))`` scored in the same issue order as the learner (``--score-order``).
``--scratch`` adds a ``--warm-start none`` row per graph; ``--seeds 0,1,2`` runs
each row per seed and reports the median.

Usage:
    OMP_NUM_THREADS=1 python -m bench.zoo_train --time-budget 300 nmt-2 rnnlm
    OMP_NUM_THREADS=1 python -m bench.zoo_train --time-budget 300 --seeds 0,1,2 --scratch --json nmt-2
    python -m bench.zoo_train --json > bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import envs
from bench.common import OneLineParser
from graphs import zoo
from placer.learn.config import TrainConfig
from placer.learn.loop import train
from placer.methods import get


def run_one(name: str, args: argparse.Namespace, seed: int, warm_start: str) -> dict:
    t0 = time.perf_counter()
    graph = zoo.graph(name)
    cluster = envs.resolve_cluster(args.cluster)
    config = TrainConfig(
        source=name,
        cluster=args.cluster,
        policy=args.policy,
        algo=args.algo,
        samples=args.samples,
        time_budget_s=args.time_budget,
        seed=seed,
        warm_start=warm_start,
        progress=False,
        score_order=args.score_order,
        **({"lr": args.scratch_lr} if warm_start == "none" else {}),
        logdir=os.path.join(
            args.logdir, f"{name}-{args.cluster}-{args.policy}-{warm_start}-{args.score_order}-s{seed}"
        ),
    )
    result = train(config, graph=graph, cluster=cluster)
    doc = result.to_dict()
    doc.update(
        graph=name, num_ops=graph.num_ops, wall_s=time.perf_counter() - t0, seed=seed, warm_start_mode=warm_start
    )
    if args.annealing and doc["best_heuristic"]:
        doc["annealing_from_best_s"] = annealing_from_best(graph, cluster, doc["best_heuristic"], args, seed)
    return doc


def annealing_from_best(graph, cluster, best: str, args: argparse.Namespace, seed: int) -> float:
    """Annealing started from the best heuristic with the learner's budget, scored in the learner's order."""
    env = envs.SimEnv(graph, cluster)
    order = "planned" if args.score_order == "planned" else None
    op_devices = get("annealing")(
        graph,
        cluster,
        seed=seed,
        steps=10**9,
        time_budget_s=args.time_budget,
        t0=0.002,
        init=(best,),
        env=env,
        order=order,
    )
    step_time_s, failed = env.step_times(np.asarray(op_devices, dtype=np.int32)[None], order=order)
    return float("inf") if failed[0] else float(step_time_s[0])


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per (graph, warm start): the median over seeds of the step times (the median seed's row)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["graph"], r["warm_start_mode"]), []).append(r)
    merged = []
    for group in out.values():
        ranked = sorted(
            group, key=lambda r: r["best_step_time_s"] if r["best_step_time_s"] is not None else float("inf")
        )
        row = dict(ranked[(len(ranked) - 1) // 2])
        finite = [r["annealing_from_best_s"] for r in group if r.get("annealing_from_best_s") is not None]
        if finite:
            row["annealing_from_best_s"] = statistics.median(finite)
        row["seeds"] = [r["seed"] for r in group]
        merged.append(row)
    return merged


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.2f}"


def _s(seconds: float | None) -> str:
    return "–" if seconds is None or seconds != seconds else f"{seconds:.0f}"


def table(rows: list[dict]) -> str:
    head = (
        "| graph | start | seeds | ops | items | learned ms | best heuristic ms | annealing from best ms | expert ms | "
        "lower bound ms | learned / annealing | vs best heur. | vs expert | s to match heur. | s to best | "
        "iters | setup s |"
    )
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        learned, bh, ex = r["best_step_time_s"], r["best_heuristic_step_time_s"], r["expert_step_time_s"]
        ann = r.get("annealing_from_best_s")
        gain = lambda ref: f"{(1 - learned / ref) * 100:+.1f}%" if learned and ref else "–"  # noqa: E731
        ratio = f"{learned / ann:.3f}" if learned and ann else "–"
        lines.append(
            f"| {r['graph']} | {r['warm_start_mode']} | {','.join(map(str, r.get('seeds', [r['seed']])))} | "
            f"{r['num_ops']} | "
            f"{r['num_items']} | {_ms(learned)} | {_ms(bh)} ({r['best_heuristic']}) | {_ms(ann)} | "
            f"{_ms(ex)} | {_ms(r['lower_bound_s'])} | {ratio} | {gain(bh)} | {gain(ex)} | "
            f"{_s(r['time_to_beat_heuristic_s'])} | "
            f"{_s(r['time_to_best_s'])} | {r['iterations']} | {_s(r['setup_s'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m bench.zoo_train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("graphs", nargs="*", help=f"zoo graphs (default: all of {', '.join(zoo.names())})")
    p.add_argument("--cluster", default="k80x4")
    p.add_argument("--time-budget", type=float, default=300.0, help="training seconds per graph")
    p.add_argument("--policy", default="seq2seq")
    p.add_argument("--algo", default="reinforce")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seeds", default="0", help="comma-separated seeds; rows report the median (default 0)")
    p.add_argument("--warm-start", default="best")
    p.add_argument("--scratch", action="store_true", help="also a --warm-start none row per graph")
    p.add_argument(
        "--scratch-lr", type=float, default=0.01, help="learning rate of the from-scratch rows (default 0.01)"
    )
    p.add_argument(
        "--score-order",
        choices=("node", "planned"),
        default="node",
        help="issue order samples (and annealing's proposals) are scored in (default node)",
    )
    p.add_argument(
        "--no-annealing",
        dest="annealing",
        action="store_false",
        help="skip the annealing-from-best column (it takes another time budget per row)",
    )
    p.add_argument("--logdir", default="runs/bench")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    names = args.graphs or zoo.names()
    unknown = [n for n in names if n not in zoo.names()]
    if unknown:
        print(f"zoo_train: unknown zoo graph {unknown[0]!r} (known: {', '.join(zoo.names())})", file=sys.stderr)
        return 2
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        print(f"zoo_train: --seeds {args.seeds!r}: give non-negative integers, e.g. 0,1,2", file=sys.stderr)
        return 2
    starts = [args.warm_start] + (["none"] if args.scratch and args.warm_start != "none" else [])
    rows = []
    for name in names:
        for start in starts:
            for seed in seeds:
                rows.append(run_one(name, args, seed, start))
                if not args.json:
                    print(
                        f"{name} ({start}, seed {seed}): learned {_ms(rows[-1]['best_step_time_s'])} ms, best "
                        "heuristic "
                        f"{_ms(rows[-1]['best_heuristic_step_time_s'])} ms, annealing from best "
                        f"{_ms(rows[-1].get('annealing_from_best_s'))} ms",
                        file=sys.stderr,
                        flush=True,
                    )
    print(json.dumps({"runs": rows, "median": median_rows(rows)}, indent=1) if args.json else table(median_rows(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
