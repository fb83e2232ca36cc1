"""Is the looped plan's gap the lockstep of torch's looped schedules? Run from the repository root:

    PYTHONPATH=. python docs/ranks/cpu2/looped/lockstep.py

Times the encoder-decoder's looped plan (looped_encoder_decoder.json) slot by slot in torch's ScheduleLoopedBFS
order, idle slots kept: each time step ends when this rank's action and every message of that step between it and
its neighbour are through. Prints the stages' costs, the simulator's step and the lockstep's end per rank.
"""

import numpy as np

from bench.rank_splits import MODELS, model_graph
from envs.cluster import resolve_cluster
from envs.real.distributed.cut import StageCutter
from envs.sim.rank_actions import torch_order
from envs.sim.ranks import RankSim, stage_costs
from graphs.plan import Placement

E = "docs/ranks/cpu2/early"
g = model_graph(MODELS["encoder_decoder"], f"{E}/ops_encoder_decoder.json")
c = resolve_cluster(f"{E}/ranks_encoder_decoder.json")
p = Placement.load("docs/ranks/cpu2/looped/looped_encoder_decoder.json")
dev = p.indices(g, c.device_names)
M = p.microbatches
stages = StageCutter(g, c.device_names)(dev, None)
sim = RankSim(g, c)
costs = stage_costs(g, c, stages, M, sim.per_op(M))
print(
    "stages",
    costs.ranks,
    "fwd",
    np.round(np.array(costs.fwd_s) * 1e3, 1),
    "bwd",
    np.round(np.array(costs.bwd_s) * 1e3, 1),
)
print("simulated now", sim.simulate(p).step_time_s * 1e3)
S, R = len(costs.ranks), 2
order = torch_order("looped_bfs", S, R, M)
T = max(len(v) for v in order.values())
for r in range(R):
    print(
        r, [None if a is None else f"{a.stage_index}{a.computation_type.value}{a.microbatch_index}" for a in order[r]]
    )
lat = float(c.latency_s[0][1])
bw = float(c.bandwidth_bytes_per_s[0][1])
end = np.zeros(R)
for t in range(T):
    own = end.copy()
    sends = []
    for r in range(R):
        a = order[r][t] if t < len(order[r]) else None
        if a is None:
            continue
        s, k = a.stage_index, a.computation_type.value
        if k not in ("F", "B"):
            continue
        own[r] += costs.fwd_s[s] if k == "F" else costs.bwd_s[s]
        if k == "F" and s < S - 1:
            sends.append((r, costs.ranks[s + 1], costs.send_bytes[s]))
        if k == "B" and s > 0:
            sends.append((r, costs.ranks[s - 1], costs.grad_bytes[s - 1]))
    new = own.copy()
    for a, b, nb in sends:
        if a == b:
            continue
        done = max(own[a], own[b]) + lat + nb / bw
        new[a] = max(new[a], done)
        new[b] = max(new[b], done)
    end = new
print("lockstep end per rank (ms)", np.round(end * 1e3, 1))
