"""Each decoder layer of ``bench.rank_models:deepseek_moe_b32`` alone on one core: its FLOPs (torch's counter),
forward and backward time (median of 5), the rate, and its foreach Adam step. Run from the repository root:

    D=docs/ranks/cpu2/deepseek_moe; OMP_NUM_THREADS=1 PYTHONPATH=. python $D/layers.py > $D/layers.txt
"""

import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.rank_models import SEQ, deepseek_moe_b32

torch.set_num_threads(1)
model, (tokens, _) = deepseek_moe_b32()
lm = model.model.model
h = lm.embed_tokens(tokens).detach()
position = lm.rotary_emb(h, torch.arange(SEQ)[None])


def step(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = layer(x, position_embeddings=position, attention_mask=None)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()
    return out


print("layer  kind             params  GFLOP (fwd+bwd)  ms (fwd+bwd)  GFLOP/s  Adam ms")
for i, layer in enumerate(lm.layers):
    x = h.clone().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        out = step(layer, x)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        step(layer, x)
        times.append(time.perf_counter() - t)
    opt = torch.optim.Adam(layer.parameters(), foreach=True)
    opt.step()
    adam = []
    for _ in range(5):
        t = time.perf_counter()
        opt.step()
        adam.append(time.perf_counter() - t)
    flops, ms = counter.get_total_flops(), statistics.median(times) * 1e3
    params = sum(p.numel() for p in layer.parameters())
    kind = type(layer.mlp).__name__
    print(
        f"{i:5d}  {kind:15s} {params / 1e6:6.2f}M {flops / 1e9:16.2f} {ms:13.1f} {flops / ms / 1e6:8.1f} "
        f"{statistics.median(adam) * 1e3:8.2f}"
    )
    h = out.detach()
