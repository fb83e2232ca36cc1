"""The simulator: one training step of a placed graph, scheduled on a cluster's model.

Every rule of the model lives in one place. A rule the compiled batch runs is
written twice: the Python reference (the specification, slow), then the numba
kernel, which computes the same times and bytes bit for bit
(tests/envs/sim/test_kernel.py). ``file:function`` names each, files in this
package unless a path says otherwise (tests/envs/sim/test_package_doc.py checks
that each exists and that every module here is named).

Rules, reference | kernel:

* the eager executor's issue, the host thread's forward: ``eager.py:EagerRun.forward`` |
  ``kernel_eager.py:eager_forward``
* a copy made before its first consumer on a device (eager; peer copies hold both streams, a copy to the host holds
  the host, pinned staging from it): ``eager.py:EagerRun.copy_in`` | ``kernel_eager.py:eager_forward``
* the host program, forward segments and ``backward()`` calls (microbatches, 1F1B:
  ``envs/microbatch.py:issue_segments``): ``eager.py:eager_reference`` | ``kernel_eager.py:eager_schedule``
* autograd's backward call: threads, ready queues by sequence number, blocking gradient copies, contention:
  ``autograd.py:BackwardCall`` | ``kernel_autograd.py:eager_backward``
* the dataflow executor (TensorFlow's, the paper's): ``dataflow.py:dataflow_reference`` |
  ``kernel_dataflow.py:dataflow_schedule``
* links: one copy per output and remote device, carrying its largest edge: ``tasks.py:transfer_keys`` |
  ``kernel_eager.py:count_transfers``
* memory, the peak sweep: ``memory.py:peak_bytes`` | ``kernel_memory.py:peak_live_bytes``
* out of memory (torch's fused Adam: no temporaries beside the static state): ``step_result.py:step_result`` |
  ``kernel_memory.py:over_capacity``
* the optimizer step after the backward: ``cost.py:update_time_s`` | ``kernel.py:update_time_s``
* parameter homes (parameters that live on the host, read on a GPU): copied in on a side stream before the forward
  and again before the backward (the forward's last two readers keep their copies instead), the gradient sent home:
  ``homes.py:HomeCopies`` | ``kernel_homes.py:home_copy``, ``kernel_homes.py:refetch``;
  their bytes on the GPU: ``homes.py:home_memory_events`` | ``kernel_homes.py:home_events``
* activation checkpointing per block (eager): the block's forward again before its first backward:
  ``checkpointing.py:Recompute`` | ``kernel_checkpointing.py:recompute``; its bytes (outputs held less, made again,
  the block's inputs held): ``checkpointing.py:checkpoint_frees`` | ``kernel_checkpointing.py:block_output_free``; a
  homed op of a block has its parameters copied in again by that second forward: ``homes.py:HomeCopies.recompute_in``
  | ``kernel_homes.py:copy_in``
* one placement's schedule under either model: ``schedule.py:schedule_reference`` | ``kernel.py:KernelData.schedule``

Rules in Python only:

* op, issue, copy and update times, memory footprints (the cost model): ``cost.py:op_times``,
  ``cost.py:issue_times``, ``cost.py:transfer_time_s``, ``cost.py:static_bytes``
* the graph the schedulers run, shared parameters as edges: ``sim_graph.py:schedule_graph``
  (microbatch copies: ``envs/microbatch.py:microbatch_graph``)
* the tasks and their ids: ``tasks.py:Schedule``, ``tasks.py:collect_schedule``
* the lower bound: ``bound.py:lower_bound_from_times``, with ``work_bound.py:lp_work_bound_s``,
  ``energetic.py:energetic_bound_s`` and ``blocks.py:block_bound_s``

Plans across processes (one worker per rank, point-to-point sends, the runtime's schedules), in Python only:
``ranks.py:RankSim`` (the scorer; ``ranks.py:simulate_ranks``, ``ranks.py:run_actions``), with each rank's
actions from ``rank_actions.py:schedule_actions``, the lists :mod:`envs.real.distributed.schedules` and torch run.

Around them: ``simulator.py:SimEnv`` (the scorer; ``simulator.py:simulate``),
``order_planner.py:OrderPlanner`` (the issue order a placement runs with),
``order_trust.py:order_margin`` (how far planned orders are trusted),
``trace.py:chrome_trace`` (a schedule as a Chrome/Perfetto trace) and
``compiled.py:heap_push`` (numba's ``njit`` and the kernels' heaps), ``warm.py:warm`` (every kernel compiled
into numba's cache once: ``python -m envs.sim.warm``).
"""

from __future__ import annotations

from envs.sim.bound import LowerBound, lower_bound
from envs.sim.sim_graph import schedule_graph
from envs.sim.simulator import SimEnv, plan_order, simulate

__all__ = ["SimEnv", "simulate", "plan_order", "schedule_graph", "lower_bound", "LowerBound"]
