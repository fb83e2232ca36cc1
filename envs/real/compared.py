"""What the checks compare a placed step by: a tensor as float64 on the CPU (:func:`float64_cpu`).

The conformance checks (:mod:`envs.real.conformance`, in one process and across ranks) and
:func:`envs.real.pipeline.batch_mixing` compare losses, gradients and buffers with this one conversion.
"""

from __future__ import annotations

import torch


def float64_cpu(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, as float64 on the CPU: a complex tensor (a Fourier layer's weights, their gradient) as its
    real and imaginary parts (``torch.view_as_real``, a last dimension of 2), which ``double()`` would drop the second
    of.

    >>> float64_cpu(torch.tensor([1 + 2j])).tolist()
    [[1.0, 2.0]]
    >>> float64_cpu(torch.tensor([3], dtype=torch.int64)).dtype
    torch.float64
    """
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128).resolve_conj()).cpu()
    return t.double().cpu()


__all__ = ["float64_cpu"]
