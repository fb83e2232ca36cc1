"""Benchmark the graph layer: load and memory of a synthetic graph, coarsening, zoo capture.

    python -m bench.graph_layer                  # table; 100,000-op graph; all zoo models
    python -m bench.graph_layer --skip-capture --json

Times are wall-clock seconds from :func:`time.perf_counter`; the median of
``repeats`` runs is reported (with the best run), and the process's CPU seconds
(:func:`time.process_time`), which a busy shared machine inflates less. Memory is what
:mod:`tracemalloc` sees (Python objects and numpy buffers), measured in a separate
run because tracing slows allocation down.

>>> row = bench_load(200, repeats=1)
>>> row["ops"], row["load_s"] > 0, row["load_peak_bytes"] > row["graph_bytes"] > 0
(200, True, True)
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import gc
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Callable

from bench.common import OneLineParser
from graphs import zoo
from graphs.grouping import coarsen
from graphs.io import load, save
from graphs.ir import OpGraph
from graphs.synthetic import random_dag
from graphs.torch_capture import capture


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], list[float], Any]:
    """(wall seconds per run, CPU seconds per run, last result)."""
    wall, cpu, out = [], [], None
    for _ in range(max(int(repeats), 1)):
        out = None
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu, out


def _traced(fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """(peak bytes during fn, bytes still held by its result, result)."""
    gc.collect()
    tracemalloc.start()
    try:
        out = fn()
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, held, out


def bench_load(num_ops: int = 100_000, *, seed: int = 0, repeats: int = 3) -> dict[str, Any]:
    """Save a synthetic ``num_ops`` graph as JSON, then time and trace :func:`graphs.load` of it."""
    graph = random_dag(num_ops, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.json")
        save(graph, path)
        times, cpu, loaded = _timed(lambda: load(path), repeats)
        del loaded
        peak, held, loaded = _traced(lambda: load(path))
        file_bytes = os.path.getsize(path)
    return {
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "file_bytes": file_bytes,
        "load_s": statistics.median(times),
        "load_best_s": min(times),
        "load_cpu_s": statistics.median(cpu),
        "load_peak_bytes": peak,
        "graph_bytes": held,
    }


def bench_coarsen(graph: OpGraph, max_groups: int = 256, *, repeats: int = 3) -> dict[str, Any]:
    """Time :func:`graphs.grouping.coarsen` (source hash already computed, as after a load)."""
    graph.content_hash
    times, cpu, grouping = _timed(lambda: coarsen(graph, max_groups), repeats)
    return {
        "ops": graph.num_ops,
        "max_groups": max_groups,
        "groups": grouping.num_groups,
        "group_edges": grouping.graph.num_edges,
        "coarsen_s": statistics.median(times),
        "coarsen_best_s": min(times),
        "coarsen_cpu_s": statistics.median(cpu),
    }


def bench_capture(
    names: list[str] | None = None, *, progress: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Build each zoo model on the meta device and capture it, bypassing the disk cache.

    Returns one row per model: build and capture seconds, ops, edges.
    """
    rows = []
    for name in names or zoo.names():
        if progress is not None:
            progress(f"capturing {name}")
        t0 = time.perf_counter()
        model, inputs = zoo.build(name, device="meta")
        t1, c1 = time.perf_counter(), time.process_time()
        graph = capture(model, inputs, name=name)
        t2, c2 = time.perf_counter(), time.process_time()
        rows.append(
            {
                "model": name,
                "ops": graph.num_ops,
                "edges": graph.num_edges,
                "build_s": t1 - t0,
                "capture_s": t2 - t1,
                "capture_cpu_s": c2 - c1,
            }
        )
    return rows


def run(
    num_ops: int = 100_000,
    *,
    max_groups: int = 256,
    repeats: int = 3,
    capture: bool = True,
    models: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """All graph benchmarks; the JSON object ``python -m bench.graph_layer --json`` prints."""
    if progress is not None:
        progress(f"load: synthetic graph of {num_ops:,} ops")
    load_row = bench_load(num_ops, repeats=repeats)
    graph = random_dag(num_ops, seed=0)
    if progress is not None:
        progress(f"coarsen to {max_groups} groups")
    coarsen_row = bench_coarsen(graph, max_groups, repeats=repeats)
    capture_rows = bench_capture(models, progress=progress) if capture else []
    return {"load": load_row, "coarsen": coarsen_row, "capture": capture_rows, "memory_measure": "tracemalloc"}


def format_table(result: dict[str, Any]) -> str:
    """The readable report of :func:`run`."""
    ld, co = result["load"], result["coarsen"]
    mib = 1 << 20
    lines = [
        f"synthetic graph: {ld['ops']:,} ops, {ld['edges']:,} edges, JSON {ld['file_bytes'] / mib:.1f} MiB",
        f"  load          {ld['load_s']:7.2f} s  (best {ld['load_best_s']:.2f} s, CPU {ld['load_cpu_s']:.2f} "
        "s; target < 2 s)",
        f"  load peak     {ld['load_peak_bytes'] / mib:7.1f} MiB (tracemalloc); graph held "
        f"{ld['graph_bytes'] / mib:.1f} MiB",
        f"  coarsen       {co['coarsen_s']:7.2f} s  (best {co['coarsen_best_s']:.2f} s, CPU "
        f"{co['coarsen_cpu_s']:.2f} s; target < 10 s) "
        f"-> {co['groups']} groups, {co['group_edges']} group edges",
    ]
    if result["capture"]:
        lines += ["", f"{'model':<14}{'ops':>8}{'edges':>8}{'build s':>10}{'capture s':>11}{'CPU s':>8}"]
        for r in result["capture"]:
            lines.append(
                f"{r['model']:<14}{r['ops']:>8,}{r['edges']:>8,}{r['build_s']:>10.2f}{r['capture_s']:>11.2f}{r['capture_cpu_s']:>8.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.graph_layer", description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="ops in the synthetic graph (default 100000)")
    parser.add_argument("--groups", type=int, default=256, help="max_groups for coarsening (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported (default 3)")
    parser.add_argument("--skip-capture", action="store_true", help="do not capture the zoo models")
    parser.add_argument("--models", nargs="*", default=None, help="zoo models to capture (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    result = run(
        args.ops,
        max_groups=args.groups,
        repeats=args.repeats,
        capture=not args.skip_capture,
        models=args.models,
        progress=lambda line: print(line, file=sys.stderr),
    )
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
