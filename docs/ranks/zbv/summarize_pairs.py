"""Summarize docs/ranks/zbv/remeasure.sh: per changed plan, one cut at a time against two-cut moves, simulated and
measured (median of 5 interleaved repeats [fastest-slowest]), and the ratio per repeat.

    python docs/ranks/zbv/summarize_pairs.py    # summary_pairs.json beside this script
"""

import json
import statistics
from pathlib import Path

import envs
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent
CHANGED = [("lm", "i1f1b_placer"), ("lm", "zb_placer"), ("encoder_decoder", "i1f1b_placer")]
CHANGED += [("unet", "i1f1b_placer"), ("unet", "zb_placer")]
out = {}
for m, p in CHANGED:
    graph = resolve_graph(f"bench.rank_models:{m}")
    sim = RankSim(graph, envs.resolve_cluster(str(D.parent / "zb" / f"ranks_{m}.json")))
    row = {}
    for v in (p, f"{p}_pairs"):
        steps = [json.loads(f.read_text())["step_time_s"] for f in sorted(D.glob(f"run_{m}_{v}_r[0-9].json"))]
        row[v] = {"simulated_s": sim.simulate(Placement.load(str(D / f"plan_{m}_{v}.json"))).step_time_s}
        row[v].update(measured_s=steps, median_s=statistics.median(steps))
    ratio = [b / a for a, b in zip(row[p]["measured_s"], row[f"{p}_pairs"]["measured_s"])]
    row["pairs_over_one_cut"] = {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)}
    a, b = row[p], row[f"{p}_pairs"]
    print(
        f"{m:16} {p:13} simulated {a['simulated_s'] * 1e3:6.1f} -> {b['simulated_s'] * 1e3:6.1f} ms  measured "
        f"{a['median_s'] * 1e3:6.1f} [{min(a['measured_s']) * 1e3:.1f}-{max(a['measured_s']) * 1e3:.1f}] -> "
        f"{b['median_s'] * 1e3:6.1f} [{min(b['measured_s']) * 1e3:.1f}-{max(b['measured_s']) * 1e3:.1f}]  "
        f"pairs/one cut {statistics.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}]"
    )
    out[f"{m}/{p}"] = row
(D / "summary_pairs.json").write_text(json.dumps(out, indent=1))
