"""GFLOP/s of an LSTM layer, a linear layer and a transformer encoder layer, forward and backward, on one core
(width 256, 64 steps or tokens, batch 8 and 32): whether the op kinds run at rates FLOPs could mislead about.
PYTHONPATH=. python docs/ranks/cpu2/fidelity/op_rates.py (output: op_rates.txt)."""

import time

import torch

torch.set_num_threads(1)
T, H = 64, 256


def median_s(f, n=5):
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2]


for B in (8, 32):
    x = torch.randn(B, T, H, requires_grad=True)
    lstm = torch.nn.LSTM(H, H, batch_first=True)
    lin = torch.nn.Linear(H, 4 * H)
    enc = torch.nn.TransformerEncoderLayer(H, 4, 4 * H, dropout=0.0, batch_first=True)
    rows = {  # forward FLOPs; forward and backward take three times as many
        "lstm": (lambda: lstm(x)[0].sum().backward(), T * 2 * 2 * B * H * 4 * H),
        "linear": (lambda: lin(x).sum().backward(), 2 * B * T * H * 4 * H),
        "encoder layer": (lambda: enc(x).sum().backward(), 2 * B * T * 12 * H * H + 2 * 2 * B * T * T * H),
    }
    out = []
    for name, (f, flops) in rows.items():
        s = median_s(f)
        out.append(f"{name} {s * 1e3:.1f} ms {3 * flops / s / 1e9:.1f} GFLOP/s")
    print(f"B={B}: " + " | ".join(out))
