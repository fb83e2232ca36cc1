"""Run ``placer compare`` on every zoo graph on k80x4 and v100x4; print markdown tables.

Usage: python scripts/bench_compare.py [--clusters k80x4,v100x4] [--graphs rnnlm,...] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    # Pay the imports of torch and accelerate up front, so that the place-time
    # column measures the algorithms (the CLI counts them in the first row using them).
    import importlib.util

    import torch  # noqa: F401

    if importlib.util.find_spec("accelerate"):
        import accelerate  # noqa: F401

    import envs
    from graphs import zoo
    from placer.compare import compare

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="k80x4,v100x4")
    ap.add_argument("--graphs", default=",".join(zoo.names()))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for cname in args.clusters.split(","):
        cluster = envs.Cluster.preset(cname)
        for gname in args.graphs.split(","):
            graph = zoo.graph(gname)
            t0 = time.perf_counter()
            report = compare(graph, cluster, seed=args.seed)
            wall_s = time.perf_counter() - t0
            best = report.best()
            below = [r.method for r in report.rows if r.kind != "bound" and r.status == "ok" and r.step_time_s < report.lower_bound_s * (1 - 1e-9)]
            print(f"\n### {gname} ({graph.num_ops} ops) on {cname}\n")
            print(report.table())
            single = f"{report.best_single_device} {report.best_single_s * 1e3:.3f} ms" if report.best_single_s else "none fits"
            print(f"\nbest single device: {single}; best heuristic: {best.method if best else '—'}; "
                  f"compare took {wall_s:.1f} s (seed {args.seed}){'; BELOW BOUND: ' + ', '.join(below) if below else ''}", flush=True)


if __name__ == "__main__":
    main()
