"""A toy where ranking home moves should help (even layers: much compute, few weights; odd: the reverse; the GPU
holds about half of the weights): the move search with home moves drawn uniformly or ranked by their own critic
(needs rank_homes.patch applied). PYTHONPATH=. python docs/offload_homes/home_critic/toy.py"""
import numpy as np, envs, time
from envs.cluster import Cluster, Device
from graphs import OpGraph
from placer.learn.move_search import MoveSearch, MoveSearchOptions
MB = 1 << 20
from envs.machines import PCIE5
def toy(n=40):
    names = [f"layer{k}" for k in range(n)]
    heavy = np.arange(n) % 2 == 0  # even layers: much compute, few weights (homing them is free); odd: the reverse
    flops = np.where(heavy, 4e11, 1e9)
    param = np.where(heavy, 10 * MB, 60 * MB)
    g = OpGraph.from_edges(names, [(a, b, MB) for a, b in zip(names, names[1:])], flops=flops.tolist(), param_bytes=param.astype(int).tolist())
    g.params = [[f"w{k}"] for k in range(n)]
    devices = [Device("cpu:0", "cpu", 64e9, 1e10, 1e10, 5e-6), Device("gpu:0", "gpu", 3e9, 1e13, 1e12, 6e-6)]
    return g, Cluster("toy", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})
g, cl = toy()
env = envs.SimEnv(g, cl)
for rank in (False, True):
    for seed in (0,1,2):
        t=time.time()
        s = MoveSearch(g, cl, env, options=MoveSearchOptions(homes=True, rank_homes=rank), seed=seed)
        r = s.run(max_evals=600)
        print(rank, seed, round(r.step_time_s,4), r.oom, s.home_tries.tolist(), s.home_hits.tolist(), s.tries.tolist(), s.hits.tolist(), round(time.time()-t,1))
print("budgets")
for ev in (60, 120, 200, 300):
    for rank in (False, True):
        res = [MoveSearch(g, cl, env, options=MoveSearchOptions(homes=True, rank_homes=rank), seed=seed).run(max_evals=ev).step_time_s for seed in range(6)]
        print(ev, rank, np.round(np.median(res),4), np.round(res,3).tolist())
