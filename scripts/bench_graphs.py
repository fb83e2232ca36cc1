#!/usr/bin/env python
"""Benchmark the graph layer: load and memory of a synthetic graph, coarsening, zoo capture.

    python scripts/bench_graphs.py                  # table; 100,000-op graph; all zoo models
    python scripts/bench_graphs.py --skip-capture --json

Logic lives in bench.graph_layer; memory is tracemalloc's peak (Python + numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root, for bench/


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="ops in the synthetic graph (default 100000)")
    parser.add_argument("--groups", type=int, default=256, help="max_groups for coarsening (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported (default 3)")
    parser.add_argument("--skip-capture", action="store_true", help="do not capture the zoo models")
    parser.add_argument("--models", nargs="*", default=None, help="zoo models to capture (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from bench import graph_layer as bench

    result = bench.run(
        args.ops,
        max_groups=args.groups,
        repeats=args.repeats,
        capture=not args.skip_capture,
        models=args.models,
        progress=lambda line: print(line, file=sys.stderr),
    )
    print(json.dumps(result, indent=2) if args.json else bench.format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
