"""Zero-shot generalization table for a pretrained gnn policy (BENCHMARKS.md, "Pretrained policy").

    python -m bench.zero_shot POLICY.pt|default GRAPH[,GRAPH...] CLUSTER[,CLUSTER...]
        [--samples K] [--groups N,N|none] [--refine N] [--seeds N] [--json]

Per (graph, cluster): the policy's greedy placement of the ops; its best decode (`placer place --method
learned --refine 0`: greedy over the ops, greedy plus K samples over the graph coarsened to each group count
and grouped by module at each depth, the best on the simulator); the zero-shot placement (the same decodes,
then up to N placements simulated refining them by steepest descent over their groups, `placer place
--method learned`), node-order step times; what found it (JSON); the seconds it took; and the best heuristic
of `placer compare` (all heuristics; node order). Prints markdown rows, or with --json one JSON object per row.

Two heuristics under the same budget, both on the module views:
- `uniform modules`: the `random_modules` heuristic (each module on a GPU drawn uniformly) with as many draws
  per module view as the policy decodes there (its greedy + K samples at each module temperature);
- `module search`: the `module_search` heuristic (the same steepest descent, from uniform draws) given as many
  simulated placements as the zero-shot placement took in all (its decodes plus its refinement).
`placer compare` runs both with 1,000 placements, and they count among its heuristics. Where one of them
comes close to the zero-shot figure, the module structure found the placement and the policy added little.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import envs
from bench.common import OneLineParser
from graphs import PlacerError
from graphs.sources import resolve_graph
from placer.compare import compare
from placer.methods import registry
from placer.methods.learned import (
    ZERO_SHOT_GROUPS,
    ZERO_SHOT_MODULE_TEMPERATURES,
    ZERO_SHOT_REFINE,
    ZERO_SHOT_SAMPLES,
    place_learned,
)
from placer.option_checks import check_int, parse_group_counts
from policies.views import group_views

HEAD = (
    "| graph | cluster | greedy ms | best decode ms | zero-shot ms | time s | uniform modules ms | "
    "module search ms | best heuristic ms | gap |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|"
)


def heuristic_step_time(graph, cluster, method: str, n: int, seed: int = 0) -> float | None:
    """Best simulated step time of the ``random_modules`` or ``module_search`` heuristic given ``n`` placements."""
    env = envs.SimEnv(graph, cluster)
    op_devices = registry.get(method)(graph, cluster, seed=seed, n=n, env=env)
    step_time_s, failed = env.step_times(op_devices[None])
    return None if failed[0] or not step_time_s[0] < float("inf") else float(step_time_s[0])


def _median(values: list) -> float | None:
    return float(statistics.median(values)) if values and None not in values else None


def zero_shot_row(name: str, graph: Any, cname: str, cluster: Any, args: argparse.Namespace, groups) -> dict:
    """One (graph, cluster): the policy's placements per seed, the two module heuristics at its budget, the
    best heuristic."""
    zs, dec, took, found, unis, searched = [], [], [], [], [], []
    draws = args.samples * len(ZERO_SHOT_MODULE_TEMPERATURES) + 1  # per module view, as many as the policy's decodes
    views = len(group_views(graph, ["modules"])) if "modules" in groups else 0
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        p = place_learned(
            graph,
            cluster,
            policy_file=None if args.policy == "default" else args.policy,
            samples=args.samples,
            groups=groups,
            seed=seed,
            refine=args.refine,
        )
        took.append(time.perf_counter() - t0)
        zs.append(p.meta["node_order_step_time_s"])
        dec.append(p.meta["decode_step_time_s"])
        found.append(p.meta["found_by"])
        unis.append(heuristic_step_time(graph, cluster, "random_modules", draws * views, seed) if views else None)
        n = p.meta["decodes"] + p.meta["refine_simulated"]
        searched.append(heuristic_step_time(graph, cluster, "module_search", n, seed) if views else None)
    rows = [r for r in compare(graph, cluster).rows if r.kind == "heuristic" and r.status == "ok" and r.step_time_s]
    best = min(rows, key=lambda r: r.step_time_s)
    z = _median(zs)
    return {
        "graph": name,
        "cluster": cname,
        "policy": args.policy,
        "greedy_step_time_s": p.meta["greedy_step_time_s"],
        "best_decode_step_time_s": _median(dec),
        "best_decode_by_seed": dec,
        "zero_shot_step_time_s": z,
        "zero_shot_by_seed": zs,
        "place_s": max(took),
        "samples": args.samples,
        "groups": list(groups),
        "refine": args.refine,
        "found_by": found,
        "uniform_modules_step_time_s": _median(unis),
        "uniform_modules_by_seed": unis,
        "module_search_step_time_s": _median(searched),
        "module_search_by_seed": searched,
        "best_heuristic": best.method,
        "best_heuristic_step_time_s": best.step_time_s,
        "gap": (z / best.step_time_s - 1) if z else None,
    }


def markdown_row(row: dict) -> str:
    def ms(x: float | None) -> str:
        return f"{x * 1e3:.1f}" if x else "oom"

    gap = f"{row['gap'] * 100:+.1f}%" if row["zero_shot_step_time_s"] else "fails"
    uni, searched = row["uniform_modules_step_time_s"], row["module_search_step_time_s"]
    return (
        f"| {row['graph']} | {row['cluster']} | {ms(row['greedy_step_time_s'])} | "
        f"{ms(row['best_decode_step_time_s'])} | {ms(row['zero_shot_step_time_s'])} | {row['place_s']:.1f} | "
        f"{ms(uni) if uni else '-'} | {ms(searched) if searched else '-'} | "
        f"{row['best_heuristic_step_time_s'] * 1e3:.1f} ({row['best_heuristic']}) | {gap} |"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.zero_shot", description=__doc__.splitlines()[0])
    ap.add_argument("policy", help="a policy file (.pt with its .json sidecar), or 'default' for the shipped one")
    ap.add_argument("graphs", help="comma list of zoo names, graph files or module:callable sources")
    ap.add_argument("clusters", help="comma list of cluster presets or files")
    ap.add_argument(
        "--samples", type=int, default=ZERO_SHOT_SAMPLES, help=f"samples per group count (default {ZERO_SHOT_SAMPLES})"
    )
    ap.add_argument(
        "--groups",
        default=",".join(map(str, ZERO_SHOT_GROUPS)),
        help="group counts decoded besides the ops, 'modules', or none (default: placer place's)",
    )
    ap.add_argument(
        "--refine",
        type=int,
        default=ZERO_SHOT_REFINE,
        help=f"placements simulated refining the decodes (0: none; default {ZERO_SHOT_REFINE})",
    )
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="place with seeds 0..N-1 and print the medians (a best-of-K sample is noisy; default 1)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object per (graph, cluster)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        groups = parse_group_counts(args.groups, modules=True)
        check_int(args.seeds, "--seeds", least=1, most=100)
        check_int(args.refine, "--refine", least=0, most=10**6)
        if not args.json:
            print(HEAD)
        for name in args.graphs.split(","):
            graph = resolve_graph(name)
            for cname in args.clusters.split(","):
                row = zero_shot_row(name, graph, cname, envs.resolve_cluster(cname), args, groups)
                print(json.dumps(row) if args.json else markdown_row(row), flush=True)
    except PlacerError as e:
        print(f"zero_shot: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
