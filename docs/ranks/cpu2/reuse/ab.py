"""Rank actors kept across jobs, or fresh processes every job: what a measurement costs, and whether it changes.

    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/ranks/cpu2/reuse/ab.py SOURCE CLUSTER PLAN BLOCKS EACH > ab.json

One RanksEnv (its own local Ray), the plan measured again and again (``evaluate(..., again=True)``: one job each),
in blocks of EACH measurements, alternating: actors kept (``reuse_actors``; the block's first job starts them), then
fresh processes every job, and so on for BLOCKS blocks of each. Per measurement: the wall time of the whole
``evaluate`` call (start-up, build, steps, report) and the measured step time. Prints JSON; a summary on stderr.
"""

import json
import statistics
import sys
import time

from envs.cluster import resolve_cluster
from envs.real.ray.jobs import RanksEnv
from graphs.plan import Placement


def main():
    source, cluster, plan_path, blocks, each = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    placement = Placement.load(plan_path)
    env = RanksEnv(source, resolve_cluster(cluster), warmup_steps=2, timed_steps=6, measure_timeout_s=300)
    rows = []
    try:
        for b in range(blocks):
            for mode in ("kept", "fresh"):
                env.reuse_actors = mode == "kept"
                env._release_actors()  # each block starts with no actors: its first job starts them
                for k in range(each):
                    t0 = time.perf_counter()
                    (r,) = env.evaluate([placement], again=True)
                    wall = time.perf_counter() - t0
                    assert r.ok, r.message
                    pids = [x["pid"] for x in r.extra["ranks"]]
                    rows.append(
                        {"block": b, "mode": mode, "k": k, "wall_s": wall, "step_time_s": r.step_time_s, "pids": pids}
                    )
                    print(
                        mode, b, k, f"{wall:.2f} s", f"{r.step_time_s * 1e3:.1f} ms", pids, file=sys.stderr, flush=True
                    )
    finally:
        env.close()
    summary = {}
    for mode in ("kept", "fresh"):
        later = [r for r in rows if r["mode"] == mode and r["k"] > 0]  # a kept block's first job starts its actors
        steps = [r["step_time_s"] for r in rows if r["mode"] == mode]
        summary[mode] = {
            "wall_s_median_after_first": statistics.median(r["wall_s"] for r in later),
            "step_time_s_median": statistics.median(steps),
            "n": len(steps),
        }
    print(json.dumps({"argv": sys.argv[1:], "rows": rows, "summary": summary}, indent=1))
    print(json.dumps(summary), file=sys.stderr)


if __name__ == "__main__":
    main()
