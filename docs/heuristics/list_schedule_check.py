"""The list schedulers' placements (a hash of each) on graphs, clusters and methods: recorded by one checkout,
checked by another. From the repository root, with docs/heuristics on the path for user_models:

    PYTHONPATH=.:docs/heuristics python docs/heuristics/list_schedule_check.py record GRAPHS FILE.json   # before
    PYTHONPATH=.:docs/heuristics python docs/heuristics/list_schedule_check.py check GRAPHS FILE.json    # after
"""

import hashlib
import json
import sys
import time

import numpy as np

import envs
from graphs.sources import resolve_graph
from placer.methods import get

GRAPHS = sys.argv[2].split(",")
CLUSTERS = ["k80x4", "k80x2", "v100x4"]
METHODS = ["m_etf", "m_sct", "m_etf_nocopy", "m_sct_nocopy"]
out = {}
for gname in GRAPHS:
    g = resolve_graph(gname)
    for cname in CLUSTERS:
        c = envs.resolve_cluster(cname)
        for m in METHODS:
            t = time.perf_counter()
            p = np.asarray(get(m)(g, c))
            dt = time.perf_counter() - t
            key = f"{gname}/{cname}/{m}"
            out[key] = hashlib.sha1(p.astype(np.int64).tobytes()).hexdigest()
            print(f"{key} {g.num_ops} ops {dt:.2f} s {out[key][:10]}", flush=True)
if sys.argv[1] == "record":
    json.dump(out, open(sys.argv[3], "w"), indent=0)
else:
    ref = json.load(open(sys.argv[3]))
    bad = [k for k in out if ref.get(k) != out[k]]
    print("DIFFERENT:", bad if bad else "none", f"({len(out)} compared)")
