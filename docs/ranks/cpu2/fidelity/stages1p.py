"""One process, one core: a U-Net b32 plan's two stage modules (placer's, cut from the captured program) run in
GPipe order on M = 8 microbatches, against the eager model on the same microbatches. From the repository root:

    PYTHONPATH=. python docs/ranks/cpu2/fidelity/stages1p.py METHOD   # a method of early/splits_unet_b32.json
"""

import json
import sys
import time

import torch

from bench.rank_models import unet_b32
from envs.real.distributed.stage_modules import stage_programs
from graphs.torch_capture import export_program, graph_from_program

torch.set_num_threads(1)
M = 8
model, (x, y) = unet_b32()
xs, ys = x.chunk(M), y.chunk(M)
prog = export_program(model, (xs[0], ys[0]))
g = graph_from_program(prog)
doc = json.load(open("docs/ranks/cpu2/early/splits_unet_b32.json"))
row = next(r for r in doc["models"][0]["rows"] if r["method"] == sys.argv[1])
a = row["placement"]["assignment"]
stage_ops = [[n for n in g.names if a[n] == d] for d in ("cpu:0", "cpu:1")]
mods = stage_programs(prog.module(), stage_ops)


def staged():
    outs, received, losses = [], [], []
    for i in range(M):
        o = mods[0](xs[i], ys[i])
        o = o if isinstance(o, tuple) else (o,)
        outs.append(o)
        r = [t.detach().requires_grad_(t.requires_grad) for t in o]
        received.append(r)
        losses.append(mods[1](*r))
    for i in range(M):
        losses[i].backward()
        pairs = [(t, r.grad) for t, r in zip(outs[i], received[i]) if r.grad is not None and t.requires_grad]
        torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])


def eager():
    for i in range(M):
        model(xs[i], ys[i]).backward()


for f in (staged, eager):
    f()
res = {f.__name__: [] for f in (staged, eager)}
for _ in range(5):
    for f in (staged, eager):
        for m in (*mods, model):
            m.zero_grad(set_to_none=True)
        t = time.perf_counter()
        f()
        res[f.__name__].append(time.perf_counter() - t)
print(sys.argv[1], {k: round(sorted(v)[2] * 1e3, 1) for k, v in res.items()})
