"""The simulator of ranks against timelines worked out by hand (envs/sim/ranks.py, envs/sim/rank_actions.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from envs.cluster import Cluster
from envs.devices import Device, Link
from envs.real.distributed.schedules import planned_actions
from envs.scorer import Scorer
from envs.sim.rank_actions import schedule_actions, torch_actions
from envs.sim.ranks import RankSim, boundary_traffic, simulate_ranks
from graphs import OpGraph, PlacerError
from graphs.plan import Placement

#: 1 GFLOP/s, no launch cost, memory never the bound; links of 0.1 s latency and 1000 B/s.
LATENCY_S, BANDWIDTH = 0.1, 1000.0


def cluster(num_devices: int = 2, memory_bytes: float = 1e12, kind: str = "gpu") -> Cluster:
    """Devices of ``kind``: a GPU's copies run beside its compute (its copy engine), a CPU rank's on its own core."""
    devices = [Device(f"{kind}:{d}", kind, memory_bytes, 1e9, 1e15, 0.0) for d in range(num_devices)]
    links = {(a.name, b.name): Link(BANDWIDTH, LATENCY_S) for a in devices for b in devices if a.name != b.name}
    return Cluster(name="toy", devices=devices, links=links)


def two_stage_graph(microbatches: int = 2) -> OpGraph:
    """a -> b: per microbatch, a takes 1 s (backward 2 s), b 2 s (backward 4 s), 500 bytes sent between."""
    M = microbatches
    return OpGraph.from_edges(["a", "b"], [("a", "b", 500 * M)], flops=[1e9 * M, 2e9 * M])


def test_gpipe_two_ranks_two_microbatches_is_the_hand_timeline():
    # per microbatch: a 1 s / 2 s, b 2 s / 4 s; a send is 0.1 + 500 / 1000 = 0.6 s.
    # rank 0: F0 0-1, F1 1-2 (sends arrive 1.6, 2.6); rank 1: F0 1.6-3.6, F1 3.6-5.6, B0 5.6-9.6, B1 9.6-13.6
    # (gradients arrive 10.2, 14.2); rank 0: B0 10.2-12.2, B1 14.2-16.2.
    res = simulate_ranks(two_stage_graph(), cluster(), [0, 1], microbatches=2)
    assert res.ok and res.extra["schedule"] == "gpipe"
    assert res.step_time_s == pytest.approx(16.2)
    assert res.extra["rank_end_s"] == pytest.approx([16.2, 13.6])
    assert res.busy_s["gpu:0"] == pytest.approx(6.0) and res.busy_s["gpu:1"] == pytest.approx(12.0)
    assert res.busy_s["gpu:0->gpu:1"] == pytest.approx(1.2) and res.busy_s["gpu:1->gpu:0"] == pytest.approx(1.2)


def test_a_cpu_rank_sends_and_receives_on_its_own_core_the_hand_timeline():
    # gloo on CPU ranks: a send takes the sender's core for its 0.6 s after the action, the receive the receiver's
    # core (within its wait when it waits for the bytes, after its action when it was busy):
    # rank 0: F0 0-1, sends 1-1.6 (arrives 1.6); F1 1.6-2.6, sends 2.6-3.2 (arrives 3.2)
    # rank 1: F0 1.6-3.6 (received while waiting); F1: free at 3.6, receive 3.6-4.2, 4.2-6.2; B0 6.2-10.2, sends
    #   10.2-10.8 (arrives 10.8); B1 10.8-14.8, sends 14.8-15.4 (arrives 15.4)
    # rank 0: B0: free at 3.2, the gradient arrives 10.8: 10.8-12.8; B1: receive 12.8-13.4 < 15.4: 15.4-17.4
    res = simulate_ranks(two_stage_graph(), cluster(kind="cpu"), [0, 1], microbatches=2)
    assert res.step_time_s == pytest.approx(17.4)
    assert res.extra["rank_end_s"] == pytest.approx([17.4, 15.4])
    # each core's busy time: its compute and its own sends (0.6 s each)
    assert res.busy_s["cpu:0"] == pytest.approx(6.0 + 1.2) and res.busy_s["cpu:1"] == pytest.approx(12.0 + 1.2)


def test_a_message_arrives_the_receivers_hand_off_later_taking_no_core_longer_the_hand_timeline():
    # the timeline above with a hand-off of 0.5 s on both ranks: every message arrives 0.5 s after its send ends
    # rank 0: F0 0-1, sends 1-1.6 (arrives 2.1); F1 1.6-2.6, sends 2.6-3.2 (arrives 3.7)
    # rank 1: F0 2.1-4.1; F1: receive 4.1-4.7 (arrived 3.7), 4.7-6.7; B0 6.7-10.7, sends 10.7-11.3 (arrives 11.8);
    #   B1 11.3-15.3, sends 15.3-15.9 (arrives 16.4)
    # rank 0: B0 11.8-13.8; B1: receive 13.8-14.4 < 16.4: 16.4-18.4
    slow = cluster(kind="cpu")
    slow = Cluster(name="toy", devices=[replace(d, handoff_s=0.5) for d in slow.devices], links=slow.links)
    res = simulate_ranks(two_stage_graph(), slow, [0, 1], microbatches=2)
    assert res.step_time_s == pytest.approx(18.4)
    assert res.extra["rank_end_s"] == pytest.approx([18.4, 15.9])
    assert res.busy_s["cpu:0"] == pytest.approx(6.0 + 1.2) and res.busy_s["cpu:1"] == pytest.approx(12.0 + 1.2)
    # only the receiver's own hand-off counts: rank 0's alone delays the gradients it receives (B0 10.8 + 0.5)
    one = Cluster(
        name="toy", devices=[replace(slow.devices[0]), replace(slow.devices[1], handoff_s=0.0)], links=slow.links
    )
    assert simulate_ranks(two_stage_graph(), one, [0, 1], microbatches=2).step_time_s == pytest.approx(17.4 + 0.5)


def test_1f1b_two_ranks_three_microbatches_is_the_hand_timeline():
    # rank 0 runs F0 F1 B0 F2 B1 B2, rank 1 F0 B0 F1 B1 F2 B2 (torch's Schedule1F1B):
    # rank 0: F0 0-1, F1 1-2; rank 1: F0 1.6-3.6, B0 3.6-7.6 (grad at 8.2); rank 0: B0 8.2-10.2, F2 10.2-11.2
    # (arrives 11.8); rank 1: F1 7.6-9.6, B1 9.6-13.6 (grad at 14.2), F2 13.6-15.6, B2 15.6-19.6 (grad at 20.2);
    # rank 0: B1 14.2-16.2, B2 20.2-22.2.
    res = simulate_ranks(two_stage_graph(3), cluster(), [0, 1], microbatches=3, inflight=2)
    assert res.extra["schedule"] == "1f1b"
    assert res.step_time_s == pytest.approx(22.2)


def test_a_send_charges_latency_per_tensor_and_bytes_over_bandwidth_and_passes_through_stages():
    # x feeds c two stages later: it crosses both boundaries; y (int64) carries no gradient back.
    g = OpGraph.from_edges(["x", "y", "b", "c"], [("x", "b", 800), ("x", "c", 400), ("b", "c", 200), ("y", "c", 100)])
    g.out_dtypes[1] = ["torch.int64"]
    op_stages = np.array([0, 0, 1, 2])
    send_bytes, send_tensors, grad_bytes, grad_tensors = boundary_traffic(g, op_stages, 3, microbatches=2)
    assert send_bytes.tolist() == [450.0, 550.0]  # x's largest edge (800) / 2 + y's 100 / 2; then + b's 200 / 2
    assert send_tensors.tolist() == [2, 3]
    assert grad_bytes.tolist() == [400.0, 500.0] and grad_tensors.tolist() == [1, 2]
    # one microbatch, x and y on rank 0, b and c on rank 1: 2 tensors forward, 0.2 + 1000 / 1000 = 1.2 s
    res = simulate_ranks(g, cluster(), [0, 0, 1, 1])
    assert res.busy_s["gpu:0->gpu:1"] == pytest.approx(2 * LATENCY_S + 900 / BANDWIDTH)
    assert res.busy_s["gpu:1->gpu:0"] == pytest.approx(LATENCY_S + 800 / BANDWIDTH)


def test_sends_on_one_link_wait_for_each_other():
    # two ranks, M = 4, a tiny forward and a slow link: the forward sends queue on the link
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4000)], flops=[4e6, 4e6])
    res = simulate_ranks(g, cluster(), [0, 1], microbatches=4)
    # each send: 0.1 + 1000 / 1000 = 1.1 s, back to back from 1 ms: the last forward arrives at 4.401 s
    assert res.busy_s["gpu:0->gpu:1"] == pytest.approx(4 * 1.1)
    assert res.step_time_s > 4 * 1.1


def test_torchs_gpipe_order_is_placers_fill_drain_order():
    for S, M in [(2, 2), (3, 4), (4, 1)]:
        ranks = list(range(S))
        torchs = {r: list(acts) for r, acts in torch_actions("gpipe", S, S, M).items()}
        assert torchs == planned_actions(ranks, S, microbatches=M, inflight=M)
        assert schedule_actions("gpipe", ranks, S, microbatches=M, inflight=M) == torchs


def test_every_action_of_every_schedule_runs_once():
    for name, ranks, R, M in [
        ("1f1b", [0, 1, 2], 3, 5),
        ("looped_bfs", [0, 1, 0, 1], 2, 4),
        ("interleaved_1f1b", [0, 1, 0, 1], 2, 4),
        ("planned", [0, 1, 0], 2, 3),
    ]:
        acts = schedule_actions(name, ranks, R, microbatches=M, inflight=M if name != "1f1b" else 3)
        flat = sorted(a for r in acts.values() for a in r)
        assert flat == sorted((s, k, m) for s in range(len(ranks)) for k in "FB" for m in range(M)), name
        assert all(ranks[s] == r for r, lst in acts.items() for s, _, _ in lst)


def test_interleaved_runs_a_looped_plan_and_a_schedule_that_does_not_fit_is_an_error():
    g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 100), ("b", "c", 100), ("c", "d", 100)], flops=[1e9] * 4)
    res = simulate_ranks(g, cluster(), [0, 1, 0, 1], microbatches=4, schedule="interleaved_1f1b")
    assert res.ok and res.extra["stages"] == 4 and res.extra["schedule"] == "interleaved_1f1b"
    bad = simulate_ranks(g, cluster(), [0, 1, 0, 1], microbatches=4, schedule="gpipe")
    assert bad.status == "error" and "one stage per rank" in bad.message


def test_memory_counts_params_and_the_microbatches_in_flight_and_a_rank_over_its_memory_is_oom():
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 1000)], flops=[2e9, 4e9], param_bytes=[100, 0], out_bytes=[1000, 8])
    # gpipe with 2 microbatches: rank 0 holds both microbatches' 500 bytes of a, and 4 x 100 of a's state
    res = simulate_ranks(g, cluster(), [0, 1], microbatches=2)
    assert res.peak_bytes["gpu:0"] == 400 + 2 * 500
    assert simulate_ranks(g, cluster(memory_bytes=1000), [0, 1], microbatches=2).status == "oom"


def test_overflow_is_the_worst_peak_over_memory_of_a_plan_that_does_not_fit_and_every_row_is_counted():
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 1000)], flops=[2e9, 4e9], param_bytes=[100, 0], out_bytes=[1000, 8])
    # as above: rank 0's peak is 400 + 2 x 500 = 1400 bytes, over a memory of 1000; rank 1's fits
    sim = RankSim(g, cluster(memory_bytes=1000), microbatches=2)
    step_time_s, failed, over = sim.overflow(np.array([[0, 1], [0, 0]]))
    assert failed.tolist() == [True, True] and over[0] == pytest.approx(1.4) and np.isinf(step_time_s).all()
    roomy = RankSim(g, cluster(), microbatches=2)
    step_time_s, failed, over = roomy.overflow(np.array([[0, 1]]))
    assert not failed[0] and over[0] == 0.0 and step_time_s[0] == roomy.step_times(np.array([[0, 1]]))[0][0]
    assert (sim.simulated, roomy.simulated) == (2, 2)  # what a search on it spent


def test_the_scorer_keeps_to_the_protocol_and_takes_a_placement_with_its_own_plan():
    g, c = two_stage_graph(), cluster()
    sim = RankSim(g, c, microbatches=2)
    assert isinstance(sim, Scorer)
    step_time_s, failed = sim.step_times(np.array([[0, 1], [0, 0]]))
    assert step_time_s[0] == pytest.approx(16.2) and not failed.any()
    assert step_time_s[1] == pytest.approx(2 * (1 + 2) + 2 * (2 + 4))  # one rank: no sends, all work in a row
    p = Placement.from_indices(g, c.device_names, [0, 1], microbatches=2, inflight=2, schedule="planned")
    assert sim.evaluate([p])[0].step_time_s == pytest.approx(16.2)  # placer's fill-drain order is GPipe's
    with pytest.raises(PlacerError, match="planned"):
        sim.step_times(np.array([[0, 1]]), order="planned")
    assert sim.in_order(None) is sim  # what a search in the run's order asks for: node order only
    with pytest.raises(PlacerError, match="planned"):
        sim.in_order("planned")


def test_a_tied_parameter_is_all_reduced_between_its_ranks():
    g = OpGraph.from_edges(["emb", "head"], [("emb", "head", 1000)], flops=[2e9, 4e9], param_bytes=[1000, 0])
    g.params[0], g.params[1] = ["w"], ["w"]
    res = simulate_ranks(g, cluster(), [0, 1], microbatches=2)
    untied = simulate_ranks(two_stage_graph(), cluster(), [0, 1], microbatches=2)
    # a ring of 2: 2 steps of 0.1 s + 500 B / 1000 B/s after both ranks are done (16.2 s)
    assert res.step_time_s == pytest.approx(untied.step_time_s + 2 * (0.1 + 0.5), rel=1e-3)


def test_one_stage_per_rank_scores_a_split_and_refuses_a_looped_plan_saying_why():
    """What `placer train --ranks` searches unless told --looped: the looped plan is an error, not a time."""
    g = OpGraph.from_edges(list("abcd"), [(x, y, 8) for x, y in zip("abc", "bcd")], flops=[1e9] * 4)
    free, split_only = (
        RankSim(g, cluster(), microbatches=2),
        RankSim(g, cluster(), microbatches=2, one_stage_per_rank=True),
    )
    split, looped = [0, 0, 1, 1], [0, 1, 0, 1]
    assert free.evaluate([split])[0].step_time_s == split_only.evaluate([split])[0].step_time_s < float("inf")
    assert free.evaluate([looped])[0].status == "ok"
    refused = split_only.evaluate([looped])[0]
    assert refused.status == "error" and refused.step_time_s == float("inf")
    assert "4 stages on 2 ranks: one stage per rank only" in refused.message
    assert split_only.with_microbatches(4).one_stage_per_rank  # kept at another shape
    one_rank = RankSim(g, cluster(), one_stage_per_rank=True).evaluate([[1, 1, 1, 1]])[0]
    assert one_rank.status == "ok"  # one device, one stage


def test_a_zero_bubble_plan_splits_each_backward_into_its_input_and_weight_parts_the_hand_timeline():
    # a -> b -> c -> d looped on 2 ranks (stages 0 and 2 on rank 0), M = 2, torch's interleaved zero bubble:
    # rank 0 runs 0F0 0F1 2F0 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1,
    # rank 1 1F0 1F1 3F0 3I0 3F1 3I1 3W0 1I0 3W1 1I1 1W0 1W1.
    # Per microbatch each op: forward 1 s, backward 2 s; every op has parameters: the input part 1 s and the weight
    # part 1 s, but stage 0 (it sends no gradient) runs its whole backward, 2 s, in its weight part (its I takes 0).
    # A send: 0.1 + 100 / 1000 = 0.2 s.
    # rank 0: 0F0 0-1 (at s1 1.2), 0F1 1-2 (2.2); rank 1: 1F0 1.2-2.2 (at s2 2.4), 1F1 2.2-3.2 (3.4);
    # rank 0: 2F0 2.4-3.4 (at s3 3.6), 2F1 3.4-4.4 (4.6); rank 1: 3F0 3.6-4.6, 3I0 4.6-5.6 (gradient at s2 5.8),
    # 3F1 5.6-6.6, 3I1 6.6-7.6 (7.8), 3W0 7.6-8.6; rank 0: 2I0 5.8-6.8 (at s1 7.0), 2W0 6.8-7.8, 2I1 7.8-8.8 (9.0),
    # 2W1 8.8-9.8; rank 1: 1I0 8.6-9.6 (at s0 9.8), 3W1 9.6-10.6, 1I1 10.6-11.6 (11.8), 1W0 11.6-12.6, 1W1 12.6-13.6;
    # rank 0: 0I0 9.8-9.8, 0W0 9.8-11.8, 0I1 11.8-11.8, 0W1 11.8-13.8.
    names = ["a", "b", "c", "d"]
    # a has no parameters: its backward would be all input part, but stage 0 runs it in its weight part
    edges = [(x, y, 200) for x, y in zip(names, names[1:])]
    g = OpGraph.from_edges(names, edges, flops=[2e9] * 4, param_bytes=[0, 4, 4, 4])
    events: list = []
    res = simulate_ranks(g, cluster(), [0, 1, 0, 1], microbatches=2, schedule="interleaved_zb", timeline=events)
    assert res.ok and res.extra["schedule"] == "interleaved_zb" and res.extra["stages"] == 4
    assert res.extra["rank_end_s"] == pytest.approx([13.8, 13.6])
    spans = {(e.stage, e.kind, e.microbatch): (e.start_s, e.end_s) for e in events if e.kind != "O"}
    assert spans[(0, "I", 0)] == pytest.approx((9.8, 9.8)) and spans[(0, "W", 0)] == pytest.approx((9.8, 11.8))
    assert spans[(3, "W", 0)] == pytest.approx((7.6, 8.6)) and spans[(1, "I", 1)] == pytest.approx((10.6, 11.6))
    # where splitting costs 1.5x (the devices' split_backward_factor), each part takes 1.5x; stage 0's backward,
    # unsplit, does not
    slow = Cluster(
        name="toy", devices=[replace(d, split_backward_factor=1.5) for d in cluster().devices], links=cluster().links
    )
    events = []
    simulate_ranks(g, slow, [0, 1, 0, 1], microbatches=2, schedule="interleaved_zb", timeline=events)
    took = {(e.stage, e.kind, e.microbatch): e.end_s - e.start_s for e in events if e.kind != "O"}
    assert took[(3, "I", 0)] == pytest.approx(1.5) and took[(2, "W", 1)] == pytest.approx(1.5)
    assert took[(0, "W", 0)] == pytest.approx(2.0) and took[(0, "I", 0)] == 0.0
    # the same plan under interleaved 1F1B runs whole backwards: no weight part fills rank 1's wait for 1B0
    whole = simulate_ranks(g, cluster(), [0, 1, 0, 1], microbatches=2, schedule="interleaved_1f1b")
    assert whole.ok and whole.step_time_s > res.step_time_s


def test_zero_bubble_runs_every_forward_input_and_weight_part_once_in_torchs_order():
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    from envs.sim.rank_actions import torch_order

    for S, R, M in [(4, 2, 2), (4, 2, 4), (6, 2, 4), (8, 4, 4)]:
        ranks = [s % R for s in range(S)]
        acts = schedule_actions("interleaved_zb", ranks, R, microbatches=M, inflight=None)
        flat = sorted(a for r in acts.values() for a in r)
        assert flat == sorted((s, k, m) for s in range(S) for k in "FIW" for m in range(M))
        # torch's runtime runs each rank's list after it inserts idle slots, which change no rank's order
        order = torch_order("interleaved_zb", S, R, M)
        state = SimpleNamespace(pipeline_order=order, _n_microbatches=M, pp_group_size=R, n_local_stages=S // R)
        run = ScheduleInterleavedZeroBubble._add_bubbles_to_actions(state, S)  # noqa: SLF001
        for r in range(R):
            kept = [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in run[r] if a is not None]
            assert [x for x in kept if x[1] in "FIW"] == acts[r]


def test_weight_parts_free_the_activations_and_a_zero_bubble_plan_needs_a_looped_layout():
    from envs.sim.ranks import weight_fractions

    g = OpGraph.from_edges(["embed", "mm", "relu"], [("embed", "mm", 4), ("mm", "relu", 4)], param_bytes=[8, 8, 0])
    assert weight_fractions(g).tolist() == [1.0, 0.5, 0.0]
    g.out_dtypes[0] = ["torch.int64"]  # nothing floating feeds mm: its backward is its weight's gradient alone
    assert weight_fractions(g).tolist() == [1.0, 1.0, 0.0]
    # the activations a stage keeps stay until its weight part, which reads them
    from types import SimpleNamespace

    from envs.sim.ranks import peak_activation_bytes

    acts = {0: [(0, "F", 0), (0, "I", 0), (0, "F", 1), (0, "W", 0), (0, "I", 1), (0, "W", 1)]}
    assert peak_activation_bytes(SimpleNamespace(activation_bytes=[10.0]), acts) == {0: 20.0}
    bad = simulate_ranks(two_stage_graph(), cluster(), [0, 1], microbatches=2, schedule="interleaved_zb")
    assert bad.status == "error" and "several stages per rank" in bad.message


def test_a_v_plan_hands_over_within_its_last_rank_under_zbv_the_hand_timeline():
    # a -> b -> c -> d in a V on 2 ranks: a on rank 0, b and c on rank 1 (two stages, cut apart at c), d on rank 0;
    # M = 2, torch's ZB-V: rank 0 runs 0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1,
    # rank 1 1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1.
    # Per microbatch each op: forward 1 s, input part 1 s, weight part 1 s (stage 0, a, its whole backward, 2 s, in
    # W). A send between the ranks: 0.1 + 100 / 1000 = 0.2 s; between b and c, on one rank, none.
    # rank 0: 0F0 0-1 (at s1 1.2), 0F1 1-2 (2.2); rank 1: 1F0 1.2-2.2, 2F0 2.2-3.2 (at s3 3.4), 1F1 3.2-4.2,
    # 2F1 4.2-5.2 (5.4); rank 0: 3F0 3.4-4.4, 3I0 4.4-5.4 (gradient at s2 5.6), 3W0 5.4-6.4, 3F1 6.4-7.4,
    # 3I1 7.4-8.4 (8.6), 3W1 8.4-9.4; rank 1: 2I0 5.6-6.6, 2W0 6.6-7.6, 1I0 7.6-8.6 (at s0 8.8), 1W0 8.6-9.6,
    # 2I1 9.6-10.6, 2W1 10.6-11.6, 1I1 11.6-12.6 (12.8), 1W1 12.6-13.6; rank 0: 0I0 9.4-9.4, 0W0 9.4-11.4,
    # 0I1 12.8-12.8, 0W1 12.8-14.8.
    names = ["a", "b", "c", "d"]
    g = OpGraph.from_edges(
        names, [(x, y, 200) for x, y in zip(names, names[1:])], flops=[2e9] * 4, param_bytes=[0, 4, 4, 4]
    )
    events: list = []
    res = simulate_ranks(g, cluster(), [0, 1, 1, 0], microbatches=2, schedule="zbv", timeline=events, stage_starts=[2])
    assert res.ok and res.extra["schedule"] == "zbv" and res.extra["stages"] == 4
    assert res.extra["rank_end_s"] == pytest.approx([14.8, 13.6])
    spans = {(e.stage, e.kind, e.microbatch): (e.start_s, e.end_s) for e in events if e.kind != "O"}
    assert spans[(2, "F", 0)] == pytest.approx((2.2, 3.2))  # c's input arrived when b ended: no send
    assert spans[(1, "I", 0)] == pytest.approx((7.6, 8.6)) and spans[(0, "W", 1)] == pytest.approx((12.8, 14.8))
    assert "gpu:1->gpu:1" not in res.busy_s
    # a Placement brings its cuts; without the cut, b and c are one stage, which the V schedule refuses in one line
    plan = Placement.from_indices(g, ["gpu:0", "gpu:1"], [0, 1, 1, 0], microbatches=2, schedule="zbv", stage_starts=[2])
    assert plan.stage_cuts == ["c"]
    assert RankSim(g, cluster()).evaluate([plan])[0].step_time_s == pytest.approx(res.step_time_s)
    bad = simulate_ranks(g, cluster(), [0, 1, 1, 0], microbatches=2, schedule="zbv")
    assert bad.status == "error" and "two stages per rank in a V (0 1 1 0" in bad.message
    assert "the plan has 3 stages on 2 ranks (0 1 0)" in bad.message
    # a batch of vectors, each with its own cut: the cut moved to d leaves c with b
    sim = RankSim(g, cluster(), microbatches=2, schedule="zbv")
    times, failed = sim.staged_step_times(np.array([[0, 1, 1, 0], [0, 1, 1, 0]]), [(2,), (3,)])
    assert times[0] == pytest.approx(res.step_time_s) and failed.tolist() == [False, True]


def test_zbv_runs_every_forward_input_and_weight_part_once_in_torchs_order():
    from envs.real.distributed.schedules import v_ranks
    from envs.sim.rank_actions import torch_order

    for R, M in [(2, 2), (2, 4), (3, 6), (4, 8)]:
        S = 2 * R
        acts = schedule_actions("zbv", v_ranks(R), R, microbatches=M, inflight=None)
        flat = sorted(a for r in acts.values() for a in r)
        assert flat == sorted((s, k, m) for s in range(S) for k in "FIW" for m in range(M))
        order = torch_order("zbv", S, R, M)
        for r in range(R):
            kept = [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in order[r] if a is not None]
            assert kept == acts[r]
            assert {s for s, _, _ in acts[r]} == {r, S - 1 - r}  # the rank's two stages of the V


def test_an_overlapped_forward_sends_after_the_backward_it_runs_with_the_hand_timeline():
    from envs.real.distributed.cut import cut_stages
    from envs.sim.ranks import run_actions, stage_costs

    # a (1 s forward, 2 s backward) on rank 0, b (2 s, 4 s) on rank 1, M = 2, a send 0.6 s. Rank 0 runs F0, then
    # F1 with B0 as one action (DualPipeV's OVERLAP_F_B): F1's activations leave only when B0 is done.
    # rank 0: F0 0-1 (arrives 1.6); FO1 1-2, its send held; rank 1: F0 1.6-3.6, B0 3.6-7.6 (arrives 8.2);
    # rank 0: B0 8.2-10.2, then F1's send (arrives 10.8); rank 1: F1 10.8-12.8, B1 12.8-16.8 (arrives 17.4);
    # rank 0: B1 17.4-19.4. Sent at once instead, F1 would arrive at 2.6 and rank 1 would end at 13.6.
    g, c = two_stage_graph(), cluster()
    costs = stage_costs(g, c, cut_stages(g, [0, 1], c.device_names), 2)
    acts = {
        0: [(0, "F", 0), (0, "FO", 1), (0, "B", 0), (0, "B", 1)],
        1: [(1, "F", 0), (1, "B", 0), (1, "F", 1), (1, "B", 1)],
    }
    events: list = []
    timing = run_actions(costs, acts, c, events)
    assert timing["end_s"].tolist() == pytest.approx([19.4, 16.8])
    assert [(e.stage, e.kind, e.microbatch) for e in events if e.rank == 0][1] == (0, "F", 1)  # drawn as a forward
    plain = {0: [(0, "F", 0), (0, "F", 1), (0, "B", 0), (0, "B", 1)], 1: acts[1]}
    assert run_actions(costs, plain, c)["end_s"].tolist() == pytest.approx([16.2, 13.6])


def test_dualpipev_runs_every_forward_and_backward_once_in_torchs_order():
    from envs.real.distributed.schedules import v_ranks
    from envs.sim.rank_actions import torch_order

    for R, M in [(2, 4), (2, 6), (4, 8)]:
        S = 2 * R
        acts = schedule_actions("dualpipev", v_ranks(R), R, microbatches=M, inflight=None)
        flat = [a for r in acts.values() for a in r]
        forwards = sorted((s, m) for s, k, m in flat if k in ("F", "FO"))
        assert forwards == sorted((s, m) for s in range(S) for m in range(M))
        for s in range(S):
            for m in range(M):  # a whole backward, or its input and weight parts
                kinds = sorted(k for s2, k, m2 in flat if (s2, m2) == (s, m) and k not in ("F", "FO"))
                assert kinds in (["B"], ["I", "W"]), (s, m, kinds)
        assert any(k == "FO" for _, k, _ in flat)
        order = torch_order("dualpipev", S, R, M)
        for r in range(R):  # torch's list, each overlapped pair as its forward and its backward
            expanded = []
            for a in order[r]:
                for b in a.sub_actions or ([a] if a is not None else []):
                    kind = b.computation_type.value
                    if kind in "FBIW":
                        expanded.append(
                            (b.stage_index, "FO" if a.sub_actions and kind == "F" else kind, b.microbatch_index)
                        )
            assert expanded == acts[r]
    # fewer microbatches than stages: torch's DualPipeV refuses them, and so does the simulator, in one line
    names = ["a", "b", "c", "d"]
    g = OpGraph.from_edges(names, [(x, y, 200) for x, y in zip(names, names[1:])], flops=[2e9] * 4)
    bad = simulate_ranks(g, cluster(), [0, 1, 1, 0], microbatches=2, schedule="dualpipev", stage_starts=[2])
    assert bad.status == "error" and "needs at least as many microbatches as stages (4)" in bad.message
    ok = simulate_ranks(g, cluster(), [0, 1, 1, 0], microbatches=4, schedule="dualpipev", stage_starts=[2])
    assert ok.ok and ok.extra["schedule"] == "dualpipev"


def test_no_plan_under_any_schedule_beats_the_lower_bound_of_ranks():
    from envs.sim.ranks import ranks_lower_bound
    from graphs.synthetic import random_dag

    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(12):
        g = random_dag(24, seed=trial, param_fraction=0.5, max_bytes=1 << 16)
        R = 2 + trial % 2
        devices = [
            Device(
                f"cpu:{r}",
                "cpu",
                1e12,
                float(rng.uniform(5e10, 2e11)),
                float(rng.uniform(1e9, 1e11)),
                float(rng.uniform(0, 1e-4)),
                action_overhead_s=float(rng.uniform(0, 1e-3)),
                split_backward_factor=float(rng.choice([0.6, 1.0, 1.7])),
                handoff_s=float(rng.uniform(0, 1e-3)),
            )
            for r in range(R)
        ]
        links = {(a.name, b.name): Link(1e9, 1e-5) for a in devices for b in devices if a.name != b.name}
        c = Cluster(name="rand", devices=devices, links=links)
        n = g.num_ops
        for M in (1, 2, 4):
            bound = float(ranks_lower_bound(g, c, M))
            plans = []  # (op ranks, schedule, stage starts)
            cuts = np.sort(rng.choice(np.arange(1, n), size=2 * R - 1, replace=False))
            runs = np.searchsorted(cuts, np.arange(n), side="right")  # 2R contiguous runs
            plans.append((np.minimum(runs // 2, R - 1), "gpipe", ()))
            plans.append((np.minimum(runs // 2, R - 1), "1f1b", ()))
            for schedule in ("interleaved_1f1b", "looped_bfs", "interleaved_zb"):
                plans.append((runs % R, schedule, ()))
            v = np.where(runs < R, runs, 2 * R - 1 - runs)  # ranks 0..R-1, then back R-1..0
            for schedule in ("zbv", "dualpipev"):
                plans.append((v, schedule, [int(cuts[R - 1])]))
            plans.append((rng.integers(0, R, size=n), None, ()))  # any layout, the schedule that fits it
            plans.append((np.zeros(n, dtype=np.int64), None, ()))  # all on one rank
            for op_ranks, schedule, starts in plans:
                res = simulate_ranks(g, c, op_ranks, microbatches=M, schedule=schedule, stage_starts=starts)
                if res.status == "ok":
                    checked += 1
                    assert res.step_time_s >= bound, (trial, M, schedule, res.step_time_s, bound)
    assert checked > 150


def test_the_lower_bound_of_ranks_is_tight_for_a_chain_on_one_rank_and_the_scorer_gives_it():
    # no parameters (no optimizer step), nothing sent: the step is the chain's forward and backward, the bound's path
    g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("b", "c", 8)], flops=[1e9, 2e9, 3e9])
    c = cluster(2)
    res = simulate_ranks(g, c, [0, 0, 0])
    bound = RankSim(g, c).lower_bound()
    assert bound.name == "critical path" and res.step_time_s == pytest.approx(18.0)
    assert float(bound) == pytest.approx(18.0) and float(bound) <= res.step_time_s
    # over 4 microbatches the two ranks' work is the bound: 18 s of it, 9 s each
    assert RankSim(g, c, microbatches=4).lower_bound().name == "work across ranks"
    assert float(RankSim(g, c).lower_bound(4)) == pytest.approx(9.0)


def test_a_scorer_of_one_stage_per_rank_bounds_the_fill_and_gpipe_meets_it_the_hand_timeline():
    # four ops of 1/3 s forward and 2/3 s backward per microbatch, links free, 4 microbatches on 2 ranks, cut 2 | 2:
    # rank 0 F0-F3 0-8/3; rank 1 F0-F3 2/3-10/3, B0-B3 10/3-26/3; rank 0 B0 at 14/3 ... B3 26/3-10: a 10 s step,
    # what the fill bound says (4 x 4 - 3 x 2 ops' seconds); all the work over both ranks says only 8 s
    names = ["a", "b", "c", "d"]
    g = OpGraph.from_edges(names, [(x, y, 8) for x, y in zip(names, names[1:])], flops=[4e9 / 3] * 4)
    devices = [Device(f"gpu:{d}", "gpu", 1e12, 1e9, 1e15, 0.0) for d in range(2)]
    free = Cluster("free", devices, {("gpu:0", "gpu:1"): Link(1e15, 0.0), ("gpu:1", "gpu:0"): Link(1e15, 0.0)})
    res = simulate_ranks(g, free, [0, 0, 1, 1], microbatches=4, schedule="gpipe")
    assert res.step_time_s == pytest.approx(10.0)
    tight = RankSim(g, free, microbatches=4, one_stage_per_rank=True).lower_bound()
    loose = RankSim(g, free, microbatches=4).lower_bound()  # looped plans too: the fill may be hidden
    assert tight.name == "pipeline fill, one stage per rank" and float(tight) == pytest.approx(10.0)
    assert loose.name == "work across ranks" and float(loose) == pytest.approx(8.0)


def test_no_plan_of_one_stage_per_rank_beats_its_fill_bound():
    from graphs.synthetic import random_dag

    rng = np.random.default_rng(1)
    checked = 0
    for trial in range(10):
        g = random_dag(30, seed=100 + trial, param_fraction=0.5, max_bytes=1 << 16)
        D = 2 + trial % 3
        devices = [
            Device(f"cpu:{d}", "cpu", 1e12, float(rng.uniform(5e10, 2e11)), float(rng.uniform(1e9, 1e11)), 1e-5)
            for d in range(D)
        ]
        links = {(a.name, b.name): Link(1e9, 1e-5) for a in devices for b in devices if a.name != b.name}
        c = Cluster(name="rand", devices=devices, links=links)
        for M, W in ((1, 1), (2, 2), (4, 4), (4, 2), (8, 3)):
            sim = RankSim(g, c, microbatches=M, inflight=W, one_stage_per_rank=True)
            bound = float(sim.lower_bound())
            for R in range(1, D + 1):
                for _ in range(6):
                    cuts = np.sort(rng.choice(np.arange(1, g.num_ops), size=R - 1, replace=False))
                    ranks = np.sort(rng.choice(D, size=R, replace=False))  # used ranks, in the cluster's order
                    res = sim.simulate(ranks[np.searchsorted(cuts, np.arange(g.num_ops), side="right")])
                    if res.status == "ok":
                        checked += 1
                        assert res.step_time_s >= bound, (trial, M, W, R, res.step_time_s, bound)
    assert checked > 400


def test_the_scorer_cuts_each_plan_once_and_scores_it_as_a_fresh_cut_would_on_every_cluster():
    """RankSim keeps each plan's stages and what crosses them (PlanMemo), shared with the scorers it makes for other
    clusters (the rate fit's): a plan scored again, with other stage starts or another order, or on a slower
    cluster, is what simulate_ranks gives it without the memo; the oldest plan goes first when it is full."""
    from envs.sim.ranks import PlanMemo
    from graphs.synthetic import chain_dag

    g, c = chain_dag(30, seed=0), cluster(3)
    slow = Cluster("slow", [replace(d, flops_per_s=d.flops_per_s / 3) for d in c.devices], c.links)
    sim = RankSim(g, c, microbatches=4)
    other = sim.with_cluster(slow)
    assert other._memo is sim._memo
    rng = np.random.default_rng(0)
    plans = [np.sort(rng.integers(0, 3, g.num_ops)) for _ in range(6)] + [np.arange(g.num_ops) * 3 // g.num_ops]
    for p in plans * 2:
        for starts in ((), (12,), (5, 20)):
            for scorer, on in ((sim, c), (other, slow)):
                fresh = simulate_ranks(g, on, p, microbatches=4, stage_starts=starts)
                got = scorer.simulate(p, starts=starts)
                assert (got.step_time_s, got.peak_bytes, got.extra) == (
                    fresh.step_time_s,
                    fresh.peak_bytes,
                    fresh.extra,
                )
    assert len(sim._memo.plans) == len({p.tobytes() for p in plans}) * 3  # each plan and its starts cut once
    memo = PlanMemo(1 << 30)
    assert memo.capacity == 64
    for k in range(65):
        memo.put(memo.key([k], None, (), 1), (k,))
    assert (
        len(memo.plans) == 64
        and memo.get(memo.key([0], None, (), 1)) is None
        and memo.get(memo.key([64], None, (), 1)) == (64,)
    )
