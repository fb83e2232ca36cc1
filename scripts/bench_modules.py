"""Random draws against search over whole modules, with the same number of simulated placements.

    python scripts/bench_modules.py [--graphs rnnlm,nmt-2,nmt-4,inception-v3,resnet50,gpt2] [--clusters k80x4,k80x2]
                                    [--n 1000] [--seeds 7] [--json]

Per (graph, cluster) and seed 0..N-1: the `random_modules` baseline (the best of n uniform draws of a GPU per
module, at each module depth in turn) and the `module_search` baseline (steepest descent over single-module
moves from the best of a few uniform draws, restarted at each depth in turn, n simulated placements in all).
Prints the median simulated step time (node order, eager executor) of each, their range over the seeds, the
median ratio module_search / random_modules over the seeds, and the seconds per run. Markdown rows, or with
--json one JSON object per row. Graphs that record no module paths print "needs module paths".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    import envs
    from graphs import PlacerError
    from placer.checks import check_int
    from placer.methods import registry
    from placer.methods.registry import HeuristicUnavailable
    from placer.sources import resolve_graph

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
                env = envs.SimEnv(graph, cluster)
                times: dict[str, list[float]] = {"random_modules": [], "module_search": []}
                took: list[float] = []
                try:
                    for seed in range(args.seeds):
                        for method in times:
                            t0 = time.perf_counter()
                            idx = registry.get(method)(graph, cluster, seed=seed, n=args.n, env=env)
                            took.append(time.perf_counter() - t0)
                            t, oom = env.step_times(np.asarray(idx)[None])
                            times[method].append(float("inf") if oom[0] else float(t[0]))
                except HeuristicUnavailable as e:
                    print(
                        json.dumps({"graph": name, "cluster": cname, "status": e.status})
                        if args.json
                        else f"| {name} | {cname} | {e.status} | | | |",
                        flush=True,
                    )
                    continue
                ratios = [b / a for a, b in zip(times["random_modules"], times["module_search"])]
                row = {
                    "graph": name,
                    "cluster": cname,
                    "n": args.n,
                    "seeds": args.seeds,
                    **{f"{m}_step_time_s": statistics.median(v) for m, v in times.items()},
                    **{f"{m}_by_seed": v for m, v in times.items()},
                    "ratio_median": statistics.median(ratios),
                    "seconds_per_run": statistics.median(took),
                }
                if args.json:
                    print(json.dumps(row), flush=True)
                    continue
                cell = lambda v: f"{statistics.median(v) * 1e3:.1f} [{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}]"  # noqa: E731
                print(
                    f"| {name} | {cname} | {cell(times['random_modules'])} | {cell(times['module_search'])} | "
                    f"{row['ratio_median']:.3f} | {row['seconds_per_run']:.2f} |",
                    flush=True,
                )
    except PlacerError as e:
        print(f"bench_modules: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
