"""A large embedding's dense gradient on the host, step after step, under three settings of glibc's malloc, each in
a process of its own (one thread): glibc's defaults, placer's first steady settings (blocks up to 1 GiB from the heap,
2 GiB of free heap top kept) and the unbounded ones of ``envs.real.allocator`` now.

    PYTHONPATH=. python docs/malloc/large_host_tensor.py            # 262,144 x 2,000 (1.95 GiB) and x 1,000
"""

import ctypes
import resource
import statistics
import subprocess
import sys
import time

SETTINGS = ("default", "bounded", "steady")


def one(setting: str, rows: int, dim: int, steps: int) -> str:
    import torch

    torch.set_num_threads(1)
    if setting == "bounded":
        libc = ctypes.CDLL(None)
        for param, value in ((-3, 1 << 30), (-1, (1 << 31) - 1), (-2, 64 << 20)):
            assert libc.mallopt(param, value) == 1
    elif setting == "steady":
        from envs.real.allocator import steady_malloc

        assert steady_malloc()
    emb = torch.nn.Embedding(rows, dim)
    ids = torch.randint(0, rows, (8, 512))

    def step():
        emb.weight.grad = None
        emb(ids).sum().backward()

    for _ in range(6):
        step()
    times, faults = [], []
    for _ in range(10):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return (
        f"| {rows:,} x {dim:,} ({rows * dim * 4 / 2**30:.2f} GiB) | {setting} | {statistics.median(times) * 1e3:.1f} "
        f"| {min(times) * 1e3:.1f}-{max(times) * 1e3:.1f} | {statistics.median(faults):,.0f} |"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(one(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 10))
        sys.exit(0)
    print("| embedding | malloc | median step (ms) | fastest-slowest | page faults per step (median) |")
    print("|---|---|---:|---|---:|")
    for dim in (2000, 1000):
        for setting in SETTINGS:
            out = subprocess.run(
                [sys.executable, __file__, setting, "262144", str(dim)], capture_output=True, text=True
            )
            print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])
