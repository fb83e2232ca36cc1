"""Clusters: devices (compute, memory) and the links between every ordered pair, and the presets.

A :class:`Cluster` is plain data with array views for the simulator (a leaf
module: no other :mod:`envs` import). The presets (``k80x2``, ``k80x4``, ``v100x4``,
``h100x8``, ``h200x1``, ``a100-40gx4``, ``a100-80gx8``, ``l4x4``; where their
numbers come from is said above :data:`MACHINES`) are ``Cluster.preset(name)``;
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
from typing import Any, Callable, NamedTuple

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
# optional, a host's costs under the eager executor (envs.sim.cost.host_costs); written only when set
_HOST_KEYS = ("stage_latency_s", "stage_bandwidth_bytes_per_s", "contention_op", "contention_issue")
_HOST_DEFAULTS = {
    "stage_latency_s": 0.0,
    "stage_bandwidth_bytes_per_s": math.inf,
    "contention_op": 0.0,
    "contention_issue": 0.0,
}
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
        stage_latency_s, stage_bandwidth_bytes_per_s: a host (``cpu``) device's copy of a
            tensor into a pinned staging buffer before it goes to a GPU
            (``latency + bytes / bandwidth`` of host time); default none (0, ``inf``).
        contention_op: a host device's ops run ``1 + contention_op`` times slower while a
            GPU's autograd worker thread is busy beside them (default 0).
        contention_issue: a GPU's autograd worker issues ``1 + contention_issue`` times
            slower while this host device runs an op (default 0). The last three are measured
            by a profile (:mod:`envs.real.profiler`); the presets have none.
    """

    name: str
    kind: str
    memory_bytes: float
    flops_per_s: float
    mem_bw_bytes_per_s: float
    launch_overhead_s: float
    stage_latency_s: float = 0.0
    stage_bandwidth_bytes_per_s: float = math.inf
    contention_op: float = 0.0
    contention_issue: float = 0.0


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
        _check(d.launch_overhead_s, label, f"device {d.name} launch_overhead_s", low=0.0, high=MAX_DELAY_S, what=">= 0")
        _check(d.stage_latency_s, label, f"device {d.name} stage_latency_s", low=0.0, high=MAX_DELAY_S, what=">= 0")
        if d.stage_bandwidth_bytes_per_s != math.inf:
            _check(
                d.stage_bandwidth_bytes_per_s,
                label,
                f"device {d.name} stage_bandwidth_bytes_per_s",
                low=MIN_RATE,
                what="positive",
            )
        for attr in ("contention_op", "contention_issue"):
            _check(getattr(d, attr), label, f"device {d.name} {attr}", low=0.0, high=100.0, what=">= 0")
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
        raise PlacerError(
            f"{label}: {what_field} must be at least {low:g} (smaller makes simulated times infinite), got {v!r}"
        )
    if v > high:
        raise PlacerError(
            f"{label}: {what_field} must be at most {high:g} s (larger makes simulated times infinite), got {v!r}"
        )


# ---------------------------------------------------------------- presets
# Every preset has the host CPU as device 0 (``cpu:0``), as the paper's machine
# did. Numbers are *effective* rates for the roofline estimate, rounded from
# vendor datasheets and commonly measured figures; a graph profile (measured
# per-op times) overrides them where it exists. Sources and assumptions:
#
# * Memory: usable capacity as ``nvidia-smi`` reports it (K80 die 11441 MiB,
#   V100-SXM2-16GB 16160 MiB, H100-SXM 81559 MiB, H200 143771 MiB).
# * GPU fp32 compute: datasheet peak fp32 (non-tensor-core) throughput × ~0.9.
#   K80 (GK210 die, 2496 cores at 875 MHz boost): 4.37 TFLOP/s peak -> 4.0e12.
#   V100-SXM2: 15.7 -> 14e12. H100-SXM / H200: 67 TFLOP/s fp32 -> 60e12. PyTorch
#   runs fp32 matmuls without TF32 by default
#   (``torch.backends.cuda.matmul.allow_tf32 = False``); with TF32 enabled
#   (``torch.set_float32_matmul_precision("high")``) H100/H200 dense TF32 is
#   ~495 TFLOP/s: write a cluster file with a higher ``flops_per_s`` to model it.
# * GPU memory bandwidth: datasheet × ~0.85. K80 die 240 GB/s -> 2.0e11, V100
#   900 GB/s -> 7.7e11, H100-SXM 3.35 TB/s -> 2.85e12, H200 4.8 TB/s -> 4.1e12.
# * Host CPU: K80 host = one Haswell Xeon (E5-2690 v3 class, 12 cores, AVX2 FMA:
#   ~1 TFLOP/s peak fp32, ~0.5e12 effective; 4 channels DDR4-2133, 68 GB/s peak
#   -> 5e10). V100 host = Broadwell E5-2698 v4 class (~1.4 TFLOP/s peak -> 0.7e12;
#   6e10 B/s). H100/H200 host = Sapphire Rapids class (56 cores AVX-512: ~7 TFLOP/s
#   peak -> 2e12 effective with PyTorch's CPU kernels; DDR5 8 channels -> 2.5e11).
# * Launch overhead: eager PyTorch dispatch plus kernel launch, ~8 µs per GPU op
#   (K80/V100 hosts) or ~6 µs (newer hosts); CPU ops ~5 µs of dispatch.
# * Links (effective, one direction): PCIe 3.0 x16 ~10 GB/s with ~10 µs per copy
#   (cudaMemcpy call + DMA setup); PCIe 5.0 x16 ~50 GB/s, ~8 µs. K80 GPU-to-GPU
#   goes over PCIe (the two dies of a board share a PLX switch; boards talk through
#   the root complex — both modelled as PCIe 3.0). V100x4: four SXM2 GPUs fully
#   connected by NVLink 2, two 25 GB/s bricks per pair -> 50 GB/s per direction,
#   ~45e9 effective, ~6 µs. H100x8: NVLink 4 through NVSwitch, 450 GB/s per
#   direction per GPU -> ~375e9 effective between any pair (p2p bandwidth tests
#   reach 370-390 GB/s), ~6 µs.
#
# The rented machines (``a100-40gx4``, ``a100-80gx8``, ``l4x4``), from NVIDIA's
# datasheets (A100 Tensor Core GPU datasheet, 2021; L4 Tensor Core GPU datasheet,
# 2023) and the cloud/DGX system pages named below, with the rules above:
#
# * A100-SXM4-40GB / -80GB: 40960 / 81920 MiB (``nvidia-smi``); fp32 19.5 TFLOP/s
#   -> 17.5e12 (TF32 156, bf16 312 dense on tensor cores: write a cluster file to
#   model those); HBM2 1,555 GB/s -> 1.32e12, HBM2e 2,039 GB/s -> 1.73e12. NVLink 3
#   through NVSwitch (HGX A100 boards: DGX A100, AWS p4d/p4de, GCP a2): 600 GB/s
#   per GPU both ways, 300 per direction -> ~250e9 effective, ~6 µs. Host link PCIe
#   4.0 x16: 32 GB/s peak per direction -> ~25e9, ~8 µs.
# * ``a100-40gx4`` as GCP a2-highgpu-4g: 4 A100-40GB, 24 Cascade Lake cores
#   (48 vCPUs, AVX-512: ~3.8 TFLOP/s peak -> 1e12 effective), 340 GB RAM
#   (6 DDR4 channels -> ~1e11 B/s).
# * ``a100-80gx8`` as DGX A100 640GB (AWS p4de alike): 8 A100-80GB, 2x AMD EPYC
#   7742 (128 Zen 2 cores, AVX2: ~9 TFLOP/s peak -> 2e12 effective), 2 TB RAM
#   (16 DDR4-3200 channels, 410 GB/s peak -> 2.5e11).
# * L4 (Ada, PCIe card, 72 W): 23034 MiB of GDDR6 (``nvidia-smi``); fp32 30.3
#   TFLOP/s -> 27e12 (bf16 121 dense on tensor cores); 300 GB/s -> 2.55e11; no
#   NVLink: GPU-to-GPU copies cross PCIe 4.0 x16 like the host's (~25e9, ~8 µs).
#   ``l4x4`` as GCP g2-standard-48: 4 L4, 24 Sapphire Rapids cores (48 vCPUs,
#   ~1e12 effective), 192 GB RAM (~1e11 B/s).
MIB = 1 << 20
GIB = 1 << 30

PCIE3 = Link(bandwidth_bytes_per_s=10e9, latency_s=10e-6)
PCIE4 = Link(bandwidth_bytes_per_s=25e9, latency_s=8e-6)
PCIE5 = Link(bandwidth_bytes_per_s=50e9, latency_s=8e-6)
NVLINK2_PAIR = Link(bandwidth_bytes_per_s=45e9, latency_s=6e-6)
NVLINK3_SWITCH = Link(bandwidth_bytes_per_s=250e9, latency_s=6e-6)
NVLINK4_SWITCH = Link(bandwidth_bytes_per_s=375e9, latency_s=6e-6)

CPU_LAUNCH_S = 5e-6


class Machine(NamedTuple):
    """One preset's row: a host CPU, ``gpus`` identical GPUs, a host link and a GPU-to-GPU link."""

    description: str
    cpu_memory_bytes: float
    cpu_flops_per_s: float
    cpu_mem_bw: float
    gpus: int
    gpu_memory_mib: int
    gpu_flops_per_s: float
    gpu_mem_bw: float
    gpu_launch_s: float
    host_link: Link
    gpu_link: Link


_K80 = "Haswell host + {n} K80 dies (12 GB, ~4 TFLOP/s fp32, 240 GB/s), all links PCIe 3.0 (~10 GB/s, 10 us)"

#: The preset table (see the module doc for where each number comes from).
MACHINES: dict[str, Machine] = {
    "k80x2": Machine(_K80.format(n=2), 256 * GIB, 0.5e12, 5e10, 2, 11441, 4.0e12, 2.0e11, 8e-6, PCIE3, PCIE3),
    "k80x4": Machine(_K80.format(n=4), 256 * GIB, 0.5e12, 5e10, 4, 11441, 4.0e12, 2.0e11, 8e-6, PCIE3, PCIE3),
    "v100x4": Machine(
        "Broadwell host + 4 V100-SXM2 (16 GB, ~14 TFLOP/s fp32, 900 GB/s); NVLink 2 between GPUs (~45 GB/s per "
        "pair), PCIe 3.0 to host",
        256 * GIB,
        0.7e12,
        6e10,
        4,
        16160,
        14e12,
        7.7e11,
        8e-6,
        PCIE3,
        NVLINK2_PAIR,
    ),
    "h100x8": Machine(
        "Sapphire Rapids host + 8 H100-SXM (80 GB, ~60 TFLOP/s fp32 without TF32, 3.35 TB/s); NVLink 4 via "
        "NVSwitch (~375 GB/s), PCIe 5.0 to host",
        2048 * GIB,
        2e12,
        2.5e11,
        8,
        81559,
        60e12,
        2.85e12,
        6e-6,
        PCIE5,
        NVLINK4_SWITCH,
    ),
    "h200x1": Machine(
        "Sapphire Rapids host + 1 H200 (141 GB, ~60 TFLOP/s fp32 without TF32, 4.8 TB/s); PCIe 5.0 to host (~50 GB/s)",
        512 * GIB,
        2e12,
        2.5e11,
        1,
        143771,
        60e12,
        4.1e12,
        6e-6,
        PCIE5,
        PCIE5,
    ),
    "a100-40gx4": Machine(
        "Cascade Lake host (24 cores) + 4 A100-SXM4 (40 GB, ~17.5 TFLOP/s fp32 without TF32, 1.55 TB/s); "
        "NVLink 3 via NVSwitch (~250 GB/s), PCIe 4.0 to host",
        340e9,
        1e12,
        1e11,
        4,
        40960,
        17.5e12,
        1.32e12,
        6e-6,
        PCIE4,
        NVLINK3_SWITCH,
    ),
    "a100-80gx8": Machine(
        "2x EPYC 7742 host + 8 A100-SXM4 (80 GB, ~17.5 TFLOP/s fp32 without TF32, 2.04 TB/s); "
        "NVLink 3 via NVSwitch (~250 GB/s), PCIe 4.0 to host",
        2048 * GIB,
        2e12,
        2.5e11,
        8,
        81920,
        17.5e12,
        1.73e12,
        6e-6,
        PCIE4,
        NVLINK3_SWITCH,
    ),
    "l4x4": Machine(
        "Sapphire Rapids host (24 cores) + 4 L4 (24 GB, ~27 TFLOP/s fp32, 300 GB/s); all links PCIe 4.0 (~25 "
        "GB/s, 8 us)",
        192e9,
        1e12,
        1e11,
        4,
        23034,
        27e12,
        2.55e11,
        6e-6,
        PCIE4,
        PCIE4,
    ),
}


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
