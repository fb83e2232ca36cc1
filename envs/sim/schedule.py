"""The simulated schedule of one training step, and the reference schedulers.

Two executor models share one set of tasks (so the memory sweep, OOM check,
traces and Results read any schedule the same way):

* ``fwd i`` on device ``p[i]``;
* ``act (u, d)``: the output of ``u`` copied once to each other device ``d``
  that holds a consumer of ``u`` (a tensor already sent is not sent again); it
  carries the largest edge from ``u`` to those consumers;
* ``bwd i`` on ``p[i]``;
* ``grad (u, d)``: the gradient of ``u``'s output, summed on ``d`` over the
  consumers there, sent back over ``d -> p[u]`` once their ``bwd`` ran; same bytes
  as the activation.

Then ``optimizer.step()`` runs after ``loss.backward()`` returns. Both models
charge it after the whole backward, every device updating its parameters in
parallel: ``step = backward end + max_d update_d``. (In eager PyTorch a GPU's
fused-Adam kernels could start as soon as its own stream has drained; the
conservative rule keeps one definition for both models and keeps
:mod:`envs.sim.bound` a valid bound.)

``eager`` (the default for scoring PyTorch placements) models the module
:func:`placer.apply` builds, as eager PyTorch runs it: one host thread issues the
ops in the plan's issue order to in-order GPU streams (staging each tensor sent
to a GPU through pinned memory), runs the host's ops itself, and waits for
copies to the host; ``loss.backward()`` then runs on autograd's threads, one
worker per GPU and the calling thread for the host, each serving its ready
tasks highest sequence number first, simulated in time order; a gradient copied
between a GPU and the host blocks its thread. :mod:`envs.sim.eager` has the rules of the
host's issue, :mod:`envs.sim.autograd` those of the backward.

``dataflow`` (the paper's TensorFlow setting, Placeto's and Baechi's
simulators) ignores the issue order: every device, ``cpu:0`` included, runs
whichever ready task became ready first. :mod:`envs.sim.dataflow` has the rules.

:func:`schedule_reference` runs either model in plain Python (the reference);
:mod:`envs.sim.kernel` computes identical schedules with compiled kernels and is
what the simulator uses.
"""

from __future__ import annotations

import numpy as np

from envs.sim.cost import HostCosts, default_issue_times
from envs.sim.dataflow import dataflow_reference
from envs.sim.eager import eager_reference
from envs.sim.homes import HomeCopies
from envs.sim.tasks import ACT, GRAD, Schedule, transfer_keys
from graphs.ir import OpGraph

__all__ = ["ACT", "GRAD", "EXECUTORS", "Schedule", "transfer_keys", "schedule_reference"]

#: The executor models: ``"eager"`` (PyTorch, the default) and ``"dataflow"`` (TensorFlow).
EXECUTORS = ("eager", "dataflow")


def schedule_reference(
    graph: OpGraph,
    op_devices: np.ndarray,
    fwd_t: np.ndarray,
    bwd_t: np.ndarray,
    latency_s: np.ndarray,
    bandwidth_bytes_per_s: np.ndarray,
    update_s: np.ndarray,
    *,
    executor: str = "dataflow",
    order: np.ndarray | None = None,
    host: np.ndarray | None = None,
    launch_s: np.ndarray | None = None,
    segments: np.ndarray | None = None,
    grad: np.ndarray | None = None,
    issue: tuple[np.ndarray, np.ndarray] | None = None,
    host_costs: HostCosts | None = None,
    homes: HomeCopies | None = None,
    blocks: np.ndarray | None = None,
) -> Schedule:
    """Schedule one step in plain Python (slow; the specification the kernel is tested against).

    ``executor="eager"`` also takes the issue ``order`` (default node order),
    ``host`` (True per ``cpu`` device), ``launch_s`` (host dispatch seconds
    per device) and ``segments``, the host thread's forward and backward calls
    (:func:`envs.microbatch.issue_segments`; default one of each); ``"dataflow"``
    ignores them. ``grad`` (default all True) says which ops have a backward
    (:func:`graphs.ops.grad_mask`): under eager the others run none and are sent
    no gradient; under both, no gradient bytes are counted for them. ``issue``
    (eager): ``([n, D] forward, [n, D] backward)`` host issue seconds per op and
    device (:func:`envs.sim.cost.issue_times`); it replaces ``launch_s``, which
    otherwise costs each op with a kernel on a non-host device its forward issue
    (and its backward nothing). ``host_costs`` (eager): the host's staging copies and
    contention (:func:`envs.sim.cost.host_costs`; default none). ``homes`` (eager): the step's parameter homes
    (:mod:`envs.sim.homes`; default none). ``blocks`` (eager): per op, its checkpointed block, -1 for none
    (:mod:`envs.sim.checkpointing`; default none).
    """
    if executor == "eager":
        D = latency_s.shape[0]
        is_host = np.zeros(D, dtype=bool) if host is None else np.asarray(host, dtype=bool)
        if issue is None:
            issue = default_issue_times(fwd_t, is_host, np.zeros(D) if launch_s is None else launch_s)
        return eager_reference(
            graph,
            op_devices,
            fwd_t,
            bwd_t,
            latency_s,
            bandwidth_bytes_per_s,
            update_s,
            np.arange(graph.num_ops) if order is None else order,
            is_host,
            issue,
            segments,
            np.ones(graph.num_ops, dtype=bool) if grad is None else np.asarray(grad, dtype=bool),
            host_costs,
            homes,
            blocks,
        )
    if blocks is not None:
        raise ValueError("checkpointed blocks are simulated under the eager executor")
    if executor != "dataflow":
        raise ValueError(f"executor must be one of {EXECUTORS}, not {executor!r}")
    return dataflow_reference(graph, op_devices, fwd_t, bwd_t, latency_s, bandwidth_bytes_per_s, update_s, grad)
