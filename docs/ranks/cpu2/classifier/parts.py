"""The text classifier's parts on one core: a training step, forward+backward, the Adam step, the embedding's
forward+backward, one layer's. PYTHONPATH=. python docs/ranks/cpu2/classifier/parts.py VOCAB BATCH LAYERS
(output: parts.txt; run with and without malloc kept steady)."""

import sys
import time

import torch

from bench.rank_models import TextClassifier

torch.set_num_threads(1)


V = int(sys.argv[1])
B = int(sys.argv[2])
L = int(sys.argv[3])
torch.manual_seed(0)
m = TextClassifier(V, layers=L)
x = torch.randint(0, V, (B, 64))
y = torch.randint(0, 4, (B,))
opt = torch.optim.Adam(m.parameters())


def t(f, n=5):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e3


def step():
    opt.zero_grad()
    m(x, y).backward()
    opt.step()


def fb():
    m.zero_grad()
    m(x, y).backward()


step()
step()
print("step", t(step), "fwdbwd", t(fb), "adam", t(opt.step))
emb = m.embed
e = emb(x)


def ebwd():
    emb.zero_grad(set_to_none=True)
    emb(x).sum().backward()


print("embed fwd+bwd", t(ebwd))
h = e.detach().requires_grad_()
l0 = m.layers[0]


def lfb():
    l0.zero_grad()
    l0(h).sum().backward()


print("layer fwd+bwd", t(lfb))
print("params embed", emb.weight.numel() / 1e6, "total", sum(p.numel() for p in m.parameters()) / 1e6)
# the embedding table's Adam step alone: torch's fused kernel (what placer runs) against the default path
table = [torch.nn.Parameter(torch.randn(V, 128))]
table[0].grad = torch.randn_like(table[0])
for fused in (True, None):
    adam = torch.optim.Adam(table, fused=fused)
    print("embedding table Adam", "fused" if fused else "default", t(adam.step, 7))
