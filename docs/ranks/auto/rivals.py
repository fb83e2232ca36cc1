"""The rivals' plans for ``measure.sh``: ``equal_layers`` and ``flops_balanced`` each under every schedule that fits
(M = 4; the looped ones with 2 stages per rank), simulated with the model's per-op times on its fresh ranks
profile, as ``place --ranks --profile`` does; the fastest of each is written as ``plan_MODEL_best_equal.json`` and
``plan_MODEL_best_flops.json``, and every row to ``rivals_MODEL.json``.

    PYTHONPATH=. python docs/ranks/auto/rivals.py DIR MODEL
"""

import argparse
import json
from pathlib import Path

import envs
from envs.real.profiler.fit import with_profile
from graphs import PlacerError
from graphs.sources import resolve_graph
from placer.cli.place import for_ranks
from placer.methods import registry

SCHEDULES = (None, "interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("model")
    ap.add_argument("--microbatches", type=int, default=4)
    a = ap.parse_args()
    d, m = Path(a.dir), a.model
    graph = resolve_graph(f"bench.rank_models:{m}")
    cluster = envs.resolve_cluster(str(d / f"ranks_{m}.json"))
    timed = with_profile(graph, cluster, str(d / f"ops_{m}.json"), ranks=True)[0]
    rows = []
    for method, tag in (("equal_layers", "equal"), ("flops_balanced", "flops")):
        best = None
        for schedule in SCHEDULES:
            options = {"microbatches": a.microbatches, "schedule": schedule}
            if schedule and schedule.startswith("interleaved"):
                options["stages_per_rank"] = 2
            try:
                placement = registry.place(method, timed, cluster, **options)
                result = for_ranks(placement, timed, cluster)
            except PlacerError as e:
                rows.append({"method": method, "schedule": schedule, "error": str(e)})
                continue
            step = result.step_time_s if result.ok else float("inf")
            rows.append({"method": method, "schedule": result.extra.get("schedule"), "simulated_s": step})
            print(f"{m:16} {method:15} {str(result.extra.get('schedule')):17} {step * 1e3:9.1f} ms")
            if best is None or step < best[0]:
                best = (step, placement)
        best[1].save(str(d / f"plan_{m}_best_{tag}.json"))
    (d / f"rivals_{m}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
