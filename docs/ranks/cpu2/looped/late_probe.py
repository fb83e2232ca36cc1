"""Does a receive posted after its send wait for the sender's core? Both ranks compute, then rank 1 posts late.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 docs/ranks/cpu2/looped/late_probe.py

"late": rank 0 posts a send, then computes 20 ms; rank 1 computes 5 ms, then posts the receive and times it.
"early": rank 1 posts first and waits; rank 0 sends after 5 ms of compute (the wait printed less those 5 ms).
Output of one run: late_probe.txt.
"""

import statistics
import time

import torch
import torch.distributed as dist


def busy(seconds, a):
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        torch.mm(a, a)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    a = torch.randn(128, 128)
    for nbytes in (1 << 10, 1 << 16, 1 << 18, 1 << 20):
        buf = torch.zeros(nbytes // 4)
        for mode in ("late", "early"):
            waits = []
            for k in range(12):
                dist.barrier()
                if rank == 0:
                    if mode == "late":
                        work = dist.isend(buf, peer)
                        busy(0.02, a)
                        work.wait()
                    else:
                        busy(0.005, a)
                        dist.send(buf, peer)
                        busy(0.015, a)
                else:
                    if mode == "late":
                        busy(0.005, a)
                        t0 = time.perf_counter()
                        dist.recv(buf, peer)
                        waits.append(time.perf_counter() - t0)
                    else:
                        work = dist.irecv(buf, peer)
                        t0 = time.perf_counter()
                        work.wait()
                        waits.append(time.perf_counter() - t0 - 0.005)
            if rank == 1:
                ms = [round(w * 1e3, 2) for w in waits[2:]]
                print(nbytes, mode, f"median wait {statistics.median(waits[2:]) * 1e3:.2f} ms", ms, flush=True)
    dist.destroy_process_group()


main()
