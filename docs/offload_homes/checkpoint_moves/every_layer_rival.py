"""The rival users reach for first: every op on the GPU and every layer checkpointed (Hugging Face's
``gradient_checkpointing_enable()``), simulated on each cell of this directory's tables, beside the plans found there
(the medians in ``plan_2k.jsonl``, ``other_models.jsonl``). One JSON row per cell. From the repository root:

    PYTHONPATH=. python docs/offload_homes/checkpoint_moves/every_layer_rival.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

import envs
import graphs
from bench import offload
from bench.offload_homes import GIB, capped
from graphs.plan import Placement
from placer.learn.checkpoint_choice import candidate_blocks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from other_models import bert_large, gpt2_medium  # noqa: E402


def every_layer(g, cluster):
    p = Placement.from_indices(g, cluster.device_names, np.full(g.num_ops, cluster.gpu_indices()[0]))
    p.checkpoint = candidate_blocks(g)
    r = envs.SimEnv(g, cluster).simulate(p)
    return {"step_time_s": r.step_time_s if r.ok else None, "peak_gib": r.peak_bytes["gpu:0"] / GIB, "fits": r.ok}


def main() -> None:
    for name, caps in (("llama-256k", (16, 8)), ("llama-3b", (16,)), ("llama-long", (24, 16, 8))):
        model, inputs = offload.build(offload.SCENARIOS[name], meta=True)
        g = graphs.capture(model, inputs, name=name)
        for cap in caps:
            cluster = offload.scenario_cluster(capped(offload.SCENARIOS[name], cap * GIB))
            print(json.dumps({"cell": f"{name}:{cap}", **every_layer(g, cluster)}), flush=True)
    base = offload.SCENARIOS["llama-256k"]
    here = os.path.dirname(os.path.abspath(__file__))
    caps: dict[str, set[float]] = {}  # the caps other_models.py planned at, per model
    for line in open(os.path.join(here, "other_models.jsonl")):
        row = json.loads(line)
        caps.setdefault(row["model"], set()).add(row["cap_gib"])
    for name, build in (("gpt2-medium", gpt2_medium), ("bert-large", bert_large)):
        model, inputs = build()
        g = graphs.capture(model, inputs, name=name)
        for cap in sorted(caps[name], reverse=True):
            cluster = offload.scenario_cluster(dataclasses.replace(base, name=name, gpu_cap_bytes=int(cap * GIB)))
            print(json.dumps({"cell": f"{name}:{cap:.1f}", **every_layer(g, cluster)}), flush=True)


if __name__ == "__main__":
    main()
