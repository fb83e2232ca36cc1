"""How long a frozen layer's backward takes against its forward, as ``placer profile`` timed them on this CPU.

The simulator charges an op that reads only frozen weights ``BACKWARD_MULTIPLIER - 1`` x its forward (the input's
gradient alone), a trainable one ``BACKWARD_MULTIPLIER`` x (the input's and the weight's). This reads two profiles of
the same Llama, one with LoRA on every projection (the base weights frozen), one with every weight trainable, and
prints the medians of backward / forward over their dense layers (``aten.linear``). From the repository root::

    PYTHONPATH=.:docs/lora placer profile lora:wide_lora -o docs/lora/profile/wide_lora.json --repeats 5
    PYTHONPATH=.:docs/lora placer profile lora:wide_full -o docs/lora/profile/wide_full.json --repeats 5
    PYTHONPATH=.:docs/lora python docs/lora/backward_ratio.py
"""

import json

import lora
import numpy as np

from graphs.ops import frozen_weight_mask, grad_mask
from graphs.torch_capture import capture


def ratios(name: str, path: str) -> dict[str, list[float]]:
    graph = capture(*getattr(lora, name)())
    prof = json.load(open(path))
    cpu = prof["devices"]["cpu"]
    fwd, bwd = dict(zip(prof["ops"], cpu["fwd_s"])), dict(zip(prof["ops"], cpu["bwd_s"]))
    frozen, grad = frozen_weight_mask(graph), grad_mask(graph)
    out: dict[str, list[float]] = {"frozen": [], "trainable": [], "frozen, no backward": []}
    for i, (op, t) in enumerate(zip(graph.names, graph.op_types)):
        if t != "aten.linear.default" or not fwd.get(op) or bwd.get(op) is None:
            continue
        big = graph.flops[i] > 1e8  # the base projections and the head, not LoRA's rank-8 adapters
        if not big:
            continue
        kind = ("frozen" if grad[i] else "frozen, no backward") if frozen[i] else "trainable"
        out[kind].append(bwd[op] / fwd[op])
    return out


if __name__ == "__main__":
    for name in ("wide_lora", "wide_full"):
        for kind, values in ratios(name, f"docs/lora/profile/{name}.json").items():
            if values:
                print(
                    f"{name}: {kind} dense layers: backward / forward, median {np.median(values):.2f} "
                    f"({len(values)} layers, {min(values):.2f}-{max(values):.2f})"
                )
