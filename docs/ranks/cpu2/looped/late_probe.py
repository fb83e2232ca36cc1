"""Does a receive posted after its send wait for the sender's core? Both ranks compute, then rank 1 posts late.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 docs/ranks/cpu2/looped/late_probe.py

"late": rank 0 posts a send, then computes 20 ms; rank 1 computes 5 ms, then posts the receive and times it.
"early": rank 1 posts first and waits; rank 0 sends after 5 ms of compute (the wait printed less those 5 ms).
Output of one run: late_probe.txt (12 rounds, unpinned).

The same probe with each rank pinned to its own core (rank r on core r), 42 rounds, and gloo's threads at a short
scheduler slice when PROBE_SLICE_US > 0 (envs.real.slices; docs/ranks/cpu2/slices/probe.txt):

    for s in 0 100; do PROBE_PIN=1 PROBE_ROUNDS=42 PROBE_SLICE_US=$s OMP_NUM_THREADS=1 PYTHONPATH=. \
        torchrun --nproc-per-node 2 docs/ranks/cpu2/looped/late_probe.py; done
"""

import os
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
    if os.environ.get("PROBE_PIN"):
        os.sched_setaffinity(0, {int(os.environ["RANK"])})
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    us = int(os.environ.get("PROBE_SLICE_US", "0"))
    if us:
        from envs.real.slices import shorten_helper_slices

        helpers = shorten_helper_slices(us)
        if rank == 0:
            print(f"slice {us} us: {len(helpers)} helper threads changed", flush=True)
    rounds = int(os.environ.get("PROBE_ROUNDS", "12"))
    peer = 1 - rank
    a = torch.randn(128, 128)
    for nbytes in (1 << 10, 1 << 16, 1 << 18, 1 << 20):
        buf = torch.zeros(nbytes // 4)
        for mode in ("late", "early"):
            waits = []
            for _ in range(rounds):
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
                line = f"median wait {statistics.median(ms):.2f} ms, mean {statistics.mean(ms):.2f} ms"
                line += f", over 2 ms {sum(w > 2 for w in ms)}/{len(ms)}"
                print(nbytes, mode, line, [round(w, 2) for w in ms] if rounds <= 12 else "", flush=True)
    dist.destroy_process_group()


main()
