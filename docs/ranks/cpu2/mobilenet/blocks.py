import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

torch.set_num_threads(1)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6()]
        layers += [
            nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False),
            nn.BatchNorm2d(hid),
            nn.ReLU6(),
            nn.Conv2d(hid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


class MobileNetV2(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        blocks = [nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())]
        c = 32
        for t, co, n, s in SETTINGS:
            for i in range(n):
                blocks.append(InvertedResidual(c, co, s if i == 0 else 1, t))
                c = co
        blocks.append(nn.Sequential(nn.Conv2d(c, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()))
        self.features = nn.ModuleList(blocks)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x, y):
        for b in self.features:
            x = b(x)
        return F.cross_entropy(self.classifier(x.mean((2, 3))), y)


res = int(sys.argv[1])
B = int(sys.argv[2])
torch.manual_seed(0)
m = MobileNetV2()
x = torch.randn(B, 3, res, res)
y = torch.randint(0, 1000, (B,))
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
