"""How fast the host runs Adam: the optimizer step every plan with parameters on the host pays (issue 34).

FSDP2's ``CPUOffloadPolicy`` runs the whole model's Adam step on the host; a
placement with the token embedding on the host runs that module's. Both step
times are bounded below by ``parameters / rate`` with the rate measured here:
fp32 Adam (``torch.optim.Adam``: the foreach path, the per-tensor loop that its
defaults take with a parameter on the host, and the fused kernels that placer's
measurements build, :func:`envs.real.timing.adam`) over
``parameters`` split into tensors of ``tensor_params``, median of ``repeats``
steps after one warm-up step (which allocates the moments).

>>> r = adam_rate(200_000, threads=1, repeats=2, tensor_params=50_000)
>>> sorted(r) == ["foreach", "fused", "single_tensor"] and all(v > 0 for v in r.values())
True
"""

from __future__ import annotations

import statistics
import time

import torch


def adam_rate(parameters: int, *, threads: int, repeats: int = 3, tensor_params: int = 4_000_000) -> dict[str, float]:
    """Parameters updated per second by one fp32 Adam step on the host: ``{"foreach": ..., "single_tensor": ...,
    "fused": ...}``."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sizes = [tensor_params] * (parameters // tensor_params) + (
            [parameters % tensor_params] if parameters % tensor_params else []
        )
        out = {}
        paths = (("foreach", {"foreach": True}), ("single_tensor", {"foreach": False}), ("fused", {"fused": True}))
        for name, path in paths:
            params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.Adam(params, lr=1e-3, **path)
            opt.step()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t0)
            out[name] = parameters / statistics.median(times)
            del opt, params
        return out
    finally:
        torch.set_num_threads(before)


__all__ = ["adam_rate"]
