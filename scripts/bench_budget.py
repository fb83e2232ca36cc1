#!/usr/bin/env python
"""Every method at equal budgets: the learner, its ablation and the rivals, every simulated placement counted.

    python scripts/bench_budget.py                                   # nmt-2 on k80x4, 1k/10k/100k placements, 60/300 s
    python scripts/bench_budget.py --graphs nmt-2,inception-v3,moe-400 --clusters k80x4,v100x4 --seeds 0,1,2
    python scripts/bench_budget.py --evals 1000 --seconds "" --methods learned,uniform,module_search --json
    python scripts/bench_budget.py --plot docs/budget.png

Methods (bench/budget.py): learned (the move search with its critic, after module_search's share of
the budget when that is 1,000 placements or more), uniform (the same loop, uniform proposals),
module_search(n), annealing from the best rule heuristic with the same n, ilp with the same seconds;
on request, learned_accept and uniform_accept (the same two loops taking slower moves as annealing
does). Graphs: zoo names, graph files, module:callable, or synthetic families as
family-ops[-seed] (moe-400, unet-400-1). Medians over the seeds. Progress on stderr; a markdown table (or --json) on
stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root, for bench/

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _numbers(arg: str, option: str, cast) -> list:
    from graphs import PlacerError

    if not arg.strip():
        return []
    try:
        values = [cast(v) for v in arg.split(",")]
    except ValueError:
        raise PlacerError(f"{option} {arg!r}: give comma-separated numbers") from None
    if any(v <= 0 for v in values):
        raise PlacerError(f"{option} {arg!r}: every budget must be positive")
    return values


def main(argv: list[str] | None = None) -> int:
    from bench import budget as bb
    from bench.common import machine_line, parse_list
    from graphs import PlacerError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="nmt-2", help="comma list (default nmt-2)")
    ap.add_argument("--clusters", default="k80x4", help="comma list of presets or files (default k80x4)")
    ap.add_argument("--evals", default="1000,10000,100000", help="budgets in simulated placements ('' for none)")
    ap.add_argument("--seconds", default="60,300", help="budgets in seconds ('' for none)")
    ap.add_argument(
        "--methods",
        default=",".join(bb.METHODS),
        help=f"default: {','.join(bb.METHODS)}; also learned_accept and uniform_accept (the move search "
        f"taking slower moves at temperature {bb.ACCEPT}, with and without its critic)",
    )
    ap.add_argument("--seeds", default="0", help="comma list of seeds (medians are reported)")
    ap.add_argument(
        "--score-order",
        choices=("node", "planned"),
        default="node",
        help="issue order every placement is scored in (default node)",
    )
    ap.add_argument("--ilp-workers", type=int, default=1, help="CP-SAT workers (default 1: the others use one core)")
    ap.add_argument("--plot", default=None, metavar="FILE.png", help="draw quality against budget (the plot extra)")
    ap.add_argument("--json", action="store_true", help="print every run as JSON instead of the table")
    args = ap.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        budgets = [bb.Budget("evals", v) for v in _numbers(args.evals, "--evals", int)]
        budgets += [bb.Budget("seconds", v) for v in _numbers(args.seconds, "--seconds", float)]
        if not budgets:
            raise PlacerError("--evals and --seconds: give at least one budget")
        methods = parse_list(args.methods, what="methods", known=list(bb.RUNNERS))
        seeds = [int(s) for s in parse_list(args.seeds, what="seeds") if s.isdigit()] or [0]
        if args.ilp_workers < 1:
            raise PlacerError(f"--ilp-workers {args.ilp_workers}: must be at least 1")
        graphs, clusters = bb.graphs_and_clusters(args.graphs, args.clusters)
        cells = []
        for graph in graphs:
            for cluster in clusters:
                say(f"{graph.name} ({graph.num_ops:,} ops) on {cluster.name}")
                cells.append(
                    bb.budget_cell(
                        graph,
                        cluster,
                        budgets,
                        methods=methods,
                        seeds=seeds,
                        order=None if args.score_order == "node" else "planned",
                        ilp_workers=args.ilp_workers,
                        progress=say,
                    )
                )
        if args.plot:
            from bench.plots import plot_budget_curves

            plot_budget_curves(cells, args.plot)
            say(f"{args.plot}: {os.path.getsize(args.plot) / 1024:.0f} KiB")
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"machine": machine_line(), "cells": cells}, indent=1))
    else:
        print(bb.markdown_table(cells))
        print(
            f"\nMedians over seeds {','.join(map(str, seeds))}; simulated step times in ms of each method's best "
            f"placement in its best issue order (searched in {args.score_order} order). Machine: {machine_line()}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
