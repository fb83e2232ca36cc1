import copy
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class TextClassifier(nn.Module):
    def __init__(self, vocab=65536, width=128, layers=4, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.layers = nn.ModuleList([layer] + [copy.deepcopy(layer) for _ in range(layers - 1)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens, labels):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return F.cross_entropy(self.head(self.norm(h).mean(1)), labels)


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
