"""The true step of each method's plan over the stand-in's best, by graph (median and worst of the seeds) and over
all runs, from ``bench.correction stand-in --json`` files: ``python docs/correction/pick/summarize.py A.json [B.json]``
(each file's table; with two, the first is labelled "before" and the second "after")."""

import json
import sys

import numpy as np


def table(path: str, label: str) -> None:
    cells = json.load(open(path))["cells"]
    methods = [m for m in ("simulator", "simulator rank", "corrected") if any(m in c.get("true_s", {}) for c in cells)]
    print(f"\n{label} ({path})\n")
    print("| graph | runs | " + " | ".join(methods) + " |")
    print("|---|---:|" + "---:|" * len(methods))
    graphs = list(dict.fromkeys(c["graph"] for c in cells))
    for g in [*graphs, None]:
        rows = [c for c in cells if g is None or c["graph"] == g]
        ratios = {m: np.array([c["true_s"][m] / c["stand_in_best_s"] for c in rows]) for m in methods}
        cols = [f"{np.median(r):.3f} ({r.max():.3f})" for r in ratios.values()]
        print(f"| {g or 'all'} | {len(rows)} | " + " | ".join(cols) + " |")
    chosen = {}
    for c in cells:
        if "corrected" in c["methods"]:
            k = c["methods"]["corrected"].get("chosen", "?")
            chosen[k] = chosen.get(k, 0) + 1
    if chosen:
        print(f"\ncorrected loop's plan was: {chosen}")


for path, label in zip(sys.argv[1:], ["before", "after"] if len(sys.argv) > 2 else ["runs"]):
    table(path, label)
