"""Summarize searched_ops.sh: per model and plan, simulated with per-op times on the fresh profile and measured
(median of the repeats, fastest-slowest); per schedule, the plan searched with per-op times over the one searched
on the roofline, repeat by repeat (median [range]); and which plan each simulator would pick.

    PYTHONPATH=. python docs/ranks/fidelity_v/summarize_searched.py [MODEL ...]   # summary.json in searched_ops/
"""

import json
import statistics
import sys
from pathlib import Path

import envs
from envs.real.profiler.fit import with_profile
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent / "searched_ops"
SEARCHED = ("zbv_placer", "dpv_placer", "zb_placer", "i1f1b_placer")
PLANS = (*(f"{p}_ops" for p in SEARCHED), *SEARCHED, "zbv_equal", "gpipe_equal")
out = {}
for m in sys.argv[1:] or ["vgg16", "text_classifier"]:
    graph = resolve_graph(f"bench.rank_models:{m}")
    cluster = envs.resolve_cluster(str(D / f"ranks_{m}.json"))
    timed = with_profile(graph, cluster, str(D / f"ops_{m}.json"), ranks=True)[0]
    rows = {}
    for p in PLANS:
        runs = sorted(D.glob(f"run_{m}_{p}_[0-9]*.json"))
        steps = [json.loads(f.read_text())["step_time_s"] for f in runs]
        plan = Placement.load(str(D / f"plan_{m}_{p}.json"))
        rows[p] = {"simulated_s": RankSim(timed, cluster).simulate(plan).step_time_s, "measured_s": steps}
        rows[p]["median_s"] = statistics.median(steps)
        r = rows[p]
        print(
            f"{m:16} {p:17} simulated {r['simulated_s'] * 1e3:8.1f} ms  measured {r['median_s'] * 1e3:8.1f} "
            f"[{min(steps) * 1e3:.1f}-{max(steps) * 1e3:.1f}]"
        )
    for p in SEARCHED:
        ratios = [a / b for a, b in zip(rows[f"{p}_ops"]["measured_s"], rows[p]["measured_s"])]
        rows[f"{p}_ops"]["over_roofline_searched"] = statistics.median(ratios)
        print(
            f"{m:16} {p}: searched with per-op times / on the roofline, per repeat {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}-{max(ratios):.3f}]"
        )
    pick = min(rows, key=lambda p: rows[p]["simulated_s"])
    fastest = min(rows, key=lambda p: rows[p]["median_s"])
    print(
        f"{m:16} the per-op simulator's pick: {pick} ({rows[pick]['median_s'] * 1e3:.1f} ms measured); the measured "
        f"fastest: {fastest} ({rows[fastest]['median_s'] * 1e3:.1f} ms)"
    )
    out[m] = rows
(D / "summary.json").write_text(json.dumps(out, indent=1))
