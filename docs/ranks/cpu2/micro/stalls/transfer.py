"""64 KB from rank 0 to rank 1 over gloo while one of them computes: when does it arrive?

A probe (BENCHMARKS.md, "The LM, with the microbatch's times"):

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 docs/ranks/cpu2/micro/stalls/transfer.py

"late": the sender posts ``isend`` and computes 20 ms; the receiver computes 2 ms, then posts ``irecv`` and waits
(its median wait is when the data came, from the step's start). "early": the receiver posts ``irecv`` and waits;
the sender, 3 ms later, posts ``isend`` and computes 20 ms.
"""

import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
r = dist.get_rank()
a, b = torch.randn(256, 256), torch.randn(256, 256)
x = torch.randn(16 * 1024)


def busy(ms):
    t = time.perf_counter()
    while (time.perf_counter() - t) * 1e3 < ms:
        a @ b


res = {}
for mode in ("late", "early"):
    out = []
    for _ in range(11):
        dist.barrier()
        t0 = time.perf_counter()
        sender = r == 0 if mode == "late" else r == 1
        if sender:
            if mode == "early":
                time.sleep(0.003)
            w = dist.isend(x, 1 - r)
            busy(20)
            w.wait()
        else:
            if mode == "late":
                busy(2)
            w = dist.irecv(x, 1 - r)
            w.wait()
            out.append((time.perf_counter() - t0) * 1e3)
    if out:
        res[mode] = sorted(out)[len(out) // 2]
print(r, {k: f"data after {v:.2f} ms" for k, v in res.items()}, flush=True)
dist.destroy_process_group()
