"""Why the text classifier's embedding gradient costs about twice what the simulator charges to accumulate.

On two CPU ranks its embedding-only stage's backward took 1.8-2.4 ms for a step's first microbatch and 4.9-7.1 ms
for the others (BENCHMARKS.md, "The models again with receives posted early"), where the simulator charges 3.3 ms on
average: the profiled microbatch plus ``ACCUMULATE_TRAFFIC_MULTIPLIER`` passes over the 33.6 MB weight at the rank's
bandwidth. This times the same embedding (65,536 x 128, fp32) backward per microbatch (M = 4 of a batch of 8 x 64
tokens, one thread, glibc's malloc kept steady as placer measures), beside a bare ``a += b`` and a copy of its size,
on one core alone and then on both cores at once (two copies of this script, as two ranks run):

    PYTHONPATH=. python docs/ranks/accum/probe.py            # both settings, one after the other
    PYTHONPATH=. python docs/ranks/accum/probe.py --one      # one copy, the line only (what the pair runs)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

V, D, M, B, S = 65536, 128, 4, 8, 64


def one() -> str:
    import torch

    from envs.real.allocator import steady_malloc

    steady_malloc()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(V, D)
    tokens = torch.randint(0, V, (B, S))

    def step() -> list[float]:
        emb.weight.grad = None
        times = []
        for m in range(M):
            loss = emb(tokens[m * B // M : (m + 1) * B // M]).sum()
            t = time.perf_counter()
            loss.backward()
            times.append(time.perf_counter() - t)
        return times

    for _ in range(3):
        step()
    rows = [step() for _ in range(30)]
    first = statistics.median(r[0] for r in rows)
    later = statistics.median(x for r in rows for x in r[1:])
    a, b, c = torch.randn(V, D), torch.randn(V, D), torch.empty(V, D)

    def median_s(fn) -> float:
        times = []
        for _ in range(30):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    add, copy = median_s(lambda: a.add_(b)), median_s(lambda: c.copy_(b))
    nbytes = V * D * 4
    return (
        f"backward: first {first * 1e3:.2f} ms, later {later * 1e3:.2f} ms"
        f" (accumulation {(later - first) * 1e3:.2f} ms)"
        f"; a += b {add * 1e3:.2f} ms ({3 * nbytes / add / 1e9:.1f} GB/s over 3 passes)"
        f"; copy {copy * 1e3:.2f} ms ({2 * nbytes / copy / 1e9:.1f} GB/s over 2 passes)"
    )


def main() -> None:
    if "--one" in sys.argv:
        print(one(), flush=True)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--one"]
    alone = subprocess.run(["taskset", "-c", "0", *cmd], env=env, capture_output=True, text=True, check=True)
    print(f"one core alone:   {alone.stdout.strip()}")
    pair = [
        subprocess.Popen(["taskset", "-c", str(c), *cmd], env=env, stdout=subprocess.PIPE, text=True) for c in (0, 1)
    ]
    for core, p in enumerate(pair):
        print(f"both cores, core {core}: {p.communicate()[0].strip()}")


if __name__ == "__main__":
    main()
