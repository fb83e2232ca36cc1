"""Hand-computed schedules of simulator model 4's rules (envs.sim.eager), kernel and reference.

The toy cluster of tests/envs/conftest.py: cpu:0 (host), gpu:0, gpu:1 at 1 FLOP/s,
links of 1 byte/s, no launch cost: forward = FLOPs, backward = 2 × forward, a copy
of b bytes = b seconds. ``h_f`` is the host time at which ``loss.backward()`` is
called; "seq" is autograd's sequence number (the order the host made the op or copy).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envs.cluster import Cluster
from envs.sim.simulator import SimEnv

BACKENDS = ["kernel", "reference"]


def run(graph, cluster, place, backend, order=None):
    env = SimEnv(graph, cluster, backend=backend)
    return env.schedule(place, order), env.simulate(place, order=order)


def with_host(cluster: Cluster, **fields) -> Cluster:
    """``cluster`` with its host device's staging and contention fields set."""
    devices = [dataclasses.replace(d, **fields) if d.kind == "cpu" else d for d in cluster.devices]
    return Cluster(cluster.name, devices, cluster.links)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_runs_an_older_ready_task_while_a_newer_one_waits_for_its_gradient(toy, backend):
    # w (gpu:0, 4) independent; u (gpu:0, 1) -> v (cpu, 5), 1 byte. Order w u v.
    # forward: w [0, 4]; u [4, 5]; copy u -> cpu waits for the stream [5, 6], h = 6; v [6, 11].  h_f = 11
    # backward (seq: w 0, u 1, the copy 2, v 3): v on the host [11, 21]; u waits for its gradient, so gpu:0's
    #   worker issues the older w meanwhile: [max(11, free0 6) = 11, 19]; grad of u, cpu -> gpu:0 (blocking, on the
    #   calling thread) [21, 22]; u [22, 24].  Step 24.
    #   (Model 3 ran each GPU's tasks in strict reverse order: u, then w behind it, [24, 32].)
    g = toy.graph(["w", "u", "v"], [("u", "v", 1)], [4, 1, 5])
    s, r = run(g, toy.cluster(), [toy.G0, toy.G0, toy.CPU], backend)
    assert s.bwd_start_s.tolist() == [11, 22, 11] and s.bwd_end_s.tolist() == [19, 24, 21]
    grad = [(st, en) for k, st, en in zip(s.xfer_kind, s.xfer_start_s, s.xfer_end_s) if k == 1]
    assert grad == [(21.0, 22.0)]
    assert r.step_time_s == 24.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_copy_to_the_host_is_issued_right_after_its_last_consumer(toy, backend):
    # a (cpu, 1) -> b (gpu:0, 1), 1 byte; z (gpu:0, 5) and y (gpu:0, 1) independent. Order a z b y.
    # forward: a [0, 1], h = 1; z [1, 6]; copy a -> gpu:0 (pinned) [max(1, free0 6) = 6, 7]; b [7, 8]; y [8, 9].  h_f =
    # 1
    # backward on gpu:0's worker, highest seq first (a 0, z 1, the copy 2, b 3, y 4): y [9, 11]; b [11, 13];
    #   then the copy of a's gradient (seq 2, before z): blocking, once the stream drained [13, 14];
    #   z [14, 24]; a on the host [14, 16].  Step 24.
    #   (Model 3 copied it at a's turn, after z: [23, 24], and a [24, 26].)
    g = toy.graph(["a", "z", "b", "y"], [("a", "b", 1)], [1, 5, 1, 1])
    s, r = run(g, toy.cluster(), [toy.CPU, toy.G0, toy.G0, toy.G0], backend)
    assert s.fwd_start_s.tolist() == [0, 1, 7, 8]
    assert s.bwd_start_s.tolist() == [14, 14, 11, 9] and s.bwd_end_s.tolist() == [16, 24, 13, 11]
    grad = [(st, en) for k, st, en in zip(s.xfer_kind, s.xfer_start_s, s.xfer_end_s) if k == 1]
    assert grad == [(13.0, 14.0)]
    assert r.step_time_s == 24.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_host_stages_every_tensor_it_sends_to_a_gpu(toy, backend):
    # staging: 0.5 s + 0.5 s per byte of host time (4 bytes: 2.5 s)
    staged = with_host(toy.cluster(), stage_latency_s=0.5, stage_bandwidth_bytes_per_s=2.0)
    # forward: a (cpu, 1) -> b (gpu:0, 1), 4 bytes. a [0, 1]; staged [1, 3.5]; copy [3.5, 7.5]; b [7.5, 8.5].  h_f = 3.5
    #   backward: b [8.5, 10.5]; a's gradient, gpu:0 -> cpu on the worker (no staging) [10.5, 14.5]; a [14.5, 16.5]
    #   without staging: copy [1, 5]; b [5, 6]; h_f = 1; b [6, 8]; gradient [8, 12]; a [12, 14]
    g = toy.graph(["a", "b"], [("a", "b", 4)], [1, 1])
    s, r = run(g, staged, [toy.CPU, toy.G0], backend)
    assert s.fwd_start_s.tolist() == [0, 7.5] and s.bwd_start_s.tolist() == [14.5, 8.5]
    assert sorted(zip(s.xfer_kind.tolist(), s.xfer_start_s.tolist(), s.xfer_end_s.tolist())) == [
        (0, 3.5, 7.5),
        (1, 10.5, 14.5),
    ]
    assert r.step_time_s == 16.5 and run(g, toy.cluster(), [toy.CPU, toy.G0], backend)[1].step_time_s == 14.0
    # backward: c (gpu:0, 1) -> d (cpu, 1), 4 bytes. c [0, 1]; copy to the host [1, 5], h = 5; d [5, 6].  h_f = 6
    #   d [6, 8]; c's gradient, cpu -> gpu:0 from pageable memory on the calling thread: staged [8, 10.5], copied
    #   [10.5, 14.5]; c [14.5, 16.5]  (without staging: [8, 12], c [12, 14])
    s, r = run(g, staged, [toy.G0, toy.CPU], backend)
    assert sorted(zip(s.xfer_kind.tolist(), s.xfer_start_s.tolist(), s.xfer_end_s.tolist())) == [
        (0, 1, 5),
        (1, 10.5, 14.5),
    ]
    assert s.bwd_start_s.tolist() == [14.5, 6] and r.step_time_s == 16.5
    assert run(g, toy.cluster(), [toy.G0, toy.CPU], backend)[1].step_time_s == 14.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_ops_and_gpu_issue_slow_each_other_where_they_overlap(toy, backend):
    # h2, g (gpu:0, 1 each) independent of a (cpu, 1) -> b (cpu, 2), 1 byte; order h2 g a b. A gpu profile gives
    # backward issue times h2 2, g 4 (nothing else). Host: contention_op 0.5, contention_issue 0.25.
    # forward: h2 [0, 1]; g [1, 2]; a [0, 1]; b [1, 3].  h_f = 3.   seq: h2 0, g 1, a 2, b 3
    # backward at 3, the worker first on ties: g issued [3, 7] (the host runs nothing yet), kernel [7, 9];
    #   b on the host [3, 3 + 4 + 0.5 x 4 (its overlap with the worker's busy time, to 7)] = [3, 9];
    #   h2 issued at 7 beside b (until 9): 7 + 2 + 0.25 x 2 = 9.5, kernel [9.5, 11.5];
    #   a at 9 beside the worker (busy to 9.5): 9 + 2 + 0.5 x 0.5 = 11.25.  Step 11.5.
    # Without contention: g kernel [7, 9]; b [3, 7]; h2 issued [7, 9], kernel [9, 11]; a [7, 9].  Step 11.
    g = toy.graph(["h2", "g", "a", "b"], [("a", "b", 1)], [1, 1, 1, 2])
    g = dataclasses.replace(
        g, profile={"gpu": {"issue_fwd_s": np.zeros(4), "issue_bwd_s": np.array([2.0, 4.0, 0.0, 0.0])}}
    )
    place = [toy.G0, toy.G0, toy.CPU, toy.CPU]
    s, r = run(g, with_host(toy.cluster(), contention_op=0.5, contention_issue=0.25), place, backend)
    assert s.bwd_start_s.tolist() == [9.5, 7, 9, 3] and s.bwd_end_s.tolist() == [11.5, 9, 11.25, 9]
    assert r.step_time_s == 11.5
    s, r = run(g, toy.cluster(), place, backend)
    assert s.bwd_start_s.tolist() == [9, 7, 7, 3] and r.step_time_s == 11.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_returns_once_every_worker_has_issued_its_tasks(toy, backend):
    # M = 2 microbatches one after another (W = 1: F0 B0 F1 B1) of x (cpu) and a (gpu:0) -> b (cpu), 1 byte; 1 FLOP
    # each, so 0.5 s per microbatch (the byte is not split). A gpu profile gives a's backward an issue time of 3.
    # F0: x0 [0, 0.5]; a0 [0.5, 1]; copy to the host [1, 2], h = 2; b0 [2, 2.5].  h_f = 2.5
    # B0 (seq: x0 0, a0 1, the copy 2, b0 3): the host runs b0 [2.5, 3.5], copies a0's gradient back [3.5, 4.5]
    #   (before x0: seq 2 > 0), then x0 [4.5, 5.5]; gpu:0's worker issues a0 [4.5, 7.5], kernel [7.5, 8.5].
    # backward() returns when the worker is done: 7.5, so F1's first op x1 runs [7.5, 8].
    # (Model 3 returned with the calling thread's last task, 5.5.)
    g = toy.graph(["x", "a", "b"], [("a", "b", 1)], [1, 1, 1])
    g = dataclasses.replace(g, profile={"gpu": {"issue_fwd_s": np.zeros(3), "issue_bwd_s": np.array([0.0, 3.0, 0.0])}})
    s = SimEnv(g, toy.cluster(), backend=backend, microbatches=2, inflight=1).schedule([toy.CPU, toy.G0, toy.CPU])
    assert s.fwd_start_s.tolist()[:3] == [0, 0.5, 2] and s.bwd_start_s.tolist()[:3] == [4.5, 7.5, 2.5]
    assert s.bwd_end_s.tolist()[:3] == [5.5, 8.5, 3.5]
    assert s.fwd_start_s[3] == 7.5
