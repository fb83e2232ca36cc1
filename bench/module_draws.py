"""Random draws against search over whole modules, with the same number of simulated placements.

    python -m bench.module_draws [--graphs rnnlm,nmt-2,nmt-4,inception-v3,resnet50,gpt2] [--clusters k80x4,k80x2]
                                 [--n 1000] [--seeds 7] [--json]

Per (graph, cluster) and seed 0..N-1: the `random_modules` heuristic (the best of n uniform draws of a GPU per
module, at each module depth in turn) and the `module_search` heuristic (steepest descent over single-module
moves from the best of a few uniform draws, restarted at each depth in turn, n simulated placements in all).
Prints the median simulated step time (node order, eager executor) of each, their range over the seeds, the
median ratio module_search / random_modules over the seeds, and the seconds per run. Markdown rows, or with
--json one JSON object per row. Graphs that record no module paths print "needs module paths".
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import json
import statistics
import sys
import time
from typing import Any

import numpy as np

import envs
from bench.common import OneLineParser
from graphs import PlacerError
from graphs.sources import resolve_graph
from placer.methods import registry
from placer.methods.registry import HeuristicUnavailable
from placer.option_checks import check_int

METHODS = ("random_modules", "module_search")


def draws_and_search(graph: Any, cluster: Any, n: int, seeds: int) -> tuple[dict[str, list[float]], list[float]]:
    """Each method's simulated step time per seed (inf where it fails) and the seconds of every run.

    Raises HeuristicUnavailable where the graph records no module paths."""
    env = envs.SimEnv(graph, cluster)
    step_times: dict[str, list[float]] = {m: [] for m in METHODS}
    took: list[float] = []
    for seed in range(seeds):
        for method in METHODS:
            t0 = time.perf_counter()
            op_devices = registry.get(method)(graph, cluster, seed=seed, n=n, env=env)
            took.append(time.perf_counter() - t0)
            step_time_s, failed = env.step_times(np.asarray(op_devices)[None])
            step_times[method].append(float("inf") if failed[0] else float(step_time_s[0]))
    return step_times, took


def row_of(name: str, cname: str, n: int, seeds: int, step_times: dict[str, list[float]], took: list[float]) -> dict:
    """The JSON row of one (graph, cluster): medians, every seed's figure, the median ratio, seconds per run."""
    ratios = [b / a for a, b in zip(step_times["random_modules"], step_times["module_search"])]
    return {
        "graph": name,
        "cluster": cname,
        "n": n,
        "seeds": seeds,
        **{f"{m}_step_time_s": statistics.median(v) for m, v in step_times.items()},
        **{f"{m}_by_seed": v for m, v in step_times.items()},
        "ratio_median": statistics.median(ratios),
        "seconds_per_run": statistics.median(took),
    }


def markdown_row(row: dict) -> str:
    def cell(v: list[float]) -> str:
        return f"{statistics.median(v) * 1e3:.1f} [{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}]"

    return (
        f"| {row['graph']} | {row['cluster']} | {cell(row['random_modules_by_seed'])} | "
        f"{cell(row['module_search_by_seed'])} | {row['ratio_median']:.3f} | {row['seconds_per_run']:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.module_draws", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--graphs",
        default="rnnlm,nmt-2,nmt-4,inception-v3,resnet50,gpt2",
        help="comma list of zoo names, graph files or module:callable sources",
    )
    ap.add_argument("--clusters", default="k80x4,k80x2", help="comma list of cluster presets or files")
    ap.add_argument("--n", type=int, default=1000, help="simulated placements per run, both methods (default 1000)")
    ap.add_argument("--seeds", type=int, default=7, help="seeds 0..N-1 per method (default 7)")
    ap.add_argument("--json", action="store_true", help="one JSON object per (graph, cluster)")
    args = ap.parse_args(argv)
    try:
        check_int(args.n, "--n", least=1, most=10**6)
        check_int(args.seeds, "--seeds", least=1, most=100)
        if not args.json:
            print(
                "| graph | cluster | random_modules ms [range] | module_search ms [range] | ratio (median) | s "
                "per run |"
            )
            print("|---|---|---:|---:|---:|---:|")
        for name in args.graphs.split(","):
            graph = resolve_graph(name)
            for cname in args.clusters.split(","):
                cluster = envs.resolve_cluster(cname)
                try:
                    step_times, took = draws_and_search(graph, cluster, args.n, args.seeds)
                except HeuristicUnavailable as e:
                    status = {"graph": name, "cluster": cname, "status": e.status}
                    print(json.dumps(status) if args.json else f"| {name} | {cname} | {e.status} | | | |", flush=True)
                    continue
                row = row_of(name, cname, args.n, args.seeds, step_times, took)
                print(json.dumps(row) if args.json else markdown_row(row), flush=True)
    except PlacerError as e:
        print(f"module_draws: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
