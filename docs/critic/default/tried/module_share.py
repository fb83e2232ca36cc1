"""Checked: the pretrained critic's move search with module_share 0.2 (the default), 0 and 0.1 at a budget of
placements (BENCHMARKS.md, "The pretrained critic as the default"). Usage: module_share.py GRAPHS CLUSTERS EVALS"""

import json
import sys

import bench.budget_runs as br
from bench.budget import budget_cell
from bench.budget_env import Budget
from bench.budget_runs import RUNNERS, run_moves
from bench.graph_sources import graphs_and_clusters


def with_share(share):
    def run(*a, **k):
        orig = br.MoveSearchOptions
        br.MoveSearchOptions = lambda **kw: orig(**kw, module_share=share)
        try:
            inner = run_moves("critic", critic="pretrained", name=f"pretrained_ms{share}")
        finally:
            br.MoveSearchOptions = orig
        return inner(*a, **k)

    return run


graphs, clusters = graphs_and_clusters(sys.argv[1], sys.argv[2])
evals = [int(x) for x in sys.argv[3].split(",")]
runners = dict(RUNNERS)
for s in (0.0, 0.1):
    runners[f"pretrained_ms{s}"] = with_share(s)
methods = ["pretrained", "pretrained_ms0.0", "pretrained_ms0.1"]
cells = []
for g in graphs:
    for c in clusters:
        cells.append(
            budget_cell(
                g,
                c,
                [Budget("evals", e) for e in evals],
                methods=methods,
                seeds=range(8),
                runners=runners,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        )
json.dump(cells, sys.stdout)
