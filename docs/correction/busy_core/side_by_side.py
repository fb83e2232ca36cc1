"""The side-by-side reads of a bench.correction run: per plan its reads, median, median over the simulator's best, and
the geometric mean of the round-by-round ratio with its 95 % t-interval (logs of the ratios); and the corrected loop
over its ablation, the same way.

    python docs/correction/busy_core/side_by_side.py docs/correction/busy_core/unet_b32_m36_seed6_kept.json
"""

import json
import math
import statistics
import sys

from scipy import stats


def ratio(a: list[float], b: list[float]) -> str:
    logs = [math.log(x / y) for x, y in zip(a, b)]
    mean, n = statistics.mean(logs), len(logs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return f"{math.exp(mean):.3f} ({math.exp(mean - half):.2f}-{math.exp(mean + half):.2f})"


for path in sys.argv[1:]:
    cell = json.load(open(path))["cells"][0]
    reads = cell["side_by_side"]
    base = reads["simulator"]
    print(f"{path}: seed {cell['seed']}")
    for name, r in reads.items():
        ms = ", ".join(f"{x * 1e3:.0f}" for x in r)
        med = statistics.median(r) / statistics.median(base)
        print(f"  {name:15s} {ms} | median {statistics.median(r) * 1e3:.1f} | {med:.3f} | {ratio(r, base)}")
    print(f"  corrected / simulator rank: {ratio(reads['corrected'], reads['simulator rank'])}")
    chosen = {m: cell["methods"][m]["chosen"] for m in ("corrected", "simulator rank")}
    print(f"  chosen by each loop's finals: {chosen}")
