"""A toy where ranking home moves should help: a 40-layer chain, even layers with much compute and few weights, odd
layers the reverse, and a GPU that holds about half of the weights. The move search with its home moves drawn
uniformly or ranked by their own critic (``rank_homes``, in ``rank_homes.patch``: apply it first). From the
repository root:

    PYTHONPATH=. python docs/offload_homes/home_critic/toy.py
"""

import time

import numpy as np

import envs
from envs.cluster import Cluster, Device
from envs.machines import PCIE5
from graphs import OpGraph
from placer.learn.move_search import MoveSearch, MoveSearchOptions

MB = 1 << 20


def toy(n=40):
    names = [f"layer{k}" for k in range(n)]
    heavy = np.arange(n) % 2 == 0  # even layers: much compute, few weights (homing them is free); odd: the reverse
    flops = np.where(heavy, 4e11, 1e9).tolist()
    param = np.where(heavy, 10 * MB, 60 * MB).astype(int).tolist()
    edges = [(a, b, MB) for a, b in zip(names, names[1:])]
    g = OpGraph.from_edges(names, edges, flops=flops, param_bytes=param)
    g.params = [[f"w{k}"] for k in range(n)]
    devices = [Device("cpu:0", "cpu", 64e9, 1e10, 1e10, 5e-6), Device("gpu:0", "gpu", 3e9, 1e13, 1e12, 6e-6)]
    return g, Cluster("toy", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})


def search(g, cl, env, rank, seed, evals):
    s = MoveSearch(g, cl, env, options=MoveSearchOptions(homes=True, rank_homes=rank), seed=seed)
    return s, s.run(max_evals=evals)


g, cl = toy()
env = envs.SimEnv(g, cl)
# ranked, seed, step time, out of memory, home moves tried and faster [uniform, ranked], all moves likewise, seconds
for rank in (False, True):
    for seed in (0, 1, 2):
        t = time.time()
        s, r = search(g, cl, env, rank, seed, 600)
        tallies = [x.tolist() for x in (s.home_tries, s.home_hits, s.tries, s.hits)]
        print(rank, seed, round(r.step_time_s, 4), r.oom, *tallies, round(time.time() - t, 1))
print("budgets")  # placements, ranked, the median step time of 6 seeds, each seed's
for evals in (60, 120, 200, 300):
    for rank in (False, True):
        res = [search(g, cl, env, rank, seed, evals)[1].step_time_s for seed in range(6)]
        print(evals, rank, np.round(np.median(res), 4), np.round(res, 3).tolist())
