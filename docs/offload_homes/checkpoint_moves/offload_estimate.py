"""Would activation offload pay where placer checkpoints? An estimate from the simulator, per cell of this
directory's tables (issue 50, item 2: "activation offload if it pays").

For the plan `plan_with_homes` finds (2,000 placements, seed 0) with its checkpointed layers, it prints:

* ``checkpointed_s``: the plan's simulated step (the second forwards included);
* ``no_recompute_s``: the same placement and homes with no layer checkpointed and the GPU's memory unlimited: the
  step an offload that hid every copy would give (the most offloading instead of recomputing can gain);
* ``offload_bytes``: the activations those layers keep for the backward (``graphs.ops.saved_mask``, views left out), and
  ``transfer_s``: their time out to the host and back over the cluster's link;
* ``synchronous_s`` = ``no_recompute_s + transfer_s``: torch's ``save_on_cpu`` copies on the compute stream, so the
  step pays every copy.

From the repository root: ``PYTHONPATH=. python docs/offload_homes/checkpoint_moves/offload_estimate.py``
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
from graphs.ops import saved_mask, view_mask
from graphs.plan import checkpoint_blocks
from placer.learn.offload_plan import plan_with_homes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from other_models import bert_large, gpt2_medium  # noqa: E402


def estimate(name: str, g, cluster) -> dict:
    p = plan_with_homes(g, cluster, evals=2000, seed=0)
    env = envs.SimEnv(g, cluster)
    checkpointed = env.simulate(p).step_time_s
    roomy = dataclasses.replace(cluster, devices=[dataclasses.replace(d, memory_bytes=1e15) for d in cluster.devices])
    plain = dataclasses.replace(p, checkpoint=[])
    no_recompute = envs.SimEnv(g, roomy).simulate(plain).step_time_s
    inside = checkpoint_blocks(g, p.checkpoint) >= 0 if p.checkpoint else np.zeros(g.num_ops, dtype=bool)
    nbytes = float(g.out_bytes[inside & saved_mask(g) & ~view_mask(g)].sum())  # views alias, take none
    link = cluster.links[("gpu:0", "cpu:0")]
    transfer = 2 * (link.latency_s + nbytes / link.bandwidth_bytes_per_s)
    return {
        "cell": name,
        "layers": len(p.checkpoint),
        "checkpointed_s": checkpointed,
        "no_recompute_s": no_recompute,
        "offload_gib": nbytes / GIB,
        "transfer_s": transfer,
        "synchronous_s": no_recompute + transfer,
        "best_case_gain": checkpointed / no_recompute,
        "synchronous_gain": checkpointed / (no_recompute + transfer),
    }


def main() -> None:
    for name, cap in (("llama-long", 24), ("llama-256k", 16), ("llama-3b", 16)):
        model, inputs = offload.build(offload.SCENARIOS[name], meta=True)
        g = graphs.capture(model, inputs, name=name)
        print(
            json.dumps(
                estimate(f"{name}:{cap}", g, offload.scenario_cluster(capped(offload.SCENARIOS[name], cap * GIB)))
            )
        )
    base = offload.SCENARIOS["llama-256k"]
    for name, build, cap in (("gpt2-medium", gpt2_medium, 24.5), ("bert-large", bert_large, 12.6)):
        model, inputs = build()
        g = graphs.capture(model, inputs, name=name)
        cluster = offload.scenario_cluster(dataclasses.replace(base, name=name, gpu_cap_bytes=int(cap * GIB)))
        print(json.dumps(estimate(f"{name}:{cap}", g, cluster)), flush=True)


if __name__ == "__main__":
    main()
