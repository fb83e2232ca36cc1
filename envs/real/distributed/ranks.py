"""Which process runs each logical device: its rank, and the torch device it uses there.

One process per logical device of the plan. By default the plan's devices, in the
order of its device list, are ranks ``0, 1, ...``; a *rank map* (``"gpu:0=1,gpu:1=0"``)
says otherwise. The torch device a rank uses is ``cpu`` with the gloo backend and
``cuda:<local rank>`` with nccl; a device map (``"*=cpu"``, the syntax of
:func:`envs.real.placing.parse_device_map`) overrides it per logical device.

>>> ranks = assign_ranks(["gpu:0", "gpu:1"], backend="nccl", nproc_per_node=2)
>>> ranks["gpu:1"]
RankDevice(rank=1, torch_device='cuda:1')
>>> assign_ranks(["gpu:0", "gpu:1"], "gpu:0=1,gpu:1=0", backend="gloo", nproc_per_node=2)["gpu:0"]
RankDevice(rank=1, torch_device='cpu')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envs.real.devices import parse_device_map
from graphs import PlacerError

#: The process-group backends a plan runs on.
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class RankDevice:
    """Where one logical device runs: the process (global rank) and the torch device in it."""

    rank: int
    torch_device: str


def plan_devices(assignment: Mapping[str, str], device_list: Sequence[str]) -> list[str]:
    """The logical devices a plan uses, in the order of its device list (devices outside it last, sorted).

    >>> plan_devices({"a": "gpu:1", "b": "cpu:0"}, ["cpu:0", "gpu:0", "gpu:1"])
    ['cpu:0', 'gpu:1']
    """
    used = set(assignment.values())
    listed = [d for d in device_list if d in used]
    return listed + sorted(used - set(listed))


def parse_rank_map(text: str, devices: Sequence[str]) -> dict[str, int]:
    """``"gpu:0=1,gpu:1=0"`` -> ``{"gpu:0": 1, "gpu:1": 0}``: every device of ``devices`` once, ranks ``0..N-1``.

    >>> parse_rank_map("gpu:1=0, gpu:0=1", ["gpu:0", "gpu:1"])
    {'gpu:1': 0, 'gpu:0': 1}
    """
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value.isdigit():
            raise PlacerError(f"--rank-map: {item!r} is not LOGICAL=RANK (e.g. gpu:0=1)")
        if key not in devices:
            raise PlacerError(f"--rank-map: {key!r} is not a device of the plan ({', '.join(devices)})")
        out[key] = int(value)
    missing = [d for d in devices if d not in out]
    if missing:
        raise PlacerError(f"--rank-map: no rank for {missing[0]!r} (the plan uses {', '.join(devices)})")
    if sorted(out.values()) != list(range(len(devices))):
        raise PlacerError(
            f"--rank-map: the ranks must be 0..{len(devices) - 1}, each once (one process per device); "
            f"got {sorted(out.values())}"
        )
    return out


def assign_ranks(
    devices: Sequence[str],
    rank_map: str | Mapping[str, int] | None = None,
    *,
    backend: str = "gloo",
    nproc_per_node: int | None = None,
    device_map: str | Mapping[str, str] | None = None,
) -> dict[str, RankDevice]:
    """Logical device -> :class:`RankDevice`, for the plan's ``devices`` (see the module doc).

    ``nproc_per_node`` (default: all on one node) gives each rank its local rank, so
    its CUDA device under nccl.
    """
    if backend not in BACKENDS:
        raise PlacerError(f"--backend {backend!r}: one of {', '.join(BACKENDS)}")
    if rank_map is None:
        ranks = {d: r for r, d in enumerate(devices)}
    elif isinstance(rank_map, str):
        ranks = parse_rank_map(rank_map, devices)
    else:
        ranks = parse_rank_map(",".join(f"{d}={r}" for d, r in rank_map.items()), devices)
    overrides = parse_device_map(device_map) if isinstance(device_map, str) else dict(device_map or {})
    per_node = nproc_per_node or len(devices)
    out = {}
    for d in devices:
        default = "cpu" if backend == "gloo" else f"cuda:{ranks[d] % per_node}"
        out[d] = RankDevice(ranks[d], overrides.get(d, overrides.get("*", default)))
    return out


def check_world(devices: Sequence[str], world_size: int, what: str = "processes") -> None:
    """One process per device of the plan: anything else is a :class:`PlacerError` that says both counts."""
    if world_size != len(devices):
        what = what.replace("processes", "process", 1) if world_size == 1 else what
        raise PlacerError(
            f"{world_size} {what} for a plan on {len(devices)} device{'s' if len(devices) != 1 else ''} "
            f"({', '.join(devices)}): a plan across processes runs one process per device"
        )


__all__ = ["BACKENDS", "RankDevice", "assign_ranks", "check_world", "parse_rank_map", "plan_devices"]
