"""Benchmark ``placer train`` on the zoo: learned vs best heuristic vs expert vs lower bound.

Runs training on each zoo graph (or those named) on a cluster (default k80x4)
with a time budget, one after another, and prints one row per graph: the learned
step time, the best heuristic of ``placer compare`` (and which), the expert
placement, the lower bound, the time to first match the best heuristic and to the
best, and the setup time (capture + heuristics, not in the budget).

Usage:
    OMP_NUM_THREADS=1 python scripts/bench_train.py --time-budget 300 nmt-2 rnnlm
    python scripts/bench_train.py --json > bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def run_one(name: str, args: argparse.Namespace) -> dict:
    import envs
    from graphs import zoo
    from placer.train import TrainConfig, train

    t0 = time.perf_counter()
    graph = zoo.graph(name)
    cluster = envs.resolve_cluster(args.cluster)
    config = TrainConfig(
        source=name, cluster=args.cluster, policy=args.policy, algo=args.algo, samples=args.samples,
        time_budget_s=args.time_budget, seed=args.seed, warm_start=args.warm_start, progress=False,
        logdir=os.path.join(args.logdir, f"{name}-{args.cluster}-{args.policy}-s{args.seed}"),
    )
    result = train(config, graph=graph, cluster=cluster)
    doc = result.to_dict()
    doc.update(graph=name, num_ops=graph.num_ops, wall_s=time.perf_counter() - t0)
    return doc


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.2f}"


def _s(x: float | None) -> str:
    return "–" if x is None or x != x else f"{x:.0f}"


def table(rows: list[dict]) -> str:
    head = ("| graph | ops | items | learned ms | best heuristic ms | expert ms | lower bound ms | "
            "vs best heur. | vs expert | s to match heur. | s to best | iters | setup s |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        learned, bh, ex = r["best_step_time_s"], r["best_heuristic_step_time_s"], r["expert_step_time_s"]
        gain = lambda ref: f"{(1 - learned / ref) * 100:+.1f}%" if learned and ref else "–"  # noqa: E731
        lines.append(
            f"| {r['graph']} | {r['num_ops']} | {r['num_items']} | {_ms(learned)} | {_ms(bh)} ({r['best_heuristic']}) | "
            f"{_ms(ex)} | {_ms(r['lower_bound_s'])} | {gain(bh)} | {gain(ex)} | {_s(r['time_to_beat_heuristic_s'])} | "
            f"{_s(r['time_to_best_s'])} | {r['iterations']} | {_s(r['setup_s'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from graphs import zoo

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graphs", nargs="*", help=f"zoo graphs (default: all of {', '.join(zoo.names())})")
    p.add_argument("--cluster", default="k80x4")
    p.add_argument("--time-budget", type=float, default=300.0, help="training seconds per graph")
    p.add_argument("--policy", default="seq2seq")
    p.add_argument("--algo", default="reinforce")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start", default="best")
    p.add_argument("--logdir", default="runs/bench")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    names = args.graphs or zoo.names()
    unknown = [n for n in names if n not in zoo.names()]
    if unknown:
        print(f"bench_train: unknown zoo graph {unknown[0]!r} (known: {', '.join(zoo.names())})", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        rows.append(run_one(name, args))
        if not args.json:
            print(f"{name}: learned {_ms(rows[-1]['best_step_time_s'])} ms, best heuristic "
                  f"{_ms(rows[-1]['best_heuristic_step_time_s'])} ms", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
