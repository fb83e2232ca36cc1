"""The host's costs beside its ops (staging, contention) measured and taken in; the issue times fitted to the clean
step."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import envs
from envs.cluster import Cluster
from envs.devices import STEP_CALL_S
from envs.real.profiler import calibrate_cluster, check_profile
from envs.real.profiler.fit import all_on_device_step_s, fit_issue_scale, host_fields
from envs.real.profiler.host import call_cost, time_contention, time_staging, time_step_call
from graphs import OpGraph, PlacerError


def test_staging_on_this_host_is_timed_and_fitted():
    s = time_staging(sizes_bytes=(4 << 10, 1 << 20, 8 << 20), repeats=3)
    assert s["device"] == "cpu" and s["sizes_bytes"] == [4 << 10, 1 << 20, 8 << 20]
    assert all(t > 0 for t in s["times_s"]) and s["times_s"][2] > s["times_s"][0]
    assert s["latency_s"] >= 0 and 1e8 < s["bandwidth_bytes_per_s"] < 1e12  # a memcpy: 0.1-1000 GB/s


def test_contention_is_measured_as_two_slowdowns():
    c = time_contention(seconds=0.05, trials=2, size=64)
    assert set(c) == {"op", "issue", "threads", "device", "rates", "windows"} and c["device"] == "cpu"
    assert c["windows"] == 2
    assert math.isfinite(c["op"]) and math.isfinite(c["issue"]) and c["op"] >= 0 and c["issue"] >= 0
    assert all(v > 0 for v in c["rates"].values())


def two_op_profile(issue: float, step_s: float) -> tuple[OpGraph, dict]:
    """a -> b on one GPU with free kernels and ``issue`` seconds of host issue per op, forward and backward."""
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e6, 1e6], op_types=["aten.mm.default"] * 2)
    entry = {
        "kind": "gpu",
        "method": "context",
        "fwd_s": [0.0, 0.0],
        "bwd_s": [0.0, 0.0],
        "issue_fwd_s": [issue, issue],
        "issue_bwd_s": [issue, issue],
        "step_s": step_s,
    }
    return g, {
        "format": "placer-profile/1",
        "graph_hash": g.content_hash,
        "ops": g.names,
        "devices": {"cuda:0": entry},
        "links": [],
    }


def test_issue_times_are_scaled_until_the_simulated_step_is_the_measured_one():
    # the host issues a then b (2 x 2 s), a's and b's backward on the worker (2 x 2 s), no kernel time: 8 s simulated
    g, prof = two_op_profile(2.0, step_s=4.0)
    assert all_on_device_step_s(g, prof, "cuda:0") == 8.0
    fit_issue_scale(prof, g)
    entry = prof["devices"]["cuda:0"]
    assert entry["issue_scale"] == pytest.approx(0.5, rel=1e-3)
    assert entry["issue_fwd_s"] == pytest.approx([1.0, 1.0], rel=1e-3)
    assert entry["issue_fit"]["simulated_before_s"] == 8.0 and entry["issue_fit"]["simulated_after_s"] == pytest.approx(
        4.0, rel=1e-3
    )
    g2, prof2 = two_op_profile(1.0, step_s=4.0)  # already right: left alone
    fit_issue_scale(prof2, g2)
    assert prof2["devices"]["cuda:0"]["issue_scale"] == 1.0 and prof2["devices"]["cuda:0"]["issue_fwd_s"] == [1.0, 1.0]
    g3, prof3 = two_op_profile(2.0, step_s=80.0)  # far too slow to explain by issue alone: the factor stops at 4
    fit_issue_scale(prof3, g3)
    assert prof3["devices"]["cuda:0"]["issue_scale"] == pytest.approx(4.0, rel=1e-3)


def test_a_calls_fixed_cost_is_what_merging_calls_saves():
    # one call over k parameters takes 30 + 10 k us: k calls of one take 40 k, (k - 1) x 30 us more
    assert call_cost([1, 2, 4, 8], [1e-6 * (30 + 10 * k) for k in (1, 2, 4, 8)]) == pytest.approx(30e-6)
    # the median of the counts' estimates, not their mean: one noisy count does not move it
    assert call_cost([1, 2, 4, 8], [40e-6, 50e-6, 70e-6, 10e-6]) == pytest.approx(30e-6)
    assert call_cost([1], [40e-6]) == 40e-6
    r = time_step_call((1, 4), numel=8, repeats=3)
    assert r["counts"] == [1, 4] and len(r["seconds"]) == 2 and r["call_s"] == call_cost([1, 4], r["seconds"])
    with pytest.raises(ValueError, match="must start at 1"):
        time_step_call((2, 4))


def host_profile(staging=None, contention=None) -> dict:
    entry = {"kind": "cpu", "method": "isolated", "fwd_s": [], "bwd_s": []}
    if staging is not None:
        entry["staging"] = staging
    if contention is not None:
        entry["contention"] = contention
    return {"format": "placer-profile/1", "ops": [], "devices": {"cpu": entry}, "links": []}


def test_calibrated_host_pays_for_staging_and_contention():
    prof = host_profile({"latency_s": 1e-5, "bandwidth_bytes_per_s": 1e9}, {"op": 0.3, "issue": 0.2})
    check_profile(prof)
    c = calibrate_cluster(Cluster.preset("h200x1"), prof, device_map="gpu:0=cuda:0,cpu:0=cpu")
    host = c.devices[0]
    assert (host.stage_latency_s, host.stage_bandwidth_bytes_per_s, host.contention_op, host.contention_issue) == (
        1e-5,
        1e9,
        0.3,
        0.2,
    )
    assert c.devices[1].stage_bandwidth_bytes_per_s == math.inf  # a GPU stages nothing
    assert Cluster.from_dict(c.to_dict()).devices[0] == host  # and a cluster file keeps them
    assert "stage_latency_s" not in Cluster.preset("h200x1").to_dict()["devices"][0]  # written only when measured
    # a host op's output sent to the GPU: 1e-5 + 64 MB / 1 GB/s of host time before the copy
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 64 << 20)], flops=[1e9, 1e9], op_types=["aten.mm.default"] * 2)
    base = envs.simulate(g, [0, 1], Cluster.preset("h200x1"))
    staged = envs.simulate(g, [0, 1], c)
    assert staged.extra["sim_step_time_s"] - base.extra["sim_step_time_s"] >= 1e-5 + (64 << 20) / 1e9 - 1e-9
    assert host_fields({"kind": "cpu"}) == {}
    assert c.devices[0].step_call_s == STEP_CALL_S  # not measured: the default


def test_a_calibrated_host_pays_its_measured_call_cost_per_batch_of_parameters_stepped_in_the_backward():
    prof = host_profile()
    prof["devices"]["cpu"]["step_call"] = {"call_s": 45e-6}
    check_profile(prof)
    preset = Cluster.preset("h200x1")
    c = calibrate_cluster(preset, prof, device_map="gpu:0=cuda:0,cpu:0=cpu")
    assert c.devices[0].step_call_s == 45e-6  # the call's whole fixed cost, whatever launch the host was fitted
    assert c.devices[1].step_call_s == STEP_CALL_S  # a GPU's is its default (no worker runs there)
    assert Cluster.from_dict(c.to_dict()).devices[0] == c.devices[0]


@pytest.mark.parametrize(
    "entry, field",
    [
        ({"staging": {"latency_s": -1.0, "bandwidth_bytes_per_s": 1e9}}, "staging.latency_s"),
        ({"staging": {"latency_s": 0.0}}, "staging.bandwidth_bytes_per_s"),
        ({"contention": {"op": "a lot", "issue": 0.1}}, "contention.op"),
        ({"contention": [0.1, 0.2]}, "contention"),
        ({"step_call": {"call_s": "fast"}}, "step_call.call_s"),
    ],
)
def test_bad_host_entries_are_one_line_errors(entry, field):
    prof = host_profile()
    prof["devices"]["cpu"].update(copy.deepcopy(entry))
    with pytest.raises(PlacerError, match=field.replace(".", r"\.")) as e:
        check_profile(prof, source="p.json")
    assert "p.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_cpu_profile_carries_the_host_probes(small_program_profile):
    entry = small_program_profile["devices"]["cpu"]
    assert set(entry["staging"]) >= {"latency_s", "bandwidth_bytes_per_s"} and set(entry["contention"]) >= {
        "op",
        "issue",
    }
    check_profile(small_program_profile)
    assert np.isfinite(entry["contention"]["op"])
    assert entry["step_call"]["path"] == "fused" and np.isfinite(entry["step_call"]["call_s"])


@pytest.fixture(scope="module")
def small_program_profile():
    import torch
    from torch import nn

    from envs.real.profiler import profile_model

    torch.manual_seed(0)
    return profile_model(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (torch.randn(4, 8),), ["cpu"], warmup=1, repeats=2)
