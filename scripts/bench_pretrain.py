"""Zero-shot generalization table for a pretrained gnn policy (BENCHMARKS.md, "Pretrained policy").

    python scripts/bench_pretrain.py POLICY.pt|default GRAPH[,GRAPH...] CLUSTER[,CLUSTER...] [--samples K] [--groups N,N|none] [--json]

Per (graph, cluster): the policy's greedy placement of the ops, the zero-shot placement (`placer place
--method learned`: greedy over the ops, greedy plus K samples over the graph coarsened to each group count,
the best on the simulator, node-order step time), what found it (JSON), the seconds it took,
and the best heuristic of `placer compare` (all baselines; node order). Prints markdown rows, or with
--json one JSON object per row.

The rival of the module views under the same budget: as many placements drawn uniformly at random, each
module group on one GPU (`uniform modules`), on the same module views (K + 1 draws per view, the
policy's greedy + K samples). Where it comes close to the zero-shot figure, the module structure found
the placement and the policy's distribution over it added little.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import envs
from graphs import PlacerError
from placer.compare import compare
from placer.checks import parse_group_counts
from placer.sources import resolve_graph
from placer.pretrain import ZERO_SHOT_GROUPS, ZERO_SHOT_SAMPLES, group_views, place_learned


def uniform_modules(graph, cluster, draws: int, seed: int = 0) -> float | None:
    """Best simulated step time of ``draws`` uniform random placements per module view, a module group per GPU."""
    import numpy as np

    rng = np.random.default_rng(seed)
    devices = cluster.gpu_indices() if cluster.gpu_indices() else list(range(cluster.num_devices))
    env = envs.SimEnv(graph, cluster)
    best = np.inf
    for _, kwargs in group_views(graph, ["modules"]):
        grouping = kwargs["grouping"]
        rows = np.stack([grouping.expand(rng.choice(devices, grouping.num_groups)) for _ in range(draws)])
        t, failed = env.step_times(rows)
        t = np.where(failed | ~np.isfinite(t), np.inf, t)
        best = min(best, float(t.min()))
    return best if np.isfinite(best) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("policy", help="a policy file (.pt with its .json sidecar), or 'default' for the shipped one")
    ap.add_argument("graphs", help="comma list of zoo names, graph files or module:callable sources")
    ap.add_argument("clusters", help="comma list of cluster presets or files")
    ap.add_argument("--samples", type=int, default=ZERO_SHOT_SAMPLES, help=f"samples per group count (default {ZERO_SHOT_SAMPLES})")
    ap.add_argument("--groups", default=",".join(map(str, ZERO_SHOT_GROUPS)),
                    help="group counts decoded besides the ops, or none (default: placer place's)")
    ap.add_argument("--json", action="store_true", help="one JSON object per (graph, cluster)")
    args = ap.parse_args()
    groups = parse_group_counts(args.groups, modules=True)
    if not args.json:
        print("| graph | cluster | greedy ms | zero-shot ms | time s | uniform modules ms | best heuristic ms | gap |")
        print("|---|---|---:|---:|---:|---:|---|---:|")
    for name in args.graphs.split(","):
        g = resolve_graph(name)
        for cname in args.clusters.split(","):
            c = envs.resolve_cluster(cname)
            t0 = time.perf_counter()
            p = place_learned(g, c, policy_file=None if args.policy == "default" else args.policy, samples=args.samples,
                              groups=groups)
            took = time.perf_counter() - t0
            rows = [r for r in compare(g, c).rows if r.kind == "baseline" and r.status == "ok" and r.step_time_s]
            best = min(rows, key=lambda r: r.step_time_s)
            z = p.meta["node_order_step_time_s"]
            gr = p.meta["greedy_step_time_s"]
            uni = uniform_modules(g, c, args.samples + 1) if "modules" in groups else None
            if args.json:
                print(json.dumps({"graph": name, "cluster": cname, "policy": args.policy, "greedy_step_time_s": gr,
                                  "zero_shot_step_time_s": z, "place_s": took, "samples": args.samples,
                                  "groups": list(groups), "found_by": p.meta["found_by"],
                                  "uniform_modules_step_time_s": uni, "best_heuristic": best.method, "best_heuristic_step_time_s": best.step_time_s,
                                  "gap": (z / best.step_time_s - 1) if z else None}), flush=True)
                continue
            gap = f"{(z / best.step_time_s - 1) * 100:+.1f}%" if z else "fails"
            ms = lambda x: f"{x * 1e3:.1f}" if x else "oom"  # noqa: E731
            print(f"| {name} | {cname} | {ms(gr)} | {ms(z)} | {took:.1f} | {ms(uni) if uni else '-'} | {best.step_time_s * 1e3:.1f} ({best.method}) | {gap} |",
                  flush=True)


if __name__ == "__main__":
    try:
        main()
    except PlacerError as e:
        print(f"bench_pretrain: {e}", file=sys.stderr)
        sys.exit(2)
