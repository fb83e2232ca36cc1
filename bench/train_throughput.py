"""Training throughput: placements scored per second and iterations per second at several K.

One iteration is what ``placer train`` does per step: sample K placements from the
policy, score them with the simulator, and one REINFORCE update. Each part is
timed separately (policy sampling, simulator, update), so the table shows where
an iteration's time goes:

    OMP_NUM_THREADS=1 python -m bench.train_throughput                       # nmt-2, k80x4, K = 8, 64, 256
    OMP_NUM_THREADS=1 python -m bench.train_throughput --samples 8,64 --policies seq2seq --json
    python -m bench.train_throughput --device cuda                            # the policy on a GPU

GRAPH is a zoo name or a graph file. Times are wall-clock medians over
``--repeats`` iterations after one uncounted warm-up iteration (which compiles
the simulator kernel). ``--order planned`` also times scoring every sample with
its planned issue order (``SimEnv.plan_order``) instead of node order.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import envs
from bench.common import OneLineParser
from graphs import PlacerError
from graphs.grouping import default_num_groups
from graphs.sources import resolve_graph
from placer.learn.algos import Reinforce
from placer.learn.config import TrainConfig
from placer.learn.loop import resolve_device
from policies import POLICIES


def _policy(name: str, graph, num_devices: int, args: argparse.Namespace, device):
    torch.manual_seed(0)
    return POLICIES[name](graph, num_devices, max_groups=args.max_groups, hidden=args.hidden).to(device)


def measure(graph, cluster, name: str, k: int, args: argparse.Namespace) -> dict:
    """Median seconds per part of one training iteration with K samples."""
    device = torch.device(args.device)
    env = envs.SimEnv(graph, cluster)
    policy = _policy(name, graph, cluster.num_devices, args, device)
    opt = torch.optim.Adam(policy.parameters(), lr=5e-4)
    config = TrainConfig()
    gen = torch.Generator(device=device).manual_seed(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    parts: dict[str, list[float]] = {"sample_s": [], "simulate_s": [], "update_s": []}
    for rep in range(args.repeats + 1):
        t0 = time.perf_counter()
        s = Reinforce.sample(policy, k, gen)
        sync()
        t1 = time.perf_counter()
        step_time_s, failed = env.step_times(s.op_devices, order=None if args.order == "node" else args.order)
        t2 = time.perf_counter()
        reward = -np.sqrt(np.where(failed, 10 * step_time_s.max(), step_time_s) / step_time_s.min())
        adv = torch.as_tensor((reward - reward.mean()) / (reward.std() + 1e-8), dtype=torch.float32, device=device)
        Reinforce.update(policy, opt, s, adv, config)
        sync()
        t3 = time.perf_counter()
        if rep:  # the first iteration warms up (kernel compile, allocator)
            parts["sample_s"].append(t1 - t0)
            parts["simulate_s"].append(t2 - t1)
            parts["update_s"].append(t3 - t2)
    row = {key: statistics.median(v) for key, v in parts.items()}
    it_s = sum(row.values())
    row.update(
        policy=name,
        samples=k,
        items=int(getattr(policy, "num_items", 0)),
        iteration_s=it_s,
        iterations_per_s=1.0 / it_s,
        placements_per_s=k / it_s,
        policy_share=(row["sample_s"] + row["update_s"]) / it_s,
        order=args.order,
        device=str(device),
    )
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| policy | K | items | sample s | simulate s | update s | iteration s | iterations/s | placements/s | "
        "policy share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['samples']} | {r['items']} | {r['sample_s']:.4f} | {r['simulate_s']:.4f} | "
            f"{r['update_s']:.4f} | {r['iteration_s']:.4f} | {r['iterations_per_s']:.2f} | "
            f"{r['placements_per_s']:.0f} | {r['policy_share'] * 100:.0f}% |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.train_throughput", description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?", default="nmt-2", help="zoo name or graph file (default nmt-2)")
    parser.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")
    parser.add_argument("--samples", default="8,64,256", help="comma-separated K values (default 8,64,256)")
    parser.add_argument("--policies", default="seq2seq,hierarchical", help="policies to time (default both)")
    parser.add_argument("--max-groups", type=int, default=None, help="items / groups (default min(256, 20 x devices))")
    parser.add_argument("--hidden", type=int, default=64, help="LSTM units (default 64, train's default)")
    parser.add_argument("--repeats", type=int, default=3, help="timed iterations per cell (median; default 3)")
    parser.add_argument(
        "--order",
        choices=("node", "planned"),
        default="node",
        help="issue order the samples are scored in (default node)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the policy (cpu, cuda, cuda:N)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown")
    args = parser.parse_args(argv)
    try:
        ks = [int(x) for x in args.samples.split(",") if x.strip()]
        if not ks or min(ks) < 1:
            raise PlacerError(f"--samples {args.samples!r}: give positive integers, e.g. 8,64,256")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            raise PlacerError(f"--policies: unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
        if args.repeats < 1:
            raise PlacerError("--repeats: must be >= 1")
        resolve_device(args.device)
        graph = resolve_graph(args.graph)
        cluster = envs.resolve_cluster(args.cluster)
        if args.max_groups is None:
            args.max_groups = default_num_groups(cluster.num_devices)
    except PlacerError as e:
        print(f"train_throughput: {e}", file=sys.stderr)
        return 2
    rows = []
    for name in policies:
        for k in ks:
            rows.append(measure(graph, cluster, name, k, args))
            if not args.json:
                print(f"{name} K={k}: {rows[-1]['placements_per_s']:.0f} placements/s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"graph": args.graph, "cluster": args.cluster, "rows": rows}, indent=1))
    else:
        print(table(rows))
        print(
            f"\n{args.graph} on {args.cluster}, policy on {args.device}, samples scored in {args.order} order; "
            f"medians of {args.repeats} iterations (wall clock)."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
