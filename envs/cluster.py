"""Clusters: devices (compute, memory) and the links between every ordered pair.

A :class:`Cluster` is plain data with array views for the simulator (a leaf
module: no other :mod:`envs` import). Presets (``k80x2``, ``k80x4``, ``v100x4``,
``h100x8``, ``h200x1``,
``a100-40gx4``, ``a100-80gx8``, ``l4x4``) and :func:`envs.resolve_cluster` live in :mod:`envs.presets`;
any cluster round-trips through JSON (``"format": "placer-cluster/1"``)::

    {"format": "placer-cluster/1", "name": "tiny",
     "devices": [{"name": "cpu:0", "kind": "cpu", "memory_bytes": 6.4e10,
                  "flops_per_s": 5e11, "mem_bw_bytes_per_s": 5e10,
                  "launch_overhead_s": 5e-6}, ...],
     "links": [{"src": "cpu:0", "dst": "gpu:0", "bandwidth_bytes_per_s": 1e10,
                "latency_s": 1e-5, "bidirectional": true}, ...]}

Every ordered pair of distinct devices needs a link (``bidirectional`` covers
both directions). Bad files raise :class:`graphs.PlacerError` naming the file
and the field.

>>> c = Cluster.preset("k80x2")
>>> c.device_names, c.kinds
(['cpu:0', 'gpu:0', 'gpu:1'], ['cpu', 'gpu', 'gpu'])
>>> Cluster.from_dict(c.to_dict()).to_dict() == c.to_dict()
True
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphs import schema
from graphs.errors import PlacerError
from graphs.io import read_document

FORMAT = "placer-cluster/1"
KINDS = ("cpu", "gpu")

# Sane ranges that keep every simulated time finite. An op takes
# ``launch + max(flops / flops_per_s, bytes / mem_bw_bytes_per_s)`` and a transfer
# ``latency + bytes / bandwidth``: a positive but tiny rate (1e-300) turns a real
# graph's 1e12 FLOPs into an infinite step time that would still be reported as
# "ok". No real device or link is slower than 1 FLOP/s or 1 byte/s; with rates at
# least that and fixed delays at most a million seconds, an op or transfer takes at
# most its FLOPs or bytes in seconds (plus 1e6 s), finite for any finite graph.
MIN_RATE = 1.0
MAX_DELAY_S = 1e6
MIN_MEMORY_BYTES = 1.0

_DEVICE_KEYS = ("name", "kind", "memory_bytes", "flops_per_s", "mem_bw_bytes_per_s", "launch_overhead_s")
_LINK_KEYS = ("src", "dst", "bandwidth_bytes_per_s", "latency_s")
_TOP_KEYS = ("format", "name", "description", "devices", "links")


@dataclass(frozen=True)
class Device:
    """One compute device.

    Attributes:
        name: logical name, ``"cpu:0"``, ``"gpu:1"`` (maps to torch ``cpu``/``cuda:1``).
        kind: ``"cpu"`` or ``"gpu"``; selects the graph's profile column.
        memory_bytes: usable memory capacity.
        flops_per_s: effective compute rate for the roofline estimate.
        mem_bw_bytes_per_s: effective memory bandwidth for the roofline estimate.
        launch_overhead_s: fixed cost per (non-view) op: dispatch + kernel launch.
    """

    name: str
    kind: str
    memory_bytes: float
    flops_per_s: float
    mem_bw_bytes_per_s: float
    launch_overhead_s: float


@dataclass(frozen=True)
class Link:
    """A directed connection between two devices: ``time = latency_s + bytes / bandwidth``."""

    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(eq=False)
class Cluster:
    """Devices plus a link for every ordered pair of distinct devices.

    Attributes:
        name: preset or file label.
        devices: the devices; their order is the device index used everywhere.
        links: ``(src_name, dst_name) -> Link`` for every ordered pair.
        description: where the numbers come from.

    This module is plain data and imports nothing else of :mod:`envs`. The
    constructors that need more are defined by their owners and attached here:
    ``Cluster.preset(name)`` and ``Cluster.presets()`` by :mod:`envs.presets`,
    ``cluster.with_profile(profile)`` by :mod:`envs.profiler` (``import envs``
    loads both).
    """

    name: str
    devices: list[Device]
    links: dict[tuple[str, str], Link]
    description: str = ""
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.devices = list(self.devices)
        self.links = dict(self.links)
        _validate(self, self.name or "cluster")
        self._build_arrays()

    def _build_arrays(self) -> None:
        D = len(self.devices)
        bw = np.full((D, D), np.inf)
        lat = np.zeros((D, D))
        for i, a in enumerate(self.devices):
            for j, b in enumerate(self.devices):
                if i != j:
                    link = self.links[(a.name, b.name)]
                    bw[i, j] = link.bandwidth_bytes_per_s
                    lat[i, j] = link.latency_s
        col = lambda attr: np.array([float(getattr(d, attr)) for d in self.devices])  # noqa: E731
        self._arrays = {
            "memory_bytes": col("memory_bytes"),
            "flops_per_s": col("flops_per_s"),
            "mem_bw_bytes_per_s": col("mem_bw_bytes_per_s"),
            "launch_overhead_s": col("launch_overhead_s"),
            "bandwidth_bytes_per_s": bw,
            "latency_s": lat,
        }
        for a in self._arrays.values():
            a.flags.writeable = False

    # ------------------------------------------------------------- views
    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def kinds(self) -> list[str]:
        return [d.kind for d in self.devices]

    @property
    def memory_bytes(self) -> np.ndarray:
        return self._arrays["memory_bytes"]

    @property
    def flops_per_s(self) -> np.ndarray:
        return self._arrays["flops_per_s"]

    @property
    def mem_bw_bytes_per_s(self) -> np.ndarray:
        return self._arrays["mem_bw_bytes_per_s"]

    @property
    def launch_overhead_s(self) -> np.ndarray:
        return self._arrays["launch_overhead_s"]

    @property
    def bandwidth_bytes_per_s(self) -> np.ndarray:
        """[D, D] link bandwidth; ``inf`` on the diagonal (no copy needed)."""
        return self._arrays["bandwidth_bytes_per_s"]

    @property
    def latency_s(self) -> np.ndarray:
        """[D, D] link latency; 0 on the diagonal."""
        return self._arrays["latency_s"]

    def gpu_indices(self) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.kind == "gpu"]

    def index(self, name: str) -> int:
        for i, d in enumerate(self.devices):
            if d.name == name:
                return i
        raise PlacerError(f"cluster {self.name}: no device {name!r} (has {', '.join(self.device_names)})")

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, devices={self.device_names})"

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Cluster":
        return read_document(path, cls.from_dict)

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "cluster") -> "Cluster":
        """Build from a parsed placer-cluster/1 document; errors name ``source`` and the field."""
        schema.document(doc, source, FORMAT, format_optional=True)
        _no_unknown(doc, _TOP_KEYS, source, "")
        name = schema.string(doc.get("name", ""), source, "name")
        description = schema.string(doc.get("description", ""), source, "description")
        devs_doc = doc.get("devices")
        if not isinstance(devs_doc, list) or not devs_doc:
            raise PlacerError(f"{source}: 'devices' must be a non-empty list")
        devices = []
        for k, d in enumerate(devs_doc):
            where = f"devices[{k}]"
            if not isinstance(d, dict):
                raise PlacerError(f"{source}: {where} must be an object")
            _no_unknown(d, _DEVICE_KEYS, source, where + ".")
            for key in _DEVICE_KEYS:
                if key not in d:
                    raise PlacerError(f"{source}: {where} is missing {key!r}")
            schema.string(d["name"], source, where + ".name", nonempty=True)
            if any(prev.name == d["name"] for prev in devices):
                raise PlacerError(f"{source}: {where}: duplicate device name {d['name']!r}")
            where = f"devices[{k}] ({d['name']})"
            devices.append(
                Device(
                    name=d["name"],
                    kind=schema.string(d["kind"], source, where + ".kind"),
                    memory_bytes=_number(d["memory_bytes"], source, where + ".memory_bytes"),
                    flops_per_s=_number(d["flops_per_s"], source, where + ".flops_per_s"),
                    mem_bw_bytes_per_s=_number(d["mem_bw_bytes_per_s"], source, where + ".mem_bw_bytes_per_s"),
                    launch_overhead_s=_number(d["launch_overhead_s"], source, where + ".launch_overhead_s"),
                )
            )
        links_doc = doc.get("links", [])
        if not isinstance(links_doc, list):
            raise PlacerError(f"{source}: 'links' must be a list")
        links: dict[tuple[str, str], Link] = {}
        names = {d.name for d in devices}
        for k, lk in enumerate(links_doc):
            where = f"links[{k}]"
            if not isinstance(lk, dict):
                raise PlacerError(f"{source}: {where} must be an object")
            _no_unknown(lk, _LINK_KEYS + ("bidirectional",), source, where + ".")
            for key in _LINK_KEYS:
                if key not in lk:
                    raise PlacerError(f"{source}: {where} is missing {key!r}")
            src = schema.string(lk["src"], source, where + ".src")
            dst = schema.string(lk["dst"], source, where + ".dst")
            for end, nm in (("src", src), ("dst", dst)):
                if nm not in names:
                    raise PlacerError(f"{source}: {where}.{end} names unknown device {nm!r}")
            if src == dst:
                raise PlacerError(f"{source}: {where} links {src!r} to itself")
            link = Link(
                bandwidth_bytes_per_s=_number(lk["bandwidth_bytes_per_s"], source, where + ".bandwidth_bytes_per_s"),
                latency_s=_number(lk["latency_s"], source, where + ".latency_s"),
            )
            both = schema.boolean(lk.get("bidirectional", False), source, where + ".bidirectional")
            pairs = [(src, dst), (dst, src)] if both else [(src, dst)]
            for pair in pairs:
                if pair in links:
                    raise PlacerError(f"{source}: {where} defines link {pair[0]}->{pair[1]} a second time")
                links[pair] = link
        try:
            return cls(name=name, devices=devices, links=links, description=description)
        except PlacerError as e:
            raise PlacerError(f"{source}: {str(e).split(': ', 1)[-1]}") from None

    def to_dict(self) -> dict[str, Any]:
        """The placer-cluster/1 document; symmetric links are written once, ``bidirectional``."""
        links = []
        names = self.device_names
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                if i == j:
                    continue
                ab, ba = self.links[(a, b)], self.links[(b, a)]
                if ab == ba and j < i:
                    continue  # written with the (b, a) entry
                entry: dict[str, Any] = {"src": a, "dst": b, "bandwidth_bytes_per_s": ab.bandwidth_bytes_per_s, "latency_s": ab.latency_s}
                if ab == ba:
                    entry["bidirectional"] = True
                links.append(entry)
        return {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "devices": [{k: getattr(d, k) for k in _DEVICE_KEYS} for d in self.devices],
            "links": links,
        }


CLUSTER_ARG_HELP = "a preset (k80x2, k80x4, v100x4, h100x8, h200x1, a100-40gx4, a100-80gx8, l4x4; see `placer clusters`) or a placer-cluster/1 JSON file"


# ---------------------------------------------------------------- validation
def _no_unknown(d: dict, allowed: tuple[str, ...], source: str, prefix: str) -> None:
    for key in d:
        if key not in allowed:
            raise PlacerError(f"{source}: unknown key {prefix}{key!r} (allowed: {', '.join(allowed)})")


def _number(x: Any, source: str, where: str) -> float:
    # Type and representability here (schema layer); ranges in _validate, which
    # also guards clusters built in Python.
    return schema.number(x, source, where, finite=False)


def _validate(c: Cluster, label: str) -> None:
    seen: set[str] = set()
    for d in c.devices:
        if not isinstance(d.name, str) or not d.name:
            raise PlacerError(f"{label}: device name {d.name!r} is not a non-empty string")
        if d.name in seen:
            raise PlacerError(f"{label}: duplicate device name {d.name!r}")
        seen.add(d.name)
        if d.kind not in KINDS:
            raise PlacerError(f"{label}: device {d.name} has kind {d.kind!r}, expected one of {', '.join(KINDS)}")
        _check(d.memory_bytes, label, f"device {d.name} memory_bytes", low=MIN_MEMORY_BYTES, what="positive and finite")
        for attr in ("flops_per_s", "mem_bw_bytes_per_s"):
            _check(getattr(d, attr), label, f"device {d.name} {attr}", low=MIN_RATE, what="positive and finite")
        _check(d.launch_overhead_s, label, f"device {d.name} launch_overhead_s", low=0.0, high=MAX_DELAY_S, what=">= 0")
    for (a, b), link in c.links.items():
        if a not in seen or b not in seen or a == b:
            raise PlacerError(f"{label}: link {a}->{b} does not join two distinct devices of the cluster")
        _check(link.bandwidth_bytes_per_s, label, f"link {a}->{b} bandwidth_bytes_per_s", low=MIN_RATE, what="positive and finite")
        _check(link.latency_s, label, f"link {a}->{b} latency_s", low=0.0, high=MAX_DELAY_S, what=">= 0")
    for a in c.devices:
        for b in c.devices:
            if a.name != b.name and (a.name, b.name) not in c.links:
                raise PlacerError(f"{label}: missing link {a.name}->{b.name} (every ordered device pair needs one)")


def _check(v: Any, label: str, what_field: str, *, low: float, high: float = math.inf, what: str) -> None:
    """``low <= v <= high`` and finite, else one line saying why the bound exists."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise PlacerError(f"{label}: {what_field} must be a number, got {v!r}")
    try:
        v = float(v)
    except OverflowError:
        raise PlacerError(f"{label}: {what_field} is too large") from None
    if not math.isfinite(v) or (low == 0.0 and v < 0) or (low > 0 and v <= 0):
        raise PlacerError(f"{label}: {what_field} must be {what}, got {v!r}")
    if v < low:
        raise PlacerError(f"{label}: {what_field} must be at least {low:g} (smaller makes simulated times infinite), got {v!r}")
    if v > high:
        raise PlacerError(f"{label}: {what_field} must be at most {high:g} s (larger makes simulated times infinite), got {v!r}")
