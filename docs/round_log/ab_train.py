"""``placer train``'s move search in two checkouts side by side: how many rounds the same time budget gives, and the
best step time it ends at. Each run is a process of its own (``python -m placer train``), the checkouts alternating,
nothing after the budget (``--no-ablation --no-equal-budget-search``), one heuristic to start from (m_etf).

Usage, from anywhere (``BEFORE`` a checkout of the commit before, e.g. ``git worktree add /tmp/old_wt 09d3fec``, its
numba kernels warmed with ``PYTHONPATH=/tmp/old_wt python -m envs.sim.warm``)::

    python docs/round_log/ab_train.py BUDGET_S REPEATS GRAPH CLUSTER BEFORE AFTER [HEURISTICS]

prints one line per run and the medians. ``HEURISTICS``: ``--heuristics`` (default m_etf); ``all``: every heuristic,
as the README's main command (which then gives module_search 20 % of the budget first).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile


def main() -> None:
    budget, reps, graph, cluster, before, after = sys.argv[1:7]
    heuristics = sys.argv[7] if len(sys.argv) > 7 else "m_etf"
    trees = {"before": before, "after": after}
    rows: dict[str, list] = {k: [] for k in trees}
    for rep in range(int(reps)):
        for label, tree in trees.items():
            logdir = tempfile.mkdtemp()
            env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, "-m", "placer", "train", graph, "--cluster", cluster, "--time-budget", budget]
            cmd += ["--no-ablation", "--no-equal-budget-search", "--logdir", logdir]
            cmd += [] if heuristics == "all" else ["--heuristics", heuristics]
            cmd += ["--json", "--no-progress"]
            doc = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree, check=True).stdout)
            rows[label].append((doc["iterations"], doc["best_step_time_s"] * 1e3))
            print(f"{label} {rep} rounds {doc['iterations']} best {doc['best_step_time_s'] * 1e3:.3f} ms", flush=True)
    medians = {k: statistics.median(r[0] for r in v) for k, v in rows.items()}
    for label, v in rows.items():
        print(f"{label}: median rounds {medians[label]}, median best {statistics.median(r[1] for r in v):.3f} ms")
    print(f"after / before, rounds: {medians['after'] / medians['before']:.3f}")


if __name__ == "__main__":
    main()
