"""The parts of a cluster: a compute device and the link between two devices (plain, frozen data).

:class:`envs.cluster.Cluster` holds them (and re-exports both); :mod:`envs.machines` builds the presets' from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The default :attr:`Device.step_call_s`: one call of ``torch.optim.Adam(fused=True).step()`` cost 18.7-21.6 us
#: more than adding its parameters to another call, on a 2-core x86 host (``python -m bench.host_step_call``;
#: BENCHMARKS.md, "Homed parameters stepped in batches").
STEP_CALL_S = 20e-6


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
        action_overhead_s: across processes, what each action of a pipeline schedule (one
            stage's forward or backward of one microbatch) costs its rank beyond its ops: torch's
            runtime between actions, posting the sends and receives (default 0; ``placer profile
            --ranks`` fits it to the model run as a pipeline, :mod:`envs.real.distributed.profile_ranks`).
        split_backward_factor: across processes, how much longer a stage's backward takes split
            into its input part and its weight part (a zero-bubble schedule) than whole: autograd
            walks the stage twice, torch finds the parameter groups at every input part, and a
            convolution's two gradients are two calls where the whole backward makes one (default
            1; ``placer profile --ranks`` measures it on the model).
        update_bw_bytes_per_s: the memory bandwidth of the optimizer step alone (Adam's passes over the parameter
            bytes, :func:`envs.sim.cost.update_time_s`); 0 (the default): ``mem_bw_bytes_per_s``. ``placer profile
            --ranks`` fits it to the optimizer steps its calibration pipelines measured: the compute fit slows the
            microbenchmarks' bandwidth with their FLOP rate, and a streaming update does not slow with it
            (``BENCHMARKS.md``, "Looped and V plans against the simulator").
        handoff_s: across processes, how much later than its link says a message this device's rank receives
            arrives, without taking either rank's core longer: gloo moves the data on threads that share the ranks'
            cores, and a thread woken beside a computing one gets its core at a scheduler tick (default 0;
            ``placer profile --ranks`` fits it to the model run as a looped pipeline, ``BENCHMARKS.md``, "Where a
            rank of two stages loses its time").
        step_call_s: a host device's fixed cost of one optimizer call of the worker that steps homed parameters
            during the backward (:mod:`envs.real.homes`): paid once per batch of parameters the worker steps
            together (:func:`envs.sim.homes.host_steps`), instead of ``launch_overhead_s`` (which a profile fits to
            the host's shortest ops, not to an optimizer's call); default :data:`STEP_CALL_S`.
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
    action_overhead_s: float = 0.0
    split_backward_factor: float = 1.0
    update_bw_bytes_per_s: float = 0.0
    handoff_s: float = 0.0
    step_call_s: float = STEP_CALL_S


@dataclass(frozen=True)
class Link:
    """A directed connection between two devices: ``time = latency_s + bytes / bandwidth``."""

    bandwidth_bytes_per_s: float
    latency_s: float
