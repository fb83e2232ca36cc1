#!/usr/bin/env python
"""How cost grows with graph size: save/load, coarsening, one training iteration, memory.

    python scripts/bench_scale.py                        # 1,000 / 10,000 / 100,000 ops
    python scripts/bench_scale.py --sizes 1000,10000 --json

Each size runs in a fresh Python process so its peak RSS (ru_maxrss) is its own.
The growth exponent b fits cost ~ ops**b between the two largest sizes (1: linear).
Logic lives in bench.scale.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root, for bench/

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    from bench import scale
    from bench.common import machine_line, parse_list
    from graphs import PlacerError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated op counts")
    parser.add_argument("--samples", type=int, default=8, help="K placements per iteration (default 8)")
    parser.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")
    parser.add_argument("--policies", default="seq2seq,hierarchical", help="policies to time (default both)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown")
    args = parser.parse_args(argv)
    try:
        sizes = []
        for s in parse_list(args.sizes, what="sizes"):
            if not s.isdigit() or int(s) < 2:
                raise PlacerError(f"--sizes: {s!r} is not an op count >= 2")
            sizes.append(int(s))
        policies = parse_list(args.policies, what="policies")
        rows = scale.run(
            sizes,
            samples=args.samples,
            cluster=args.cluster,
            policies=policies,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {"machine": machine_line(), "memory_measure": "ru_maxrss of a fresh process per size", "rows": rows},
                indent=2,
            )
        )
    else:
        print(scale.markdown_table(rows))
        print(
            f"\nK = {args.samples} samples on {args.cluster}; times in wall-clock seconds (fastest of 2 "
            "iterations after a first one); "
            f"memory: peak RSS (ru_maxrss) of a fresh process per size. Machine: {machine_line()}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
