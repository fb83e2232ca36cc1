"""Summarize docs/ranks/zb/measure.sh's runs: per model and schedule, simulated and measured step (median of the
repeats, with the fastest and slowest), and the zero-bubble schedule against the others, repeat by repeat.

    python docs/ranks/zb/summarize.py                                        # summary.json
    python docs/ranks/zb/summarize.py lm_b32 encoder_decoder_b32 unet_b32    # summary_b32.json
"""

import json
import statistics
import sys
from pathlib import Path

import envs
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent
SCHEDULES = ("looped_bfs", "interleaved_1f1b", "interleaved_zb")
out = {}
for m in sys.argv[1:] or ["lm", "encoder_decoder", "unet"]:
    graph = resolve_graph(f"bench.rank_models:{m}")
    cluster = envs.resolve_cluster(str(D / f"ranks_{m}.json"))
    from envs.sim.ranks import RankSim

    rows = {}
    for s in SCHEDULES:
        plan = Placement.load(str(D / f"plan_{m}_{s}.json"))
        sim = RankSim(graph, cluster).simulate(plan)
        runs = sorted(D.glob(f"run_{m}_{s}_*.json"))
        steps = [json.loads(p.read_text())["step_time_s"] for p in runs]
        rows[s] = {"simulated_s": sim.step_time_s, "measured_s": steps, "stages": sim.extra.get("stages")}
    for s, r in rows.items():
        med = statistics.median(r["measured_s"])
        ratio = [z / o for z, o in zip(rows["interleaved_zb"]["measured_s"], r["measured_s"])]
        r.update(median_s=med, zb_over_this=statistics.median(ratio), measured_over_simulated=med / r["simulated_s"])
        print(
            f"{m:16} {s:17} simulated {r['simulated_s'] * 1e3:7.2f} ms  measured {med * 1e3:7.2f} ms "
            f"[{min(r['measured_s']) * 1e3:.1f}-{max(r['measured_s']) * 1e3:.1f}]"
            f"  meas/sim {med / r['simulated_s']:.2f}"
            f"  zb/this {statistics.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}]"
        )
    out[m] = rows
name = "summary_b32.json" if out and all(m.endswith("_b32") for m in out) else "summary.json"
(D / name).write_text(json.dumps(out, indent=1))
