"""Plans of more stages than ranks against one stage per rank, each run as a job of two gloo ranks under several
settings, interleaved build by build: per rank, the compute its actions took (the median step's) over what the
simulator of ranks gives the same plan with the model's per-op times, and the rest of the step (waits, sends, the
runtime's work, the optimizer step) against the simulator's. Settings: ``os`` (the defaults: the ranks
left to the OS, receives posted as ``early_by_default`` says; before 2026-12-04's change that was torch's posting
for these schedules, and the files here were measured so), ``jit`` (torch's posting), ``pinned`` (a core each),
``early`` (every receive of a step posted as it begins), ``short`` (gloo's threads on a short scheduler slice),
``early+short``. The first plan gets every setting, the others (the reference) those that start with neither
``early`` nor ``jit``.

    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/ranks/auto/stages/variants.py MODEL [--plans auto,gpipe_placer]
        [--settings os,early] [--builds N] > out.json
"""

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import envs
from envs.real.distributed.launch import launch
from envs.real.distributed.worker import RankJob, one_core_each, run_rank
from envs.real.profiler.fit import with_profile
from envs.real.slices import HELPER_SLICE_US
from envs.sim.ranks import RankSim
from graphs import sources
from graphs.plan import Placement
from placer import distributed

D = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--plans", default="auto,gpipe_placer")
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--settings", default="os,pinned", help="os, pinned, early, short, early+short")
    a = ap.parse_args()
    source = f"bench.rank_models:{a.model}"
    model, inputs = sources.resolve_model(source)
    graph = sources.resolve_graph(source)
    cluster = envs.resolve_cluster(str(D / f"ranks_{a.model}.json"))
    timed = with_profile(graph, cluster, str(D / f"ops_{a.model}.json"), ranks=True)[0]
    jobs, simulated = {}, {}
    for p in a.plans.split(","):
        placement = Placement.load(str(D / f"plan_{a.model}_{p}.json") if "/" not in p else p)
        plan, _ = distributed.compile_for_model(model, inputs, placement, backend="gloo", nproc_per_node=2)
        jobs[p] = RankJob(source=source, plan=plan.to_dict(), warmup=2, steps=a.steps)
        result, events = RankSim(timed, cluster).timeline(placement)
        simulated[p] = {
            "step_s": result.step_time_s,
            "compute_s": {r: sum(e.end_s - e.start_s for e in events if e.rank == r and e.kind != "O") for r in (0, 1)},
        }
    settings = {
        "os": {},
        "jit": {"early_receives": False},
        "pinned": {"cpus": one_core_each(2)},
        "early": {"early_receives": True},
        "short": {"helper_slice_us": HELPER_SLICE_US},
        "early+short": {"early_receives": True, "helper_slice_us": HELPER_SLICE_US},
    }
    chosen = a.settings.split(",")
    first = a.plans.split(",")[0]
    variants = [(p, s) for p in jobs for s in chosen if p == first or not s.startswith(("early", "jit"))]
    rows = []
    for k in range(a.builds):
        for p, s in variants if k % 2 == 0 else variants[::-1]:
            report = launch(run_rank, (replace(jobs[p], **settings[s]),), nproc_per_node=2)[0]
            ev = report["timeline"]["events"]
            row = {"build": k, "plan": p, "setting": s, "step_s": report["step_time_s"], "events": ev}
            for r in (0, 1):
                c = sum(e[5] - e[4] for e in ev if e[0] == r and e[2] != "O")
                row[f"rank{r}_compute_s"] = c
                row[f"rank{r}_ratio"] = c / simulated[p]["compute_s"][r]
            rows.append(row)
            print(
                f"{a.model} build {k} {p:13} {s:11} step {row['step_s'] * 1e3:7.1f} ms (simulated "
                f"{simulated[p]['step_s'] * 1e3:.1f})  compute/simulated rank 0 {row['rank0_ratio']:.2f} "
                f"rank 1 {row['rank1_ratio']:.2f}",
                file=sys.stderr,
            )
    medians = {}
    for p, s in variants:
        mine = [r for r in rows if r["plan"] == p and r["setting"] == s]
        medians[f"{p}/{s}"] = {
            key: statistics.median(r[key] for r in mine) for key in ("step_s", "rank0_ratio", "rank1_ratio")
        }
        for r in (0, 1):  # what is not an action's compute: waits, sends, the runtime's work, the optimizer step
            medians[f"{p}/{s}"][f"rank{r}_rest_s"] = statistics.median(
                x["step_s"] - x[f"rank{r}_compute_s"] for x in mine
            )
            medians[f"{p}/{s}"][f"rank{r}_rest_simulated_s"] = simulated[p]["step_s"] - simulated[p]["compute_s"][r]
    for key, v in medians.items():
        print(
            f"{a.model} {key:22} step {v['step_s'] * 1e3:7.1f} ms  compute/simulated {v['rank0_ratio']:.2f} "
            f"{v['rank1_ratio']:.2f}  rest (measured/simulated) rank 0 {v['rank0_rest_s'] * 1e3:.1f}/"
            f"{v['rank0_rest_simulated_s'] * 1e3:.1f} ms, rank 1 {v['rank1_rest_s'] * 1e3:.1f}/"
            f"{v['rank1_rest_simulated_s'] * 1e3:.1f} ms",
            file=sys.stderr,
        )
    print(json.dumps({"model": a.model, "simulated": simulated, "rows": rows, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
