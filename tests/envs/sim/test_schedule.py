"""Hand-computed schedules on toy graphs, for both the kernel and the reference.

Toy cluster: 1 FLOP/s everywhere, no launch cost, links of 1 byte/s, so forward
time = FLOPs, backward = 2 × FLOPs, a transfer = its bytes (seconds).

Tests parametrised over EXECUTORS hold for both models; ``*_dataflow`` tests
pin the dataflow model (their numbers need later ready work to overtake), and
the eager model's own cases are in tests/envs/test_eager.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from envs.sim.simulator import SimEnv
from tests.envs.sim.test_eager import xfers

BACKENDS = ["kernel", "reference"]
EXECUTORS = ["eager", "dataflow"]


def sim(graph, cluster, place, backend, executor="dataflow"):
    env = SimEnv(graph, cluster, backend=backend, executor=executor)
    return env, env.schedule(place), env.simulate(place)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_one_device(toy, backend, executor):
    g = toy.graph(["a", "b", "c"], [("a", "b", 1), ("b", "c", 1)], [1, 2, 3])
    _, s, r = sim(g, toy.cluster(), [toy.G0] * 3, backend, executor)
    assert s.fwd_start_s.tolist() == [0, 1, 3] and s.fwd_end_s.tolist() == [1, 3, 6]
    assert s.bwd_start_s.tolist() == [16, 12, 6] and s.bwd_end_s.tolist() == [18, 16, 12]
    assert len(s.xfer_op) == 0
    assert r.status == "ok" and r.step_time_s == 18.0
    assert r.busy_s["gpu:0"] == 18.0 and r.busy_s["gpu:1"] == 0.0


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cycle_between_devices(toy, backend, executor):
    # A on gpu:0 -> B on gpu:1 -> C on gpu:0: activations out and back, gradients in reverse.
    g = toy.graph(["a", "b", "c"], [("a", "b", 1), ("b", "c", 1)], [1, 2, 3])
    _, s, r = sim(g, toy.cluster(), [toy.G0, toy.G1, toy.G0], backend, executor)
    assert s.fwd_start_s.tolist() == [0, 2, 5] and s.fwd_end_s.tolist() == [1, 4, 8]
    assert s.bwd_start_s.tolist() == [20, 15, 8] and s.bwd_end_s.tolist() == [22, 19, 14]
    assert xfers(s) == [(0, 0, 1, 2, 1, 2), (0, 1, 2, 1, 4, 5), (1, 0, 2, 1, 19, 20), (1, 1, 1, 2, 14, 15)]
    assert r.step_time_s == 22.0
    assert r.busy_s["gpu:0->gpu:1"] == 2.0 and r.busy_s["gpu:1->gpu:0"] == 2.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_diamond_dataflow(toy, backend):
    g = toy.graph(["a", "b", "c", "d"], [("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1)], [1, 2, 2, 1])
    _, s, r = sim(g, toy.cluster(), [toy.G0, toy.G0, toy.G1, toy.G0], backend)
    assert s.fwd_start_s.tolist() == [0, 1, 2, 5] and s.fwd_end_s.tolist() == [1, 3, 4, 6]
    assert s.bwd_start_s.tolist() == [14, 8, 9, 6] and s.bwd_end_s.tolist() == [16, 12, 13, 8]
    assert r.step_time_s == 16.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_join_contention_and_ties_dataflow(toy, backend):
    # b and c both become ready at t=1 on gpu:0 and run one after the other; in
    # backward, bwd c (lower task id: reverse topological order) goes before bwd b.
    g = toy.graph(
        ["a", "b", "c", "d", "e"],
        [("a", "b", 1), ("a", "c", 1), ("a", "d", 1), ("b", "e", 1), ("c", "e", 1), ("d", "e", 1)],
        [1, 2, 2, 2, 1],
    )
    _, s, r = sim(g, toy.cluster(), [toy.G0, toy.G0, toy.G0, toy.G1, toy.G0], backend)
    assert s.fwd_start_s.tolist() == [0, 1, 3, 2, 5] and s.fwd_end_s.tolist() == [1, 3, 5, 4, 6]
    assert s.bwd_start_s.tolist() == [16, 12, 8, 9, 6] and s.bwd_end_s.tolist() == [18, 16, 12, 13, 8]
    assert r.step_time_s == 18.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_tensor_sent_once_per_device_dataflow(toy, backend):
    # a's output feeds b and c on gpu:1 and d on cpu:0: one copy to each device.
    g = toy.graph(["a", "b", "c", "d"], [("a", "b", 2), ("a", "c", 2), ("a", "d", 2)], [1, 1, 1, 1])
    _, s, r = sim(g, toy.cluster(), [toy.G0, toy.G1, toy.G1, toy.CPU], backend)
    assert sorted(zip(s.xfer_kind.tolist(), s.xfer_dst.tolist())) == [(0, 0), (0, 2), (1, 1), (1, 1)]
    assert s.fwd_start_s.tolist() == [0, 3, 4, 3] and s.fwd_end_s.tolist() == [1, 4, 5, 4]
    # backward: FIFO by ready time on gpu:1 (bwd b ready at 4, bwd c at 5)
    assert s.bwd_start_s.tolist() == [11, 5, 7, 4] and s.bwd_end_s.tolist() == [13, 7, 9, 6]
    assert r.busy_s["gpu:0->gpu:1"] == 2.0 and r.busy_s["gpu:0->cpu:0"] == 2.0
    assert r.busy_s["gpu:1->gpu:0"] == 2.0 and r.busy_s["cpu:0->gpu:0"] == 2.0
    assert r.step_time_s == 13.0
    assert r.extra["num_transfers"] == 2


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_latency_and_update(toy, backend, executor):
    # Each transfer costs latency + bytes; the optimizer step follows the backward
    # pass on every device: launch 0 + 7 passes over the param bytes at mem bandwidth.
    g = toy.graph(["a", "b"], [("a", "b", 3)], [1, 1], param_bytes=[0, 10])
    c = toy.cluster(latency_s=0.5, mem_bw_bytes_per_s=70.0)
    _, s, r = sim(g, c, [toy.G0, toy.G1], backend, executor)
    assert s.fwd_end_s.tolist() == [1, 5.5]
    assert s.xfer_start_s.tolist() == [1, 7.5] and s.xfer_end_s.tolist() == [4.5, 11]
    assert s.bwd_end_s.tolist() == [13, 7.5]
    assert s.update_s.tolist() == [0.0, 0.0, 1.0]
    assert r.step_time_s == 14.0 and r.busy_s["gpu:1"] == 1 + 2 + 1


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_peak_exact_and_oom(toy, backend, executor):
    # a -> b -> c on gpu:0 with outputs of 10, 20, 30 bytes. Live: 60 once c ran,
    # +30 for c's output gradient during bwd c = 90; static = 3 × 5 param bytes = 15 (the weight and Adam's two
    # moments): a's 5-byte gradient comes at bwd a, when 10 + 10 + 5 are live. 105.
    edges = [("a", "b", 10), ("b", "c", 20)]
    g = toy.graph(["a", "b", "c"], edges, [1, 2, 3], out_bytes=[10, 20, 30], param_bytes=[5, 0, 0])
    place = [toy.G0] * 3
    _, _, r = sim(g, toy.cluster(memory_bytes=105), place, backend, executor)
    assert r.status == "ok" and r.peak_bytes["gpu:0"] == 105 and r.peak_bytes["gpu:1"] == 0
    env, _, r = sim(g, toy.cluster(memory_bytes=104), place, backend, executor)
    assert r.status == "oom" and r.step_time_s == float("inf")
    assert r.extra["oom_devices"] == ["gpu:0"] and r.message.startswith("out of memory on gpu:0: peak")
    assert r.extra["sim_step_time_s"] == 18.0 and r.busy_s["gpu:0"] == 18.0
    times, oom = env.step_times(np.array([place, [toy.G1] * 3]))
    assert times.tolist() == [18.0, 18.0] and oom.tolist() == [True, True]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_no_backward_reads_are_freed_after_their_consumers(toy, backend, executor):
    from graphs import OpGraph

    # a (mm) -> b (add) -> c (relu), outputs 10, 20, 30 bytes: add's backward reads neither input and relu's reads its
    # own output, so autograd keeps c alone. Forward a [0, 1], b [1, 3], c [3, 6]; backward c [6, 12], b, a.
    # Live: a 10 + b 20 = 30; at 3 a is freed, c comes: 20 + 30 = 50; at 6 b is freed, c's gradient comes: 30 + 30 = 60
    # (keeping every output: 90). Static: 3 x 5 parameter bytes = 15 (a's gradient comes at bwd a, with 25 live).
    types = ["aten.mm.default", "aten.add.Tensor", "aten.relu.default"]
    g = OpGraph.from_edges(
        ["a", "b", "c"],
        [("a", "b", 10), ("b", "c", 20)],
        flops=[1, 2, 3],
        out_bytes=[10, 20, 30],
        param_bytes=[5, 0, 0],
        op_types=types,
    )
    place = [toy.G0] * 3
    env, _, r = sim(g, toy.cluster(memory_bytes=75), place, backend, executor)
    assert r.status == "ok" and r.peak_bytes["gpu:0"] == 15 + 60
    env, _, r = sim(g, toy.cluster(memory_bytes=74), place, backend, executor)
    assert r.status == "oom"
    assert env.step_times(np.array([place]))[1].tolist() == [True]  # the batch scorer frees them alike
    # across devices, a on gpu:0, b and c on gpu:1: a's copy on gpu:1 goes once b has run (a 10-byte copy over
    # [1, 11], b [11, 13], c [13, 16]), as does a itself on gpu:0: gpu:1 holds 10 + 20, then 20 + 30, then c and its
    # gradient, 60; gpu:0 in a's backward a's gradient, received and its buffer, and its parameters' gradient:
    # 10 + 10 + 5 (keeping every output: 90 and 30)
    _, _, r = sim(g, toy.cluster(), [toy.G0, toy.G1, toy.G1], backend, executor)
    assert r.peak_bytes["gpu:1"] == 60 and r.peak_bytes["gpu:0"] == 15 + 25


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_oom_on_the_right_device(toy, backend, executor):
    # Received tensors count on the receiver: b on gpu:1 receives a's 50 bytes.
    g = toy.graph(["a", "b"], [("a", "b", 50)], [1, 1], out_bytes=[50, 1])
    _, _, r = sim(g, toy.cluster(memory_bytes=60), [toy.G0, toy.G1], backend, executor)
    # gpu:0: a's output 50, kept for b's backward (an mm reads its inputs) until that has ended on gpu:1; then the
    # gradient coming back 50 and, during bwd a, its buffer 50 -> 100 (a's output held to bwd a's end: 150)
    # gpu:1: received 50 + b's output 1 + its grad 1 -> 52
    assert r.peak_bytes == {"cpu:0": 0, "gpu:0": 100, "gpu:1": 52}
    assert r.status == "oom" and r.extra["oom_devices"] == ["gpu:0"]
    assert r.message.startswith("out of memory on gpu:0")


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_output_goes_when_the_backward_that_reads_it_ends(toy, backend, executor):
    from graphs import OpGraph

    # a (mm, 10 bytes) -> v (a view of it) -> c (linear, 1 byte): c's backward reads its input, a's output through
    # the view; a's own backward does not. Forward a [0, 1], c [1, 2]; backward c [2, 4], a [4, 6]. In bwd c: a 10,
    # c 1 and c's gradient 1 = 12; at 4 a's output goes with c's backward, and bwd a holds its gradient buffer, 10.
    # Held to a's own backward, as autograd does not, bwd a would hold 10 + 10 = 20 (the logits of an LM head, read
    # by the loss's backward, were 0.95 GiB of the simulated peak on an H200).
    g = OpGraph.from_edges(
        ["a", "v", "c"],
        [("a", "v", 10), ("v", "c", 10)],
        flops=[1, 0, 1],
        out_bytes=[10, 10, 1],
        op_types=["aten.mm.default", "aten.view.default", "aten.linear.default"],
    )
    env, s, r = sim(g, toy.cluster(memory_bytes=12), [toy.G0] * 3, backend, executor)
    assert s.bwd_start_s[2] == 2.0 and s.bwd_end_s[0] == 6.0
    assert r.status == "ok" and r.peak_bytes["gpu:0"] == 12
    assert env.step_times(np.array([[toy.G0] * 3]))[1].tolist() == [False]  # the batch scorer frees it alike
    env, _, r = sim(g, toy.cluster(memory_bytes=11), [toy.G0] * 3, backend, executor)
    assert r.status == "oom" and env.step_times(np.array([[toy.G0] * 3]))[1].tolist() == [True]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_views_are_free(toy, backend, executor):
    from graphs import OpGraph

    g = OpGraph.from_edges(
        ["a", "v", "b"],
        [("a", "v", 8), ("v", "b", 8)],
        flops=[1, 0, 1],
        out_bytes=[8, 8, 8],
        op_types=["aten.mm.default", "aten.view.default", "aten.relu.default"],
    )
    env, s, r = sim(g, toy.cluster(), [toy.G0] * 3, backend, executor)
    assert env.fwd_s[1].tolist() == [0.0, 0.0, 0.0]
    assert r.step_time_s == 6.0
    # a and b in forward (the view takes nothing); a is freed once b has run (relu's backward reads relu's output, not
    # a), then b and b's gradient in backward
    assert r.peak_bytes["gpu:0"] == 8 + 0 + 8


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("seed, preset, spread", [(3, "k80x4", 5), (4, "h100x8", 9), (5, "v100x4", 2)])
def test_trace_has_no_overlap_per_track(seed, preset, spread, executor):
    from envs.cluster import Cluster
    from graphs.synthetic import random_dag

    g = random_dag(300, seed=seed, avg_degree=2.0)
    env = SimEnv(g, Cluster.preset(preset), executor=executor)
    place = np.random.default_rng(seed).integers(0, spread, g.num_ops)
    r = env.simulate(place, trace=True)
    doc = json.loads(json.dumps(r.extra["trace"]))
    tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert set(env.cluster.device_names) <= set(tracks.values()) and any("->" in t for t in tracks.values())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sum(e["name"].startswith("fwd ") for e in spans) == g.num_ops
    assert sum(e["name"].startswith("bwd ") for e in spans) == g.num_ops
    assert sum(e["name"].startswith(("act ", "grad ")) for e in spans) == 2 * r.extra["num_transfers"]
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(r.step_time_s * 1e6)
    for tid in tracks:
        evs = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == tid)
        for (s0, e0), (s1, _) in zip(evs, evs[1:]):
            assert s1 >= e0 - 1e-6, (tracks[tid], e0, s1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_trace_draws_the_home_copies_and_the_recomputes(toy, backend):
    # a -> b -> c -> d on gpu:0 (1 FLOP each, 4-byte outputs); b owns 2 bytes homed on cpu:0, c 3 frozen bytes homed
    # there too; l1 (c, d) checkpointed. The trace has every copy the schedule has (c's gradient none: it is
    # frozen), each on a track of its own beside the activations', and c's and d's second forward.
    from graphs.plan import Placement

    g = toy.graph(list("abcd"), [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)], [1, 1, 1, 1], param_bytes=[0, 2, 0, 0])
    g.module_paths, g.out_bytes = ["l0", "l0", "l1", "l1"], np.array([4, 4, 4, 4])
    g.buffer_bytes, g.params, g.meta["frozen_params"] = np.array([0, 0, 3, 0]), [[], ["w1"], ["w2"], []], ["w2"]
    p = Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [toy.G0] * 4, homes=[-1, toy.CPU, toy.CPU, -1])
    p.checkpoint = ["l1"]
    env = SimEnv(g, toy.cluster(), backend=backend, executor="eager")
    s, r = env.schedule(p), env.simulate(p, trace=True)
    doc = json.loads(json.dumps(r.extra["trace"]))
    tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]

    def drawn(prefix):
        return sorted(
            (e["name"], tracks[e["tid"]], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
            for e in spans
            if e["name"].startswith(prefix)
        )

    h = s.homes
    names = ["b", "c"]
    # c, the forward's last reader, is checkpointed: its recompute copies it in again; b keeps its forward's copy
    assert h.op.tolist() == [1, 2] and h.grad_nbytes.tolist() == [2, 0] and h.kept.tolist() == [True, False]
    assert drawn("param ") == sorted(
        [(f"param {n}", "cpu:0->gpu:0 homes", a, b) for n, a, b in zip(names, h.fetch_start_s, h.fetch_end_s)]
        + [("param again c", "cpu:0->gpu:0 homes", h.refetch_start_s[1], h.refetch_end_s[1])]
        + [("param grad b", "gpu:0->cpu:0 homes", h.grad_start_s[0], h.grad_end_s[0])]
    )
    assert drawn("recompute ") == [
        ("recompute c", "gpu:0", s.recompute_start_s[2], s.recompute_start_s[2] + 1),
        ("recompute d", "gpu:0", s.recompute_start_s[3], s.recompute_start_s[3] + 1),
    ]
    assert r.busy_s["cpu:0->gpu:0"] == sum(e[3] - e[2] for e in drawn("param ") if e[1] == "cpu:0->gpu:0 homes")
    for tid in tracks:
        evs = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == tid)
        for (s0, e0), (s1, _) in zip(evs, evs[1:]):
            assert s1 >= e0 - 1e-6, (tracks[tid], e0, s1)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_optimizer_step_adds_nothing_to_the_static_state(toy, backend, executor):
    # a -> b, params 100 and 300 bytes, outputs of 1 byte. All on gpu:0: static 3 x 400 = 1200 (the weights and
    # Adam's two moments), and torch's fused Adam (envs.real.timing.adam) steps in place. Each gradient comes at its
    # op's backward and stays: in b's backward both outputs, b's output's gradient and b's 300 (303); a's output,
    # which b's backward read, goes with it; in a's backward, its output's gradient and 300 + 100 (401): 1601.
    g = toy.graph(["a", "b"], [("a", "b", 1)], [1, 1], out_bytes=[1, 1], param_bytes=[100, 300])
    for cap, fits in ((1601, True), (1600, False)):
        env, _, r = sim(g, toy.cluster(memory_bytes=cap), [toy.G0] * 2, backend, executor)
        assert (r.status == "ok") == fits and env.step_times(np.array([[toy.G0] * 2]))[1].tolist() == [not fits]
        if fits:
            assert r.peak_bytes["gpu:0"] == 1601
    # a on the host: no temporaries of the step on either device. gpu:0 holds b's 3 x 300, a's output received
    # (1), b's output (1) and, in b's backward, its output's gradient (1) and b's 300: 1203. cpu:0 holds a's 3 x 100,
    # its output (1) until b's backward has read b's copy of it, then the gradient received for it (1) and, in a's
    # backward, its output's gradient buffer (1) and a's 100: 402.
    env, _, r = sim(g, toy.cluster(memory_bytes=1203), [toy.CPU, toy.G0], backend, executor)
    assert r.status == "ok" and r.peak_bytes["gpu:0"] == 1203 and r.peak_bytes["cpu:0"] == 402
    env, _, r = sim(g, toy.cluster(memory_bytes=1202), [toy.CPU, toy.G0], backend, executor)
    assert r.status == "oom" and r.extra["oom_devices"] == ["gpu:0"]
    assert env.step_times(np.array([[toy.CPU, toy.G0]]))[1].tolist() == [True]
