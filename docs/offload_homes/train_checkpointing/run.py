"""placer train's plan with homes and checkpointed layers (--homes auto, --checkpointing auto) against the same run
with --checkpointing off and against plan_with_homes given the same placements, on the offload scenario at 16 and
8 GiB, simulated (issue 50, 2026-11-30, later). All plan within the same memory (the cap times MEMORY_HEADROOM, as
`placer place --method homes`); all are then simulated at the cap. Run from the repository root:

    PYTHONPATH=. python docs/offload_homes/train_checkpointing/run.py [SECONDS]

Writes docs/offload_homes/train_checkpointing/{graph.json, cluster_<cap>.json, run_<cap>[_off]/summary.json,
result.json}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import envs
import graphs
from bench import offload
from bench.offload_homes import capped, fsdp2_offload_plan
from graphs.plan import Placement
from placer.learn.offload_plan import plan_with_homes, with_headroom
from placer.methods.heuristics.costs import MEMORY_HEADROOM

GIB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))
seconds = sys.argv[1] if len(sys.argv) > 1 else "60"
scenario = offload.SCENARIOS["llama-256k"]
model, inputs = offload.build(scenario, meta=True)
graph = graphs.capture(model, inputs, name=scenario.name)
graph_path = os.path.join(HERE, "graph.json")
graphs.save(graph, graph_path)
result = {"scenario": scenario.name, "ops": graph.num_ops, "seconds": float(seconds), "caps": []}
for cap in (16, 8):
    cluster = offload.scenario_cluster(capped(scenario, cap * GIB))
    # train plans within the cluster file's memory: the file holds the headroom that plan_with_homes keeps
    cluster_path = os.path.join(HERE, f"cluster_{cap}.json")
    with open(cluster_path, "w") as f:
        json.dump(with_headroom(cluster, MEMORY_HEADROOM).to_dict(), f)
    off_dir = os.path.join(HERE, f"run_{cap}_off")
    for logdir, extra in ((os.path.join(HERE, f"run_{cap}"), []), (off_dir, ["--checkpointing", "off"])):
        subprocess.run(["rm", "-rf", logdir], check=True)
        cmd = ["placer", "train", graph_path, "--cluster", cluster_path, "--time-budget", seconds, "--logdir", logdir]
        subprocess.run([*cmd, *extra, "--json"], check=True, stdout=subprocess.DEVNULL)
    logdir = os.path.join(HERE, f"run_{cap}")
    off = Placement.load(os.path.join(off_dir, "best_placement.json"))
    summary = json.load(open(os.path.join(logdir, "summary.json")))
    best = Placement.load(os.path.join(logdir, "best_placement.json"))
    env = envs.SimEnv(graph, cluster)
    trained = env.simulate(best)
    n = int(summary["equal_budget_search"]["simulated"])  # every placement the run simulated, the heuristics' too
    searched = plan_with_homes(graph, cluster, evals=n, seed=0)
    fsdp = env.simulate(fsdp2_offload_plan(graph, cluster))
    row = {
        "cap_gib": cap,
        "train": {
            "step_time_s": trained.step_time_s,
            "ok": trained.ok,
            "found_by": summary["found_by"],
            "simulated": n,
            "homed_params": len(best.param_homes),
            "homed_gib": best.homed_bytes(graph) / GIB,
            "checkpoint": best.checkpoint,
            "checkpoint_pruned": best.meta.get("checkpoint_pruned"),
            "best_heuristic": summary["best_heuristic"],
            "equal_budget_search": summary.get("equal_budget_search"),
        },
        "move_search_homes_same_placements": {
            "step_time_s": env.simulate(searched).step_time_s,
            "ok": env.simulate(searched).ok,
            "evals": n,
        },
        "fsdp2_as_plan": {"step_time_s": fsdp.step_time_s, "ok": fsdp.ok},
        "train_checkpointing_off": {"step_time_s": env.simulate(off).step_time_s, "ok": env.simulate(off).ok},
    }
    result["caps"].append(row)
    print(json.dumps(row, indent=1), flush=True)
with open(os.path.join(HERE, "result.json"), "w") as f:
    json.dump(result, f, indent=1)
