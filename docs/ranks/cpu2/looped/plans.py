"""Looped plans (2 stages per rank) of a model, written for an A/B of where their receives are posted.

    python docs/ranks/cpu2/looped/plans.py MODEL CLUSTER OPS OUT_DIR

MODEL a bench.rank_splits model name; CLUSTER and OPS its `placer profile --ranks 2` and `placer profile` files.
Writes OUT_DIR/looped_MODEL.json, stage_search's best looped plan over the shapes (M, W) of the simulator of ranks
(looped BFS, W = M, or interleaved 1F1B), and OUT_DIR/one_MODEL.json, stage_search's plan at one stage per rank
at the same M, and prints both simulated steps.
"""

import sys

from bench.rank_splits import MODELS, model_graph
from envs.cluster import resolve_cluster
from envs.sim.ranks import PIPELINE_SHAPES, RankSim
from graphs.plan import Placement
from placer.methods import registry

name, cluster_path, ops_path, out = sys.argv[1:5]
graph = model_graph(MODELS[name], ops_path)
cluster = resolve_cluster(cluster_path)
sim = RankSim(graph, cluster)
fn = registry.get("stage_search")
best = {}
for per_rank in (1, 2):
    for M, W in PIPELINE_SHAPES:
        if M < 2:
            continue
        shape = type("Shape", (), {"microbatches": M, "inflight": W})()
        devices = fn(graph, cluster, env=shape, stages_per_rank=per_rank)
        plan = Placement.from_indices(
            graph, cluster.device_names, devices, method="stage_search", microbatches=M, inflight=W
        )
        res = sim.evaluate([plan])[0]
        print(
            f"stages per rank {per_rank}  M={M} W={W}  {res.extra.get('schedule')}  "
            f"sim {res.step_time_s * 1e3:.1f} ms" + ("" if res.ok else "  (does not run)")
        )
        if res.ok and (per_rank not in best or res.step_time_s < best[per_rank][1]):
            best[per_rank] = (plan, res.step_time_s)
for per_rank, tag in ((2, "looped"), (1, "one")):
    plan, s = best[per_rank]
    plan.save(f"{out}/{tag}_{name}.json")
    print(f"{tag}: M={plan.microbatches} W={plan.inflight} sim {s * 1e3:.1f} ms -> {out}/{tag}_{name}.json")
