"""The simulator of ranks with its stages cut as arrays (``StageCutter.runs``, this checkout) and as tuples of ints
(``envs/sim/ranks.py`` at commit a05193f, the one before, loaded beside): every field of every Result the same, and
the milliseconds per plan.

200 random contiguous plans per case (cuts drawn with a fixed seed; the schedule's own stage layout), scored new,
old, new, old in this process; the best time of each kept. Run from a git checkout: ``OMP_NUM_THREADS=1
PYTHONPATH=. python docs/ranks_sim/runs_ab.py``; output: ``docs/ranks_sim/runs_ab.txt``.
"""

import importlib.util
import subprocess
import sys
import tempfile
import time

import numpy as np

import envs
from envs.sim import ranks as new
from graphs import zoo
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.pipeline_splits import stage_map
from placer.methods.heuristics.stage_search import stages_of

BEFORE = "a05193f"
CASES = [
    ("nmt-2", "k80x4", 1, None, 1),
    ("nmt-2", "k80x4", 4, None, 1),
    ("nmt-4", "h100x8", 8, "1f1b", 1),
    ("inception-v3", "k80x4", 2, "interleaved_1f1b", 2),
    ("rnnlm", "k80x2", 4, "zbv", 2),
    ("gpt2", "v100x4", 2, "interleaved_zb", 2),
]


def old_module():
    source = subprocess.run(["git", "show", f"{BEFORE}:envs/sim/ranks.py"], capture_output=True, text=True, check=True)
    path = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    path.write(source.stdout)
    path.close()
    spec = importlib.util.spec_from_file_location("ranks_before", path.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def fields(r):
    return (repr(r.step_time_s), r.status, r.message, r.peak_bytes, r.busy_s, r.extra)


def main() -> None:
    old = old_module()
    print(f"{'case':44s} {'new ms/plan':>11s} {'old ms/plan':>11s} {'new/old':>7s}  same Results")
    for name, preset, M, schedule, per in CASES:
        graph, cluster = zoo.graph(name), envs.Cluster.preset(preset)
        devices = gpu_devices(cluster)
        S, n = len(devices) * per, graph.num_ops
        on = devices[stage_map(len(devices), S, schedule)]
        rng = np.random.default_rng(0)
        plans = []
        for _ in range(200):
            cuts = sorted(rng.choice(np.arange(1, n), size=S - 1, replace=False).tolist())
            plans.append((on[stages_of(cuts, n)], (cuts[len(devices) - 1],) if schedule == "zbv" else ()))
        best, results = {}, {}
        for label in ("new", "old", "new", "old"):
            module = new if label == "new" else old
            sim = module.RankSim(graph, cluster, microbatches=M, schedule=schedule)  # a fresh memo each pass
            sim.simulate(plans[0][0], starts=plans[0][1])  # imports (torch's schedules) before the clock
            sim._memo.plans.clear()  # noqa: SLF001
            t = time.process_time()
            out = [sim.simulate(p, starts=s) for p, s in plans]
            best[label] = min(best.get(label, np.inf), (time.process_time() - t) / len(plans))
            results[label] = [fields(r) for r in out]
        case = f"{name} {preset} M={M} {schedule or 'fitting'}"
        same = results["new"] == results["old"]
        print(
            f"{case:44s} {1e3 * best['new']:11.3f} {1e3 * best['old']:11.3f} {best['new'] / best['old']:7.3f}  {same}"
        )


if __name__ == "__main__":
    main()
