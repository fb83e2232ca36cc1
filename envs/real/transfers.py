"""Copies between torch devices in a placed program, without host synchronisation where torch allows.

GPU->GPU copies are ``non_blocking`` peer copies, host->GPU copies go from pinned
memory with ``non_blocking=True``, and GPU->host copies stay synchronous, as the
host op that reads the result needs the data at once.
"""

from __future__ import annotations

from typing import Any

import torch


def copy_kind(source: torch.device, target: torch.device) -> str:
    """How :func:`to_device` copies a tensor from ``source`` to ``target``.

    ``"same"``: no copy; ``"peer"``: GPU->GPU, ``non_blocking``; ``"pinned"``: host->GPU
    from pinned memory, ``non_blocking``; ``"sync"``: any other pair (GPU->host, which
    the host op needs at once, and CPU/meta pairs), an ordinary ``.to()``.

    >>> copy_kind(torch.device("cpu"), torch.device("cuda:1")), copy_kind(torch.device("cuda:0"), torch.device("cpu"))
    ('pinned', 'sync')
    """
    if source == target:
        return "same"
    if target.type == "cuda":
        if source.type == "cuda":
            return "peer"
        if source.type == "cpu":
            return "pinned"
    return "sync"


def _copy_tensor(t: torch.Tensor, torch_device: torch.device) -> torch.Tensor:
    kind = copy_kind(t.device, torch_device)
    if kind == "same":
        return t
    if kind == "pinned":
        if not t.is_pinned():
            t = staged(t)
        return t.to(torch_device, non_blocking=True)
    if kind == "peer":
        return t.to(torch_device, non_blocking=True)  # stream-ordered on both devices; autograd's backward too
    return t.to(torch_device)


def staged(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a new dense, contiguous host buffer, pinned where CUDA is present.

    The staging buffer of a host->GPU copy. Any strided tensor is accepted: an
    expanded one (stride 0, which ``Tensor.pin_memory()`` refuses, as it keeps the
    strides), a slice, a transpose. The copy into it is differentiable (its
    gradient is the identity), and torch's pinned allocator keeps the block alive
    until the asynchronous copy to the GPU has read it. Without CUDA nothing can
    be pinned: the buffer is ordinary memory (the path tests take on the CPU).

    >>> x = torch.ones(3, 1, requires_grad=True)
    >>> s = staged(x.expand(3, 4))
    >>> s.is_contiguous(), s.stride(), s.requires_grad
    (True, (4, 1), True)
    """
    buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
    return buffer.copy_(t)


def to_device(value: Any, torch_device: str | torch.device) -> Any:
    """Copy a tensor (or a tuple/list of them) to ``torch_device``; other values pass through.

    >>> to_device((torch.ones(1), [torch.zeros(2), 3]), "cpu")
    (tensor([1.]), [tensor([0., 0.]), 3])
    """
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, torch.device(torch_device))
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, torch_device) for v in value)
    return value


def write_back(master: torch.Tensor, copy: torch.Tensor) -> None:
    """Copy an in-place update made on ``copy`` back into ``master`` (on another device).

    Where two logical devices are one real one, the copy is ``master`` itself (``to_device`` made none) and the update
    is there already: a copy onto itself would change nothing but the tensor's version, and a backward that reads
    what the update wrote (``scatter_reduce_``'s amax reads its result) would then refuse to run.

    >>> t = torch.zeros(2).scatter_reduce_(0, torch.tensor([0, 1]), torch.ones(2, requires_grad=True), "amax")
    >>> write_back(t, to_device(t, "cpu"))
    >>> t.sum().backward()
    """
    if copy is master:
        return
    with torch.no_grad():
        master.copy_(copy)
