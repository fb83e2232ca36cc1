"""The pretrained critic's move search with one MoveSearchOptions field varied, in bench.budget's harness
(BENCHMARKS.md, "The pretrained critic as the default"): what was checked and not kept.

    PYTHONPATH=. python docs/critic/default/tried/variants.py nmt-2 k80x4 evals=10000 module_share=0,0.1 > out.json
    PYTHONPATH=. python docs/critic/default/tried/variants.py moe-300-0 k80x4 seconds=4 batch=8,16 > out.json

Each value is a method ``pretrained_<short><value>`` (``ms`` for module_share, ``b`` for batch) beside the default
``pretrained``; with a budget of seconds, annealing and uniform too. 8 seeds; the cells as JSON on stdout.
"""

import json
import sys

from bench.budget import budget_cell
from bench.budget_env import Budget
from bench.budget_runs import RUNNERS, run_moves
from bench.graph_sources import graphs_and_clusters

SHORT = {"module_share": ("ms", float), "batch": ("b", int)}

graphs, clusters = graphs_and_clusters(sys.argv[1], sys.argv[2])
kind, budgets = sys.argv[3].split("=")
field, values = sys.argv[4].split("=")
short, cast = SHORT[field]
runners = dict(RUNNERS)
methods = ["pretrained"]
for value in (cast(v) for v in values.split(",")):
    name = f"pretrained_{short}{value}"
    runners[name] = run_moves("critic", critic="pretrained", name=name, **{field: value})
    methods.append(name)
if kind == "seconds":
    methods += ["annealing", "uniform"]
cells = [
    budget_cell(
        g,
        c,
        [Budget(kind, float(b) if kind == "seconds" else int(b)) for b in budgets.split(",")],
        methods=methods,
        seeds=range(8),
        runners=runners,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    for g in graphs
    for c in clusters
]
json.dump(cells, sys.stdout)
