"""Per model, each rank's stage actions under interleaved_1f1b over the same under looped_bfs (probe.sh): the
median time of each (rank, stage, kind) action over every microbatch and repeat, and the rank's compute per step.

    python docs/ranks/auto/interleave/compare.py [MODEL ...]   # writes compare.json beside it
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

D = Path(__file__).resolve().parent
out: dict = {}
for m in sys.argv[1:] or ["text_classifier", "mobilenet_v2"]:
    per: dict = {}
    for p in ("i1f1b", "bfs"):
        actions, busy, steps = defaultdict(list), defaultdict(list), []
        for f in sorted(D.glob(f"run_{m}_{p}_[0-9]*.json")):
            run = json.loads(f.read_text())
            steps.append(run["step_time_s"])
            for r in {e[0] for e in run["timeline"]["events"]}:
                busy[r].append(sum(e[5] - e[4] for e in run["timeline"]["events"] if e[0] == r and e[1] >= 0))
            for r, s, k, _, start, end in run["timeline"]["events"]:
                if s >= 0:
                    actions[(r, s, k)].append(end - start)
        per[p] = {"step_s": statistics.median(steps), "busy": {r: statistics.median(v) for r, v in busy.items()}}
        per[p]["actions"] = {k: statistics.median(v) for k, v in actions.items()}
    a, b = per["i1f1b"], per["bfs"]
    print(f"{m}: step {a['step_s'] * 1e3:.1f} ms interleaved, {b['step_s'] * 1e3:.1f} ms back to back")
    rows = {}
    for r in sorted(a["busy"]):
        print(
            f"  rank {r}: compute {a['busy'][r] * 1e3:.1f} / {b['busy'][r] * 1e3:.1f} ms "
            f"({a['busy'][r] / b['busy'][r]:.2f}x)"
        )
    for k in sorted(a["actions"]):
        if k in b["actions"]:
            rows[str(k)] = a["actions"][k] / b["actions"][k]
            print(f"    {k}: {a['actions'][k] * 1e3:.2f} / {b['actions'][k] * 1e3:.2f} ms ({rows[str(k)]:.2f}x)")
    out[m] = {
        "i1f1b": per["i1f1b"]["step_s"],
        "bfs": per["bfs"]["step_s"],
        "busy": {r: a["busy"][r] / b["busy"][r] for r in a["busy"]},
        "actions": rows,
    }
(D / "compare.json").write_text(json.dumps(out, indent=1))
