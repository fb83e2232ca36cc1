"""Print ab.sh's figures: each profile's calibration compute per rank (M = 8), the plan simulated on it, and each run's
measured compute per rank (forward and backward actions) and step.

    PYTHONPATH=. python docs/ranks/fidelity_v/drift/ab.py
"""

import json
from pathlib import Path

import envs
from envs.sim.ranks import RankSim
from envs.timeline import rank_phases
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent
g = resolve_graph("bench.rank_models:unet")
plan = Placement.load(str(D.parent / "plan_unet_gpipe_equal.json"))
for i in (1, 2):
    res, events = RankSim(g, envs.resolve_cluster(str(D / f"ranks_{i}.json"))).timeline(plan)
    sim = {r: round((p["forward_s"] + p["backward_s"]) * 1e3, 1) for r, p in rank_phases(events).items()}
    parts = json.loads((D / f"profile_{i}.json").read_text())["measured"]
    calibration = [
        round((run["phases"]["forward_s"] + run["phases"]["backward_s"]) * 1e3, 1)
        for p in parts
        for run in p["pipelines"]
        if run["microbatches"] == 8
    ]
    print(
        f"profile {i}: calibration compute per rank at M = 8 {calibration} ms; the plan simulated "
        f"{res.step_time_s * 1e3:.1f} ms, compute per rank {sim}"
    )
    for j in (1, 2):
        run = json.loads((D / f"run_{i}_{j}.json").read_text())
        compute = [round((r["phases"]["forward_s"] + r["phases"]["backward_s"]) * 1e3, 1) for r in run["ranks"]]
        print(f"  run {j}: step {run['step_time_s'] * 1e3:.1f} ms, compute per rank {compute}")
