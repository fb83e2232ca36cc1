"""Draw one placement's simulated training step as a Gantt chart (one row per device and link).

    python -m bench.plot_placement nmt-2 --cluster k80x4 -o docs/placement_nmt2_k80x4.png   # train RL, then draw
    python -m bench.plot_placement nmt-2 --cluster k80x4 --placement runs/x/best_placement.json -o p.png
    python -m bench.plot_placement nmt-2 --cluster k80x4 --method expert --color-by kind -o expert.png

Without --placement or --method, RL (placer.train) is trained for --time-budget
seconds and its best placement is drawn. The drawing is :func:`bench.plots.plot_schedule`'s.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import json
import sys
import tempfile
from typing import Any

import envs
from bench import plots
from bench.common import OneLineParser
from graphs import PlacerError
from graphs.sources import resolve_graph
from placer import Placement
from placer.learn.config import TrainConfig
from placer.learn.loop import train
from placer.methods import registry


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m bench.plot_placement", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="graph file or zoo name")
    parser.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--placement", default=None, help="a placement JSON file (e.g. best_placement.json)")
    what.add_argument("--method", default=None, help="a heuristic's name instead of RL")
    parser.add_argument("--policy", default="seq2seq", help="RL policy when training (default seq2seq)")
    parser.add_argument("--time-budget", type=float, default=60.0, metavar="S", help="RL training seconds (default 60)")
    parser.add_argument(
        "--warm-start",
        choices=("best", "none"),
        default="best",
        help="RL imitates the best heuristic first (default) or starts from scratch",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--color-by", choices=("layer", "kind"), default="layer")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    parser.add_argument("--trace", default=None, help="also write the Chrome trace JSON here")
    parser.add_argument("--dpi", type=int, default=100)
    return parser.parse_args(argv)


def trained(graph: Any, cluster: Any, args: argparse.Namespace) -> tuple[Placement, str]:
    """RL's best placement after ``--time-budget`` seconds of training, and its label."""
    with tempfile.TemporaryDirectory(prefix="placer-plot-") as tmp:
        config = TrainConfig(
            cluster=cluster.name,
            policy=args.policy,
            time_budget_s=args.time_budget,
            warm_start=args.warm_start,
            seed=args.seed,
            progress=False,
            logdir=tmp,
        )
        result = train(config, graph=graph, cluster=cluster)
    if result.best_placement is None:
        raise PlacerError(f"{args.source}: RL found no valid placement in {args.time_budget:g} s")
    print(
        f"RL {args.policy}: {result.best_step_time_s * 1e3:.2f} ms after {result.iterations} iterations "
        f"({result.warm_start})",
        file=sys.stderr,
    )
    return result.best_placement, f"RL {args.policy}, {args.time_budget:g} s"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        graph = resolve_graph(args.source)
        cluster = envs.resolve_cluster(args.cluster)
        if args.placement:
            placement, label = Placement.load(args.placement), os.path.basename(args.placement)
        elif args.method:
            placement, label = registry.place(args.method, graph, cluster, seed=args.seed), args.method
        else:
            placement, label = trained(graph, cluster, args)
        sim = envs.simulate(graph, placement, cluster, trace=True)
        trace = sim.extra["trace"]
        if args.trace:
            with open(args.trace, "w") as f:
                json.dump(trace, f)
        status = f"{sim.step_time_s * 1e3:.1f} ms" if sim.ok else sim.status
        title = f"{graph.name or args.source} on {cluster.name}: {label}, simulated step {status}"
        plots.plot_schedule(trace, args.output, graph=graph, color_by=args.color_by, title=title, dpi=args.dpi)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"{args.output}: {os.path.getsize(args.output) / 1024:.0f} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
