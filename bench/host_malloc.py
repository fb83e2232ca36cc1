"""What the host's allocator costs a training step on the CPU: glibc's defaults against malloc kept steady.

Each run is a fresh process that builds ``--source``'s model, takes ``--warmup`` then
``--steps`` timed training steps (forward, the model's loss, backward, Adam) on one
thread, and counts the page faults of each; the settings alternate run by run (ABBA),
so a drift of the machine falls on both alike:

* ``default``: glibc's malloc as it comes (large blocks mapped and unmapped, the heap's
  top trimmed);
* ``steady``: :func:`envs.real.allocator.steady_malloc` first, as every measurement of
  placer runs.

Per setting: the median over runs of each run's median step, p10 and p90 of all steps,
p90/p10, and the median page faults per step. A markdown table (``--json``: every step)::

    python -m bench.host_malloc --source bench.rank_models:lm --runs 6 --steps 40
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bench.common import OneLineParser, machine_line, parse_list, repo_env
from graphs import PlacerError

SETTINGS = ("default", "steady")


def child(source: str, setting: str, warmup: int, steps: int) -> dict[str, Any]:
    """One run in this process (see the module doc): each timed step's seconds and page faults."""
    import resource

    import torch

    from envs.real.allocator import steady_malloc
    from envs.real.timing import adam, default_loss, train_step
    from graphs import sources

    torch.set_num_threads(1)
    if setting == "steady" and not steady_malloc():
        raise PlacerError("steady: this C library is not glibc")
    model, inputs = sources.resolve_model(source)
    model.train()
    optimizer = adam(model.parameters())
    for _ in range(warmup):
        train_step(model, inputs, optimizer, default_loss)
    times, faults = [], []
    for _ in range(steps):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        train_step(model, inputs, optimizer, default_loss)
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {"setting": setting, "step_times_s": times, "faults": faults}


def run(source: str, settings: list[str], runs: int, warmup: int, steps: int, say) -> dict[str, Any]:
    """``runs`` fresh processes per setting, alternating ABBA; every run's steps and each setting's summary."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    for k in range(runs):
        for s in settings if k % 2 == 0 else settings[::-1]:
            argv = ["--child", s, "--source", source, "--warmup", str(warmup), "--steps", str(steps)]
            cmd = [sys.executable, "-m", "bench.host_malloc", *argv]
            done = subprocess.run(cmd, capture_output=True, text=True, env=repo_env())
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("error: ")
                raise PlacerError(f"run {k} ({s}): {tail}")
            out[s].append(json.loads(done.stdout))
            say(f"  run {k}, {s}: {np.median(out[s][-1]['step_times_s']) * 1e3:.2f} ms")
    doc = {"source": source, "machine": machine_line(), "runs": out}
    return {**doc, "summary": {s: summary(r) for s, r in out.items()}}


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median of the runs' median steps, p10/p90 of every step, and the median page faults per step.

    >>> s = summary([{"step_times_s": [1.0, 2.0, 3.0], "faults": [0, 5, 7]}])
    >>> s["median_s"], s["faults_per_step"]
    (2.0, 5.0)
    """
    every = np.concatenate([r["step_times_s"] for r in runs])
    p10, p90 = np.percentile(every, [10, 90])
    return {
        "median_s": float(np.median([np.median(r["step_times_s"]) for r in runs])),
        "p10_s": float(p10),
        "p90_s": float(p90),
        "p90_over_p10": float(p90 / p10),
        "faults_per_step": float(np.median(np.concatenate([r["faults"] for r in runs]))),
    }


def table(doc: dict[str, Any]) -> str:
    lines = ["| malloc | runs | median ms | p10 ms | p90 ms | p90/p10 | page faults per step |", "|---|" + "---:|" * 6]
    for s, v in doc["summary"].items():
        lines.append(
            f"| {s} | {len(doc['runs'][s])} | {v['median_s'] * 1e3:.2f} | {v['p10_s'] * 1e3:.2f} | "
            f"{v['p90_s'] * 1e3:.2f} | {v['p90_over_p10']:.2f} | {v['faults_per_step']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.host_malloc", description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="bench.rank_models:lm", help="a zoo name or module:callable")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of default,steady")
    ap.add_argument("--runs", type=int, default=6, help="fresh processes per setting (default 6)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per run (default 5)")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per run (default 40)")
    ap.add_argument("--json", action="store_true", help="print every step as JSON")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # one run, in the process it starts
    args = ap.parse_args(argv)
    if args.runs < 1 or args.steps < 2 or args.warmup < 0:
        ap.error("--runs must be at least 1, --steps at least 2 and --warmup at least 0")
    try:
        if args.child:
            try:
                print(json.dumps(child(args.source, args.child, args.warmup, args.steps)))
            finally:  # the process ends here: its exit no longer walks torch's objects (~1 s, more on a busy host)
                gc.freeze()
            return 0
        settings = parse_list(args.settings, what="settings", known=list(SETTINGS))
        doc = run(args.source, settings, args.runs, args.warmup, args.steps, say=lambda s: print(s, file=sys.stderr))
    except PlacerError as e:  # a bad option or source: one line (a run's: the line its process ended with)
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(doc, indent=1) if args.json else table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
