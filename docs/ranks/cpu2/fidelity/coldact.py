import sys
import time

import torch

from bench.rank_models import encoder_decoder_b32, mobilenet_v2_b128, unet_b32

torch.set_num_threads(1)

name = sys.argv[1]
M = int(sys.argv[2])
m, (x, y) = {"unet": unet_b32, "mnv2": mobilenet_v2_b128, "ed": encoder_decoder_b32}[name]()
xs, ys = x.chunk(M), y.chunk(M)


def interleaved():  # fwd+bwd of each microbatch before the next: activations hot
    for a, b in zip(xs, ys):
        m(a, b).backward()


def gpipe():  # every forward, then every backward: M microbatches' activations alive
    losses = [m(a, b) for a, b in zip(xs, ys)]
    for loss in losses:
        loss.backward()


for f in (interleaved, gpipe):
    f()
res = {f.__name__: [] for f in (interleaved, gpipe)}
for _ in range(5):
    for f in (interleaved, gpipe):
        m.zero_grad(set_to_none=True)
        t = time.perf_counter()
        f()
        res[f.__name__].append(time.perf_counter() - t)
med = {k: sorted(v)[2] * 1e3 for k, v in res.items()}
print(
    name,
    "M",
    M,
    {k: round(v, 1) for k, v in med.items()},
    "gpipe/interleaved",
    round(med["gpipe"] / med["interleaved"], 3),
)
