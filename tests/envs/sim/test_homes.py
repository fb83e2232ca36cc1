"""Parameter homes (envs.sim.homes): hand-computed schedules, memory and errors, kernel and reference.

Toy cluster (tests/envs/conftest.py): cpu:0 (host), gpu:0, gpu:1 at 1 FLOP/s, links of 1 byte/s, no latency, no
launch cost: forward = FLOPs, backward = 2 x forward, a copy of b bytes = b seconds. An op is *offloaded* when its
parameters live on cpu:0 while it runs on a GPU: copied in on the side stream before its forward (after the one two
before has been read), again before its backward, and its gradient sent home after it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from envs.cluster import Cluster
from envs.sim.homes import chain_pairs, home_readers, homeable, parted
from envs.sim.simulator import SimEnv
from graphs import PlacerError
from graphs.plan import Placement
from graphs.synthetic import random_dag

BACKENDS = ["kernel", "reference"]
DEVICES = ["cpu:0", "gpu:0", "gpu:1"]


def chain(toy, flops, param_bytes, out_bytes=None):
    names = [chr(ord("a") + k) for k in range(len(flops))]
    g = toy.graph(names, [(u, v, 1) for u, v in zip(names, names[1:])], flops, param_bytes=param_bytes)
    g.params = [[f"w{k}"] if b else [] for k, b in enumerate(param_bytes)]
    if out_bytes is not None:
        g.out_bytes = np.asarray(out_bytes, dtype=np.int64)
    return g


def changed(cluster, **by_device):
    """``cluster`` with devices changed: ``gpu_0={"memory_bytes": 250}``."""
    devices = [replace(d, **by_device.get(d.name.replace(":", "_"), {})) for d in cluster.devices]
    return Cluster(cluster.name, devices, cluster.links)


def homes_times(s):
    h = s.homes
    return [
        (int(i), (float(a), float(b)), (float(c), float(d)), (float(e), float(f)))
        for i, a, b, c, d, e, f in zip(
            h.op, h.fetch_start_s, h.fetch_end_s, h.refetch_start_s, h.refetch_end_s, h.grad_start_s, h.grad_end_s
        )
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_homed_on_the_host_is_fetched_on_the_side_stream_and_its_gradient_sent_home(toy, backend):
    # a (1) -> b (2, owns 2 bytes) -> c (1, owns 3 bytes), all on gpu:0; b's and c's parameters live on cpu:0.
    # forward: a [0, 1].  fetch b: [max(h 0, link 0), 2]; b waits for it: [max(free 1, 2) = 2, 4].
    #   fetch c (the window has one copy before it: no wait): [max(0, link 2) = 2, 5]; c [max(4, 5) = 5, 6].
    # b and c are the forward's last two readers: their copies are kept for the backward, none made again.
    # backward (h_f = 0; the worker is ahead of the stream): c [max(free 6, 0) = 6, 8]; its gradient home [8, 11]
    #   (gpu:0 -> cpu:0, on no thread).  b [8, 12]; gradient [max(12, link 11), 14].  a [12, 14].
    #   The step ends with the last gradient home: 14 (Adam on the host: 5 bytes at 1e30 B/s).
    g = chain(toy, [1, 2, 1], [0, 2, 3], out_bytes=[1, 1, 0])
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 3, homes=[-1, toy.CPU, toy.CPU])
    assert p.param_homes == {"w1": "cpu:0", "w2": "cpu:0"}
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert s.fwd_start_s.tolist() == [0, 2, 5] and s.fwd_end_s.tolist() == [1, 4, 6]
    assert s.bwd_start_s.tolist() == [12, 8, 6] and s.bwd_end_s.tolist() == [14, 12, 8]
    assert homes_times(s) == [(1, (0, 2), (0, 0), (12, 14)), (2, (2, 5), (0, 0), (8, 11))]
    assert s.homes.kept.tolist() == [True, True]
    r = env.simulate(p)
    assert r.step_time_s == 14.0
    assert r.busy_s["cpu:0->gpu:0"] == 5.0 and r.busy_s["gpu:0->cpu:0"] == 5.0
    # gpu:0 holds no parameter state; at t = 6: b's copy (2, kept to b's backward's end), c's copy (3) and gradient
    # (3), a's and b's outputs (1 + 1, kept for backward) = 10.  cpu:0: 4 x 5 bytes of state (torch's fused Adam
    # steps them in place)
    assert r.peak_bytes == {"cpu:0": 20, "gpu:0": 10, "gpu:1": 0}
    # the batch path, with the same homes, says the same
    t, failed = env.with_homes(p.home_indices(g)).step_times(p.indices(g)[None, :])
    assert t.tolist() == [14.0] and not failed[0]
    # a plan whose copies are all made again (home_copies "again": a file from before the kept copies): c's copy
    #   again [max(now 0, link 5) = 5, 8], its kernel [max(free 6, 8) = 8, 10], its gradient home [10, 13]; b's
    #   again [max(0, link 8) = 8, 10], kernel [10, 14], gradient [max(14, link 13), 16]; a [14, 16]. At t = 8:
    #   c's copy (3) and gradient (3), b's copy (2), a's and b's outputs (1 + 1) = 10.
    p.home_copies = "again"
    s, r = env.schedule(p), env.simulate(p)
    assert s.bwd_start_s.tolist() == [14, 10, 8] and s.bwd_end_s.tolist() == [16, 14, 10]
    assert homes_times(s) == [(1, (0, 2), (8, 10), (14, 16)), (2, (2, 5), (5, 8), (10, 13))]
    assert s.homes.kept.tolist() == [False, False] and r.step_time_s == 16.0
    assert r.busy_s["cpu:0->gpu:0"] == 10.0 and r.peak_bytes == {"cpu:0": 20, "gpu:0": 10, "gpu:1": 0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_homed_parameters_stepped_during_the_backward_each_once_its_gradient_is_home(toy, backend):
    # The schedule of the test above (a (1) -> b (2, owns 2 bytes) -> c (1, owns 3 bytes), b's and c's parameters
    # on cpu:0), with the host's Adam at 7 B/s: 7 passes over a parameter's bytes take as many seconds as it has
    # bytes. c's gradient is home at 11, b's at 14, and the backward's last task (a) ends at 14.
    # "after": Adam over 5 bytes once backward() returns: 14 + 5 = 19.
    # "backward": one host worker steps c [11, 14] as soon as its gradient is home, then b [max(14, 14), 16];
    #   backward() returns at 16, and the optimizer's step has nothing left to step: 16.
    g = chain(toy, [1, 2, 1], [0, 2, 3], out_bytes=[1, 1, 0])
    c = changed(toy.cluster(), cpu_0={"mem_bw_bytes_per_s": 7.0})
    env = SimEnv(g, c, backend=backend)
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 3, homes=[-1, toy.CPU, toy.CPU])
    assert env.simulate(p).step_time_s == 19.0 and "host_steps" not in env.simulate(p).extra
    p.host_step = "backward"
    s = env.schedule(p)
    assert s.bwd_end_s.tolist() == [14, 12, 8]  # the backward itself does not change
    assert s.host_steps.owner.tolist() == [2, 1] and s.host_steps.home.tolist() == [toy.CPU] * 2
    assert s.host_steps.start_s.tolist() == [11, 14] and s.host_steps.end_s.tolist() == [14, 16]
    r = env.simulate(p)
    assert r.step_time_s == 16.0 and r.extra["backward_end_s"] == 16.0 and r.extra["update_s"] == 0.0
    # two calls (c alone, then b); autograd's last task ends at 14: backward() waits 2 s for the worker
    assert r.extra["host_steps"] == {"calls": 2, "stepped": 2, "waited_s": 2.0} and s.host_steps.batch.tolist() == [
        0,
        1,
    ]
    assert r.busy_s["cpu:0"] == 5.0
    # the batch path: the env's host_step, or the call's
    homes, rows = p.home_indices(g), p.indices(g)[None, :]
    assert env.with_homes(homes).step_times(rows)[0].tolist() == [19.0]
    assert env.batch(rows, homes=homes, host_step="backward")[0].tolist() == [16.0]
    env.host_step = "backward"
    assert env.with_homes(homes).step_times(rows)[0].tolist() == [16.0]
    # a plan without homes is stepped after the backward either way
    own = Placement.from_indices(g, DEVICES, [toy.G0] * 3, host_step="backward")
    assert env.simulate(own).step_time_s == SimEnv(g, c, backend=backend).simulate(own).step_time_s
    # no placement beats the bound of plans stepped during the backward (the plain bound adds the update after)
    assert env.lower_bound(host_step="backward") <= 16.0
    # each call of the worker costs the host 1 s more (step_call_s): c [11, 11 + 1 + 3 = 15], b [15, 15 + 1 + 2];
    # stepped after the backward, one call on no worker: 19 as before
    c = changed(toy.cluster(step_call_s=1.0), cpu_0={"mem_bw_bytes_per_s": 7.0})
    env = SimEnv(g, c, backend=backend)
    s = env.schedule(p)
    assert s.host_steps.start_s.tolist() == [11, 15] and s.host_steps.end_s.tolist() == [15, 18]
    assert env.simulate(p).step_time_s == 18.0 and env.simulate(p).extra["host_steps"]["waited_s"] == 4.0
    assert env.batch(rows, homes=homes, host_step="backward")[0].tolist() == [18.0]
    p.host_step = "after"
    assert env.simulate(p).step_time_s == 19.0


def test_the_host_worker_steps_together_the_parameters_complete_while_it_was_busy(toy):
    # Three offloaded ops' parameters (a, b, c: 1 byte each on cpu:0, whose Adam's 7 passes at 7 B/s take 1 s, and
    # each call of the worker 2 s), complete at 1, 2 and 2.5: a alone [1, 1 + 2 + 1 = 4]; then b and c, complete
    # while it stepped a, in one call taken at 4: b [4, 4 + 2 + 1 = 7] (the call's cost), c [7, 8]. Stepped one
    # at a time, c would end at 4 + 3 + 3 = 10.
    from envs.sim.homes import host_steps, no_home_times
    from envs.sim.kernel_homes import host_step_chain

    c = toy.cluster(mem_bw_bytes_per_s=7.0, step_call_s=2.0)
    home = np.full(3, toy.CPU)
    t = no_home_times()._replace(
        op=np.arange(3), grad_end_s=np.array([1.0, 2.0, 2.5]), owner=np.arange(3), owner_home=home
    )
    pairs, param_b = (np.arange(3), np.arange(3)), np.full(3, 1.0)
    s = host_steps(t, pairs, param_b, c)
    assert s.owner.tolist() == [0, 1, 2] and s.home.tolist() == [toy.CPU] * 3
    assert s.start_s.tolist() == [1, 4, 7] and s.end_s.tolist() == [4, 7, 8] and s.batch.tolist() == [0, 1, 1]
    ht = np.zeros((6, 3))
    ht[5] = t.grad_end_s
    call = c.step_call_s
    done = np.empty(3)
    end = host_step_chain(3, home, home, ht, *pairs, param_b, call, c.update_bw_bytes_per_s, done, 5.0)
    assert end == 8.0 and done.tolist() == [1.0, 2.0, 2.5]
    assert host_step_chain(3, home, home, ht, *pairs, param_b, call, c.update_bw_bytes_per_s, done, 9.0) == 9.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_homed_parameters_read_by_two_ops_are_stepped_once_both_gradients_are_home(toy, backend):
    # The tied weight of test_a_parameter_two_ops_read_is_copied_for_each: w (2 bytes, a's) read by a and c, its
    # gradients home at 9 (c's) and 13 (a's); Adam at 1 B/s on the host takes 14 s over w: stepped [13, 27].
    g = chain(toy, [1, 1, 1], [2, 0, 0], out_bytes=[1, 1, 0])
    g.params = [["w"], [], ["w"]]
    c = changed(toy.cluster(), cpu_0={"mem_bw_bytes_per_s": 1.0})
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 3, homes=[toy.CPU, -1, -1], host_step="backward")
    env = SimEnv(g, c, backend=backend)
    s = env.schedule(p)
    assert s.host_steps.owner.tolist() == [0] and s.host_steps.start_s.tolist() == [13.0]
    assert env.simulate(p).step_time_s == 27.0
    env.host_step = "backward"
    assert env.with_homes([toy.CPU, -1, -1]).step_times(np.array([[toy.G0] * 3]))[0].tolist() == [27.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_side_stream_waits_for_the_reader_of_the_copy_two_before(toy, backend):
    # a (10), b (1), c (1), every one owning 1 byte on cpu:0, all on gpu:0.
    # fetch a [0, 1]; a [1, 11].  fetch b [1, 2] (one copy before it); b [11, 12].
    # fetch c waits for a's forward to end (the copy two before): [11, 12] (not [2, 3]); c [12, 13].
    # live on gpu:0 in the forward: never more than two copies (a's until 11, b's, c's from 11).
    g = chain(toy, [10, 1, 1], [1, 1, 1], out_bytes=[0, 0, 0])
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 3, homes=[toy.CPU] * 3)
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert [t[1] for t in homes_times(s)] == [(0, 1), (1, 2), (11, 12)]
    assert s.fwd_start_s.tolist() == [1, 11, 12]
    # backward (now = 0: the worker is ahead of the stream): b and c, the forward's last two readers, keep their
    #   copies: c [13, 15], home [15, 16]; b [15, 17], home [17, 18]; both join the backward's window, so a's copy
    #   waits for the end of c's backward (two before): [15, 16] (not [max(0, link 12) = 12, 13]), kernel [17, 37],
    #   home [37, 38]
    assert [t[2] for t in homes_times(s)] == [(15, 16), (0, 0), (0, 0)] and s.homes.kept.tolist() == [False, True, True]
    assert s.bwd_end_s.tolist() == [37, 17, 15] and env.simulate(p).step_time_s == 38.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_optimizer_step_of_homed_parameters_runs_on_the_home(toy, backend):
    # one op on gpu:0 owning 7 bytes; GPU memory at 2 B/s, the host's at 1 B/s: Adam's step (7 passes over the
    # bytes) takes 24.5 s on gpu:0, 49 s on cpu:0. The op touches 7 bytes: forward 3.5 s, backward 7 s on gpu:0.
    g = chain(toy, [1], [7], out_bytes=[0])
    c = changed(toy.cluster(mem_bw_bytes_per_s=2.0), cpu_0={"mem_bw_bytes_per_s": 1.0})
    env = SimEnv(g, c, backend=backend)
    home, own = (Placement.from_indices(g, DEVICES, [toy.G0], homes=[h]) for h in (toy.CPU, -1))
    # own: fwd [0, 3.5], bwd [3.5, 10.5], Adam on gpu:0
    assert env.simulate(own).step_time_s == 10.5 + 24.5
    # home: fetch [0, 7]; fwd [7, 10.5]; its copy kept (the forward's last): bwd [10.5, 17.5]; gradient home
    # [17.5, 24.5]; Adam on cpu:0
    r = env.simulate(home)
    assert r.step_time_s == 24.5 + 49
    assert r.busy_s["cpu:0"] == 49 and r.busy_s["gpu:0"] == 10.5
    assert env.with_homes([toy.CPU]).step_times(np.array([[toy.G0]]))[0].tolist() == [24.5 + 49]


@pytest.mark.parametrize("backend", BACKENDS)
def test_homes_decide_what_fits(toy, backend):
    # b owns 100 bytes: 400 of state on gpu:0 over a 250-byte GPU; homed on the host, its copies fit.
    g = chain(toy, [1, 1], [0, 100], out_bytes=[0, 0])
    env = SimEnv(g, changed(toy.cluster(), gpu_0={"memory_bytes": 250}), backend=backend)
    rows = np.array([[toy.G0, toy.G0]] * 2)
    t, failed, over = env.with_homes(np.array([[-1, -1], [-1, toy.CPU]])).overflow(rows)
    assert failed.tolist() == [True, False] and over[0] == 400 / 250 and over[1] == 0
    # the copy for the backward and the gradient overlap: 200 bytes at most
    r = env.simulate(Placement.from_indices(g, DEVICES, [toy.G0] * 2, homes=[-1, toy.CPU]))
    assert r.ok and r.peak_bytes["gpu:0"] == 200
    # ... which a 150-byte GPU cannot hold
    small = SimEnv(g, changed(toy.cluster(), gpu_0={"memory_bytes": 150}), backend=backend)
    t, failed, over = small.with_homes([-1, toy.CPU]).overflow(rows[:1])
    assert failed.tolist() == [True] and over[0] == 200 / 150


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_parameters_homed_on_the_host_are_copied_in_twice_and_send_no_gradient_home(toy, backend):
    # The first test's chain with b's 2 bytes frozen (held like a buffer's, meta["frozen_params"]) and d after c, so
    # that b is not among the forward's last two readers (c and d keep their copies): a (1) -> b (2, frozen: backward
    # 1 x forward = 2) -> c (1, owns 3 trainable bytes) -> d (1, owns 1); b's, c's and d's parameters on cpu:0.
    # forward: a [0, 1]; fetch b [0, 2], b [2, 4]; fetch c [2, 5], c [5, 6]; fetch d waits for b's forward (two
    #   before): [max(link 5, 4) = 5, 6], d [6, 7].
    # backward: d [7, 9], its gradient home [9, 10]; c [9, 11], its gradient home [max(11, link 10) = 11, 14].
    #   b fetched again (its input's gradient reads the weights) once d's backward (two before) ends: [max(link 6,
    #   9) = 9, 11]; kernel [11, 13]; no gradient: nothing goes home (zero-length at 13).  a [13, 15]. The step ends
    #   at 15 (c's gradient home at 14).
    g = chain(toy, [1, 2, 1, 1], [0, 0, 3, 1], out_bytes=[1, 1, 1, 0])
    g.buffer_bytes = np.array([0, 2, 0, 0])
    g.params = [[], ["w1"], ["w2"], ["w3"]]
    g.meta["frozen_params"] = ["w1"]
    assert homeable(g).tolist() == [0, 1, 1, 1]
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 4, homes=[-1, toy.CPU, toy.CPU, toy.CPU])
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert s.fwd_start_s.tolist() == [0, 2, 5, 6] and s.fwd_end_s.tolist() == [1, 4, 6, 7]
    assert s.bwd_start_s.tolist() == [13, 11, 9, 7] and s.bwd_end_s.tolist() == [15, 13, 11, 9]
    assert homes_times(s) == [
        (1, (0, 2), (9, 11), (13, 13)),
        (2, (2, 5), (0, 0), (11, 14)),
        (3, (5, 6), (0, 0), (9, 10)),
    ]
    assert s.homes.grad_nbytes.tolist() == [0, 3, 1] and s.homes.kept.tolist() == [False, True, True]
    r = env.simulate(p)
    assert r.step_time_s == 15.0
    assert r.busy_s["cpu:0->gpu:0"] == 2 + 3 + 1 + 2 and r.busy_s["gpu:0->cpu:0"] == 4.0  # b's gradient: none
    # cpu:0 holds b's 2 bytes (no gradient, no Adam state) and c's and d's 4 x 4; gpu:0 at t = 9, once d's copy and
    # c's output (read by d's backward) are let go: c's copy (3, kept) and gradient (3), b's copy again (2), b's
    # output (1, kept for c's weight gradient), c's output's gradient (1) and d's gradient (1, home at 10) = 11; a's
    # output is not kept: b's frozen weights' backward computes its input's gradient from the weights alone
    # (graphs.ops.PRODUCTS)
    assert r.peak_bytes == {"cpu:0": 2 + 16, "gpu:0": 11, "gpu:1": 0}
    t, failed = env.with_homes(p.home_indices(g)).step_times(p.indices(g)[None, :])
    assert t.tolist() == [15.0] and not failed[0]
    # stepped during the backward: d's and c's (b has nothing to step)
    p.host_step = "backward"
    assert env.schedule(p).host_steps.owner.tolist() == [3, 2]
    # with b on gpu:0 (its op's device), its 2 bytes count there
    own = Placement.from_indices(g, DEVICES, [toy.G0] * 4, homes=[-1, -1, toy.CPU, toy.CPU])
    assert env.simulate(own).peak_bytes["cpu:0"] == 16


def test_homes_are_for_a_gpu_op_s_own_parameters_on_the_host(toy):
    g = chain(toy, [1, 1], [4, 4])
    env = SimEnv(g, toy.cluster())
    on_gpu = np.array([[toy.G0, toy.G0]])
    with pytest.raises(PlacerError, match="home must be its op's device or, for an op on a GPU, a host"):
        env.with_homes([toy.G1, -1]).step_times(on_gpu)
    with pytest.raises(PlacerError, match="home must be"):
        env.with_homes([toy.G0, -1]).step_times(np.array([[toy.CPU, toy.G0]]))  # a host op's on a GPU
    # its own device as its home is no home apart
    assert env.with_homes([toy.G0, toy.G0]).step_times(on_gpu)[0] == env.step_times(on_gpu)[0]
    with pytest.raises(PlacerError, match="one microbatch, eager"):
        SimEnv(g, toy.cluster(), executor="dataflow").with_homes([toy.CPU, -1]).step_times(on_gpu)
    with pytest.raises(PlacerError, match="one microbatch, eager"):
        env.with_microbatches(2).with_homes([toy.CPU, -1]).step_times(on_gpu)
    shared = chain(toy, [1, 1], [4, 0])
    shared.params = [["w0"], ["w0"]]  # b reads a's parameter too: it lives apart only with b on a's device
    with pytest.raises(PlacerError, match="op a's parameters are read on another device .by op b"):
        SimEnv(shared, toy.cluster()).with_homes([toy.CPU, -1]).step_times(np.array([[toy.G0, toy.G1]]))
    plan = Placement.from_indices(shared, DEVICES, [toy.G0, toy.G1], homes=[toy.CPU, -1])
    plan.source = "plan.json"  # a plan file's error names it first
    with pytest.raises(PlacerError, match="^plan.json: homes: op a's parameters are read on another device"):
        SimEnv(shared, toy.cluster()).simulate(plan)
    shared.buffer_bytes = np.array([2, 0])  # ... and not at all where a holds buffers too (they stay with a)
    assert homeable(shared).tolist() == [-1, 0]
    with pytest.raises(PlacerError, match="cannot live apart from it"):
        SimEnv(shared, toy.cluster()).with_homes([toy.CPU, -1]).step_times(on_gpu)
    tied = chain(toy, [1, 1], [4, 4])
    tied.params = [["w0"], ["w1"]]
    tied.meta["tied_params"] = [["w1", "head.w1"]]  # b's parameter has two names: one tensor, one home
    assert homeable(tied).tolist() == [1, 1]


def viewed(toy, owner):
    """a (1) -> c (2); t (``w.T``, a view: no kernel) -> c. ``owner``: "t" (c reads w through the view, as ``x @ w.T``
    captures) or "c" (c reads w itself). w: 2 bytes."""
    g = toy.graph(["a", "t", "c"], [("a", "c", 1), ("t", "c", 2)], [1, 0, 2], param_bytes=[0, 2, 0])
    g.op_types = ["aten.mm.default", "aten.t.default", "aten.mm.default"]
    g.out_bytes = np.array([1, 2, 0], dtype=np.int64)
    if owner == "c":
        g.param_bytes = np.array([0, 0, 2], dtype=np.int64)
    g.params = [[], ["w"], []] if owner == "t" else [[], [], ["w"]]
    return g


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_read_through_a_view_is_copied_for_the_op_that_reads_it(toy, backend):
    # all on gpu:0, w on cpu:0. The copy is made for c, the op that reads w's data (the view t has no kernel):
    # forward: a [0, 1]; w in [0, 2]; c waits for it: [2, 4].  backward: c, the forward's last reader, keeps its
    # copy: its kernel [4, 8]; its gradient home [8, 10]; a [8, 10]. The step ends at 10 (Adam on the host: 2 bytes).
    g = viewed(toy, "t")
    assert homeable(g).tolist() == [0, 1, 0] and home_readers(g).tolist() == [0, 2, 2]
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 3, homes=[-1, toy.CPU, -1])
    assert p.param_homes == {"w": "cpu:0"}
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert homes_times(s) == [(2, (0, 2), (0, 0), (8, 10))]
    assert s.homes.owner.tolist() == [1] and s.homes.owner_home.tolist() == [toy.CPU]
    assert s.fwd_start_s[[0, 2]].tolist() == [0, 2] and s.bwd_end_s[[0, 2]].tolist() == [10, 8]
    r = env.simulate(p)
    assert r.step_time_s == 10.0 and r.busy_s["cpu:0->gpu:0"] == 2.0 and r.busy_s["gpu:0->cpu:0"] == 2.0
    # exactly as if c read w itself: the same schedule, the same memory (w's state, 4 x 2 bytes, on cpu:0)
    own = Placement.from_indices(viewed(toy, "c"), DEVICES, [toy.G0] * 3, homes=[-1, -1, toy.CPU])
    ref = SimEnv(viewed(toy, "c"), toy.cluster(), backend=backend).simulate(own)
    assert r.peak_bytes == ref.peak_bytes and r.peak_bytes["cpu:0"] == 8 and r.step_time_s == ref.step_time_s
    t, failed = env.with_homes([-1, toy.CPU, -1]).step_times(np.array([[toy.G0] * 3]))
    assert t.tolist() == [10.0] and not failed[0]
    # without the home, w lives on gpu:0 with its view
    plain = env.simulate(Placement.from_indices(g, DEVICES, [toy.G0] * 3))
    assert plain.peak_bytes["cpu:0"] == 0 and plain.step_time_s == 9.0  # a [0, 1], c [1, 3], c [3, 7], a [7, 9]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_whose_metadata_is_checked_first_is_copied_for_the_op_that_reads_it(toy, backend):
    # w.to(dtype) exports a check of w's metadata (k: w's owner, its first reader) and a cast at the same dtype (t, a
    # view reading w), read by c: the copy is made for c, as in the test above (a [0, 1], c [2, 4], step 10 s)
    g = toy.graph(["a", "k", "t", "c"], [("a", "c", 1), ("t", "c", 2)], [1, 0, 0, 2], param_bytes=[0, 2, 0, 0])
    g.op_types = ["aten.mm.default", "aten._assert_tensor_metadata.default", "aten.to.dtype", "aten.mm.default"]
    g.out_bytes = np.array([1, 0, 2, 0], dtype=np.int64)
    g.params = [[], ["w"], ["w"], []]
    g.meta["alias_ops"] = ["t"]  # as capture records it (its schema: the same tensor at the same dtype)
    assert homeable(g).tolist() == [0, 1, 0, 0] and home_readers(g).tolist() == [0, 3, 2, 3]
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 4, homes=[-1, toy.CPU, -1, -1])
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert homes_times(s) == [(3, (0, 2), (0, 0), (8, 10))] and s.homes.owner.tolist() == [1]
    r = env.simulate(p)
    assert r.step_time_s == 10.0 and r.peak_bytes == {"cpu:0": 8, "gpu:0": 5, "gpu:1": 0}
    ref = SimEnv(viewed(toy, "c"), toy.cluster(), backend=backend)
    assert (
        r.peak_bytes
        == ref.simulate(Placement.from_indices(ref.graph, DEVICES, [toy.G0] * 3, homes=[-1, -1, 0])).peak_bytes
    )
    with pytest.raises(PlacerError, match="read on another device"):  # the cast parted from its reader
        env.with_homes([-1, toy.CPU, -1, -1]).step_times(np.array([[toy.G0, toy.G0, toy.G1, toy.G0]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_two_ops_read_is_copied_for_each(toy, backend):
    # a (1, owns w: 2 bytes) -> b (1) -> c (1, reads w too: a tied head, a layer applied twice), all on gpu:0, w on
    # cpu:0. forward: w in for a [0, 2]; a [2, 3]; b [3, 4]; w in for c [max(0, link 2) = 2, 4]; c [4, 5].
    # backward: a and c, the forward's last two readers, keep their copies: c [5, 7]; its gradient home [7, 9];
    # b [7, 9]; a [9, 11]; its gradient home [max(11, link 9) = 11, 13]. Step: 13.
    g = chain(toy, [1, 1, 1], [2, 0, 0], out_bytes=[1, 1, 0])
    g.params = [["w"], [], ["w"]]
    assert homeable(g).tolist() == [1, 0, 0]
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 3, homes=[toy.CPU, -1, -1])
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert homes_times(s) == [(0, (0, 2), (0, 0), (11, 13)), (2, (2, 4), (0, 0), (7, 9))]
    assert s.homes.owner.tolist() == [0] and s.fwd_start_s.tolist() == [2, 3, 4]
    r = env.simulate(p)
    assert r.step_time_s == 13.0 and r.peak_bytes["cpu:0"] == 8  # w's state once, on the host
    assert env.with_homes([toy.CPU, -1, -1]).step_times(np.array([[toy.G0] * 3]))[0].tolist() == [13.0]


def test_a_parameter_read_through_a_view_lives_apart_only_with_the_view_on_its_reader_s_device(toy):
    g = viewed(toy, "t")
    env = SimEnv(g, toy.cluster())
    with pytest.raises(PlacerError, match="op t's parameters are read on another device .by op c.*only with every op"):
        env.with_homes([-1, toy.CPU, -1]).step_times(np.array([[toy.G0, toy.G1, toy.G0]]))
    # a view two ops read lives apart only with both on its device
    g = branching(toy, "t")
    with pytest.raises(PlacerError, match="op t's parameters are read on another device .by op c"):
        SimEnv(g, toy.cluster()).with_homes([-1, toy.CPU, -1, -1]).step_times(np.array([[toy.G0] * 3 + [toy.G1]]))


def branching(toy, owner):
    """a (1) -> b (1) -> c (1); t (``w.T``, a view: no kernel) -> b and -> c. ``owner``: "t" (b and c read w through
    the one view, as ``wt = w.T; ... x @ wt ... y @ wt`` captures) or "b" (b owns w and c reads it too: a tied
    parameter). w: 2 bytes."""
    g = toy.graph(["a", "t", "b", "c"], [("a", "b", 1), ("b", "c", 1), ("t", "b", 2), ("t", "c", 2)], [1, 0, 1, 1])
    g.op_types = ["aten.mm.default", "aten.t.default", "aten.mm.default", "aten.mm.default"]
    g.out_bytes = np.array([1, 2, 1, 0], dtype=np.int64)
    g.param_bytes = np.array([0, 2, 0, 0] if owner == "t" else [0, 0, 2, 0], dtype=np.int64)
    g.params = [[], [], ["w"], ["w"]] if owner == "b" else [[], ["w"], [], []]
    return g


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_read_through_a_view_two_ops_read_is_copied_for_each(toy, backend):
    # all on gpu:0, w on cpu:0: a copy for b and one for c, the ops reading w's data through the view t (no kernel).
    # forward: a [0, 1]; w in for b [0, 2]; b [2, 3]; w in for c [max(0, link 2) = 2, 4]; c [4, 5].
    # backward: b and c, the forward's last two readers, keep their copies: c [5, 7]; its gradient home [7, 9];
    # b [7, 9]; its gradient home [max(9, link 9) = 9, 11]; a [9, 11]. The step ends at 11.
    g = branching(toy, "t")
    assert homeable(g).tolist() == [0, 1, 0, 0]
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 4, homes=[-1, toy.CPU, -1, -1])
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert homes_times(s) == [(2, (0, 2), (0, 0), (9, 11)), (3, (2, 4), (0, 0), (7, 9))]
    assert s.homes.owner.tolist() == [1]
    r = env.simulate(p)
    assert r.step_time_s == 11.0 and r.peak_bytes["cpu:0"] == 8  # w's state once, on the host
    # exactly as if b read w itself and c read it too (a tied parameter)
    tied = branching(toy, "b")
    own = Placement.from_indices(tied, DEVICES, [toy.G0] * 4, homes=[-1, -1, toy.CPU, -1])
    ref = SimEnv(tied, toy.cluster(), backend=backend)
    assert homes_times(ref.schedule(own)) == homes_times(s)
    assert ref.simulate(own).peak_bytes == r.peak_bytes and ref.simulate(own).step_time_s == r.step_time_s
    assert env.with_homes([-1, toy.CPU, -1, -1]).step_times(np.array([[toy.G0] * 4]))[0].tolist() == [11.0]


def packed(toy, owner):
    """a (1) -> b (1) -> c (1); s (``split_with_sizes``, a view) -> q (``getitem``, 2 bytes) -> b and s -> k (4 bytes)
    -> c: ``nn.MultiheadAttention``'s packed projection (6 bytes) split into the query's part, read by b, and the keys'
    and values', read by c. ``owner``: "s" (the packed parameter) or "bc" (b owns a 2-byte parameter, c a 4-byte
    one)."""
    names = ["a", "s", "q", "k", "b", "c"]
    edges = [("a", "b", 1), ("b", "c", 1), ("s", "q", 6), ("s", "k", 6), ("q", "b", 2), ("k", "c", 4)]
    g = toy.graph(names, edges, [1, 0, 0, 0, 1, 1])
    g.op_types = ["aten.mm.default", "aten.split_with_sizes.default", "getitem", "getitem"] + ["aten.mm.default"] * 2
    g.out_bytes = np.array([1, 6, 2, 4, 1, 0], dtype=np.int64)
    g.param_bytes = np.array([0, 6, 0, 0, 0, 0] if owner == "s" else [0, 0, 0, 0, 2, 4], dtype=np.int64)
    g.params = [[], ["w"], [], [], [], []] if owner == "s" else [[], [], [], [], ["wq"], ["wk"]]
    return g


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_op_reading_a_part_of_a_packed_parameter_is_copied_that_part(toy, backend):
    # all on gpu:0, w (6 bytes) on cpu:0: b's copy is the query's 2 bytes, c's the other 4 (not 6 each).
    # forward: a [0, 1]; w's part in for b [0, 2]; b [2, 3]; w's part in for c [max(0, link 2) = 2, 6]; c [6, 7].
    # backward (b and c keep their copies, the forward's last two): c [7, 9]; its gradient home [9, 13]; b [9, 11];
    # its gradient home [max(11, link 13) = 13, 15]; a [11, 13]. The step ends at 15 (with whole copies of 6 bytes:
    # b's [0, 6], b [6, 7], c's [6, 12], c [12, 13]; c [13, 15], home [15, 21]; b [15, 17], home [21, 27]: 27).
    g = packed(toy, "s")
    p = Placement.from_indices(g, DEVICES, [toy.G0] * 6, homes=[-1, toy.CPU, -1, -1, -1, -1])
    env = SimEnv(g, toy.cluster(), backend=backend)
    s = env.schedule(p)
    assert homes_times(s) == [(4, (0, 2), (0, 0), (13, 15)), (5, (2, 6), (0, 0), (9, 13))]
    assert s.homes.nbytes.tolist() == [2, 4]
    r = env.simulate(p)
    assert r.step_time_s == 15.0 and r.peak_bytes["cpu:0"] == 24  # w's state once, on the host
    # exactly as if b and c each owned their part
    apart = packed(toy, "bc")
    own = Placement.from_indices(apart, DEVICES, [toy.G0] * 6, homes=[-1, -1, -1, -1, toy.CPU, toy.CPU])
    ref = SimEnv(apart, toy.cluster(), backend=backend)
    assert homes_times(ref.schedule(own)) == homes_times(s)
    assert ref.simulate(own).peak_bytes == r.peak_bytes and ref.simulate(own).step_time_s == r.step_time_s
    assert env.with_homes([-1, toy.CPU, -1, -1, -1, -1]).step_times(np.array([[toy.G0] * 6]))[0].tolist() == [15.0]


@pytest.mark.parametrize("host_step", ["after", "backward"])
@pytest.mark.parametrize("seed", range(4))
def test_kernel_and_reference_agree_with_random_homes(seed, host_step):
    rng = np.random.default_rng(seed)
    g = random_dag(40, seed=seed)
    g.param_bytes = rng.integers(0, 3, g.num_ops) * rng.integers(1 << 20, 1 << 24, g.num_ops)
    g.params = [[f"w{i}"] if b else [] for i, b in enumerate(g.param_bytes)]
    if seed % 2:  # some owners frozen: their bytes held like a buffer's, homed with no gradient
        frozen = (g.param_bytes > 0) & (rng.random(g.num_ops) < 0.4)
        g.buffer_bytes = np.where(frozen, g.param_bytes, 0)
        g.param_bytes = np.where(frozen, 0, g.param_bytes)
        g.meta["frozen_params"] = [f"w{i}" for i in np.flatnonzero(frozen)]
        assert frozen.any() and (homeable(g)[frozen] > 0).all()
    c = Cluster.preset("h200x1")
    c = changed(c, gpu_0={"memory_bytes": float(g.param_bytes.sum() * 1.2)})  # some placements do not fit
    p = rng.integers(0, c.num_devices, (8, g.num_ops))
    homes = np.where((rng.random((8, g.num_ops)) < 0.5) & (p > 0) & (homeable(g) > 0), 0, -1)
    homes[parted(p, chain_pairs(g))] = -1  # a parameter read through views: apart with its views on its reader's
    kernel, reference = (SimEnv(g, c, backend=b).with_homes(homes) for b in BACKENDS)
    kernel.env.host_step = reference.env.host_step = host_step
    tk, fk, ok = kernel.overflow(p)
    tr, fr, orf = reference.overflow(p)
    assert homes.max() == 0 and (homes == 0).any()
    np.testing.assert_array_equal(tk, tr)
    np.testing.assert_array_equal(fk, fr)
    np.testing.assert_allclose(ok, orf, rtol=1e-12)
    assert fk.any() and not fk.all()


def test_the_lower_bound_charges_the_host_s_adam_for_what_the_gpus_cannot_hold(toy):
    # 200 parameter bytes (800 of state) over two GPUs of 300 bytes: at least 50 bytes of parameters live on cpu:0
    # (with their op, or as its home) and Adam updates them there: 7 x 50 / 1 B/s = 350 s after the backward.
    import itertools

    g = chain(toy, [1, 1], [100, 100], out_bytes=[0, 0])
    c = changed(
        toy.cluster(), cpu_0={"mem_bw_bytes_per_s": 1.0}, gpu_0={"memory_bytes": 300}, gpu_1={"memory_bytes": 300}
    )
    env = SimEnv(g, c)
    bound = env.lower_bound()
    best = min(
        env.simulate(Placement.from_indices(g, DEVICES, list(p), homes=list(h))).step_time_s
        for p in itertools.product(range(3), repeat=2)
        for h in itertools.product([-1, toy.CPU], repeat=2)
    )
    assert 350 <= bound <= best < float("inf")
    # stepped during the backward, that Adam still waits for the forward (a, b: 1 s each): 2 + 350 s, no plan faster
    during = env.lower_bound(host_step="backward")
    assert during.name == "forward + host update" and during.parts["forward + host update"] == pytest.approx(352.0)
    best = min(
        env.simulate(Placement.from_indices(g, DEVICES, list(p), homes=list(h), host_step="backward")).step_time_s
        for p in itertools.product(range(3), repeat=2)
        for h in itertools.product([-1, toy.CPU], repeat=2)
    )
    assert during <= best < float("inf")
