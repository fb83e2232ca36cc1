"""Torch's global state (grad mode, autocast) as the caller had it, even when a placed program's call raises."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx


@contextlib.contextmanager
def global_state_kept() -> Iterator[None]:
    """Restore torch's grad mode and autocast state if the block raises.

    An exported program switches grad mode on entering a ``no_grad`` region and
    back on leaving it, and autocast likewise (``wrap_with_set_grad_enabled`` and
    ``wrap_with_autocast`` use no ``finally``): an error inside the region would
    leave the caller's process with gradients off, or autocast on.
    """
    grad = torch.is_grad_enabled()
    autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}
    try:
        yield
    except BaseException:
        torch.set_grad_enabled(grad)
        for d, (enabled, dtype) in autocast.items():
            torch.set_autocast_enabled(d, enabled)
            torch.set_autocast_dtype(d, dtype)
        raise


def keep_global_state(gm: fx.GraphModule) -> None:
    """Run every call of ``gm`` under :func:`global_state_kept` (until ``gm.recompile()``).

    A ``GraphModule`` has a class of its own, so this wraps that instance's forward only.
    """
    cls = type(gm)
    run = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        with global_state_kept():
            return run(self, *args, **kwargs)

    forward.__wrapped__ = run  # type: ignore[attr-defined]
    cls.forward = forward
