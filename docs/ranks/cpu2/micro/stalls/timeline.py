"""Each rank's actions and point-to-point calls in one step of a plan across 2 gloo ranks, on one clock.

A probe (BENCHMARKS.md, "The LM, with the microbatch's times"), run from the repository root:

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 \
        docs/ranks/cpu2/micro/stalls/timeline.py PLAN.json [NOGC=1] [BOOST=1]

``perf_counter`` is ``CLOCK_MONOTONIC``: both processes read one clock, so the ranks' times compare directly.
NOGC=1: Python's garbage collector off; BOOST=1: gloo's threads at nice -15 (needs root).
"""

import gc
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.pipelining.schedules as S

sys.path.insert(0, os.getcwd())
from bench import rank_models  # noqa: E402
from envs.real.allocator import steady_malloc  # noqa: E402
from envs.real.distributed.trace import ActionRecorder  # noqa: E402
from graphs.plan import Placement  # noqa: E402
from placer.distributed import stages as make_stages  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo")
if os.environ.get("NOGC"):
    gc.disable()
steady_malloc()
r = dist.get_rank()
model, inputs = rank_models.lm()
stages, sched = make_stages(model, Placement.load(sys.argv[1]), inputs)
LOG = []
_wait, _post = S._wait_batch_p2p, S._sorted_batch_p2p


def wait(work):
    t = time.perf_counter()
    out = _wait(work)
    LOG.append(("wait", t, time.perf_counter()))
    return out


def post(ops, desc=None):
    t = time.perf_counter()
    out = _post(ops, desc=desc)
    LOG.append((desc, t, time.perf_counter()))
    return out


S._wait_batch_p2p, S._sorted_batch_p2p = wait, post
opt = torch.optim.Adam(sched.parameters(), lr=1e-3)
rec = ActionRecorder(r, sched.stages, opt)
if os.environ.get("BOOST"):
    for t in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{t}/comm") as f:
            if f.read().strip() in ("gloo_tcp_loop", "pt_gloo_runloop"):
                os.setpriority(os.PRIO_PROCESS, int(t), -15)
T0, STEPS = [], []
for step in range(30):
    opt.zero_grad()
    dist.barrier()
    rec.begin_step()
    T0.append(rec._t0)
    sched.step(*inputs)
    opt.step()
    STEPS.append(time.perf_counter() - T0[-1])
base, end = T0[28], T0[29]
p2p = " ".join(f"{d}:{(a - base) * 1e3:.1f}-{(b - base) * 1e3:.1f}" for d, a, b in LOG if base <= a < end)
acts = " ".join(f"{e.kind}{e.microbatch}:{e.start_s * 1e3:.1f}-{e.end_s * 1e3:.1f}" for e in rec.steps[28])
time.sleep(0.3 * r)
print(f"rank {r}: median step {statistics.median(STEPS[5:]) * 1e3:.1f} ms\n  actions {acts}\n  p2p {p2p}", flush=True)
dist.destroy_process_group()
