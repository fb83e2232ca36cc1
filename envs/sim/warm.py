"""Compile the simulator's numba kernels into numba's on-disk cache, once.

The kernels are compiled with ``cache=True``: in a fresh checkout or install they
compile on their first call (a minute or more on a small machine) and load from
``__pycache__`` after. ``python -m envs.sim.warm`` pays that once, for example
after ``pip install`` or before a test run on several workers, each of which would
otherwise compile the same kernels at the same time. It simulates a small graph in
every executor, node and planned issue orders, with and without microbatches, with
parameter homes, and one full schedule each.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

import graphs
from envs.cluster import Cluster
from envs.sim.homes import chain_pairs, homeable, parted
from envs.sim.schedule import EXECUTORS
from envs.sim.simulator import SimEnv
from graphs.ir import OpGraph
from graphs.ops import param_paths
from graphs.synthetic import random_dag


def warm(num_ops: int = 24, placements: int = 4) -> float:
    """Run every kernel once on a ``num_ops``-op graph; returns the seconds it took (compiling included).

    The graph is simulated as built and as read back from a file: their arrays differ in layout and
    writability, and numba compiles each kind once.
    """
    t0 = time.perf_counter()
    built = random_dag(num_ops, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "warm.json")
        graphs.save(built, path)
        for graph in (built, graphs.load(path)):
            _run_every_kernel(graph, placements)
    return time.perf_counter() - t0


def _run_every_kernel(graph: OpGraph, placements: int) -> None:
    cluster = Cluster.preset("k80x4")
    rng = np.random.default_rng(0)
    op_devices = rng.integers(0, cluster.num_devices, (placements, graph.num_ops)).astype(np.int32)
    # every parameter that can live apart homed on the host (one read through views: where they are on its reader's)
    paths = param_paths(graph)
    homes = np.where((homeable(graph, paths) > 0) & ~parted(op_devices, chain_pairs(graph, paths)), 0, -1)
    for executor in EXECUTORS:
        for plan in ({}, {"microbatches": 2}, {"microbatches": 2, "inflight": 1}):
            env = SimEnv(graph, cluster, executor=executor, **plan)
            env.step_times(op_devices)
            env.overflow(op_devices)
            if executor == "eager":
                env.step_times(op_devices, order="planned")
            if not plan and executor == "eager":  # (homes are simulated with one microbatch, eager)
                env.batch(op_devices, homes=homes)
            env.simulate(op_devices[0])
            env.simulate(op_devices[0], trace=True)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"envs.sim.warm: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """``python -m envs.sim.warm``: compile the kernels and say how long it took."""
    parser = _OneLineParser(prog="python -m envs.sim.warm", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print(f"envs.sim.warm: the simulator's kernels are compiled and cached ({warm():.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
