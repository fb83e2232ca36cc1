"""Run ``placer compare`` on every zoo graph on k80x4 and v100x4; print markdown tables.

    python -m bench.zoo_compare [--clusters k80x4,v100x4] [--graphs rnnlm,...] [--seed 0] [--methods all]
        [--ilp-time-limit 60] [--ilp-workers N]

After each table: the ``ilp`` row's solver status, objective, proven bound (of its
item problem), solve time and item count, and the headroom between the best
placement found and the tightest valid lower bound (the previous bound beside it).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import importlib.util
import sys
import time
from typing import Any

import envs
from bench.common import OneLineParser
from graphs import zoo
from placer.compare import compare


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.zoo_compare", description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="k80x4,v100x4")
    ap.add_argument("--graphs", default=",".join(zoo.names()))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default="all", help="comma-separated heuristics (default all, ilp included)")
    ap.add_argument("--ilp-time-limit", type=float, default=60.0, help="ilp solver seconds per graph (default 60)")
    ap.add_argument("--ilp-workers", type=int, default=None, help="ilp solver workers (default: every core)")
    return ap.parse_args(argv)


def ilp_line(report: Any) -> str | None:
    """The ``ilp`` row's solver status, objective, bound and time (None: no ilp row)."""
    ilp = next((r for r in report.rows if r.method == "ilp"), None)
    if ilp is None:
        return None
    if not ilp.meta:
        return f"ilp: {ilp.status}: {ilp.message}"
    m = ilp.meta
    hint = f"hint {m.get('hint')} {m.get('hint_step_time_s', 0) * 1e3:.3f} ms"
    if m["solver_status"] == "windows":  # large-neighbourhood search from the hint
        windows = f"{m['windows']} windows of {m['window_ops']} ops, {m['windows_improved']} improved the plan"
        return f"ilp: {windows}; {hint}"
    bound = f"{m['solver_bound_s'] * 1e3:.3f} ms" if m.get("solver_bound_s") is not None else "—"
    return (
        f"ilp: status {m['solver_status']}, objective {m['solver_objective_s'] * 1e3:.3f} ms, solver bound "
        f"{bound} (over {m['items']} items), solve {m['solve_time_s']:.1f} s, {hint}"
    )


def headroom_line(report: Any, best: Any) -> str | None:
    """How far the best placement is above the tightest valid bound and the previous one (None: nothing placed)."""
    lb, prev = report.lower_bound_s, report.previous_lower_bound_s
    if best is None or lb <= 0:
        return None
    return (
        f"best known {best.step_time_s * 1e3:.3f} ms ({best.method}); lower bound {lb * 1e3:.3f} "
        f"ms ({report.lower_bound_name}), headroom {100 * (best.step_time_s / lb - 1):.1f}%; previous bound "
        f"{prev * 1e3:.3f} ms ({report.previous_lower_bound_name}), headroom {100 * (best.step_time_s / prev - 1):.1f}%"
    )


def print_cell(gname: str, cname: str, graph: Any, report: Any, wall_s: float, seed: int) -> None:
    best = report.best()
    below = [
        r.method
        for r in report.rows
        if r.kind != "bound" and r.status == "ok" and r.step_time_s < report.lower_bound_s * (1 - 1e-9)
    ]
    print(f"\n### {gname} ({graph.num_ops} ops) on {cname}\n")
    print(report.table())
    single = f"{report.best_single_device} {report.best_single_s * 1e3:.3f} ms" if report.best_single_s else "none fits"
    print(
        f"\nbest single device: {single}; best heuristic: {best.method if best else '—'}; "
        f"compare took {wall_s:.1f} s (seed {seed}){'; BELOW BOUND: ' + ', '.join(below) if below else ''}",
        flush=True,
    )
    for line in (ilp_line(report), headroom_line(report, best)):
        if line is not None:
            print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # Pay the imports of torch and accelerate up front, so that the place-time
    # column measures the algorithms (the CLI counts them in the first row using them).
    import torch  # noqa: F401

    if importlib.util.find_spec("accelerate"):
        import accelerate  # noqa: F401

    methods = None if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    ilp_options: dict[str, Any] = {"time_limit_s": args.ilp_time_limit}
    if args.ilp_workers is not None:
        ilp_options["num_workers"] = args.ilp_workers
    for cname in args.clusters.split(","):
        cluster = envs.Cluster.preset(cname)
        for gname in args.graphs.split(","):
            graph = zoo.graph(gname)
            t0 = time.perf_counter()
            report = compare(graph, cluster, methods=methods, seed=args.seed, options={"ilp": ilp_options})
            print_cell(gname, cname, graph, report, time.perf_counter() - t0, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
