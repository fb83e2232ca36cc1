"""Does a rank compute slower while the other rank computes too? For every action of the measured runs (``auto``
and ``gpipe_placer``), the share of its time during which the other rank was also running an action, and its
measured time over its simulated time (per-op times, the model's fresh profile). Printed per model: the ratio of
the actions mostly alone (overlap < 0.25) and mostly together (> 0.75), medians, and their correlation.

    PYTHONPATH=. python docs/ranks/auto/overlap.py [MODEL ...]   # writes overlap.json beside it
"""

import json
import statistics
import sys
from pathlib import Path

import numpy as np

import envs
from envs.real.profiler.fit import with_profile
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

D = Path(__file__).resolve().parent
MODELS = ("text_classifier", "vgg16", "mobilenet_v2", "convnet", "lm", "encoder_decoder", "unet")


def overlap(event: list, others: list) -> float:
    start, end = event[4], event[5]
    shared = sum(max(0.0, min(end, o[5]) - max(start, o[4])) for o in others)
    return shared / (end - start) if end > start else 0.0


out = {}
for m in sys.argv[1:] or MODELS:
    graph = resolve_graph(f"bench.rank_models:{m}")
    cluster = envs.resolve_cluster(str(D / f"ranks_{m}.json"))
    timed = with_profile(graph, cluster, str(D / f"ops_{m}.json"), ranks=True)[0]
    shares, ratios = [], []
    for p in ("auto", "gpipe_placer"):
        _, events = RankSim(timed, cluster).timeline(Placement.load(str(D / f"plan_{m}_{p}.json")))
        simulated = {(e.rank, e.stage, e.kind, e.microbatch): e.end_s - e.start_s for e in events}
        for f in sorted(D.glob(f"run_{m}_{p}_[0-9]*.json")):
            measured = [e for e in json.loads(f.read_text())["timeline"]["events"] if e[1] >= 0]
            for e in measured:
                s = simulated.get(tuple(e[:4]))
                if not s or s < 5e-4 or e[5] <= e[4]:  # actions under half a millisecond: their time is overhead
                    continue
                shares.append(overlap(e, [o for o in measured if o[0] != e[0]]))
                ratios.append((e[5] - e[4]) / s)
    shares_a, ratios_a = np.array(shares), np.array(ratios)
    alone, together = ratios_a[shares_a < 0.25], ratios_a[shares_a > 0.75]
    row = {
        "actions": len(ratios),
        "alone": {"n": len(alone), "median_ratio": float(np.median(alone)) if len(alone) else None},
        "together": {"n": len(together), "median_ratio": float(np.median(together)) if len(together) else None},
        "correlation": float(np.corrcoef(shares_a, ratios_a)[0, 1]),
    }
    out[m] = row
    print(
        f"{m:16} {row['actions']:4} actions: measured/simulated {statistics.median(ratios):.2f} overall; "
        f"alone {row['alone']['median_ratio'] or float('nan'):.2f} (n={row['alone']['n']}), "
        f"together {row['together']['median_ratio'] or float('nan'):.2f} (n={row['together']['n']}); "
        f"correlation {row['correlation']:.2f}"
    )
(D / "overlap.json").write_text(json.dumps(out, indent=1))
