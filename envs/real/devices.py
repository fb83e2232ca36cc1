"""Logical devices (``cpu:0``, ``gpu:1``) as torch devices: device maps.

A plan names logical devices; a device map says which torch device runs each
(``"gpu:0=cuda:1,*=cpu"``). Without one, ``gpu:i`` is ``cuda:i`` and ``cpu:i`` the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch

from graphs import PlacerError

_LOGICAL_RE = re.compile(r"^(cpu|gpu):(\d+)$")


def parse_device_map(text: str) -> dict[str, str]:
    """Parse ``"gpu:0=cuda:1,*=cpu"`` into ``{"gpu:0": "cuda:1", "*": "cpu"}``.

    >>> parse_device_map("gpu:0=cuda:1, *=cpu")
    {'gpu:0': 'cuda:1', '*': 'cpu'}
    """
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise PlacerError(f"--device-map: {item!r} is not LOGICAL=TORCH_DEVICE (e.g. gpu:0=cuda:1 or *=cpu)")
        out[key.strip()] = value.strip()
    return out


def resolve_devices(
    logical: Iterable[str], device_map: Mapping[str, str] | str | None = None
) -> dict[str, torch.device]:
    """Torch device of each logical device name.

    Explicit entries of ``device_map`` win, then its ``"*"`` wildcard, then the
    default ``gpu:i -> cuda:i``, ``cpu:i -> cpu``.

    >>> resolve_devices(["cpu:0", "gpu:0", "gpu:1"], "gpu:1=cuda:0,*=cpu")
    {'cpu:0': device(type='cpu'), 'gpu:0': device(type='cpu'), 'gpu:1': device(type='cuda', index=0)}
    """
    entries = parse_device_map(device_map) if isinstance(device_map, str) else dict(device_map or {})
    out: dict[str, torch.device] = {}
    for device in logical:
        if device in out:
            continue
        target = entries.get(device, entries.get("*"))
        if target is None:
            m = _LOGICAL_RE.match(device)
            if not m:
                raise PlacerError(
                    f"device map: no torch device for logical device {device!r} (add {device}=... or *=...)"
                )
            target = "cpu" if m.group(1) == "cpu" else f"cuda:{m.group(2)}"
        try:
            out[device] = torch.device(target)
        except (RuntimeError, ValueError):
            raise PlacerError(f"device map: {target!r} (for {device!r}) is not a torch device") from None
    return out


def check_available(torch_devices: Mapping[str, torch.device]) -> None:
    """Raise :class:`PlacerError` if a logical device maps to a CUDA device this machine lacks."""
    for device, torch_device in torch_devices.items():
        index = torch_device.index or 0
        if torch_device.type == "cuda" and (not torch.cuda.is_available() or index >= torch.cuda.device_count()):
            raise PlacerError(
                f"{device} maps to {torch_device}, which this machine does not have (use a device map, e.g. "
                "--device-map '*=cpu')"
            )
