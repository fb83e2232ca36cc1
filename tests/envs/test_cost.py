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
