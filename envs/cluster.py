"""Clusters: devices (compute, memory) and the links between every ordered pair, and the presets.

A :class:`Cluster` is plain data with array views for the simulator, at the bottom
of :mod:`envs` (it imports only :mod:`envs.devices`, its :class:`Device` and
:class:`Link`, and :mod:`envs.machines`, the preset table). The presets (``k80x2``,
``k80x4``, ``v100x4``, ``h100x8``, ``h200x1``, ``a100-40gx4``, ``a100-80gx8``,
``l4x4``; where their numbers come from is said in :mod:`envs.machines`) are ``Cluster.preset(name)``;
:func:`resolve_cluster` takes a preset name or a file. Any cluster round-trips
through JSON (``"format": "placer-cluster/1"``)::

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
>>> [len(Cluster.preset(n).devices) for n in Cluster.presets()]
[3, 5, 5, 9, 2, 5, 9, 5]
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from envs.devices import STEP_CALL_S, Device, Link
from envs.machines import CPU_LAUNCH_S, MACHINES, MIB, Machine
from graphs import schema
from graphs.errors import PlacerError
from graphs.io import read_document

__all__ = [
    "FORMAT",
    "KINDS",
    "Device",
    "Link",
    "Cluster",
    "CLUSTER_ARG_HELP",
    "PRESETS",
    "build",
    "preset",
    "resolve_cluster",
]

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
# optional, written only when set: a host's costs under the eager executor (envs.sim.cost.host_costs); a rank's
# cost per pipeline action (envs.sim.ranks)
_HOST_KEYS = (
    "stage_latency_s",
    "stage_bandwidth_bytes_per_s",
    "contention_op",
    "contention_issue",
    "action_overhead_s",
    "split_backward_factor",
    "update_bw_bytes_per_s",
    "handoff_s",
    "step_call_s",
)
_HOST_DEFAULTS = {
    "stage_latency_s": 0.0,
    "stage_bandwidth_bytes_per_s": math.inf,
    "contention_op": 0.0,
    "contention_issue": 0.0,
    "action_overhead_s": 0.0,
    "split_backward_factor": 1.0,
    "update_bw_bytes_per_s": 0.0,
    "handoff_s": 0.0,
    "step_call_s": STEP_CALL_S,
}
_LINK_KEYS = ("src", "dst", "bandwidth_bytes_per_s", "latency_s")
_TOP_KEYS = ("format", "name", "description", "devices", "links")


@dataclass(eq=False)
class Cluster:
    """Devices plus a link for every ordered pair of distinct devices.

    Attributes:
        name: preset or file label.
        devices: the devices; their order is the device index used everywhere.
        links: ``(src_name, dst_name) -> Link`` for every ordered pair.
        description: where the numbers come from.

    Build one with ``Cluster.preset(name)``, :meth:`load` (a file) or
    :meth:`from_dict`; a profile calibrates a copy
    (:func:`envs.real.profiler.cluster_with_profile`).
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
            # the optimizer step's bandwidth: the device's own where measured (Device.update_bw_bytes_per_s)
            "update_bw_bytes_per_s": np.where(
                col("update_bw_bytes_per_s") > 0, col("update_bw_bytes_per_s"), col("mem_bw_bytes_per_s")
            ),
            "step_call_s": col("step_call_s"),
            "host": np.array([d.kind == "cpu" for d in self.devices], dtype=bool),
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
    def update_bw_bytes_per_s(self) -> np.ndarray:
        """[D] the memory bandwidth of the optimizer step: each device's ``update_bw_bytes_per_s``, its
        ``mem_bw_bytes_per_s`` where that is 0 (not measured)."""
        return self._arrays["update_bw_bytes_per_s"]

    @property
    def step_call_s(self) -> np.ndarray:
        """[D] each device's ``step_call_s``: the fixed cost of one optimizer call of the worker stepping homed
        parameters during the backward."""
        return self._arrays["step_call_s"]

    @property
    def bandwidth_bytes_per_s(self) -> np.ndarray:
        """[D, D] link bandwidth; ``inf`` on the diagonal (no copy needed)."""
        return self._arrays["bandwidth_bytes_per_s"]

    @property
    def latency_s(self) -> np.ndarray:
        """[D, D] link latency; 0 on the diagonal."""
        return self._arrays["latency_s"]

    @property
    def host(self) -> np.ndarray:
        """[D] bool: which devices are the host (kind ``"cpu"``): where ops issue from, and where homed parameters
        and the host's optimizer step live."""
        return self._arrays["host"]

    def gpu_indices(self) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.kind == "gpu"]

    def host_indices(self) -> list[int]:
        """The indices of the host devices (:attr:`host`), in device order."""
        return np.flatnonzero(self.host).tolist()

    def index(self, name: str) -> int:
        for i, d in enumerate(self.devices):
            if d.name == name:
                return i
        raise PlacerError(f"cluster {self.name}: no device {name!r} (has {', '.join(self.device_names)})")

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, devices={self.device_names})"

    @classmethod
    def preset(cls, name: str) -> "Cluster":
        """The preset cluster ``name`` (a fresh copy each call); :class:`PlacerError` for an unknown name."""
        return preset(name)

    @classmethod
    def presets(cls) -> list[str]:
        """The preset names, in the order ``placer clusters`` lists them."""
        return list(PRESETS)

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
            _no_unknown(d, _DEVICE_KEYS + _HOST_KEYS, source, where + ".")
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
                    **{k: _number(d[k], source, f"{where}.{k}") for k in _HOST_KEYS if k in d},
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
                entry: dict[str, Any] = {
                    "src": a,
                    "dst": b,
                    "bandwidth_bytes_per_s": ab.bandwidth_bytes_per_s,
                    "latency_s": ab.latency_s,
                }
                if ab == ba:
                    entry["bidirectional"] = True
                links.append(entry)
        return {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "devices": [
                {
                    **{k: getattr(d, k) for k in _DEVICE_KEYS},
                    **{k: getattr(d, k) for k in _HOST_KEYS if getattr(d, k) != _HOST_DEFAULTS[k]},
                }
                for d in self.devices
            ],
            "links": links,
        }


CLUSTER_ARG_HELP = (
    "a preset (k80x2, k80x4, v100x4, h100x8, h200x1, a100-40gx4, a100-80gx8, l4x4; see `placer "
    "clusters`) or a placer-cluster/1 JSON file"
)


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
        for attr in ("launch_overhead_s", "stage_latency_s", "action_overhead_s", "handoff_s", "step_call_s"):
            _check(getattr(d, attr), label, f"device {d.name} {attr}", low=0, high=MAX_DELAY_S, what=">= 0 and finite")
        if d.stage_bandwidth_bytes_per_s != math.inf:
            _check(
                d.stage_bandwidth_bytes_per_s,
                label,
                f"device {d.name} stage_bandwidth_bytes_per_s",
                low=MIN_RATE,
                what="positive",
            )
        for attr in ("contention_op", "contention_issue"):
            _check(getattr(d, attr), label, f"device {d.name} {attr}", low=0.0, high=100.0, what=">= 0 and finite")
        factor = d.split_backward_factor
        _check(factor, label, f"device {d.name} split_backward_factor", low=0.1, high=100.0, what="positive")
        if d.update_bw_bytes_per_s != 0:  # 0: the device's mem_bw_bytes_per_s
            what = "0 or positive and finite"
            _check(d.update_bw_bytes_per_s, label, f"device {d.name} update_bw_bytes_per_s", low=MIN_RATE, what=what)
    for (a, b), link in c.links.items():
        if a not in seen or b not in seen or a == b:
            raise PlacerError(f"{label}: link {a}->{b} does not join two distinct devices of the cluster")
        _check(
            link.bandwidth_bytes_per_s,
            label,
            f"link {a}->{b} bandwidth_bytes_per_s",
            low=MIN_RATE,
            what="positive and finite",
        )
        _check(link.latency_s, label, f"link {a}->{b} latency_s", low=0.0, high=MAX_DELAY_S, what=">= 0 and finite")
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
        raise PlacerError(
            f"{label}: {what_field} must be at least {low:g} (smaller makes simulated times infinite), got {v!r}"
        )
    if v > high:
        raise PlacerError(
            f"{label}: {what_field} must be at most {high:g} s (larger makes simulated times infinite), got {v!r}"
        )


# ---------------------------------------------------------------- presets
def build(name: str, m: Machine) -> Cluster:
    """The cluster of one table row: ``cpu:0`` then ``gpu:0..``, every pair linked."""
    devices = [Device("cpu:0", "cpu", float(m.cpu_memory_bytes), m.cpu_flops_per_s, m.cpu_mem_bw, CPU_LAUNCH_S)]
    devices += [
        Device(f"gpu:{i}", "gpu", float(m.gpu_memory_mib * MIB), m.gpu_flops_per_s, m.gpu_mem_bw, m.gpu_launch_s)
        for i in range(m.gpus)
    ]
    links = {}
    for a in devices:
        for b in devices:
            if a.name != b.name:
                links[(a.name, b.name)] = m.gpu_link if a.kind == b.kind == "gpu" else m.host_link
    return Cluster(name=name, devices=devices, links=links, description=m.description)


#: Preset name -> builder (a fresh Cluster per call).
PRESETS: dict[str, Callable[[], Cluster]] = {
    name: (lambda name=name, m=m: build(name, m)) for name, m in MACHINES.items()
}


def preset(name: str) -> Cluster:
    """The preset cluster ``name`` (``Cluster.preset(name)``)."""
    try:
        make = PRESETS[name]
    except KeyError:
        raise PlacerError(f"unknown cluster preset {name!r} (known: {', '.join(PRESETS)})") from None
    return make()


def resolve_cluster(arg: str) -> Cluster:
    """A cluster from a preset name or a placer-cluster/1 JSON file path.

    >>> resolve_cluster("h200x1").device_names
    ['cpu:0', 'gpu:0']
    """
    if arg in PRESETS:
        return PRESETS[arg]()
    if os.path.exists(arg):
        return Cluster.load(arg)
    if arg.endswith(".json"):
        raise PlacerError(f"{arg}: no such file")
    raise PlacerError(f"unknown cluster {arg!r}: not a preset ({', '.join(PRESETS)}) nor a JSON file")
