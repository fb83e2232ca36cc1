"""Summarize docs/ranks/zbv/dualpipev.sh: per model, the DualPipeV plan against the ZB-V plan, simulated and measured
(median of 3 interleaved repeats [fastest-slowest]), and the ratio per repeat.

    python docs/ranks/zbv/summarize_dpv.py    # summary_dpv.json beside this script
"""

import json
import statistics
from pathlib import Path

import envs
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent
out = {}
for m in ("lm", "encoder_decoder", "unet"):
    graph = resolve_graph(f"bench.rank_models:{m}")
    sim = RankSim(graph, envs.resolve_cluster(str(D.parent / "zb" / f"ranks_{m}.json")))
    row = {}
    for p in ("zbv_placer", "dpv_placer"):
        steps = [json.loads(f.read_text())["step_time_s"] for f in sorted(D.glob(f"run_{m}_{p}_d[0-9].json"))]
        row[p] = {"simulated_s": sim.simulate(Placement.load(str(D / f"plan_{m}_{p}.json"))).step_time_s}
        row[p].update(measured_s=steps, median_s=statistics.median(steps))
    ratio = [b / a for a, b in zip(row["zbv_placer"]["measured_s"], row["dpv_placer"]["measured_s"])]
    row["dpv_over_zbv"] = {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)}
    a, b = row["zbv_placer"], row["dpv_placer"]
    print(
        f"{m:16} simulated zbv {a['simulated_s'] * 1e3:6.1f} dualpipev {b['simulated_s'] * 1e3:6.1f} ms  measured "
        f"zbv {a['median_s'] * 1e3:6.1f} [{min(a['measured_s']) * 1e3:.1f}-{max(a['measured_s']) * 1e3:.1f}] "
        f"dualpipev {b['median_s'] * 1e3:6.1f} [{min(b['measured_s']) * 1e3:.1f}-{max(b['measured_s']) * 1e3:.1f}]  "
        f"dualpipev/zbv {statistics.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}]"
    )
    out[m] = row
(D / "summary_dpv.json").write_text(json.dumps(out, indent=1))
