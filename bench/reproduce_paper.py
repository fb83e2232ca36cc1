"""Reproduce the paper's Table 1 in the simulator: heuristics, RL (seq2seq, hierarchical), the bound.

    python -m bench.reproduce_paper  # 4 models x (k80x2, k80x4, v100x4, h100x8), < 1 h on 2 cores
    python -m bench.reproduce_paper --graphs nmt-2 --clusters k80x4 --time-budget 20
    python -m bench.reproduce_paper --json > table1.json

Progress goes to stderr, the markdown table to stdout (or --out FILE.md); --json
prints the numbers instead. The rows and tables are :mod:`bench.table1`'s.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import argparse
import json
import shlex
import sys
import time

from bench import table1
from bench.common import OneLineParser, machine_line, parse_list
from graphs import PlacerError
from policies import POLICIES

#: Seconds per RL run. 16 (model, cluster) pairs x 2 policies x 45 s (24 min), plus the
#: heuristics and each run's setup and warm start (~40-60 s per pair measured with 2 models
#: x 4 clusters at --time-budget 20 on a loaded 2-core machine), finish within an hour.
DEFAULT_BUDGET_S = 45.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m bench.reproduce_paper", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--time-budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="S",
        help=f"seconds of training per RL run (default {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--graphs",
        default=",".join(table1.PAPER_GRAPHS),
        help="comma-separated zoo names or graph files (default: the paper's four models)",
    )
    parser.add_argument(
        "--clusters",
        default=",".join(table1.PAPER_CLUSTERS + table1.MODERN_CLUSTERS),
        help="comma-separated cluster presets or JSON files (default: k80x2,k80x4,v100x4,h100x8)",
    )
    parser.add_argument("--policies", default=",".join(table1.RL_POLICIES), help="RL policies to train (default: both)")
    parser.add_argument(
        "--warm-start",
        choices=("best", "none"),
        default="best",
        help="RL starts by imitating the best heuristic (default, as placer train) or from scratch",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ilp-time-limit",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds for the ilp heuristic's solver per (model, cluster) (default 60)",
    )
    parser.add_argument(
        "--executor",
        choices=("dataflow", "eager"),
        default="dataflow",
        help="simulator executor model (default dataflow: the paper's TensorFlow setting; "
        "eager is the PyTorch runtime placer.apply builds)",
    )
    parser.add_argument("--logdir", default=None, help="keep the RL runs' TensorBoard logs here (default: discarded)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of markdown")
    parser.add_argument("--out", default=None, metavar="FILE.md", help="also write the markdown report to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if args.time_budget <= 0:
            raise PlacerError(f"--time-budget {args.time_budget:g}: must be positive")
        graphs = parse_list(args.graphs, what="graphs")
        clusters = parse_list(args.clusters, what="clusters")
        policies = parse_list(args.policies, what="policies", known=list(POLICIES))
        pairs = len(graphs) * len(clusters)
        say(
            f"{pairs} (model, cluster) pairs x {len(policies)} RL runs of {args.time_budget:g} s: "
            f"at least {pairs * len(policies) * args.time_budget / 60:.0f} min of training"
        )
        t0 = time.perf_counter()
        rows = table1.run_table1(
            graphs,
            clusters,
            rl_budget_s=args.time_budget,
            policies=policies,
            seed=args.seed,
            warm_start=args.warm_start,
            logdir=args.logdir,
            progress=say,
            executor=args.executor,
            compare_options={"ilp": {"time_limit_s": args.ilp_time_limit}},
        )
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    say(f"done in {(time.perf_counter() - t0) / 60:.1f} min")
    command = "python -m bench.reproduce_paper " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    text = table1.markdown_report(
        rows, budget_s=args.time_budget, warm_start=args.warm_start, seed=args.seed, command=command.strip()
    )
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            print(f"error: {args.out}: cannot write ({e.strerror})", file=sys.stderr)
            return 2
    if args.json:
        print(
            json.dumps(
                {
                    "machine": machine_line(),
                    "time_budget_s": args.time_budget,
                    "warm_start": args.warm_start,
                    "seed": args.seed,
                    "rows": [r.to_dict() for r in rows],
                },
                indent=2,
            )
        )
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
