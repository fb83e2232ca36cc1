"""How long does a late hand-off wait between two pinned gloo ranks, with gloo's threads at the scheduler's slice and
at a short one?

    for s in 0 100; do PROBE_SLICE_US=$s OMP_NUM_THREADS=1 PYTHONPATH=. torchrun --nproc-per-node 2 \
        docs/ranks/cpu2/slices/probe.py; done

Each rank pinned to its own core (rank r on core r). "late": rank 0 posts a send, then computes 20 ms; rank 1
computes 5 ms, then posts the receive and times it (the sender's gloo thread must run, beside the sender's compute,
to move the data). "early": rank 1 posts first and waits; rank 0 sends after 5 ms of compute (the wait printed
less those 5 ms). PROBE_SLICE_US > 0: every thread but the main one asks for that slice once the group is up
(envs.real.slices). Output of one run: probe.txt.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

from envs.real.slices import shorten_helper_slices


def busy(seconds, a):
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        torch.mm(a, a)


def main():
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {int(os.environ["RANK"])})
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    us = int(os.environ.get("PROBE_SLICE_US", "0"))
    helpers = shorten_helper_slices(us) if us else []
    if rank == 0:
        print(f"slice {us or 'default'}: {len(helpers)} helper threads changed", flush=True)
    peer = 1 - rank
    a = torch.randn(128, 128)
    for nbytes in (1 << 10, 1 << 16, 1 << 18, 1 << 20):
        buf = torch.zeros(nbytes // 4)
        for mode in ("late", "early"):
            waits = []
            for _ in range(42):
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
                ms = [w * 1e3 for w in waits[2:]]
                print(
                    f"{nbytes:>8} B {mode:>5}: median {statistics.median(ms):.2f} ms, "
                    f"mean {statistics.mean(ms):.2f} ms, over 2 ms {sum(w > 2 for w in ms)}/{len(ms)}",
                    flush=True,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
