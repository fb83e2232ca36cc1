"""The optimizer step's own bandwidth (``update_bw_bytes_per_s``) against the fidelity set: each model's cluster
refitted from its profile's raw numbers (``profile_<model>.json``, ``placer profile --ranks --json``) with and
without it, the per-op times on the graph (``ops_<model>.json``), every measured plan simulated both ways.

    PYTHONPATH=. python docs/ranks/fidelity_v/update_bw.py [--dir D] MODEL ...
"""

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

import envs.real.distributed.profile_ranks as pr
from envs.real.profiler.fit import with_profile
from envs.real.worker import build_model
from envs.sim.ranks import RankSim
from envs.timeline import rank_phases
from graphs.plan import Placement
from graphs.torch_capture import capture

PLANS = ("zbv_placer", "zbv_equal", "dpv_placer", "zb_placer", "i1f1b_placer", "gpipe_equal")
ap = argparse.ArgumentParser()
ap.add_argument("models", nargs="+")
ap.add_argument("--dir", default=str(Path(__file__).resolve().parent / "held_out"))
args = ap.parse_args()
d = Path(args.dir)
fit = pr.fit_update_bandwidth
pooled = {"memory bandwidth": [], "update bandwidth": []}
for m in args.models:
    model, inputs = build_model(f"bench.rank_models:{m}", search_dir=".")
    graph = capture(model, inputs)
    micro, program = pr.microbatch_program(model, inputs, graph)
    split, _ = pr.calibration_plans(graph, 2, program, micro)
    parts = json.loads((d / f"profile_{m}.json").read_text())["measured"]
    measured = {
        p: statistics.median(json.loads(f.read_text())["step_time_s"] for f in d.glob(f"run_{m}_{p}_[0-9]*.json"))
        for p in PLANS
    }
    runs = [json.loads(f.read_text()) for f in sorted(d.glob(f"run_{m}_gpipe_equal_[0-9]*.json"))]
    opt = [statistics.median(r["ranks"][k]["phases"]["optimizer_s"] for r in runs) * 1e3 for k in range(2)]
    for label in pooled:
        pr.fit_update_bandwidth = fit if label == "update bandwidth" else (lambda *a: 0.0)
        cluster = pr.ranks_cluster(graph, parts, split=split)
        g = with_profile(graph, cluster, str(d / f"ops_{m}.json"), ranks=True)[0]
        sim = {
            p: RankSim(g, cluster).simulate(Placement.load(str(d / f"plan_{m}_{p}.json"))).step_time_s for p in PLANS
        }
        _, events = RankSim(g, cluster).timeline(Placement.load(str(d / f"plan_{m}_gpipe_equal.json")))
        sim_opt = [round(ph["optimizer_s"] * 1e3, 1) for ph in rank_phases(events).values()]
        errors = [abs(sim[p] / measured[p] - 1) for p in PLANS]
        rho = spearmanr([sim[p] for p in PLANS], [measured[p] for p in PLANS]).correlation
        pooled[label] += [(sim[p], measured[p]) for p in PLANS]
        print(
            f"{m:16} {label:16} MAPE {np.mean(errors):.1%}  Spearman {rho:.2f}  gpipe_equal's optimizer step per rank "
            f"simulated {sim_opt} ms, measured {[round(x, 1) for x in opt]} ms  "
            f"(update bandwidth {cluster.devices[0].update_bw_bytes_per_s / 1e9:.1f} GB/s, memory "
            f"{cluster.devices[0].mem_bw_bytes_per_s / 1e9:.1f} GB/s)"
        )
pr.fit_update_bandwidth = fit
for label, rows in pooled.items():
    errors = [abs(s / x - 1) for s, x in rows]
    rho = spearmanr([s for s, _ in rows], [x for _, x in rows]).correlation
    print(f"all, {label}: MAPE {np.mean(errors):.1%}, Spearman (pooled) {rho:.2f}, {len(rows)} plans")
