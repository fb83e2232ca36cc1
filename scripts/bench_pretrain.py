"""Zero-shot generalization table for a pretrained gnn policy (BENCHMARKS.md, "Pretrained policy").

    python scripts/bench_pretrain.py POLICY.pt GRAPH[,GRAPH...] CLUSTER[,CLUSTER...] [--samples K]

Per (graph, cluster): the zero-shot placement (`placer place --method learned`: greedy plus K samples,
the best on the simulator, node-order step time), the seconds it took, and the best heuristic of
`placer compare` (all baselines; node order). Prints markdown rows.
"""

from __future__ import annotations

import argparse
import time

import envs
from graphs import zoo
from placer.compare import compare
from placer.pretrain import place_learned


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("policy")
    ap.add_argument("graphs")
    ap.add_argument("clusters")
    ap.add_argument("--samples", type=int, default=16)
    args = ap.parse_args()
    print("| graph | cluster | zero-shot ms | time s | best heuristic ms | gap |")
    print("|---|---|---:|---:|---|---:|")
    for name in args.graphs.split(","):
        g = zoo.graph(name)
        for cname in args.clusters.split(","):
            c = envs.resolve_cluster(cname)
            t0 = time.perf_counter()
            p = place_learned(g, c, policy_file=args.policy, samples=args.samples)
            took = time.perf_counter() - t0
            rows = [r for r in compare(g, c).rows if r.kind == "baseline" and r.status == "ok" and r.step_time_s]
            best = min(rows, key=lambda r: r.step_time_s)
            z = p.meta["node_order_step_time_s"]
            gap = f"{(z / best.step_time_s - 1) * 100:+.1f}%" if z else "fails"
            zs = f"{z * 1e3:.1f}" if z else "oom"
            print(f"| {name} | {cname} | {zs} | {took:.1f} | {best.step_time_s * 1e3:.1f} ({best.method}) | {gap} |", flush=True)


if __name__ == "__main__":
    main()
