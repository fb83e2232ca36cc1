#!/usr/bin/env python
"""Time-to-placement: best step time vs wall time and vs evaluated placements, RL vs annealing vs random search.

    python scripts/bench_search.py                                  # nmt-2, inception-v3 on k80x4, 60 s each
    python scripts/bench_search.py --graphs nmt-2 --budget 20 --plot docs/search_curves.png
    python scripts/bench_search.py --json > search.json

Every method starts from scratch (no warm start, no heuristic seed) and is scored
by the same simulator through bench.search.RecordingEnv. Progress goes to
stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root, for bench/

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    from bench import search
    from bench.common import machine_line, parse_list
    from graphs import PlacerError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="nmt-2,inception-v3", help="comma-separated zoo names or graph files")
    parser.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")
    parser.add_argument(
        "--budget", type=float, default=60.0, metavar="S", help="seconds per method and graph (default 60)"
    )
    parser.add_argument("--methods", default=",".join(search.METHODS), help=f"default: {','.join(search.METHODS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the curves into this PNG")
    parser.add_argument("--json", action="store_true", help="print the curves as JSON instead of markdown")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        import envs
        from placer.sources import resolve_graph

        graphs = parse_list(args.graphs, what="graphs")
        methods = parse_list(args.methods, what="methods", known=list(search.RUNNERS))
        cluster = envs.resolve_cluster(args.cluster)
        results = []
        for source in graphs:
            graph = resolve_graph(source)
            graph.name = graph.name or os.path.splitext(os.path.basename(source))[0]
            say(f"{graph.name} ({graph.num_ops:,} ops) on {cluster.name}")
            results.append(
                search.search_curves(
                    graph, cluster, budget_s=args.budget, methods=methods, seed=args.seed, progress=say
                )
            )
        if args.plot:
            from bench.plots import plot_search_curves

            plot_search_curves([c for r in results for c in r["curves"]], args.plot)
            say(f"{args.plot}: {os.path.getsize(args.plot) / 1024:.0f} KiB")
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"machine": machine_line(), "results": results}, indent=2))
    else:
        print(search.markdown_table(results))
        print()
        print(search.reference_lines(results))
        print(
            f"\nBudget {args.budget:g} s per method; every method from scratch; seed {args.seed}. "
            f"Machine: {machine_line()}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
