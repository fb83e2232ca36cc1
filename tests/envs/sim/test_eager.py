"""Hand-computed schedules of the eager executor model (envs.sim.schedule), kernel and reference.

Toy cluster (tests/envs/conftest.py): cpu:0 (host), gpu:0, gpu:1 at 1 FLOP/s,
links of 1 byte/s with no latency: forward = FLOPs (+ the GPU launch cost, when
set), backward = 2 × forward, a copy of b bytes = b seconds. ``h`` is the host
thread's clock, ``free[d]`` a GPU stream's, ``h_f`` the host time at which
``loss.backward()`` is called.
"""

from __future__ import annotations

import numpy as np
import pytest

from envs.sim.simulator import SimEnv, simulate
from graphs import PlacerError

BACKENDS = ["kernel", "reference"]


def run(graph, cluster, place, backend, order=None, executor="eager"):
    env = SimEnv(graph, cluster, backend=backend, executor=executor)
    return env.schedule(place, order), env.simulate(place, order=order)


def xfers(s):
    return sorted(
        zip(
            s.xfer_kind.tolist(),
            s.xfer_op.tolist(),
            s.xfer_src.tolist(),
            s.xfer_dst.tolist(),
            s.xfer_start_s.tolist(),
            s.xfer_end_s.tolist(),
        )
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_op_between_two_gpu_ops_blocks_the_host(toy, backend):
    # a (gpu:0) -> b (cpu:0) -> c (gpu:0), and x (gpu:1, independent) issued after b.
    # GPU launch 1 s: fwd a = x = c = 1 + 1 = 2, bwd 4; b on the host: fwd 3, bwd 6.
    # forward, order a b x c:
    #   a: host dispatch h = 1; kernel [1, 3]; free0 = 3
    #   copy a -> cpu (device->host): max(h 1, free0 3) = 3 .. 4; free0 = 4; host waits: h = 4
    #   b on the host: [4, 7]; h = 7 (nothing else issued meanwhile)
    #   x: dispatch h = 8; kernel [max(8, free1 0) = 8, 10]  (dataflow would start it at 0)
    #   copy b -> gpu:0 (pinned, non_blocking): max(h 8, free0 4) = 8 .. 9; free0 = 9; h stays 8
    #   c: dispatch h = 9; kernel [max(9, 9) = 9, 11]; free0 = 11.  h_f = 9
    # backward, reversed order c x b a:
    #   c: [max(9, free0 11) = 11, 15]; x: [max(9, free1 10) = 10, 14]
    #   grad b: gpu:0 -> cpu after bwd c: [15, 16]; bwd b on the host queue: [16, 22]
    #   grad a: cpu -> gpu:0 after bwd b: [22, 23]; bwd a: [max(free0 15, 23) = 23, 27]
    g = toy.graph(["a", "b", "x", "c"], [("a", "b", 1), ("b", "c", 1)], [1, 3, 1, 1])
    c = toy.cluster(gpu_launch_s=1.0)
    s, r = run(g, c, [toy.G0, toy.CPU, toy.G1, toy.G0], backend)
    assert s.fwd_start_s.tolist() == [1, 4, 8, 9] and s.fwd_end_s.tolist() == [3, 7, 10, 11]
    assert s.bwd_start_s.tolist() == [23, 16, 10, 11] and s.bwd_end_s.tolist() == [27, 22, 14, 15]
    assert xfers(s) == [(0, 0, 1, 0, 3, 4), (0, 1, 0, 1, 8, 9), (1, 0, 0, 1, 22, 23), (1, 1, 1, 0, 15, 16)]
    assert r.status == "ok" and r.step_time_s == 27.0 and r.extra["executor"] == "eager"
    s, r = run(g, c, [toy.G0, toy.CPU, toy.G1, toy.G0], backend, executor="dataflow")
    assert s.fwd_start_s[2] == 0.0 and r.extra["executor"] == "dataflow"


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_of_line_blocking_on_one_stream(toy, backend):
    # a (gpu:0, 4) -> b (gpu:1, 1) with 2 bytes; x (gpu:1, 3) independent; no launch cost.
    # order a b x: a [0, 4]; peer copy a -> gpu:1 waits for both streams: [max(free0 4, free1 0) = 4, 6];
    #   b [6, 7]; x is stuck behind b on gpu:1's stream: [7, 10].
    #   backward x b a: x [10, 16]; b [16, 18]; grad a [18, 20]; bwd a [max(free0 6, 20) = 20, 28]
    g = toy.graph(["a", "b", "x"], [("a", "b", 2)], [4, 1, 3])
    place = [toy.G0, toy.G1, toy.G1]
    s, r = run(g, toy.cluster(), place, backend)
    assert s.fwd_start_s.tolist() == [0, 6, 7] and s.fwd_end_s.tolist() == [4, 7, 10]
    assert s.bwd_start_s.tolist() == [20, 16, 10] and s.bwd_end_s.tolist() == [28, 18, 16]
    assert xfers(s) == [(0, 0, 1, 2, 4, 6), (1, 0, 2, 1, 18, 20)]
    assert r.step_time_s == 28.0
    # order a x b: x runs first [0, 3]; copy [max(4, 3) = 4, 6]; b [6, 7].
    #   backward b x a: b [7, 9]; x [9, 15]; grad a [9, 11]; bwd a [max(free0 6, 11) = 11, 19]
    s, r = run(g, toy.cluster(), place, backend, order=[0, 2, 1])
    assert s.fwd_start_s.tolist() == [0, 6, 0] and s.fwd_end_s.tolist() == [4, 7, 3]
    assert s.bwd_start_s.tolist() == [11, 7, 9] and s.bwd_end_s.tolist() == [19, 9, 15]
    assert r.step_time_s == 19.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_to_host_copy_makes_the_host_wait(toy, backend):
    # a (gpu:0, 4) -> b (cpu:0, 1) with 2 bytes; x (gpu:1, 2) independent, issued last; no launch cost.
    # a [0, 4]; copy a -> cpu: [max(h 0, free0 4) = 4, 6], h = 6; b [6, 7], h = 7;
    # x can only be issued now: [max(h 7, free1 0) = 7, 9].  h_f = 7
    # backward x b a: x [max(7, 9) = 9, 13]; b on the host [7, 9]; grad a cpu -> gpu:0 [9, 11];
    # bwd a [max(free0 6, 11) = 11, 19]
    g = toy.graph(["a", "b", "x"], [("a", "b", 2)], [4, 1, 2])
    s, r = run(g, toy.cluster(), [toy.G0, toy.CPU, toy.G1], backend)
    assert s.fwd_start_s.tolist() == [0, 6, 7] and s.fwd_end_s.tolist() == [4, 7, 9]
    assert s.bwd_start_s.tolist() == [11, 7, 9] and s.bwd_end_s.tolist() == [19, 9, 13]
    assert xfers(s) == [(0, 0, 1, 0, 4, 6), (1, 0, 0, 1, 9, 11)]
    assert r.step_time_s == 19.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_and_dataflow_rank_two_placements_differently(toy, backend):
    # s (1) feeds a (10) and b (10) with 12 bytes each; no launch cost.
    # one: everything on gpu:0 — both models: fwd s a b [0,1] [1,11] [11,21], bwd 20 each
    #   after it: 21 + 20 + 20 + bwd s 2 = 63.
    # two: s, a on gpu:0, b on gpu:1.
    #   dataflow: s [0,1]; a [1,11] while the copy runs [1,13]; b [13,23]; bwd a [11,31];
    #     bwd b [23,43]; grad s [43,55]; bwd s [55,57] -> 57: "two" is faster.
    #   eager (order s a b): the peer copy waits for a on gpu:0: [11, 23]; b [23, 33];
    #     backward b a s: b [33,53]; a [max(free0 23), 43]; grad s [53,65]; bwd s [65,67] -> 67:
    #     "one" is faster.
    #   eager, order s b a: copy [1, 13]; b [13, 23]; a [13, 23]; bwd a [23,43], bwd b [23,43];
    #     grad s [43,55]; bwd s [55,57] -> 57 (the issue order matters).
    g = toy.graph(["s", "a", "b"], [("s", "a", 12), ("s", "b", 12)], [1, 10, 10])
    c = toy.cluster()
    one, two = [toy.G0] * 3, [toy.G0, toy.G0, toy.G1]
    t = {ex: [run(g, c, p, backend, executor=ex)[1].step_time_s for p in (one, two)] for ex in ("dataflow", "eager")}
    assert t == {"dataflow": [63.0, 57.0], "eager": [63.0, 67.0]}
    assert run(g, c, two, backend, order=[0, 2, 1])[1].step_time_s == 57.0
    assert run(g, c, two, backend, order=[0, 2, 1], executor="dataflow")[1].step_time_s == 57.0  # ignores the order


def test_order_sources_and_validation(toy):
    g = toy.graph(["a", "b", "x"], [("a", "b", 2)], [4, 1, 3])
    c = toy.cluster()
    place = [toy.G0, toy.G1, toy.G1]

    class Ordered(dict):
        """A name -> device mapping that carries an issue order, like placer.Placement."""

    p = Ordered(a="gpu:0", b="gpu:1", x="gpu:1")
    assert simulate(g, p, c).step_time_s == 28.0
    p.order = np.array([0, 2, 1])
    assert simulate(g, p, c).step_time_s == 19.0
    assert simulate(g, p, c, order=[0, 1, 2]).step_time_s == 28.0  # the argument wins
    env = SimEnv(g, c)
    times, _ = env.step_times(np.array([place, place]), np.array([[0, 1, 2], [0, 2, 1]]))
    assert times.tolist() == [28.0, 19.0]
    assert env.step_times(np.array([place, place]), [0, 2, 1])[0].tolist() == [19.0, 19.0]
    # the one order validation (graphs.plan.check_order) words these
    for bad, match in (
        ([0, 1], "2 entries for 3 ops"),
        ([0, 1, 1], "permutation"),
        ([0, 1, 3], "out of range"),
        ([1, 0, 2], r"op 'b' \(1\) is issued before its input 'a' \(0\)"),
        ([0.5, 1, 2], "op indices"),
    ):
        with pytest.raises(PlacerError, match=match) as e:
            env.simulate(place, order=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(PlacerError, match="shape"):
        env.step_times(np.array([place, place, place]), np.zeros((2, 3), dtype=int))
    with pytest.raises(PlacerError, match=r"--executor .tf.: unknown \(known: eager, dataflow\)"):
        SimEnv(g, c, executor="tf")


# ------------------------------------------------------------ pipelined plans and ops without a backward
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_forward_one_backward_holds_one_microbatch(toy, backend):
    # a (gpu:0) -> b (gpu:1), 2 FLOPs each and 2 bytes, in M = 2 microbatches: per microbatch a, b take 1 s
    # forward, 2 s backward, and the copy 1 byte = 1 s. Positions: a0 b0 a1 b1.
    # fill-drain (W = 2): F0 F1, then one backward over both (reversed: b1 a1 b0 a0)
    #   a0 [0, 1]; copy a0 (peer: both streams) [1, 2]; b0 [2, 3]; a1 [max(free0 2) = 2, 3];
    #   copy a1 [max(free0 3, free1 3, link 2) = 3, 4]; b1 [4, 5]
    #   bwd b1 [5, 7]; grad a1 [7, 8]; bwd a1 [max(free0 4, 8) = 8, 10]; bwd b0 [7, 9];
    #   grad a0 [max(9, link 8) = 9, 10]; bwd a0 [max(free0 10, 10) = 10, 12]
    # W = 1: F0 B0 F1 B1
    #   a0 [0, 1]; copy [1, 2]; b0 [2, 3]; bwd b0 [3, 5]; grad a0 [5, 6]; bwd a0 [6, 8]
    #   a1 waits for gpu:0's stream: [8, 9]; copy [max(free0 9, free1 5, link 2) = 9, 10]; b1 [10, 11]
    #   bwd b1 [11, 13]; grad a1 [max(13, link 6) = 13, 14]; bwd a1 [max(free0 10, 14) = 14, 16]
    g = toy.graph(["a", "b"], [("a", "b", 2)], [2, 2])
    c = toy.cluster()
    place = np.array([toy.G0, toy.G1])
    both = SimEnv(g, c, backend=backend, microbatches=2)
    one = SimEnv(g, c, backend=backend, microbatches=2, inflight=1)
    s = both.schedule(place)
    assert s.fwd_start_s.tolist() == [0, 2, 2, 4] and s.bwd_start_s.tolist() == [10, 7, 8, 5]
    assert s.backward_end_s == 12
    s = one.schedule(place)
    assert s.fwd_start_s.tolist() == [0, 2, 8, 10] and s.fwd_end_s.tolist() == [1, 3, 9, 11]
    assert s.bwd_start_s.tolist() == [6, 3, 14, 11] and s.bwd_end_s.tolist() == [8, 5, 16, 13]
    assert s.backward_end_s == 16
    # memory: with both in flight gpu:0 holds two outputs of a; with one, never more than one
    ra, r1 = both.simulate(place), one.simulate(place)
    assert r1.extra["inflight"] == 1 and ra.extra["inflight"] == 2
    assert r1.peak_bytes["gpu:0"] < ra.peak_bytes["gpu:0"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_op_without_a_backward_is_sent_no_gradient(toy, backend):
    # m (cpu:0, 1 FLOP, an integer mask) -> a (gpu:0, 2 FLOPs, a weight), 2 bytes.
    #   m on the host [0, 1]; copy m -> gpu:0 (pinned) [1, 3]; a [3, 5]
    #   backward: a [5, 9]. Differentiable m (a graph that does not say): grad m [9, 11] back to the host,
    #   bwd m on the host [11, 13]. Integer m in a capture: no gradient, no backward; its "backward" is
    #   the instant a's ended, and the step ends with a.
    g = toy.graph(["m", "a"], [("m", "a", 2)], [1, 2], param_bytes=[0, 8])
    place = [toy.CPU, toy.G0]
    s, r = run(g, toy.cluster(), place, backend)
    assert s.bwd_start_s.tolist() == [11, 5] and r.step_time_s == 13
    g.meta["capture_version"] = 1
    g.out_dtypes[0] = ["int64"]
    s, r = run(g, toy.cluster(), place, backend)
    assert s.fwd_end_s.tolist() == [1, 5] and s.bwd_start_s.tolist() == [9, 5] and s.bwd_end_s.tolist() == [9, 9]
    grad = [(st, en, b) for k, st, en, b in zip(s.xfer_kind, s.xfer_start_s, s.xfer_end_s, s.xfer_bytes) if k == 1]
    assert grad == [(9.0, 9.0, 0)]
    assert r.step_time_s == 9


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_read_on_another_device_is_copied_there_and_its_gradient_back(toy, backend):
    # a (gpu:0, 4 FLOPs) owns parameter w (3 bytes); a -> b (gpu:0, 1) -> c (gpu:1, 1), 2 bytes each;
    # c reads w too (a reused module). placer.apply copies w to gpu:1 before c, and w's gradient comes back.
    #   a [0, 4]; b [4, 5]; before c: copy b -> gpu:1 [5, 7], copy w -> gpu:1 [7, 10]; c [10, 11]
    #   backward c b a: c [11, 13]; grad b [13, 15]; bwd b [15, 17]; grad w [15, 18] (link busy until 15);
    #   bwd a [max(17, 18) = 18, 26]
    # Without the shared read: c [7, 8]; c [8, 10]; grad b [10, 12]; b [12, 14]; a [14, 22].
    g = toy.graph(["a", "b", "c"], [("a", "b", 2), ("b", "c", 2)], [4, 1, 1], param_bytes=[3, 0, 0])
    place = [toy.G0, toy.G0, toy.G1]
    s, r = run(g, toy.cluster(), place, backend)
    assert r.step_time_s == 22 and len(s.xfer_op) == 2
    g.params = [["w"], [], ["w"]]
    s, r = run(g, toy.cluster(), place, backend)
    assert s.fwd_start_s.tolist() == [0, 4, 10] and s.bwd_end_s.tolist() == [26, 17, 13]
    assert xfers(s) == [(0, 0, 1, 2, 7, 10), (0, 1, 1, 2, 5, 7), (1, 0, 2, 1, 15, 18), (1, 1, 2, 1, 13, 15)]
    assert r.step_time_s == 26
    assert r.peak_bytes["gpu:1"] >= 3 + 2  # w's copy and b's output are both held for c's backward
    # on one device nothing is copied; names tied to one tensor are that tensor
    assert run(g, toy.cluster(), [toy.G0] * 3, backend)[1].step_time_s == 18  # 6 forward + 12 backward
    g.params = [["w"], [], ["head.w"]]
    assert run(g, toy.cluster(), place, backend)[1].step_time_s == 22
    g.meta["tied_params"] = [["head.w", "w"]]
    assert run(g, toy.cluster(), place, backend)[1].step_time_s == 26


def test_every_microbatch_copies_the_whole_parameter(toy):
    # activations (and their edges) split over the microbatches; a parameter does not
    g = toy.graph(["a", "b", "c"], [("a", "b", 2), ("b", "c", 2)], [4, 1, 1], param_bytes=[4, 0, 0])
    g.params = [["w"], [], ["w"]]
    s = SimEnv(g, toy.cluster(), microbatches=2).schedule([toy.G0, toy.G0, toy.G1])
    assert sorted(zip(s.xfer_op[s.xfer_kind == 0].tolist(), s.xfer_bytes[s.xfer_kind == 0].tolist())) == [
        (0, 4),
        (1, 1),
        (3, 4),
        (4, 1),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_profiled_issue_times_cost_the_host_and_the_autograd_worker(toy, backend):
    # a -> b, both on gpu:0; the gpu profile gives kernels fwd 1, 1, bwd 2, 2 and issue times
    # forward 3 and 0.5 (b a view-like op: cheap to issue), backward 1 and 4.
    # forward: a: h = 3; kernel [3, 4]; b: h = 3.5; kernel [max(3.5, free0 4) = 4, 5].  h_f = 3.5
    # backward (the worker issues from h_f): b: w = 3.5 + 4 = 7.5; [max(free0 5, 7.5) = 7.5, 9.5]
    #   a: w = 7.5 + 1 = 8.5; [max(free0 9.5, 8.5) = 9.5, 11.5]
    import dataclasses

    g = toy.graph(["a", "b"], [("a", "b", 1)], [1, 1])
    prof = {
        "gpu": {
            "fwd_s": np.array([1.0, 1.0]),
            "bwd_s": np.array([2.0, 2.0]),
            "issue_fwd_s": np.array([3.0, 0.5]),
            "issue_bwd_s": np.array([1.0, 4.0]),
        }
    }
    g = dataclasses.replace(g, profile=prof)
    s, r = run(g, toy.cluster(gpu_launch_s=100.0), [toy.G0, toy.G0], backend)  # the launch default is replaced
    assert s.fwd_start_s.tolist() == [3.0, 4.0] and s.fwd_end_s.tolist() == [4.0, 5.0]
    assert s.bwd_start_s.tolist() == [9.5, 7.5] and s.bwd_end_s.tolist() == [11.5, 9.5]
    assert r.step_time_s == 11.5
    # without issue columns: the launch default (0 here) on the host, nothing on the worker
    g0 = dataclasses.replace(g, profile={"gpu": {k: v for k, v in prof["gpu"].items() if not k.startswith("issue")}})
    s0, r0 = run(g0, toy.cluster(), [toy.G0, toy.G0], backend)
    assert s0.fwd_start_s.tolist() == [0.0, 1.0] and s0.bwd_start_s.tolist() == [4.0, 2.0] and r0.step_time_s == 6.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_gpu_gradient_copy_blocks_its_thread_and_waits_for_the_stream(toy, backend):
    # a (gpu:0, 1) -> b (cpu, 1) with 1 byte, x (gpu:0, 5) independent; order a x b; no launch cost.
    # forward: a [0, 1]; x [1, 6]; copy a -> cpu waits for the stream: [6, 7], h = 7; b on the host [7, 8].  h_f = 8
    # backward, reversed b x a: b on the host [8, 10]; x [max(free0 7, h_f 8) = 8, 18]
    #   grad of a, cpu -> gpu:0 (a blocking .to() on the calling thread): it waits for gpu:0's stream to drain
    #   (x's backward, issued before it): [max(b's end 10, free0 18) = 18, 19]; a: [19, 21]
    #   (an asynchronous copy would have run [10, 11] beside x, and a [18, 20])
    g = toy.graph(["a", "x", "b"], [("a", "b", 1)], [1, 5, 1])
    s, r = run(g, toy.cluster(), [toy.G0, toy.G0, toy.CPU], backend)
    assert s.fwd_start_s.tolist() == [0, 1, 7] and s.bwd_start_s.tolist() == [19, 8, 8]
    assert xfers(s) == [(0, 0, 1, 0, 6, 7), (1, 0, 0, 1, 18, 19)]
    assert r.step_time_s == 21.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_host_gradient_copy_blocks_the_gpu_worker(toy, backend):
    # a (cpu, 1) -> b (gpu:0, 1) with 1 byte, y (gpu:0, 4) independent of both; order a b y.
    # forward: a on the host [0, 1]; copy a -> gpu:0 (pinned, asynchronous) [1, 2]; b [2, 3]; y [3, 7].  h_f = 1
    # backward, reversed y b a: y [max(free0 7, 1) = 7, 15]; b [15, 17]
    #   grad of a, gpu:0 -> cpu: gpu:0's worker copies it (blocking) once the stream has drained: [17, 18]
    #   a on the host [18, 20]
    g = toy.graph(["a", "b", "y"], [("a", "b", 1)], [1, 1, 4])
    s, r = run(g, toy.cluster(), [toy.CPU, toy.G0, toy.G0], backend)
    assert s.fwd_start_s.tolist() == [0, 2, 3] and s.bwd_start_s.tolist() == [18, 15, 7]
    assert xfers(s) == [(0, 0, 0, 1, 1, 2), (1, 0, 1, 0, 17, 18)]
    assert r.step_time_s == 20.0
