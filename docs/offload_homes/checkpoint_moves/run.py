"""placer train with checkpoint moves (--checkpointing auto, --algo moves: each move may turn one layer's activation
checkpointing on or off) against the same run with --checkpointing off and against plan_with_homes (its two
searches) given the run's count of simulated placements, simulated (issue 50, 2026-11-30). Cells: llama-256k at 16
and 8 GiB (the training state fills the GPU) and llama-long at 24 GiB (the activations do). All plan within the same
memory (the cap times MEMORY_HEADROOM, as `placer place --method homes`), then are simulated at the cap. From the
repository root:

    PYTHONPATH=. python docs/offload_homes/checkpoint_moves/run.py [SECONDS [CELLS [OUT_DIR]]]

CELLS: SCENARIO:CAP_GIB,... (default the three above); NO_OFF=1 skips the run with --checkpointing off. Writes
docs/offload_homes/checkpoint_moves/<scenario>_graph.json
and, under OUT_DIR (default docs/offload_homes/checkpoint_moves), cluster_<scenario>_<cap>.json,
run_<scenario>_<cap>[_off]/summary.json and best_placement.json, result.json. Each row also has FSDP2's offload as a
plan, without and with every layer checkpointed (added with homes inside checkpointed layers, 2026-11-30).
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
CELLS = [("llama-256k", 16), ("llama-256k", 8), ("llama-long", 24)]
if len(sys.argv) > 2:
    CELLS = [(c.split(":")[0], int(c.split(":")[1])) for c in sys.argv[2].split(",")]
OUT = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else HERE
result = {"seconds": float(seconds), "cells": []}
captured = {}
for name, cap in CELLS:
    scenario = offload.SCENARIOS[name]
    if name not in captured:
        model, inputs = offload.build(scenario, meta=True)
        captured[name] = graphs.capture(model, inputs, name=scenario.name)
        graphs.save(captured[name], os.path.join(HERE, f"{name}_graph.json"))
    graph, graph_path = captured[name], os.path.join(HERE, f"{name}_graph.json")
    cluster = offload.scenario_cluster(capped(scenario, cap * GIB))
    cluster_path = os.path.join(OUT, f"cluster_{name}_{cap}.json")
    with open(cluster_path, "w") as f:  # train plans within the file's memory: the headroom plan_with_homes keeps
        json.dump(with_headroom(cluster, MEMORY_HEADROOM).to_dict(), f)
    runs = {}
    for key, extra in (("moves", []), ("off", ["--checkpointing", "off"]))[: 1 if os.environ.get("NO_OFF") else 2]:
        logdir = os.path.join(OUT, f"run_{name}_{cap}" + ("_off" if key == "off" else ""))
        subprocess.run(["rm", "-rf", logdir], check=True)
        cmd = ["placer", "train", graph_path, "--cluster", cluster_path, "--time-budget", seconds, "--logdir", logdir]
        subprocess.run([*cmd, *extra, "--json"], check=True, stdout=subprocess.DEVNULL)
        runs[key] = (
            json.load(open(os.path.join(logdir, "summary.json"))),
            Placement.load(os.path.join(logdir, "best_placement.json")),
        )
    env = envs.SimEnv(graph, cluster)
    summary, best = runs["moves"]
    n = int(summary["equal_budget_search"]["simulated"])  # every placement the run simulated, the heuristics' too
    searched = plan_with_homes(graph, cluster, evals=n, seed=0)
    fsdp = env.simulate(fsdp2_offload_plan(graph, cluster))
    fsdp_ac = env.simulate(fsdp2_offload_plan(graph, cluster, checkpoint=True))
    trained = env.simulate(best)
    off = env.simulate(runs["off"][1]) if "off" in runs else None
    row = {
        "scenario": name,
        "cap_gib": cap,
        "train": {
            "step_time_s": trained.step_time_s,
            "ok": trained.ok,
            "found_by": summary["found_by"],
            "simulated": n,
            "homed_gib": best.homed_bytes(graph) / GIB,
            "host_step": best.host_step,
            "best_heuristic": summary.get("best_heuristic"),
            "best_heuristic_step_time_s": summary.get("best_heuristic_step_time_s"),
            "ablation": summary.get("ablation"),
            "checkpoint": best.checkpoint,
            "checkpoint_pruned": best.meta.get("checkpoint_pruned"),
        },
        "train_checkpointing_off": off
        and {
            "step_time_s": off.step_time_s,
            "ok": off.ok,
            "simulated": int(runs["off"][0]["equal_budget_search"]["simulated"]),
        },
        "plan_with_homes_same_placements": {
            "step_time_s": env.simulate(searched).step_time_s,
            "ok": env.simulate(searched).ok,
            "evals": searched.meta["evals"],
            "host_step": searched.host_step,
            "checkpoint": searched.checkpoint,
            "checkpoint_search": searched.meta.get("checkpoint_search"),
        },
        "fsdp2_as_plan": {"step_time_s": fsdp.step_time_s, "ok": fsdp.ok},
        "fsdp2_every_layer_checkpointed_as_plan": {"step_time_s": fsdp_ac.step_time_s, "ok": fsdp_ac.ok},
    }
    result["cells"].append(row)
    print(json.dumps(row), flush=True)
with open(os.path.join(OUT, "result.json"), "w") as f:
    json.dump(result, f, indent=1)
