"""plan_with_homes' ways of choosing checkpointed layers on models the checkpoint moves were not written or tuned on:
GPT-2 medium's shape (24 layers, width 1024, batch 8 x 1024 tokens) and BERT-large's (24 layers, width 1024,
masked LM, batch 16 x 512), built from transformers configs on the meta device, on the offload scenario's machine
(bench.offload.scenario_cluster: 16 host cores, one H100) with the GPU capped at 1/2 and 3/4 of the model's all-on-GPU
simulated peak; 2,000 placements, seeds 0-2, simulated. One JSON row per model, cap and seed. From the repository
root:

    cd docs/offload_homes/checkpoint_moves && PYTHONPATH=../../.. python other_models.py > other_models.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import torch

import envs
import graphs
from bench import offload
from graphs.models.corpus import LossOf, load_transformers
from graphs.plan import Placement
from placer.learn.checkpoint_choice import candidate_blocks
from placer.learn.offload_plan import plan_with_homes

GIB = 1 << 30


def gpt2_medium():
    t = load_transformers()
    config = t.GPT2Config(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024)
    with torch.device("meta"):
        model = LossOf(t.GPT2LMHeadModel(config)).eval()
    ids = torch.randint(0, 50257, (8, 1024), generator=torch.Generator().manual_seed(1))
    return model, (ids, ids.clone())


def bert_large():
    t = load_transformers()
    config = t.BertConfig(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096)
    with torch.device("meta"):
        model = LossOf(t.BertForMaskedLM(config)).eval()
    ids = torch.randint(0, config.vocab_size, (16, 512), generator=torch.Generator().manual_seed(1))
    return model, (ids, ids.clone())


def main() -> None:
    base = offload.SCENARIOS["llama-256k"]
    for name, build in (("gpt2-medium", gpt2_medium), ("bert-large", bert_large)):
        model, inputs = build()
        g = graphs.capture(model, inputs, name=name)
        roomy = offload.scenario_cluster(dataclasses.replace(base, name=name, gpu_cap_bytes=10**15))
        peak = (
            envs.SimEnv(g, roomy)
            .simulate(Placement.from_indices(g, roomy.device_names, np.full(g.num_ops, 1)))
            .peak_bytes["gpu:0"]
        )
        for share in (0.75, 0.5):
            cap = int(peak * share)
            cluster = offload.scenario_cluster(dataclasses.replace(base, name=name, gpu_cap_bytes=cap))
            env = envs.SimEnv(g, cluster)
            for seed in (0, 1, 2):
                row = {
                    "model": name,
                    "ops": g.num_ops,
                    "layers": len(candidate_blocks(g)),
                    "state_gib": g.total_param_bytes * 4 / GIB,
                    "all_gpu_peak_gib": peak / GIB,
                    "cap_gib": cap / GIB,
                    "seed": seed,
                }
                for by in ("moves", "both", "none"):
                    t0 = time.time()
                    kw = {"checkpoint": False} if by == "none" else {"checkpoint_by": by}
                    p = plan_with_homes(g, cluster, evals=2000, seed=seed, **kw)
                    r = env.simulate(p)
                    row[by] = [r.step_time_s if r.ok else None, len(p.checkpoint), p.meta["evals"], time.time() - t0]
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
