"""``placer graphs``: the model zoo with op counts, parameters and forward FLOPs."""

from __future__ import annotations

import argparse
import sys

from graphs import zoo
from placer.cli.output import count, flops, print_json, table


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graphs", help="list the model zoo with op counts", description=run.__doc__)
    p.add_argument("--decompose", action="store_true", help="count ops after decomposition to core ATen")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List the zoo's models with op counts, parameters and forward FLOPs.

    The first run captures every model (about a minute each for the LSTM
    models); later runs read the cache.
    """
    rows = zoo.info(decompose=args.decompose, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print_json(rows, indent=2)
        return 0
    cells = [["name", "ops", "edges", "params", "fwd FLOPs", "description"]]
    for r in rows:
        cells.append(
            [r["name"], f"{r['ops']:,}", f"{r['edges']:,}", count(r["params"]), flops(r["flops"]), r["description"]]
        )
    print(table(cells, right={1, 2, 3, 4}))
    return 0
