"""MobileNetV2's blocks one by one on one core (malloc steady): forward FLOPs and forward+backward time of each,
cumulative shares. PYTHONPATH=. python docs/ranks/cpu2/mobilenet/blocks.py RESOLUTION BATCH (output: blocks.txt)."""

import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.rank_models import MobileNetV2

torch.set_num_threads(1)


res = int(sys.argv[1])
B = int(sys.argv[2])
torch.manual_seed(0)
m = MobileNetV2()
x = torch.randn(B, 3, res, res)
y = torch.randint(0, 200, (B,))
# per block times fwd+bwd
h = x
rows = []
for i, b in enumerate(m.features):
    inp = h.detach().requires_grad_(True)
    with FlopCounterMode(display=False) as fcm:
        out = b(inp)
    fl = fcm.get_total_flops()
    g = torch.randn_like(out)

    def run():
        b.zero_grad(set_to_none=True)
        o = b(inp)
        o.backward(g)

    run()
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t)
    rows.append((i, fl, sorted(ts)[2] * 1e3, tuple(out.shape)))
    h = out.detach()
tf = sum(r[1] for r in rows)
tt = sum(r[2] for r in rows)
cf = ct = 0
for i, fl, t, s in rows:
    cf += fl
    ct += t
    print(f"{i:2d} {fl / 1e6:8.1f}MF {t:7.2f}ms  cumF {cf / tf:.2f} cumT {ct / tt:.2f} {s}")
print("total ms", tt, "GFLOP fwd", tf / 1e9)
opt = torch.optim.Adam(m.parameters(), fused=True)


def step():
    opt.zero_grad()
    m(x, y).backward()
    opt.step()


step()
ts = []
for _ in range(3):
    t = time.perf_counter()
    step()
    ts.append(time.perf_counter() - t)
print("step ms", sorted(ts)[1] * 1e3)
