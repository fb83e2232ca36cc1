"""envs.profiler: real per-op timings on the CPU, link fits, and how the simulator takes them in."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import envs
from envs.profiler import (
    FORMAT,
    apply_profile,
    calibrate_cluster,
    fit_link,
    load_profile,
    profile_model,
    save_profile,
    time_link,
    with_profile,
)
from graphs import PlacerError
from graphs.torch_capture import capture


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 8))
    x = torch.randn(64, 64)
    graph = capture(model, (x,))
    prof = profile_model(model, (x,), ["cpu"], warmup=1, repeats=3)
    return graph, prof


def test_every_op_is_timed_forward_and_backward(profiled):
    graph, prof = profiled
    assert prof["format"] == FORMAT and prof["graph_hash"] == graph.content_hash
    assert prof["ops"] == graph.names and prof["errors"] == {}
    cpu = prof["devices"]["cpu"]
    assert cpu["kind"] == "cpu"
    fwd, bwd = np.array(cpu["fwd_s"]), np.array(cpu["bwd_s"])
    assert np.all(fwd > 0) and np.all(fwd < 1.0)
    by_name = dict(zip(graph.names, bwd))
    assert by_name["linear"] > 0 and by_name["batch_norm"] > 0
    assert by_name["add_"] == 0.0  # num_batches_tracked += 1: integers, nothing to differentiate
    assert prof["links"] == []  # one device, no pairs


def test_apply_profile_keeps_the_hash_and_feeds_the_simulator(profiled):
    graph, prof = profiled
    g2 = apply_profile(graph, prof)
    assert g2.content_hash == graph.content_hash and graph.profile == {}
    np.testing.assert_allclose(g2.profile["cpu"]["fwd_s"], prof["devices"]["cpu"]["fwd_s"])
    cluster = envs.Cluster.preset("h200x1")
    all_cpu = [0] * graph.num_ops
    r = envs.simulate(g2, all_cpu, cluster)
    work_s = float(np.nansum(g2.profile["cpu"]["fwd_s"]) + np.nansum(g2.profile["cpu"]["bwd_s"]))
    assert r.ok and r.step_time_s >= work_s * 0.999
    assert r.step_time_s != envs.simulate(graph, all_cpu, cluster).step_time_s


def test_profile_of_another_graph_is_refused(profiled):
    graph, prof = profiled
    other = capture(nn.Linear(3, 3), (torch.randn(2, 3),))
    with pytest.raises(PlacerError, match="profiled graph"):
        apply_profile(other, prof)


def test_fit_link_recovers_a_noisy_line():
    rng = np.random.default_rng(0)
    sizes = np.array([4e3, 2.6e5, 4e6, 3.2e7])
    times = (8e-6 + sizes / 25e9) * rng.uniform(0.97, 1.03, size=4)
    lat, bw = fit_link(sizes, times)
    assert lat == pytest.approx(8e-6, rel=0.1) and bw == pytest.approx(25e9, rel=0.1)
    with pytest.raises(PlacerError):
        fit_link([1.0], [1.0])


def test_time_link_on_the_cpu_is_monotone_and_fits():
    sizes, times = time_link("cpu", "cpu", [64 << 10, 8 << 20, 32 << 20], repeats=3)
    assert times[0] < times[-1]
    lat, bw = fit_link(sizes, times)
    assert lat >= 0 and 1e8 < bw < 1e13  # a memcpy: between 0.1 GB/s and 10 TB/s


def _fake_profile(graph, links):
    n = graph.num_ops
    return {
        "format": FORMAT, "graph_hash": graph.content_hash, "ops": list(graph.names),
        "devices": {"cpu": {"kind": "cpu", "fwd_s": [1e-3] * n, "bwd_s": [2e-3] * n},
                    "cuda:0": {"kind": "gpu", "fwd_s": [1e-5] * n, "bwd_s": [None] * n}},
        "links": [{"src": s, "dst": d, "latency_s": lat, "bandwidth_bytes_per_s": bw} for s, d, lat, bw in links],
    }


def test_calibrate_cluster_uses_measured_links_then_kind_matches(profiled):
    graph, _ = profiled
    prof = _fake_profile(graph, [("cpu", "cuda:0", 9e-6, 20e9), ("cuda:0", "cpu", 11e-6, 18e9)])
    c = calibrate_cluster(envs.Cluster.preset("k80x2"), prof, graph=graph)
    assert c.links[("cpu:0", "gpu:0")] == envs.Link(20e9, 9e-6)
    assert c.links[("gpu:1", "cpu:0")] == envs.Link(18e9, 11e-6)  # cuda:1 unmeasured: same kinds
    assert c.links[("gpu:0", "gpu:1")] == envs.Cluster.preset("k80x2").links[("gpu:0", "gpu:1")]
    cpu = c.devices[0]
    assert cpu.launch_overhead_s == pytest.approx(1e-3)
    g2 = apply_profile(graph, prof)
    assert np.all(np.isnan(g2.profile["gpu"]["bwd_s"]))  # unknown: the cost model falls back


def test_with_profile_reads_a_file_and_rejects_bad_ones(profiled, tmp_path):
    graph, prof = profiled
    path = tmp_path / "profile.json"
    save_profile(prof, path)
    g2, c2 = with_profile(graph, envs.Cluster.preset("h200x1"), str(path))
    assert "cpu" in g2.profile and c2.name == "h200x1+profile"
    assert with_profile(graph, c2, None) == (graph, c2)
    bad = dict(prof, devices={"cpu": {"kind": "cpu", "fwd_s": [1.0], "bwd_s": [1.0]}})
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlacerError, match="one time per op"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "torn.json").write_text(json.dumps(prof)[:50])
    with pytest.raises(PlacerError, match="not valid JSON"):
        load_profile(tmp_path / "torn.json")
    (tmp_path / "fmt.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(PlacerError, match="placer-profile/1"):
        load_profile(tmp_path / "fmt.json")


def test_unavailable_cuda_device_is_a_one_line_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(PlacerError, match="not available"):
        profile_model(nn.Linear(2, 2), (torch.randn(1, 2),), ["cpu", "cuda:0"])


def test_device_map_makes_logical_gpus_on_the_cpu_cpus_with_free_links(profiled):
    graph, prof = profiled
    c = calibrate_cluster(envs.Cluster.preset("k80x2"), prof, graph=graph, device_map="*=cpu")
    assert c.kinds == ["cpu", "cpu", "cpu"]
    assert c.links[("gpu:0", "gpu:1")].latency_s == 0.0 and c.links[("cpu:0", "gpu:0")].bandwidth_bytes_per_s >= 1e18
    g2 = apply_profile(graph, prof)
    # Everything on "gpu:1" (really the CPU) now costs the measured CPU times (only the
    # optimizer update, priced at the device's unmeasured memory bandwidth, differs).
    on_gpu1 = envs.simulate(g2, [2] * graph.num_ops, c)
    on_cpu0 = envs.simulate(g2, [0] * graph.num_ops, c)
    from envs.cost import update_times_s

    total = np.zeros(c.num_devices)
    total[:] = graph.param_bytes.sum()
    update = update_times_s(total, c)
    # the ops cost the same measured times on both; only the optimizer update may differ
    assert abs(on_gpu1.step_time_s - on_cpu0.step_time_s) <= abs(update[2] - update[0]) + 1e-9
    uncalibrated = envs.simulate(g2, [2] * graph.num_ops, envs.Cluster.preset("k80x2"))
    assert uncalibrated.step_time_s < 0.5 * on_gpu1.step_time_s  # a K80 would be much faster than this CPU
