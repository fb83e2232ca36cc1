"""Run ``placer compare`` on every zoo graph on k80x4 and v100x4; print markdown tables.

Usage: python scripts/bench_compare.py [--clusters k80x4,v100x4] [--graphs rnnlm,...] [--seed 0]
       [--methods all] [--ilp-time-limit 60] [--ilp-workers N]

After each table: the ``ilp`` row's solver status, objective, proven bound (of its
item problem), solve time and item count, and the headroom between the best
placement found and the tightest valid lower bound (the previous bound beside it).
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
    ap.add_argument("--methods", default="all", help="comma-separated baselines (default all, ilp included)")
    ap.add_argument("--ilp-time-limit", type=float, default=60.0, help="ilp solver seconds per graph (default 60)")
    ap.add_argument("--ilp-workers", type=int, default=None, help="ilp solver workers (default: every core)")
    args = ap.parse_args()
    methods = None if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    ilp_options = {"time_limit_s": args.ilp_time_limit}
    if args.ilp_workers is not None:
        ilp_options["num_workers"] = args.ilp_workers
    for cname in args.clusters.split(","):
        cluster = envs.Cluster.preset(cname)
        for gname in args.graphs.split(","):
            graph = zoo.graph(gname)
            t0 = time.perf_counter()
            report = compare(graph, cluster, methods=methods, seed=args.seed, options={"ilp": ilp_options})
            wall_s = time.perf_counter() - t0
            best = report.best()
            below = [
                r.method
                for r in report.rows
                if r.kind != "bound" and r.status == "ok" and r.step_time_s < report.lower_bound_s * (1 - 1e-9)
            ]
            print(f"\n### {gname} ({graph.num_ops} ops) on {cname}\n")
            print(report.table())
            single = (
                f"{report.best_single_device} {report.best_single_s * 1e3:.3f} ms"
                if report.best_single_s
                else "none fits"
            )
            print(
                f"\nbest single device: {single}; best heuristic: {best.method if best else '—'}; "
                f"compare took {wall_s:.1f} s (seed "
                f"{args.seed}){'; BELOW BOUND: ' + ', '.join(below) if below else ''}",
                flush=True,
            )
            ilp = next((r for r in report.rows if r.method == "ilp"), None)
            if ilp is not None and ilp.meta:
                m = ilp.meta
                hint = f"hint {m.get('hint')} {m.get('hint_step_time_s', 0) * 1e3:.3f} ms"
                if m["solver_status"] == "windows":  # large-neighbourhood search from the hint
                    print(
                        f"ilp: {m['windows']} windows of {m['window_ops']} ops, {m['windows_improved']} "
                        f"improved the plan; {hint}"
                    )
                else:
                    bound = f"{m['solver_bound_s'] * 1e3:.3f} ms" if m.get("solver_bound_s") is not None else "—"
                    print(
                        f"ilp: status {m['solver_status']}, objective {m['solver_objective_s'] * 1e3:.3f} ms, "
                        "solver bound "
                        f"{bound} (over {m['items']} items), solve {m['solve_time_s']:.1f} s, {hint}"
                    )
            elif ilp is not None:
                print(f"ilp: {ilp.status}: {ilp.message}")
            lb, prev = report.lower_bound_s, report.previous_lower_bound_s
            if best is not None and lb > 0:
                print(
                    f"best known {best.step_time_s * 1e3:.3f} ms ({best.method}); lower bound {lb * 1e3:.3f} "
                    f"ms ({report.lower_bound_name}), "
                    f"headroom {100 * (best.step_time_s / lb - 1):.1f}%; previous bound {prev * 1e3:.3f} ms "
                    f"({report.previous_lower_bound_name}), "
                    f"headroom {100 * (best.step_time_s / prev - 1):.1f}%",
                    flush=True,
                )


if __name__ == "__main__":
    main()
