"""A pipeline by hand on 2 gloo ranks, no torch pipelining: 4 microbatches forward (5 ms each) then backward (9 ms
each), 64 KB a message; the receives posted just in time (as torch's schedules post them) or all at once ahead.

A probe (BENCHMARKS.md, "Receives posted early"):

    OMP_NUM_THREADS=1 MODE=jit python -m torch.distributed.run --nproc-per-node 2 docs/ranks/cpu2/receives/handpipe.py
    OMP_NUM_THREADS=1 MODE=early python -m torch.distributed.run --nproc-per-node 2 docs/ranks/cpu2/receives/handpipe.py

With no delay in the messages a step takes 70.4 ms (rank 0: 4 x 5 ms forward; rank 1 ends its forward at 25 ms
and sends gradients at 34, 43, 52, 61 ms; rank 0's last backward ends at 70 ms). Each rank prints its median
step and one step's timeline (its own clock from the step's barrier).
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
r = dist.get_rank()
A, B = torch.randn(128, 128), torch.randn(128, 128)
M, MODE = 4, os.environ.get("MODE", "jit")


def compute(ms):
    t = time.perf_counter()
    while (time.perf_counter() - t) * 1e3 < ms:
        A @ B


def phase(sender: int, ms: float, bufs: list, t0: float, ev: list) -> None:
    """M messages from ``sender`` to the other rank, each after ``ms`` of the sender's compute; the receiver
    computes ``ms`` after each."""
    works = []
    early = [dist.irecv(b, sender) for b in bufs] if (r != sender and MODE == "early") else None
    for i, buf in enumerate(bufs):
        if r == sender:
            compute(ms)
            ev.append(("send", i, time.perf_counter()))
            works.append(dist.isend(buf, 1 - sender))
        else:
            (early[i] if early else dist.irecv(buf, sender)).wait()
            ev.append(("got", i, time.perf_counter()))
            compute(ms)
    for w in works:
        w.wait()


log = []
for _ in range(25):
    bufs = [torch.zeros(16 * 1024) for _ in range(M)]
    dist.barrier()
    t0, ev = time.perf_counter(), []
    phase(0, 5, bufs, t0, ev)  # forward: rank 0 sends activations
    phase(1, 9, bufs, t0, ev)  # backward: rank 1 sends gradients
    ev.append(("end", -1, time.perf_counter()))
    log.append((t0, ev))
time.sleep(0.2 * r)
steps = [ev[-1][2] - t0 for t0, ev in log]
t0, ev = log[20]
line = " ".join(f"{k}{i}@{(t - t0) * 1e3:.1f}" for k, i, t in ev)
print(f"rank {r} {MODE}: median step {statistics.median(steps[5:]) * 1e3:.1f} ms; {line}", flush=True)
dist.destroy_process_group()
