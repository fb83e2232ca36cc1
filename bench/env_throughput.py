"""Simulator throughput through the Gymnasium environments, against the simulator called directly.

The same random placements (a uniformly random device per op) are scored four
ways, each for about ``--seconds`` of CPU time on one core:

* ``direct_batch``: :meth:`envs.SimEnv.step_times` on batches of ``--batch`` placements (what
  placer's learners and searches call; ``scripts/bench_sim.py``'s figure);
* ``direct_one``: the same, one placement per call;
* ``direct_evaluate``: :meth:`envs.SimEnv.evaluate`, one placement per call (the full result: the
  peak memory per device too);
* ``place_all``: ``reset()`` + ``step()`` of ``placer/PlaceAll-v0`` with one item per op, as an
  agent runs it, with ``peak_memory=False`` (the step time alone, as ``step_times`` gives);
* ``place_all_peaks``: the same with the default ``peak_memory=True`` (the simulator's full result,
  as ``evaluate`` gives: the peak memory per device in ``info``);
* ``sequential``: whole episodes of ``placer/PlaceSequential-v0`` over the default items (co-location
  groups), one step per item, with the default ``peak_memory=True``.

Each figure is op-placements per CPU second (ops x placements); ``ratio`` divides
it by ``direct_batch``'s, ``ratio_same`` by the direct call that gives the same
information (``direct_one`` for ``place_all``, ``direct_evaluate`` for the others).

    python -m bench.env_throughput --graph nmt-2 --cluster k80x4 --seconds 10 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from bench.common import machine_line
from bench.gym_cli import add_problem, doc_parser
from graphs import PlacerError

#: The direct call that gives what each environment figure's steps give (the step time; the full result).
SAME_INFORMATION = {"place_all": "direct_one", "place_all_peaks": "direct_evaluate", "sequential": "direct_evaluate"}


def build_parser() -> argparse.ArgumentParser:
    p = doc_parser("bench.env_throughput", __doc__)
    add_problem(p)
    p.add_argument("--seconds", type=float, default=5.0, help="CPU seconds per measurement (default 5)")
    p.add_argument("--batch", type=int, default=64, help="placements per direct step_times call (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def rate(score: Callable[[int], int], seconds: float) -> float:
    """Placements per CPU second of ``score(k)`` (it scores placement ``k`` onwards, returns how many it scored)."""
    done, c0 = 0, time.process_time()
    while True:
        done += score(done)
        spent = time.process_time() - c0
        if spent >= seconds:
            return done / spent


def measure(graph: str, cluster: str, seconds: float, batch: int) -> dict[str, Any]:
    """Every figure of the module doc, for one graph and cluster."""
    import gymnasium

    import placer.gym  # noqa: F401  (registers the environments)

    place_all = gymnasium.make("placer/PlaceAll-v0", graph=graph, cluster=cluster, groups=0, peak_memory=False)
    problem = place_all.unwrapped.problem
    n, num_devices = problem.graph.num_ops, problem.num_devices
    sim = problem.scorer
    rows = np.random.default_rng(0).integers(0, num_devices, size=(4096, n)).astype(np.int32)
    pick = lambda k, count=1: rows[np.arange(k, k + count) % len(rows)]  # noqa: E731
    peaks = gymnasium.make("placer/PlaceAll-v0", graph=problem.graph, cluster=problem.cluster, groups=0)
    sequential = gymnasium.make("placer/PlaceSequential-v0", graph=problem.graph, cluster=problem.cluster)
    items = sequential.unwrapped.num_items
    item_rows = np.random.default_rng(1).integers(0, num_devices, size=(len(rows), items))

    def episode(env: Any, action: np.ndarray) -> int:
        env.reset()
        env.step(action)
        return 1

    def sequential_episode(k: int) -> int:
        sequential.reset()
        for device in item_rows[k % len(item_rows)]:
            sequential.step(int(device))
        return 1

    sim.step_times(rows[:1])  # the compiled kernel is loaded (or compiled) before anything is timed
    figures = {
        "direct_batch": rate(lambda k: len(sim.step_times(pick(k, batch))[0]), seconds),
        "direct_one": rate(lambda k: len(sim.step_times(pick(k))[0]), seconds),
        "direct_evaluate": rate(lambda k: len(sim.evaluate([pick(k)[0]])), seconds),
        "place_all": rate(lambda k: episode(place_all, pick(k)[0].astype(np.int64)), seconds),
        "place_all_peaks": rate(lambda k: episode(peaks, pick(k)[0].astype(np.int64)), seconds),
        "sequential": rate(sequential_episode, seconds),
    }
    direct = figures["direct_batch"] * n
    return {
        "graph": graph,
        "cluster": cluster,
        "num_ops": n,
        "sequential_items": items,
        "seconds": seconds,
        "batch": batch,
        "machine": machine_line(),
        **{
            name: {
                "placements_per_s": per_s,
                "op_placements_per_s": per_s * n,
                "ratio": per_s * n / direct,
                "ratio_same": per_s / figures[SAME_INFORMATION.get(name, name)],
            }
            for name, per_s in figures.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if not args.seconds > 0 or args.batch < 1:
            raise PlacerError("--seconds and --batch: give positive numbers")
        report = measure(args.graph, args.cluster, args.seconds, args.batch)
    except PlacerError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['graph']} ({report['num_ops']:,} ops) on {report['cluster']}; {report['machine']}")
    print(f"{'':16s} {'op-placements/s':>16s} {'placements/s':>13s} {'ratio':>6s} {'same':>6s}  (per CPU second)")
    for name in ("direct_batch", "direct_one", "direct_evaluate", "place_all", "place_all_peaks", "sequential"):
        row = report[name]
        print(
            f"{name:16s} {row['op_placements_per_s']:16,.0f} {row['placements_per_s']:13,.1f} "
            f"{row['ratio']:6.2f} {row['ratio_same']:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
