"""Simulator throughput: op-placements simulated per second on one core.

Scores batches of random placements (every op on a uniformly random device:
the most transfers, the slowest case) of a synthetic 10,000-op graph with
``SimEnv.step_times`` (the RL/search inner loop: step time + OOM flag) and
times one scalar ``envs.simulate`` call (full Result: memory sweep, busy times),
for one executor model (``--executor eager``, the default, or ``dataflow``) or
both (``--executor both``: the JSON is then ``{"eager": {...}, "dataflow": {...}}``).

    python -m bench.sim_throughput [--ops 10000] [--cluster k80x4] [--batch 64] [--executor eager|dataflow|both]
        [--json]
    python -m bench.sim_throughput --ranks M --ops 200 [--cluster k80x2] [--json]   # the simulator of ranks
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and numba load
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse
import json
import platform
import sys
import time

import numpy as np

import envs
from bench.common import OneLineParser
from graphs.synthetic import random_dag


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.sim_throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10_000, help="graph size (default 10000)")
    ap.add_argument("--cluster", default="k80x4", help="cluster preset or file (default k80x4)")
    ap.add_argument("--batch", type=int, default=64, help="placements per step_times call (default 64)")
    ap.add_argument("--seconds", type=float, default=3.0, help="measure for about this long (default 3)")
    ap.add_argument(
        "--executor",
        choices=("eager", "dataflow", "both"),
        default="eager",
        help="executor model to time (default eager)",
    )
    ap.add_argument(
        "--ranks",
        type=int,
        default=0,
        metavar="M",
        help="time the simulator of ranks instead (plans across processes, M microbatches; envs.sim.ranks.RankSim): "
        "random placements and random contiguous splits (one stage per device) of a --ops graph; a few hundred ops",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.ranks < 0 or args.ops < 2 or args.batch < 1 or args.seconds <= 0:
        ap.error("--ranks must be >= 0, --ops >= 2, --batch >= 1 and --seconds > 0")

    graph = random_dag(args.ops, seed=0)
    cluster = envs.resolve_cluster(args.cluster)
    if args.ranks:
        report = measure_ranks(graph, cluster, args)
        if args.json:
            print(json.dumps(report, indent=1))
            return 0
        print(
            f"simulator of ranks: graph random_dag({graph.num_ops}) on {cluster.name}, M={args.ranks} microbatches, "
            f"batches of {args.batch}"
        )
        for kind in ("random", "splits"):
            print(f"  {kind:7s} placements per second (one core): {report[kind]['placements_per_s']:,.1f}")
        return 0
    executors = ("eager", "dataflow") if args.executor == "both" else (args.executor,)
    reports = {ex: measure(graph, cluster, ex, args) for ex in executors}
    if args.json:
        print(json.dumps(reports if len(executors) > 1 else reports[executors[0]], indent=1))
        return 0
    for ex, report in reports.items():
        print(
            f"executor {ex}: graph random_dag({graph.num_ops}) ({graph.num_edges} edges) on {cluster.name}, "
            f"batches of {args.batch} random placements"
        )
        print(
            f"op-placements per second (one core): {report['op_placements_per_s']:,.0f}  "
            f"({report['placements_per_s']:,.1f} placements/s, per CPU second)"
        )
        print(
            f"  per wall-clock second:             {report['op_placements_per_wall_s']:,.0f}  (this process "
            f"had {report['cpu_share']:.0%} of a core)"
        )
        print(f"one scalar envs.simulate:            {report['scalar_simulate_s'] * 1e3:.1f} ms (full Result)")
        print(
            f"lower_bound:                         {report['lower_bound_call_s'] * 1e3:.1f} ms; warm-up "
            f"(compile or cache load) {report['warmup_s']:.2f} s"
        )
        print(f"compiled kernel: {report['compiled']}")
    return 0


def timed(call, seconds: float) -> tuple:
    """``call()`` again and again for about ``seconds``: ``(calls, wall seconds, CPU seconds, the last return)``."""
    calls, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        last = call()
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return calls, elapsed, time.process_time() - c0, last


def measure_ranks(graph, cluster, args: argparse.Namespace) -> dict:
    """Placements per CPU second of the simulator of ranks: uniformly random placements (many stages, many sends)
    and random contiguous splits over the devices in order (one stage each: what ``stage_search`` and the ranks
    loops score)."""
    from envs.sim.ranks import RankSim

    rng = np.random.default_rng(0)
    n, D = graph.num_ops, cluster.num_devices
    random_rows = rng.integers(0, D, size=(args.batch, n), dtype=np.int32)
    cuts = np.sort(rng.integers(1, n, size=(args.batch, D - 1)), axis=1)
    split_rows = np.stack([np.searchsorted(c, np.arange(n), side="right") for c in cuts]).astype(np.int32)
    sim = RankSim(graph, cluster, microbatches=args.ranks)
    out: dict = {"num_ops": n, "cluster": cluster.name, "microbatches": args.ranks, "batch": args.batch}
    for kind, rows in (("random", random_rows), ("splits", split_rows)):
        sim.step_times(rows[:1])
        calls, _, cpu_s, (step_time_s, _) = timed(lambda: sim.step_times(rows), args.seconds)
        out[kind] = {
            "placements_per_s": calls * args.batch / cpu_s,
            "median_step_time_s": float(np.median(step_time_s)),
        }
    out["python"], out["machine"] = platform.python_version(), platform.processor() or platform.machine()
    return out


def measure(graph, cluster, executor: str, args: argparse.Namespace) -> dict:
    """The figures for one executor model."""
    rng = np.random.default_rng(0)
    op_devices = rng.integers(0, cluster.num_devices, size=(args.batch, graph.num_ops), dtype=np.int32)

    t0 = time.perf_counter()
    env = envs.SimEnv(graph, cluster, executor=executor)
    env.step_times(op_devices[:1])  # compiles the kernel (or loads it from numba's cache)
    warmup_s = time.perf_counter() - t0

    # The kernel is single-threaded, so CPU time is one core's time; on a shared
    # machine wall time also counts the time other processes held the core.
    calls, elapsed, cpu_s, (step_time_s, failed) = timed(lambda: env.step_times(op_devices), args.seconds)
    placements_per_s = calls * args.batch / cpu_s
    placements_per_wall_s = calls * args.batch / elapsed

    scalar = []
    for k in range(5):
        t = time.perf_counter()
        result = envs.simulate(graph, op_devices[k % args.batch], cluster, executor=executor)
        scalar.append(time.perf_counter() - t)
    t = time.perf_counter()
    bound = envs.lower_bound(graph, cluster)
    bound_s = time.perf_counter() - t

    from envs.sim.kernel import HAVE_NUMBA  # after the timings: loading numba is part of the warm-up figure

    return {
        "executor": executor,
        "num_ops": graph.num_ops,
        "num_edges": graph.num_edges,
        "cluster": cluster.name,
        "num_devices": cluster.num_devices,
        "batch": args.batch,
        "placements": "uniform random device per op",
        "op_placements_per_s": placements_per_s * graph.num_ops,
        "op_placements_per_wall_s": placements_per_wall_s * graph.num_ops,
        "placements_per_s": placements_per_s,
        "cpu_share": cpu_s / elapsed,
        "scalar_simulate_s": float(np.median(scalar)),
        "lower_bound_call_s": bound_s,
        "warmup_s": warmup_s,
        "median_step_time_s": float(np.median(step_time_s)),
        "oom_fraction": float(failed.mean()),
        "lower_bound_s": bound,
        "scalar_status": result.status,
        "compiled": HAVE_NUMBA,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }


if __name__ == "__main__":
    sys.exit(main())
