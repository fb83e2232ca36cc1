"""Per rank, the compute measured inside the pipeline (the sum of its actions' times, per step, median over the
repeats' median steps) over the compute the simulator of ranks gives the same plan with the model's per-op times:
plans of more stages than ranks (``auto`` where it chose one) beside the one-stage plan (``gpipe_placer``).

    PYTHONPATH=. python docs/ranks/auto/busy.py [--dir DIR] MODEL ...   # writes DIR/busy.json
"""

import argparse
import json
import statistics
from pathlib import Path

import envs
from envs.real.profiler.fit import with_profile
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--plans", default="auto,gpipe_placer")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    d = Path(a.dir)
    out: dict = {}
    for m in a.models:
        graph = resolve_graph(f"bench.rank_models:{m}")
        cluster = envs.resolve_cluster(str(d / f"ranks_{m}.json"))
        timed = with_profile(graph, cluster, str(d / f"ops_{m}.json"), ranks=True)[0]
        for p in a.plans.split(","):
            plan = Placement.load(str(d / f"plan_{m}_{p}.json"))
            result, events = RankSim(timed, cluster).timeline(plan)
            runs = [json.loads(f.read_text()) for f in sorted(d.glob(f"run_{m}_{p}_[0-9]*.json"))]
            row = {"schedule": result.extra.get("schedule"), "stages": result.extra.get("stages"), "ranks": {}}
            for r in sorted({e.rank for e in events}):
                simulated = sum(e.end_s - e.start_s for e in events if e.rank == r)
                measured = statistics.median(
                    sum(e[5] - e[4] for e in run["timeline"]["events"] if e[0] == r) for run in runs
                )
                row["ranks"][r] = {"simulated_s": simulated, "measured_s": measured, "ratio": measured / simulated}
            out.setdefault(m, {})[p] = row
            each = "  ".join(
                f"rank {r} {v['measured_s'] * 1e3:.1f}/{v['simulated_s'] * 1e3:.1f} ms ({v['ratio']:.2f}x)"
                for r, v in row["ranks"].items()
            )
            print(f"{m:16} {p:13} {row['schedule']:17} {row['stages']} stages: {each}")
    (d / "busy.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
