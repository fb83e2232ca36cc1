"""Homes inside checkpointed layers on models placer was not written or tuned on, where neither the activations nor
the training state fit: GPT-2 medium's shape and BERT-large's (docs/offload_homes/checkpoint_moves/other_models.py
builds them on the meta device), on the offload scenario's machine with the GPU capped at 1/4 and 1/8 of the model's
all-on-GPU simulated peak. Per model and cap, every plan of `python -m bench.offload_homes` (bench.offload_homes.
cap_plans, 2,000 placements, seed 0: placer's plan with homes and checkpointing, without checkpointing, op placement
only, FSDP2's offload as a plan without and with every layer checkpointed, accelerate's maps, all on the host), and
placer's plan again at seeds 1 and 2; simulated. One JSON row per model and cap. From this folder:

    PYTHONPATH=../../.. python other_models.py > other_models.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

import numpy as np

import envs
import graphs
from bench import offload, offload_homes
from graphs.plan import Placement
from placer.learn.offload_plan import plan_with_homes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint_moves"))
from other_models import bert_large, gpt2_medium  # noqa: E402

GIB = 1 << 30


def main() -> None:
    base = offload.SCENARIOS["llama-256k"]
    for name, build in (("gpt2-medium", gpt2_medium), ("bert-large", bert_large)):
        model, inputs = build()
        g = graphs.capture(model, inputs, name=name)
        roomy = offload.scenario_cluster(dataclasses.replace(base, name=name, gpu_cap_bytes=10**15))
        all_gpu = Placement.from_indices(g, roomy.device_names, np.full(g.num_ops, 1))
        peak = envs.SimEnv(g, roomy).simulate(all_gpu).peak_bytes["gpu:0"]
        for share in (0.25, 0.125):
            cap = int(peak * share)
            cluster = offload.scenario_cluster(dataclasses.replace(base, name=name, gpu_cap_bytes=cap))
            env = envs.SimEnv(g, cluster)
            plans = offload_homes.cap_plans(g, cluster, model, evals=2000, seed=0)
            rows = [offload_homes.row(p, g) for p in plans]
            seeds = [rows[0]["sim_step_time_s"] if rows[0]["sim_status"] == "ok" else None]
            for seed in (1, 2):
                r = env.simulate(plan_with_homes(g, cluster, evals=2000, seed=seed))
                seeds.append(r.step_time_s if r.ok else None)
            ok = [t for t in seeds if t is not None]
            doc = {
                "model": name,
                "state_gib": g.total_param_bytes * 4 / GIB,
                "all_gpu_peak_gib": peak / GIB,
                "cap_gib": cap / GIB,
                "placer_seeds_s": seeds,
                "placer_median_s": statistics.median(ok) if ok else None,
                "rows": rows,
                "ratios": offload_homes.ratios(rows),
            }
            print(json.dumps(doc, default=float), flush=True)


if __name__ == "__main__":
    main()
