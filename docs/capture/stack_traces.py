"""A capture's export with and without the nodes' stack traces (``graphs.export.without_stack_traces``), side by side.

Each zoo model is exported and read into its graph four times, with and without, alternating; the best of each is
kept, and the two graphs are checked to be the same (content hash). Run: ``PYTHONPATH=. python
docs/capture/stack_traces.py [names...]``; output: ``docs/capture/stack_traces.txt``.
"""

import sys
import time

from graphs import zoo
from graphs.export import export_program
from graphs.torch_capture import graph_from_program


def main(names: list[str]) -> None:
    print(f"{'model':14s} {'ops':>5s} {'traces':>8s} {'none':>8s} {'ratio':>6s} same graph")
    for name in names:
        model, inputs = zoo.build(name)
        times: dict[bool, list[float]] = {True: [], False: []}
        hashes: dict[bool, set[str]] = {True: set(), False: set()}
        for traces in (True, False, True, False):
            t = time.perf_counter()
            graph = graph_from_program(export_program(model, inputs, stack_traces=traces), name)
            times[traces].append(time.perf_counter() - t)
            hashes[traces].add(graph.content_hash)
        with_s, without_s = min(times[True]), min(times[False])
        same = hashes[True] == hashes[False] and len(hashes[True]) == 1
        print(f"{name:14s} {graph.num_ops:5d} {with_s:7.2f}s {without_s:7.2f}s {without_s / with_s:6.3f} {same}")


if __name__ == "__main__":
    main(sys.argv[1:] or zoo.names())
