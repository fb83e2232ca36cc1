"""plan_with_homes with each way of choosing the checkpointed layers ("moves", "both", or "none": no
checkpointing), on cells SCENARIO:CAP_GIB, at one budget of placements and a few seeds, simulated; one JSON row per
cell and seed on stdout. From the repository root:

    PYTHONPATH=. python docs/offload_homes/checkpoint_moves/cmp3.py llama-256k:16,llama-long:24 2000 0,1,2 moves,both

A fifth argument N sets the move search's MODULE_MIN_EVALS to N (default 1000): module_search's share of a search
then runs from N placements up (an experiment, not placer's default).
"""

import json
import sys
import time

import envs
import graphs
import placer.learn.move_search
from bench import offload
from bench.offload_homes import GIB, capped
from placer.learn.offload_plan import plan_with_homes

if len(sys.argv) > 5:
    placer.learn.move_search.MODULE_MIN_EVALS = int(sys.argv[5])

cells = [c.split(":") for c in sys.argv[1].split(",")]
evals = int(sys.argv[2])
seeds = [int(s) for s in sys.argv[3].split(",")]
bys = sys.argv[4].split(",")
graphs_ = {}
for name, cap in cells:
    sc = offload.SCENARIOS[name]
    if name not in graphs_:
        m, i = offload.build(sc, meta=True)
        graphs_[name] = graphs.capture(m, i, name=sc.name)
    g = graphs_[name]
    cl = offload.scenario_cluster(capped(sc, int(float(cap) * GIB)))
    env = envs.SimEnv(g, cl)
    for seed in seeds:
        row = {"cell": f"{name}:{cap}", "seed": seed, "evals": evals}
        for by in bys:
            t = time.time()
            kw = dict(checkpoint=False) if by == "none" else dict(checkpoint_by=by)
            p = plan_with_homes(g, cl, evals=evals, seed=seed, **kw)
            s = env.simulate(p)
            row[by] = [
                round(s.step_time_s, 4) if s.ok else None,
                len(p.checkpoint),
                p.meta["evals"],
                round(time.time() - t, 1),
            ]
        print(json.dumps(row), flush=True)
