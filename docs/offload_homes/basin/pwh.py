"""plan_with_homes on one cell of the offload scenario, simulated, one JSON line (issue 50, thirty-fourth session:
"The homed start's basin" in BENCHMARKS.md). From the repository root:

    PYTHONPATH=. python docs/offload_homes/basin/pwh.py SCENARIO CAP_GIB EVALS [SEED [PROPOSALS]]

PROPOSALS: critic (the default, the search as shipped) or uniform (its ablation: every move drawn uniformly). The
graph is docs/offload_homes/checkpoint_moves/<SCENARIO>_graph.json (written by run.py there). SAVE=plan.json keeps
the plan.
"""

import functools
import json
import os
import sys
import time

import envs
import graphs
from bench import offload
from bench.offload_homes import capped
from placer.learn import move_search, offload_plan

GIB = 1 << 30
name, cap, evals = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
proposals = sys.argv[5] if len(sys.argv) > 5 else "critic"
offload_plan.MoveSearchOptions = functools.partial(move_search.MoveSearchOptions, proposals=proposals)
graph = graphs.load(f"docs/offload_homes/checkpoint_moves/{name}_graph.json")
cluster = offload.scenario_cluster(capped(offload.SCENARIOS[name], cap * GIB))
t0 = time.perf_counter()
plan = offload_plan.plan_with_homes(graph, cluster, evals=evals, seed=seed)
result = envs.SimEnv(graph, cluster).simulate(plan)  # at the cap; the plan's own host_step
if os.environ.get("SAVE"):
    plan.save(os.environ["SAVE"])
row = {
    "cell": f"{name}:{cap}",
    "evals": evals,
    "seed": seed,
    "proposals": proposals,
    "step_s": round(result.step_time_s, 4),
    "ok": result.ok,
    "host_step": plan.host_step,
    "homed_gib": round(plan.homed_bytes(graph) / GIB, 2),
    "secs": round(time.perf_counter() - t0, 1),
}
print(json.dumps(row), flush=True)
