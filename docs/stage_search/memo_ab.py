"""``stage_search`` with its memo of scored plans (this checkout) and without (the module at commit 264ddff, the one
before it, loaded beside), side by side on the zoo's graphs: the same plan, and the time and plans simulated.

Each case runs new, old, new, old; the best time of each is kept. Run from a git checkout: ``PYTHONPATH=. python
docs/stage_search/memo_ab.py``; output: ``docs/stage_search/memo_ab.txt``.
"""

import importlib.util
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

import envs
import graphs
from placer.methods.heuristics import stage_search as new

BEFORE = "264ddff"
CASES = [
    ("nmt-2", "k80x4", 1, {}),
    ("rnnlm", "k80x4", 1, {}),
    ("gpt2", "k80x4", 4, {}),
    ("inception-v3", "k80x2", 2, {}),
    ("gpt2", "k80x4", 4, {"schedule": "zbv"}),
    ("rnnlm", "k80x4", 4, {"merge": True}),
    ("gpt2", "k80x4", 8, {"schedule": "interleaved_1f1b", "stages_per_rank": 2}),
    ("resnet50", "k80x4", 4, {"schedule": "auto"}),
]


def old_module():
    where = f"{BEFORE}:placer/methods/heuristics/stage_search.py"
    source = subprocess.run(["git", "show", where], capture_output=True, text=True, check=True).stdout
    path = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    path.write(source)
    path.close()
    spec = importlib.util.spec_from_file_location("stage_search_before", path.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["stage_search_before"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    old = old_module()
    for name, cluster_name, M, options in CASES:
        graph, cluster = graphs.zoo.graph(name), envs.Cluster.preset(cluster_name)
        runs: dict[str, list] = {"new": [], "old": []}
        for which, module in (("new", new), ("old", old), ("new", new), ("old", old)):
            counted: list[int] = []
            env = SimpleNamespace(microbatches=M, inflight=None, count_simulated=counted.append)
            t = time.perf_counter()
            out = module.stage_search(graph, cluster, env=env, **options)
            seconds = time.perf_counter() - t
            plan = (
                np.asarray(getattr(out, "op_devices", out)).tobytes(),
                getattr(out, "starts", None),
                getattr(out, "schedule", None),
                tuple(sorted((getattr(out, "tried", None) or {}).items())),
            )
            runs[which].append((seconds, plan, sum(counted)))
        same = len({r[1] for r in runs["new"] + runs["old"]}) == 1
        t_new, t_old = min(r[0] for r in runs["new"]), min(r[0] for r in runs["old"])
        print(
            f"{name:13s} {cluster_name} M={M} {options}: same plan {same}; {t_new:.2f} s against {t_old:.2f} s "
            f"({t_new / t_old:.2f}x); plans simulated {runs['new'][0][2]} against {runs['old'][0][2]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
