"""Before/after medians of docs/critic_fit/equal_seconds.sh's JSON files: per graph and method, the median
plan step time (ms) and placements over the seeds, and after / before.

    python docs/critic_fit/compare.py OUTDIR
"""

import glob
import json
import os
import statistics
import sys


def cells(path: str) -> dict:
    doc = json.load(open(path))
    runs = {}
    for cell in doc["cells"] if isinstance(doc, dict) and "cells" in doc else doc:
        for r in cell["runs"]:
            runs.setdefault(r["method"], []).append(r)
    return runs


def main() -> None:
    out = sys.argv[1]
    head = ["graph", "method", "before: ms", "after: ms", "before: placements", "after: placements", "after / before"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in sorted(glob.glob(os.path.join(out, "before-*.json"))):
        graph = os.path.basename(path)[len("before-") : -len(".json")]
        after = os.path.join(out, f"after-{graph}.json")
        if not os.path.exists(after):
            continue
        b, a = cells(path), cells(after)
        for method in b:
            ms = [statistics.median(r["plan_step_time_s"] for r in x[method]) * 1e3 for x in (b, a)]
            ev = [statistics.median(r["evals"] for r in x[method]) for x in (b, a)]
            cols = [graph, method, *(f"{v:.2f}" for v in ms), *(f"{v:,.0f}" for v in ev), f"{ev[1] / ev[0]:.3f}"]
            print("| " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
