"""The profiler: per-op forward/backward seconds and link speeds, measured on real devices.

:func:`profile_program` times every op on each requested torch device. The parts:
:mod:`~envs.real.profiler.probe` (host probes, the CPU in context), :mod:`~envs.real.profiler.device`
(a CUDA device in context), :mod:`~envs.real.profiler.program` (every device, op by op where needed, and the
links), :mod:`~envs.real.profiler.file` (the document) and :mod:`~envs.real.profiler.fit` (the simulator takes it in).

* **The CPU, in context** (the default): :func:`profile_in_context` runs real
  training steps of the program with every op on the CPU, as
  :func:`envs.real.timing.train_step` runs a placed module, and charges the time
  between consecutive probes (a timestamp after each forward op, a pre-hook on each
  autograd node) to the op that owns it. So an op's time includes eager dispatch
  and the autograd engine's work for it, the caches are as warm or cold as in
  training, and the optimizer step and the rest of the step are measured too.
* **A CUDA device, in context** (the default): :func:`profile_device_in_context`
  runs real training steps with every op on the GPU and measures two times per
  op, forward and backward: its kernels' time (CUDA events, with the stream held
  back so that the host runs ahead) and the host's time to issue it (host stamps;
  in the backward, the autograd worker's). The simulator charges the first to the
  GPU's stream and the second to the issuing thread (``issue_fwd_s``,
  ``issue_bwd_s``; :func:`envs.sim.cost.issue_times`): an eager step of small ops on
  a fast GPU is bound by the issuing.
* **Other devices (and ``method="isolated"``), op by op**: one walk of the graph
  with concrete values (a ``torch.fx.Interpreter`` on the CPU) times each op alone
  on the device: its forward (inputs already on the device, autograd recording as
  in training), then its backward (``torch.autograd.grad`` of the op's outputs
  with respect to its inputs that need gradients, after an untimed forward).
  CUDA is timed with events bracketed by synchronisation. On an H200 this charged
  every op the autograd engine's start and the dispatch (a median of 130 µs per
  backward op against 5 µs of kernel in a real step): 5-7x too slow.

* **The host beside its ops** (:mod:`~envs.real.profiler.host`): the copy of a tensor
  into pinned memory before each host -> GPU copy, and how much host ops and a thread
  issuing GPU work slow each other; they go on the host device
  (:func:`calibrate_cluster`) and the eager simulator charges them (model 4).
* **The issue fit**: a GPU's issue times are scaled so that the simulated step with
  every op on it is the clean step the profile measured (:func:`fit_issue_scale`).

Each time is the median of ``repeats`` runs after ``warmup`` runs.
:func:`time_link` times copies of a few sizes between two devices and
:func:`fit_link` fits ``time = latency_s + bytes / bandwidth``.

The result is a ``placer-profile/1`` document tied to the graph hash::

    {"format": "placer-profile/1", "graph_hash": "...", "ops": [names...],
     "devices": {"cpu": {"kind": "cpu", "method": "context", "fwd_s": [...], "bwd_s": [...],
                         "update_s": .., "update_bytes": .., "overhead_s": .., "step_s": ..},
                 "cuda:0": {"kind": "gpu", "method": "context", "fwd_s": [...], "bwd_s": [...],
                            "issue_fwd_s": [...], "issue_bwd_s": [...], ...}},
     "links": [{"src": "cpu", "dst": "cuda:0", "latency_s": ..,
                "bandwidth_bytes_per_s": .., "sizes_bytes": [..], "times_s": [..]}]}

(``null`` marks an op that could not run on that device; ``update_s`` and the
fields after it are optional, written by in-context profiling: the Adam step over
``update_bytes`` of parameters, the rest of the step outside the graph's ops, and
the whole measured step.) The simulator takes it
in two ways: :func:`apply_profile` fills ``graph.profile[kind]`` (the content hash
leaves ``profile`` out, so placements made before profiling stay valid), and
:func:`calibrate_cluster` replaces link latency/bandwidth with the measured ones
and, given the graph, fits each device kind's launch overhead and compute rate
for ops the profile does not cover, and its memory bandwidth to the measured
optimizer step where there is one. :func:`with_profile` does both for a
``--profile`` command-line option.
"""

from envs.real.profiler.device import CudaMarks, HostMarks, device_mark_cost, profile_device_in_context
from envs.real.profiler.file import FORMAT, check_profile, device_kind, load_profile, save_profile
from envs.real.profiler.fit import (
    apply_profile,
    calibrate_cluster,
    cluster_with_profile,
    fit_issue_scale,
    fit_link,
    profile_columns,
    with_profile,
)
from envs.real.profiler.host import time_contention, time_staging
from envs.real.profiler.op_timing import time_call
from envs.real.profiler.probe import host_clock, probe_costs, profile_in_context
from envs.real.profiler.program import (
    DEFAULT_TRANSFER_SIZES,
    profile_model,
    profile_program,
    time_link,
    with_microbatch_times,
)

__all__ = [
    "FORMAT",
    "DEFAULT_TRANSFER_SIZES",
    "profile_program",
    "profile_model",
    "with_microbatch_times",
    "profile_in_context",
    "profile_device_in_context",
    "CudaMarks",
    "HostMarks",
    "device_mark_cost",
    "host_clock",
    "probe_costs",
    "time_call",
    "time_link",
    "fit_link",
    "save_profile",
    "load_profile",
    "check_profile",
    "device_kind",
    "profile_columns",
    "apply_profile",
    "calibrate_cluster",
    "with_profile",
    "cluster_with_profile",
    "fit_issue_scale",
    "time_staging",
    "time_contention",
]
