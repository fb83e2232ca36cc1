"""plan_with_homes with its home moves drawn uniformly ("uniform", placer's default) or ranked by their own critic
("ranked": ``MoveSearchOptions.rank_homes``), on cells SCENARIO:CAP_GIB, at one budget of placements and a few
seeds, simulated; one JSON row per cell and seed on stdout (step time, placements, seconds). From the repository
root:

    PYTHONPATH=. python docs/offload_homes/home_critic/cmp.py llama-3b:8,llama-long:8 2000 0,1,2
"""

import dataclasses
import json
import sys
import time

import envs
import graphs
from bench import offload
from bench.offload_homes import GIB, capped
from placer.learn import move_search
from placer.learn.offload_plan import plan_with_homes

cells = [c.split(":") for c in sys.argv[1].split(",")]
evals = int(sys.argv[2])
seeds = [int(s) for s in sys.argv[3].split(",")]
init = move_search.MoveSearch.__init__
RANKED = {"on": False}


def patched(self, graph, cluster, env, *, options=None, **kwargs):
    options = dataclasses.replace(options or move_search.MoveSearchOptions(), rank_homes=RANKED["on"])
    init(self, graph, cluster, env, options=options, **kwargs)


move_search.MoveSearch.__init__ = patched
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
        for by, on in (("uniform", False), ("ranked", True)):
            RANKED["on"] = on
            t = time.time()
            p = plan_with_homes(g, cl, evals=evals, seed=seed)
            s = env.simulate(p)
            row[by] = [round(s.step_time_s, 4) if s.ok else None, p.meta["evals"], round(time.time() - t, 1)]
        print(json.dumps(row), flush=True)
