"""A probe, not kept: would a per-model backward/forward ratio (in place of the roofline's 2) bring the simulator of
ranks closer to the measured plans? Per model, the profile's raw pipeline numbers (docs/ranks/zb/profile_<m>.json)
refitted with the measured ratio, then every measured plan of docs/ranks/zbv and docs/ranks/zb simulated.

    PYTHONPATH=. python docs/ranks/zbv/backward_ratio_probe.py unet lm encoder_decoder
"""

import glob
import json
import statistics
import sys

import numpy as np

import envs.real.distributed.profile_ranks as pr
import envs.sim.cost as cost
from envs.real.worker import build_model
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.torch_capture import capture


def runs_of(m):
    out = []
    if not m.endswith("_b32"):
        for name in ("zbv_placer", "zbv_equal", "zb_placer", "i1f1b_placer", "gpipe_equal"):  # measure.sh's plans
            runs = sorted(glob.glob(f"docs/ranks/zbv/run_{m}_{name}_[0-9].json"))
            steps = [json.load(open(r))["step_time_s"] for r in runs]
            out.append((f"docs/ranks/zbv/plan_{m}_{name}.json", statistics.median(steps)))
    for s in ("looped_bfs", "interleaved_1f1b", "interleaved_zb"):
        f = f"docs/ranks/zb/plan_{m}_{s}.json"
        steps = [json.load(open(r))["step_time_s"] for r in sorted(glob.glob(f"docs/ranks/zb/run_{m}_{s}_[0-9].json"))]
        out.append((f, statistics.median(steps)))
    return out


res = {}
for m in sys.argv[1:]:
    model, inputs = build_model(f"bench.rank_models:{m}", search_dir=".")
    graph = capture(model, inputs)
    micro, program = pr.microbatch_program(model, inputs, graph)
    split, _ = pr.calibration_plans(graph, 2, program, micro)
    parts = json.load(open(f"docs/ranks/zb/profile_{m}.json"))["measured"]
    f = sum(r["phases"]["forward_s"] for p in parts for r in p["pipelines"])
    b = sum(r["phases"]["backward_s"] for p in parts for r in p["pipelines"])
    for label, mult in (("x2", 2.0), ("fitted", b / f)):
        cost.BACKWARD_MULTIPLIER = mult
        cluster = pr.ranks_cluster(graph, parts, split=split)
        errs = []
        for plan_file, meas in runs_of(m):
            sim = RankSim(graph, cluster).simulate(Placement.load(plan_file)).step_time_s
            errs.append((plan_file.split("/")[-1], sim, meas))
        mape = 100 * np.mean([abs(s - x) / x for _, s, x in errs])
        from scipy.stats import spearmanr

        rho = spearmanr([s for _, s, _ in errs], [x for _, _, x in errs]).correlation
        print(
            m,
            label,
            round(mult, 3),
            "MAPE",
            round(mape, 1),
            "rho",
            round(rho, 2),
            [round(s / x, 2) for _, s, x in errs],
            flush=True,
        )
        res[(m, label)] = errs
