"""The corrected loop over its ablation across runs: each run's geometric mean of the round-by-round ratio of the
side-by-side's reads (corrected / simulator rank), and their geometric mean over the runs with a 95 % t-interval
(each run one sample: the runs' seeds and plans differ, so the spread between runs is what the interval must hold).

    python docs/correction/busy_core/pooled.py docs/correction/busy_core/*_pick.json
"""

import json
import math
import statistics
import sys

from scipy import stats


def run_log_ratio(path: str) -> float:
    reads = json.load(open(path))["cells"][0]["side_by_side"]
    logs = [math.log(a / b) for a, b in zip(reads["corrected"], reads["simulator rank"])]
    return statistics.mean(logs)


logs = []
for path in sys.argv[1:]:
    logs.append(run_log_ratio(path))
    print(f"{path}: corrected / simulator rank {math.exp(logs[-1]):.3f}")
mean, n = statistics.mean(logs), len(logs)
if n > 1:
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    print(f"over {n} runs: {math.exp(mean):.3f} ({math.exp(mean - half):.3f}-{math.exp(mean + half):.3f})")
