"""The cost model: roofline, profiles, backward multiplier, views, transfers, update."""

from __future__ import annotations

import numpy as np

from envs import Cluster
from envs.sim import cost
from graphs import OpGraph


def test_roofline_profile_and_views():
    g = OpGraph.from_edges(
        ["mm", "relu", "view"],
        [("mm", "relu", 8_000_000), ("relu", "view", 8_000_000)],
        flops=[8e9, 0.0, 0.0],
        op_types=["aten.mm.default", "aten.relu.default", "aten.view.default"],
    )
    c = Cluster.preset("k80x2")
    fwd, bwd = cost.op_times(g, c)
    assert fwd.shape == (3, 3)
    assert fwd[0, 1] == 8e9 / 4e12 + 8e-6  # compute-bound on the GPU
    assert fwd[1, 1] == 16e6 / 2e11 + 8e-6  # memory-bound: read 8 MB + write 8 MB
    assert fwd[0, 0] == 8e9 / 0.5e12 + 5e-6  # the host CPU
    assert np.all(fwd[2] == 0) and np.all(bwd[2] == 0)
    assert np.array_equal(bwd[:2], cost.BACKWARD_MULTIPLIER * fwd[:2])
    g.profile = {"gpu": {"fwd_s": np.array([1e-3, np.nan, np.nan]), "bwd_s": np.array([np.nan, 5e-4, np.nan])}}
    fwd2, bwd2 = cost.op_times(g, c)
    assert fwd2[0, 1] == 1e-3 and fwd2[0, 2] == 1e-3 and fwd2[0, 0] == fwd[0, 0]  # profile only for its kind
    assert fwd2[1, 1] == fwd[1, 1] and bwd2[1, 1] == 5e-4 and bwd2[0, 1] == 2e-3 and bwd2[0, 0] == bwd[0, 0]


def test_microbatch_times_scale_a_profile_as_the_roofline_and_charge_accumulating_weight_gradients():
    # a dense layer on a small batch (2 GB of weights read whatever the batch) and a compute-bound op, k80x2's GPU:
    # 4e12 FLOP/s, 2e11 B/s, 8 us per op
    g = OpGraph.from_edges(
        ["fc", "conv"], [("fc", "conv", 4)], flops=[8e6, 4e10], param_bytes=[2_000_000_000, 0], op_types=["op"] * 2
    )
    c = Cluster.preset("k80x2")
    g.profile = {"gpu": {"fwd_s": np.array([0.03, 0.03]), "bwd_s": np.array([0.05, np.nan])}}
    fwd, bwd = cost.op_times(g, c, microbatches=4)
    fc_whole, fc_micro = 8e-6 + (2e9 + 4) / 2e11, 8e-6 + (2e9 + 4 / 4) / 2e11  # memory-bound: the weights read whole
    conv_whole, conv_micro = 8e-6 + 4e10 / 4e12, 8e-6 + 4e10 / 4 / 4e12  # compute-bound: a quarter of the FLOPs
    assert fwd[0, 1] == 0.03 * (fc_micro / fc_whole)  # ~0.03 s, not 0.03 / 4
    assert fwd[1, 1] == 0.03 * (conv_micro / conv_whole)  # ~0.03 / 4
    accumulate_s = 3 / 4 * cost.ACCUMULATE_TRAFFIC_MULTIPLIER * 2e9 / 2e11  # grad += new after the first microbatch
    assert bwd[0, 1] == 0.05 * (fc_micro / fc_whole) + accumulate_s
    assert bwd[1, 1] == cost.BACKWARD_MULTIPLIER * fwd[1, 1]  # no parameters: nothing to accumulate
    # one microbatch: the profile as measured, and nothing accumulated
    fwd1, bwd1 = cost.op_times(g, c)
    assert fwd1[0, 1] == 0.03 and bwd1[0, 1] == 0.05 and bwd1[1, 1] == 0.06
    # the host CPU (no profile there): the roofline, and the accumulation at the host's bandwidth
    cpu = c.devices[0]
    roof = cpu.launch_overhead_s + max(8e6 / 4 / cpu.flops_per_s, (2e9 + 1) / cpu.mem_bw_bytes_per_s)
    assert np.isclose(fwd[0, 0], roof, rtol=1e-12)
    assert np.isclose(bwd[0, 0], 2 * roof + 3 / 4 * 3 * 2e9 / cpu.mem_bw_bytes_per_s, rtol=1e-12)


def test_an_op_timed_on_a_microbatch_too_costs_a_line_through_both_sizes():
    # fc: 8 ms on the whole batch, 5 ms on one of 4 (a = 4 ms every microbatch pays, b = 4 ms that scales);
    # conv: 8 ms and 2 ms (all of it scales); both on k80x2's GPU, M = 2 and 8
    g = OpGraph.from_edges(
        ["fc", "conv"], [("fc", "conv", 4)], flops=[8e6, 4e10], param_bytes=[2_000_000, 0], op_types=["op"] * 2
    )
    c = Cluster.preset("k80x2")
    g.profile = {
        "gpu": {
            "fwd_s": np.array([8e-3, 8e-3]),
            "bwd_s": np.array([16e-3, np.nan]),
            "micro_fwd_s": np.array([5e-3, 2e-3]),
            "micro_bwd_s": np.array([10e-3, 4e-3]),
            "micro_m": np.array([4.0, 4.0]),
        }
    }
    accumulate_s = cost.ACCUMULATE_TRAFFIC_MULTIPLIER * 2e6 / 2e11  # per microbatch after the first, fc's weights
    fwd, bwd = cost.op_times(g, c, microbatches=2)
    assert np.isclose(fwd[0, 1], 4e-3 + 4e-3 / 2) and np.isclose(fwd[1, 1], 8e-3 / 2)
    assert np.isclose(bwd[0, 1], 8e-3 + 8e-3 / 2 + accumulate_s / 2)  # bwd: a = 8 ms, b = 8 ms
    # conv's backward has no whole-batch time: twice its forward, as without the microbatch's columns
    assert np.isclose(bwd[1, 1], cost.BACKWARD_MULTIPLIER * fwd[1, 1])
    fwd8, _ = cost.op_times(g, c, microbatches=8)
    assert np.isclose(fwd8[0, 1], 4e-3 + 4e-3 / 8) and np.isclose(fwd8[1, 1], 8e-3 / 8)
    fwd1, bwd1 = cost.op_times(g, c)  # one microbatch: the whole batch's times as measured
    assert fwd1[0, 1] == 8e-3 and bwd1[0, 1] == 16e-3
    # the host CPU has no profile: the microbatch's columns are the GPU's only
    g.profile = {}
    assert fwd[0, 0] == cost.op_times(g, c, microbatches=2)[0][0, 0]


def test_an_op_faster_per_sample_on_a_microbatch_keeps_its_measured_rate_below_the_whole_batch():
    """Whole batch 8 ms, one of 4 microbatches 1.5 ms (6 ms for the four: a microbatch's activations stay in cache,
    as MobileNetV2's early blocks do on a CPU core). The line through both sizes needs a negative fixed part, so
    between the sizes the line is kept (it passes through both), and beyond K every microbatch pays the device's
    launch overhead o and the rest runs at the rate measured on one of K: o + (1.5 ms - o) x 4 / M. Clipping the
    fixed part at 0 had charged 2.17 ms at M = 4, 44 % over what was measured there, and 8.7 ms for the 8
    microbatches of M = 8 (more than the whole batch)."""
    whole, micro, k = np.array([8.0]), np.array([1.5]), np.array([4.0])
    assert np.isclose(cost.between_sizes(whole, micro, k, 4)[0], 1.5)  # the measured point
    assert np.isclose(cost.between_sizes(whole, micro, k, 1)[0], 8.0)
    b = (8.0 - 1.5) / (1 - 1 / 4)
    assert np.isclose(cost.between_sizes(whole, micro, k, 2)[0], 1.5 - b / 4 + b / 2)  # on the line: 3.67 ms
    assert np.isclose(cost.between_sizes(whole, micro, k, 8)[0], 1.5 * 4 / 8)
    assert np.isclose(cost.between_sizes(whole, micro, k, 8, 0.1)[0], 0.1 + 1.4 * 4 / 8)
    assert np.isclose(cost.between_sizes(whole, micro, k, 8, 2.0)[0], 1.5)  # the overhead is at most the time
    # a line with a fixed part >= 0 is unchanged: a = 4 ms, b = 4 ms
    assert np.isclose(cost.between_sizes(np.array([8.0]), np.array([5.0]), k, 8)[0], 4.5)


def test_transfer_and_update_times():
    c = Cluster.preset("v100x4")
    assert cost.transfer_time_s(45e9, "gpu:0", "gpu:1", c) == 1.0 + 6e-6
    assert cost.transfer_time_s(10e9, 0, 1, c) == 1.0 + 10e-6
    assert cost.transfer_time_s(1e9, 2, 2, c) == 0.0
    upd = cost.update_times_s(np.array([0, 7.7e11 / 7, 0, 0, 0]), c)
    assert upd[0] == 0 and abs(upd[1] - (1.0 + 8e-6)) < 1e-12


def test_static_and_activation_bytes():
    g = OpGraph.from_edges(
        ["a", "v"],
        [("a", "v", 40)],
        op_types=["aten.mm.default", "aten.t.default"],
        param_bytes=[100, 0],
        buffer_bytes=[8, 0],
        out_bytes=[40, 40],
    )
    assert cost.static_bytes(g).tolist() == [408, 0]
    assert cost.activation_bytes(g).tolist() == [40, 0]


def test_an_op_whose_weights_are_all_frozen_computes_its_input_s_gradient_alone():
    g = OpGraph.from_edges(
        ["base", "lora", "add"],
        [("base", "add", 4096), ("lora", "add", 4096)],
        op_types=["aten.mm.default"] * 2 + ["aten.add.Tensor"],
        flops=[2e9, 2e9, 1e6],
        param_bytes=[0, 4096, 0],
        buffer_bytes=[1 << 20, 0, 0],
    )
    g.params = [["base.weight"], ["lora.A"], []]
    g.meta["frozen_params"] = ["base.weight"]
    c = Cluster.preset("k80x2")
    fwd, bwd = cost.op_times(g, c)
    assert np.allclose(bwd[0], (cost.BACKWARD_MULTIPLIER - 1) * fwd[0])  # frozen: grad_input only
    assert np.allclose(bwd[1:], cost.BACKWARD_MULTIPLIER * fwd[1:])
    # a profile that timed the forward alone: the same rule on the timed forward
    g.profile = {"gpu": {"fwd_s": np.array([1e-3, 2e-3, np.nan]), "bwd_s": np.full(3, np.nan)}}
    fwd, bwd = cost.op_times(g, c)
    gpu = c.kinds.index("gpu")
    assert bwd[0, gpu] == 1e-3 and bwd[1, gpu] == 2 * 2e-3
