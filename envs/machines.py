"""The preset machines: each preset cluster's devices and links, and where their numbers come from.

Every preset has the host CPU as device 0 (``cpu:0``), as the paper's machine
did. Numbers are *effective* rates for the roofline estimate, rounded from
vendor datasheets and commonly measured figures; a graph profile (measured
per-op times) overrides them where it exists. Sources and assumptions:

* Memory: usable capacity as ``nvidia-smi`` reports it (K80 die 11441 MiB,
  V100-SXM2-16GB 16160 MiB, H100-SXM 81559 MiB, H200 143771 MiB).
* GPU fp32 compute: datasheet peak fp32 (non-tensor-core) throughput × ~0.9.
  K80 (GK210 die, 2496 cores at 875 MHz boost): 4.37 TFLOP/s peak -> 4.0e12.
  V100-SXM2: 15.7 -> 14e12. H100-SXM / H200: 67 TFLOP/s fp32 -> 60e12. PyTorch
  runs fp32 matmuls without TF32 by default
  (``torch.backends.cuda.matmul.allow_tf32 = False``); with TF32 enabled
  (``torch.set_float32_matmul_precision("high")``) H100/H200 dense TF32 is
  ~495 TFLOP/s: write a cluster file with a higher ``flops_per_s`` to model it.
* GPU memory bandwidth: datasheet × ~0.85. K80 die 240 GB/s -> 2.0e11, V100
  900 GB/s -> 7.7e11, H100-SXM 3.35 TB/s -> 2.85e12, H200 4.8 TB/s -> 4.1e12.
* Host CPU: K80 host = one Haswell Xeon (E5-2690 v3 class, 12 cores, AVX2 FMA:
  ~1 TFLOP/s peak fp32, ~0.5e12 effective; 4 channels DDR4-2133, 68 GB/s peak
  -> 5e10). V100 host = Broadwell E5-2698 v4 class (~1.4 TFLOP/s peak -> 0.7e12;
  6e10 B/s). H100/H200 host = Sapphire Rapids class (56 cores AVX-512: ~7 TFLOP/s
  peak -> 2e12 effective with PyTorch's CPU kernels; DDR5 8 channels -> 2.5e11).
* Launch overhead: eager PyTorch dispatch plus kernel launch, ~8 µs per GPU op
  (K80/V100 hosts) or ~6 µs (newer hosts); CPU ops ~5 µs of dispatch.
* Links (effective, one direction): PCIe 3.0 x16 ~10 GB/s with ~10 µs per copy
  (cudaMemcpy call + DMA setup); PCIe 5.0 x16 ~50 GB/s, ~8 µs. K80 GPU-to-GPU
  goes over PCIe (the two dies of a board share a PLX switch; boards talk through
  the root complex — both modelled as PCIe 3.0). V100x4: four SXM2 GPUs fully
  connected by NVLink 2, two 25 GB/s bricks per pair -> 50 GB/s per direction,
  ~45e9 effective, ~6 µs. H100x8: NVLink 4 through NVSwitch, 450 GB/s per
  direction per GPU -> ~375e9 effective between any pair (p2p bandwidth tests
  reach 370-390 GB/s), ~6 µs.

The rented machines (``a100-40gx4``, ``a100-80gx8``, ``l4x4``), from NVIDIA's
datasheets (A100 Tensor Core GPU datasheet, 2021; L4 Tensor Core GPU datasheet,
2023) and the cloud/DGX system pages named below, with the rules above:

* A100-SXM4-40GB / -80GB: 40960 / 81920 MiB (``nvidia-smi``); fp32 19.5 TFLOP/s
  -> 17.5e12 (TF32 156, bf16 312 dense on tensor cores: write a cluster file to
  model those); HBM2 1,555 GB/s -> 1.32e12, HBM2e 2,039 GB/s -> 1.73e12. NVLink 3
  through NVSwitch (HGX A100 boards: DGX A100, AWS p4d/p4de, GCP a2): 600 GB/s
  per GPU both ways, 300 per direction -> ~250e9 effective, ~6 µs. Host link PCIe
  4.0 x16: 32 GB/s peak per direction -> ~25e9, ~8 µs.
* ``a100-40gx4`` as GCP a2-highgpu-4g: 4 A100-40GB, 24 Cascade Lake cores
  (48 vCPUs, AVX-512: ~3.8 TFLOP/s peak -> 1e12 effective), 340 GB RAM
  (6 DDR4 channels -> ~1e11 B/s).
* ``a100-80gx8`` as DGX A100 640GB (AWS p4de alike): 8 A100-80GB, 2x AMD EPYC
  7742 (128 Zen 2 cores, AVX2: ~9 TFLOP/s peak -> 2e12 effective), 2 TB RAM
  (16 DDR4-3200 channels, 410 GB/s peak -> 2.5e11).
* L4 (Ada, PCIe card, 72 W): 23034 MiB of GDDR6 (``nvidia-smi``); fp32 30.3
  TFLOP/s -> 27e12 (bf16 121 dense on tensor cores); 300 GB/s -> 2.55e11; no
  NVLink: GPU-to-GPU copies cross PCIe 4.0 x16 like the host's (~25e9, ~8 µs).
  ``l4x4`` as GCP g2-standard-48: 4 L4, 24 Sapphire Rapids cores (48 vCPUs,
  ~1e12 effective), 192 GB RAM (~1e11 B/s).

:func:`envs.cluster.build` turns a row of :data:`MACHINES` into a :class:`~envs.cluster.Cluster`.
"""

from __future__ import annotations

from typing import NamedTuple

from envs.devices import Link

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
