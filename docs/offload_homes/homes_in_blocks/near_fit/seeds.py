"""placer train (60 s) and plan_with_homes at the run's count of placements on llama-long at 8 GiB, seeds 1 and 2
(seed 0: run.out), simulated. From the repository root:

    PYTHONPATH=. python docs/offload_homes/homes_in_blocks/near_fit/seeds.py
"""

import json
import subprocess

import envs
import graphs
from bench import offload
from bench.offload_homes import GIB, capped
from graphs.plan import Placement
from placer.learn.offload_plan import plan_with_homes

name, cap = "llama-long", 8
sc = offload.SCENARIOS[name]
g = graphs.load("docs/offload_homes/checkpoint_moves/llama-long_graph.json")
cluster = offload.scenario_cluster(capped(sc, cap * GIB))
env = envs.SimEnv(g, cluster)
for seed in (1, 2):
    logdir = f"/tmp/tr8_{seed}"
    subprocess.run(["rm", "-rf", logdir], check=True)
    subprocess.run(
        [
            "placer",
            "train",
            "docs/offload_homes/checkpoint_moves/llama-long_graph.json",
            "--cluster",
            "docs/offload_homes/homes_in_blocks/near_fit/cluster_llama-long_8.json",
            "--time-budget",
            "60",
            "--seed",
            str(seed),
            "--logdir",
            logdir,
            "--json",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    summary = json.load(open(f"{logdir}/summary.json"))
    best = Placement.load(f"{logdir}/best_placement.json")
    n = int(summary["equal_budget_search"]["simulated"])
    p = plan_with_homes(g, cluster, evals=n, seed=seed)
    print(
        json.dumps(
            {
                "seed": seed,
                "placements": n,
                "train": env.simulate(best).step_time_s,
                "plan_with_homes": env.simulate(p).step_time_s,
            }
        ),
        flush=True,
    )
