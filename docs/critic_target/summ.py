"""The medians of docs/critic_target's runs per graph and target, and each over placer's own ("faster")."""

import collections
import glob
import json
import statistics

rows = collections.defaultdict(dict)
for path in sorted(glob.glob("docs/critic_target/r-*.json")):
    mode = path.rsplit("-", 1)[1][: -len(".json")]
    for cell in json.load(open(path))["cells"]:
        by = collections.defaultdict(list)
        for run in cell["runs"]:
            by[run["budget"]["value"]].append(run["plan_step_time_s"] * 1e3)
        for budget, values in by.items():
            rows[(cell["graph"], budget)][mode] = (statistics.median(values), len(values))
for key, by_mode in sorted(rows.items()):
    base = by_mode.get("faster", (None,))[0]
    cells = [
        f"{mode}={median:.2f} ({n})" + (f" [{median / base:.3f}]" if base else "")
        for mode, (median, n) in sorted(by_mode.items())
    ]
    print(*key, "  ".join(cells))
