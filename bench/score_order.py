"""The heuristics of a planned-order run: each searched in node order and re-timed, or searched planned.

    python -m bench.score_order                                 # nmt-2,nmt-4,inception-v3 on k80x4
    python -m bench.score_order --graphs gpt2,resnet50 --clusters k80x4,v100x4 --json

``placer train`` scores its samples in each placement's planned issue order (``--score-order auto``). Its
"best heuristic" used to come from ``placer compare`` in node order, each row re-timed in its planned order
afterwards; now ``compare(score_order="planned")`` has the searches (module_search, annealing,
random_search...) search the planned objective themselves. For each heuristic this prints both planned-order
step times and their ratio, and the best heuristic each way. Every heuristic but ``ilp`` (a minute of
solver), seed 0. Simulated step times: they hold inside our simulator only.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import json
import sys
import time

import envs
from bench.common import OneLineParser
from bench.graph_sources import graphs_and_clusters
from graphs import PlacerError
from placer.compare import compare, default_methods


def cell(graph, cluster, seed: int) -> dict:
    """Both comparisons of one graph and cluster: per heuristic, its planned-order time each way."""
    methods = default_methods(exclude=("ilp",))
    env = envs.SimEnv(graph, cluster)
    t0 = time.perf_counter()
    node = compare(graph, cluster, methods=methods, seed=seed)
    node_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    planned = compare(graph, cluster, methods=methods, seed=seed, score_order="planned")
    planned_s = time.perf_counter() - t0
    rows = []
    for a, b in zip(node.rows, planned.rows):
        if a.kind != "heuristic":
            continue
        retimed = None
        if a.status == "ok" and a.placement is not None:
            op_devices = a.placement.indices(graph, cluster.device_names)
            step_time_s, failed = env.step_times(op_devices[None], order="planned")
            retimed = None if failed[0] else float(step_time_s[0])
        rows.append(
            {
                "method": a.method,
                "node_searched_s": retimed,
                "simulated_node": a.simulated,
                "planned_searched_s": b.step_time_s if b.status == "ok" else None,
                "simulated_planned": b.simulated,
            }
        )
    best = {
        k: min((r[k], r["method"]) for r in rows if r[k] is not None) for k in ("node_searched_s", "planned_searched_s")
    }
    return {
        "graph": graph.name,
        "cluster": cluster.name,
        "seed": seed,
        "rows": rows,
        "best_node_searched": {"method": best["node_searched_s"][1], "step_time_s": best["node_searched_s"][0]},
        "best_planned_searched": {
            "method": best["planned_searched_s"][1],
            "step_time_s": best["planned_searched_s"][0],
        },
        "compare_s": {"node": node_s, "planned": planned_s},
        "lower_bound_s": float(env.lower_bound()),
    }


def table(c: dict) -> str:
    ms = lambda v: f"{v * 1e3:.2f}" if v is not None else "—"  # noqa: E731
    out = [
        f"### {c['graph']} on {c['cluster']} (seed {c['seed']})",
        "",
        "| heuristic | searched in node order, timed planned (ms) | searched planned (ms) | ratio | placements "
        "simulated (node / planned) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in c["rows"]:
        a, b = r["node_searched_s"], r["planned_searched_s"]
        ratio = f"{b / a:.3f}" if a and b else "—"
        out.append(
            f"| {r['method']} | {ms(a)} | {ms(b)} | {ratio} | {r['simulated_node']:,} / {r['simulated_planned']:,} |"
        )
    bn, bp = c["best_node_searched"], c["best_planned_searched"]
    out += [
        "",
        f"best heuristic: {bn['method']} {ms(bn['step_time_s'])} ms searched in node order; {bp['method']} "
        f"{ms(bp['step_time_s'])} ms searched planned ({bp['step_time_s'] / bn['step_time_s']:.3f}x); lower bound "
        f"{ms(c['lower_bound_s'])} ms; compare took {c['compare_s']['node']:.1f} s node, "
        f"{c['compare_s']['planned']:.1f} s planned",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.score_order", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--graphs", default="nmt-2,nmt-4,inception-v3", help="comma list of zoo names, graph files or module:callable"
    )
    ap.add_argument("--clusters", default="k80x4", help="comma list of presets or files (default k80x4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print every cell as JSON instead of the tables")
    args = ap.parse_args(argv)
    try:
        graphs, clusters = graphs_and_clusters(args.graphs, args.clusters)
    except PlacerError as e:
        print(f"score_order: {e}", file=sys.stderr)
        return 2
    cells = []
    for cluster in clusters:
        for graph in graphs:
            print(f"{graph.name} on {cluster.name}...", file=sys.stderr, flush=True)
            cells.append(cell(graph, cluster, args.seed))
            if not args.json:
                print(table(cells[-1]), flush=True)
    if args.json:
        print(json.dumps(cells, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
