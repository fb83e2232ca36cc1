"""What a job's process spends on torch.export's imports, with the fork server preloading them and without.

Each job is two processes from :func:`envs.real.distributed.launch.launch`; each times the import of
``torch.export._trace`` (none where the fork server preloaded it), five exports of a 20-layer MLP after one to warm
up, and a fixed compute loop. The two settings alternate, each in a fresh interpreter (a fork server is started
once per process). Run: ``PYTHONPATH=. python docs/launch/preload.py``; output: ``docs/launch/preload.txt``.
"""

import os
import subprocess
import sys
import time


def entry() -> tuple[bool, float, float, float]:
    """A job's process: (preloaded, import s, 5 exports s, compute s)."""
    import torch

    from graphs.export import export_program

    preloaded = "torch.export._trace" in sys.modules
    t = time.perf_counter()
    import torch.export._trace  # noqa: F401

    import_s = time.perf_counter() - t
    model, x = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)]), torch.randn(8, 64)
    export_program(model, (x,))
    t = time.perf_counter()
    for _ in range(5):
        export_program(model, (x,))
    export_s = time.perf_counter() - t
    t = time.perf_counter()
    a = torch.randn(256, 256)
    for _ in range(300):
        a = torch.tanh(a @ a)
    return preloaded, import_s, export_s, time.perf_counter() - t


def one(setting: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from preload import entry as job  # importable by name: the fork server preloads its module

    import envs.real.distributed.launch as launch

    if setting == "without":
        launch.FORKSERVER_PRELOAD = ()
    for rank, (pre, imp, exp, comp) in sorted(launch.launch(job, (), nproc_per_node=2).items()):
        times = f"import {imp:5.2f} s  5 exports {exp:5.2f} s  compute {comp:5.2f} s"
        print(f"{setting:8s} rank {rank} preloaded {pre!s:5s} {times}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1])
    else:
        for setting in ("with", "without", "with", "without"):
            subprocess.run([sys.executable, __file__, setting], check=True)
