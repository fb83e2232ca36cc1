"""Tried, not kept: the pretrained critic's move search with 8 or 16 moves a round instead of 4, at equal seconds
(BENCHMARKS.md, "The pretrained critic as the default"). Usage: batch_seconds.py GRAPHS CLUSTERS SECONDS > out.json"""

import json
import sys

import bench.budget_runs as br
from bench.budget import budget_cell
from bench.budget_env import Budget
from bench.budget_runs import RUNNERS, run_moves
from bench.graph_sources import graphs_and_clusters


def with_batch(b, patience=None):
    def run(*a, **k):
        orig = br.MoveSearchOptions
        br.MoveSearchOptions = lambda **kw: orig(**kw, batch=b, **({"patience": patience} if patience else {}))
        try:
            inner = run_moves("critic", critic="pretrained", name=f"pretrained_b{b}")
        finally:
            br.MoveSearchOptions = orig
        return inner(*a, **k)

    return run


graphs, clusters = graphs_and_clusters(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "k80x4")
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 4
runners = dict(RUNNERS)
for b in (8, 16):
    runners[f"pretrained_b{b}"] = with_batch(b)
methods = ["pretrained", "pretrained_b8", "pretrained_b16", "annealing", "uniform"]
cells = []
for g in graphs:
    for c in clusters:
        cells.append(
            budget_cell(
                g,
                c,
                [Budget("seconds", secs)],
                methods=methods,
                seeds=range(8),
                runners=runners,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        )
json.dump(cells, sys.stdout)
