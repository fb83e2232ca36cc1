"""Summarize docs/ranks/zbv/measure.sh's runs: per model and plan, simulated and measured step (median of the
repeats, with the fastest and slowest), and placer's ZB-V plan against each, repeat by repeat.

    python docs/ranks/zbv/summarize.py      # summary.json beside this script
"""

import json
import statistics
import sys
from pathlib import Path

import envs
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent
PLANS = ("zbv_placer", "zbv_equal", "zb_placer", "i1f1b_placer", "gpipe_equal")
out = {}
for m in sys.argv[1:] or ["lm", "encoder_decoder", "unet"]:
    graph = resolve_graph(f"bench.rank_models:{m}")
    cluster = envs.resolve_cluster(str(D.parent / "zb" / f"ranks_{m}.json"))
    rows = {}
    for p in PLANS:
        plan = Placement.load(str(D / f"plan_{m}_{p}.json"))
        sim = RankSim(graph, cluster).simulate(plan)
        steps = [json.loads(f.read_text())["step_time_s"] for f in sorted(D.glob(f"run_{m}_{p}_[0-9].json"))]
        rows[p] = {
            "simulated_s": sim.step_time_s,
            "measured_s": steps,
            "stages": sim.extra.get("stages"),
            "schedule": sim.extra.get("schedule"),
            "ops_per_device": plan.device_counts(),
        }
    for p, r in rows.items():
        med = statistics.median(r["measured_s"])
        ratio = [z / o for z, o in zip(rows["zbv_placer"]["measured_s"], r["measured_s"])]
        over = med / r["simulated_s"]
        r.update(median_s=med, zbv_placer_over_this=statistics.median(ratio), measured_over_simulated=over)
        print(
            f"{m:16} {p:13} {r['schedule']:17} simulated {r['simulated_s'] * 1e3:7.2f} ms  "
            f"measured {med * 1e3:7.2f} ms [{min(r['measured_s']) * 1e3:.1f}-{max(r['measured_s']) * 1e3:.1f}]  "
            f"meas/sim {over:.2f}  zbv_placer/this {statistics.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}]"
        )
    out[m] = rows
(D / "summary.json").write_text(json.dumps(out, indent=1))
