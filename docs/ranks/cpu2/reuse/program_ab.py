"""A rank actor's next job of the same model: its program reused (the export skipped), or exported anew.

    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/ranks/cpu2/reuse/program_ab.py SOURCE CLUSTER PLAN BLOCKS EACH > ab.json

One RanksEnv (its own local Ray, actors kept across jobs), the plan measured again and again
(``evaluate(..., again=True)``: one job each), in blocks of EACH measurements, alternating ``reuse_program`` on and
off, BLOCKS blocks of each. The first job starts the actors and is left out. Per measurement: the wall time of the
whole ``evaluate`` call, the measured step time, and each rank's phases (``setup_s``). Prints JSON; a summary on
stderr.
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
        env.evaluate([placement])  # starts the actors (and their first export): not counted
        for b in range(blocks):
            for mode in ("reused", "exported") if b % 2 == 0 else ("exported", "reused"):  # ABBA
                env.reuse_program = mode == "reused"
                for k in range(each):
                    t0 = time.perf_counter()
                    (r,) = env.evaluate([placement], again=True)
                    wall = time.perf_counter() - t0
                    assert r.ok, r.message
                    ranks = r.extra["ranks"]
                    assert all(x["program_reused"] == (mode == "reused") for x in ranks) or k == 0, ranks
                    rows.append(
                        {
                            "block": b,
                            "mode": mode,
                            "k": k,
                            "wall_s": wall,
                            "step_time_s": r.step_time_s,
                            "losses": r.extra["losses"],
                            "setup_s": [x["setup_s"] for x in ranks],
                        }
                    )
                    print(mode, b, k, f"{wall:.2f} s", f"{r.step_time_s * 1e3:.1f} ms", file=sys.stderr, flush=True)
    finally:
        env.close()
    summary = {}
    for mode in ("reused", "exported"):
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {
            "wall_s_median": statistics.median(r["wall_s"] for r in mine),
            "step_time_s_median": statistics.median(r["step_time_s"] for r in mine),
            "export_s_median": statistics.median(max(x["export"] for x in r["setup_s"]) for r in mine),
            "n": len(mine),
        }
    summary["same_losses"] = len({json.dumps(r["losses"]) for r in rows}) == 1
    print(json.dumps({"argv": sys.argv[1:], "rows": rows, "summary": summary}, indent=1))
    print(json.dumps(summary), file=sys.stderr)


if __name__ == "__main__":
    main()
