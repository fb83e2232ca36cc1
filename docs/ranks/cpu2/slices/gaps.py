"""Where a looped plan's ranks wait, with gloo's threads at the scheduler's slice and at a short one.

    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/ranks/cpu2/slices/gaps.py SOURCE PLAN BUILDS > gaps.json

Each build is one job of two gloo ranks, pinned one to a core, 3 warm-up and 20 timed steps; the two settings
alternate ABBA. From each job's median step (the report's timeline: every rank's actions) it prints the step time and,
per rank, the time between its first action's start and its last action's end that no action ran ("idle"), and the
longest such gap. The idle of a rank waiting for a message is where a late hand-off shows.
"""

import json
import statistics
import sys
from dataclasses import replace

from envs.real.distributed.launch import launch
from envs.real.distributed.worker import RankJob, one_core_each, run_rank
from envs.real.slices import HELPER_SLICE_US
from graphs import sources
from graphs.plan import Placement
from placer import distributed


def idle(events, rank):
    """(idle seconds, longest gap) of ``rank``'s actions in one step's timeline."""
    spans = sorted((e[4], e[5]) for e in events if e[0] == rank)
    gaps = [max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:])]
    return sum(gaps), max(gaps, default=0.0)


def main():
    source, plan_path, builds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model, inputs = sources.resolve_model(source)
    plan, _ = distributed.compile_for_model(model, inputs, Placement.load(plan_path), backend="gloo", nproc_per_node=2)
    job = RankJob(source=source, plan=plan.to_dict(), warmup=3, steps=20, cpus=one_core_each(2))
    settings = {"default": None, "short": HELPER_SLICE_US}
    out = {name: [] for name in settings}
    for k in range(builds):
        for name in list(settings) if k % 2 == 0 else list(settings)[::-1]:
            report = launch(run_rank, (replace(job, helper_slice_us=settings[name]),), nproc_per_node=2)[0]
            events = report["timeline"]["events"]
            row = {"build": k, "step_time_s": report["step_time_s"]}
            for r in (0, 1):
                row[f"rank{r}_idle_s"], row[f"rank{r}_longest_gap_s"] = idle(events, r)
            out[name].append(row)
            print(name, {key: round(v * 1e3, 2) if key != "build" else v for key, v in row.items()}, file=sys.stderr)
    summary = {
        name: {key: statistics.median(r[key] for r in rows) for key in rows[0] if key != "build"}
        for name, rows in out.items()
    }
    print(json.dumps({"argv": sys.argv[1:], "builds": out, "medians": summary}, indent=1))


if __name__ == "__main__":
    main()
