"""Clusters: presets, JSON round trip, validation errors that name the file and field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envs import Cluster, resolve_cluster
from envs.devices import STEP_CALL_S
from envs.real.profiler import cluster_with_profile
from graphs import PlacerError


@pytest.mark.parametrize("name", Cluster.presets())
def test_presets_are_complete_and_round_trip(name, tmp_path):
    c = Cluster.preset(name)
    D = c.num_devices
    assert c.device_names[0] == "cpu:0" and c.kinds[0] == "cpu"
    assert c.gpu_indices() == list(range(1, D))
    for arr in (c.memory_bytes, c.flops_per_s, c.mem_bw_bytes_per_s):
        assert arr.shape == (D,) and np.all(arr > 0)
    assert c.bandwidth_bytes_per_s.shape == (D, D) and np.all(np.isinf(np.diag(c.bandwidth_bytes_per_s)))
    assert np.all(np.diag(c.latency_s) == 0)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(c.to_dict()))
    c2 = resolve_cluster(str(path))
    assert c2.to_dict() == c.to_dict()
    assert np.array_equal(c2.bandwidth_bytes_per_s, c.bandwidth_bytes_per_s)


def test_the_host_mask_names_the_cpu_devices_wherever_they_stand():
    doc = Cluster.preset("k80x2").to_dict()
    doc["devices"] = doc["devices"][1:] + doc["devices"][:1]  # the host last
    c = Cluster.from_dict(doc)
    assert c.host.tolist() == [False, False, True] and c.host_indices() == [2] and c.gpu_indices() == [0, 1]
    assert not c.host.flags.writeable  # shared by every reader: a copy is theirs to write
    assert Cluster.preset("v100x4").host_indices() == [0]


def test_preset_numbers_are_what_the_docs_say():
    assert Cluster.presets() == ["k80x2", "k80x4", "v100x4", "h100x8", "h200x1", "a100-40gx4", "a100-80gx8", "l4x4"]
    k80 = Cluster.preset("k80x4")
    assert k80.num_devices == 5 and k80.flops_per_s[1] == 4e12
    assert k80.bandwidth_bytes_per_s[1, 2] == 10e9 and k80.latency_s[1, 2] == 10e-6
    v100 = Cluster.preset("v100x4")
    assert v100.bandwidth_bytes_per_s[1, 2] > 4 * v100.bandwidth_bytes_per_s[0, 1]  # NVLink vs PCIe
    h200 = Cluster.preset("h200x1")
    assert 140e9 < h200.memory_bytes[1] < 152e9
    assert v100.index("gpu:3") == 4


def test_rented_presets_match_their_datasheets():
    """A100 40/80 GB on NVSwitch, L4 on PCIe only; each with its host CPU as device 0."""
    a40, a80, l4 = (Cluster.preset(n) for n in ("a100-40gx4", "a100-80gx8", "l4x4"))
    assert [c.num_devices for c in (a40, a80, l4)] == [5, 9, 5]
    assert all(c.kinds[0] == "cpu" and c.device_names[0] == "cpu:0" for c in (a40, a80, l4))
    assert 40e9 < a40.memory_bytes[1] < 44e9 and 80e9 < a80.memory_bytes[1] < 86e9 and 22e9 < l4.memory_bytes[1] < 25e9
    assert a80.mem_bw_bytes_per_s[1] > a40.mem_bw_bytes_per_s[1] > l4.mem_bw_bytes_per_s[1]
    assert a40.bandwidth_bytes_per_s[1, 2] >= 5 * a40.bandwidth_bytes_per_s[0, 1]  # NVLink vs PCIe 4.0
    assert l4.bandwidth_bytes_per_s[1, 2] == l4.bandwidth_bytes_per_s[0, 1]  # no NVLink on L4
    h100 = Cluster.preset("h100x8")
    assert h100.flops_per_s[1] > l4.flops_per_s[1] > a80.flops_per_s[1] == a40.flops_per_s[1]  # fp32 datasheet rates


def _doc():
    return Cluster.preset("k80x2").to_dict()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["devices"][1].update(speed=1), "unknown key devices[1].'speed'"),
        (lambda d: d["devices"][1].update(flops_per_s=0), "gpu:0 flops_per_s must be positive"),
        (lambda d: d["devices"][2].update(mem_bw_bytes_per_s=-1.0), "gpu:1 mem_bw_bytes_per_s must be positive"),
        (lambda d: d["devices"][1].update(memory_bytes="lots"), "devices[1] (gpu:0).memory_bytes must be a number"),
        (lambda d: d["devices"][2].update(name="gpu:0"), "duplicate device name 'gpu:0'"),
        (lambda d: d["devices"][1].update(kind="tpu"), "kind 'tpu'"),
        (lambda d: d["devices"][1].pop("launch_overhead_s"), "devices[1] is missing 'launch_overhead_s'"),
        (lambda d: d["links"].pop(), "missing link"),
        (lambda d: d["links"][0].update(bandwidth_bytes_per_s=0), "bandwidth_bytes_per_s must be positive"),
        (lambda d: d["links"][0].update(dst="gpu:9"), "links[0].dst names unknown device 'gpu:9'"),
        (lambda d: d["links"].append(dict(d["links"][0])), "a second time"),
        (lambda d: d.update(format="other/1"), "format is 'other/1'"),
        # Strict types (schema layer): a list is not a string, a string not a bool, a bool not a number.
        (lambda d: d["links"][0].update(src=["cpu:0"]), "links[0].src must be a string, got ['cpu:0'] (a list)"),
        (lambda d: d["links"][0].update(dst={"a": 1}), "links[0].dst must be a string"),
        (
            lambda d: d["links"][0].update(bidirectional="false"),
            "links[0].bidirectional must be true or false, got 'false'",
        ),
        (
            lambda d: d["devices"][1].update(flops_per_s=True),
            "devices[1] (gpu:0).flops_per_s must be a number, got True (a bool)",
        ),
        (lambda d: d["devices"][1].update(memory_bytes=10**400), "devices[1] (gpu:0).memory_bytes is too large"),
        (lambda d: d["devices"][1].update(kind=["gpu"]), "devices[1] (gpu:0).kind must be a string"),
        (lambda d: d["devices"][0].update(name=7), "devices[0].name must be a string"),
        (lambda d: d.update(name=["x"]), "name must be a string"),
        # Rates that make a step time infinite although "positive and finite".
        (lambda d: d["devices"][1].update(flops_per_s=1e-300), "gpu:0 flops_per_s must be at least 1"),
        (lambda d: d["devices"][2].update(mem_bw_bytes_per_s=1e-300), "gpu:1 mem_bw_bytes_per_s must be at least 1"),
        (lambda d: d["links"][0].update(bandwidth_bytes_per_s=1e-300), "bandwidth_bytes_per_s must be at least 1"),
        (lambda d: d["links"][0].update(latency_s=1e300), "latency_s must be at most 1e+06 s"),
        (lambda d: d["devices"][1].update(launch_overhead_s=1e300), "launch_overhead_s must be at most 1e+06 s"),
        (lambda d: d["devices"][1].update(split_backward_factor=0), "gpu:0 split_backward_factor must be positive"),
        (lambda d: d["devices"][1].update(split_backward_factor=1e3), "split_backward_factor must be at most 100"),
        (
            lambda d: d["devices"][1].update(update_bw_bytes_per_s=-1),
            "gpu:0 update_bw_bytes_per_s must be 0 or positive",
        ),
        (lambda d: d["devices"][1].update(update_bw_bytes_per_s=1e-300), "update_bw_bytes_per_s must be at least 1"),
        (lambda d: d["devices"][2].update(handoff_s=-0.001), "gpu:1 handoff_s must be >= 0"),
        (lambda d: d["devices"][2].update(handoff_s="2 ms"), "devices[2] (gpu:1).handoff_s must be a number"),
        (lambda d: d["devices"][0].update(step_call_s=-1e-6), "cpu:0 step_call_s must be >= 0"),
        (lambda d: d["devices"][0].update(step_call_s=float("inf")), "step_call_s must be >= 0 and finite, got inf"),
    ],
)
def test_bad_cluster_files_name_file_and_field(tmp_path, mutate, expected):
    doc = _doc()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlacerError) as e:
        Cluster.load(path)
    msg = str(e.value)
    assert msg.startswith(str(path) + ":") and expected in msg and "\n" not in msg


def test_resolve_cluster_errors(tmp_path):
    with pytest.raises(PlacerError, match="not a preset"):
        resolve_cluster("k81x2")
    with pytest.raises(PlacerError, match="no such file"):
        resolve_cluster(str(tmp_path / "missing.json"))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(PlacerError, match="not valid JSON"):
        resolve_cluster(str(tmp_path / "x.json"))
    with pytest.raises(PlacerError, match="unknown cluster preset"):
        Cluster.preset("nope")


def test_asymmetric_links_round_trip():
    doc = _doc()
    doc["links"] = [dict(link, bidirectional=False) for link in doc["links"]] + [
        {k: (v if k not in ("src", "dst") else link["dst" if k == "src" else "src"]) for k, v in link.items()}
        | {"bandwidth_bytes_per_s": 5e9, "bidirectional": False}
        for link in doc["links"]
    ]
    c = Cluster.from_dict(doc)
    assert c.bandwidth_bytes_per_s[1, 0] == 5e9 and c.bandwidth_bytes_per_s[0, 1] == 10e9
    assert Cluster.from_dict(c.to_dict()).to_dict() == c.to_dict()


def test_a_ranks_hand_off_is_written_only_where_set_and_read_back():
    doc = _doc()
    doc["devices"][1]["handoff_s"] = 0.002
    c = Cluster.from_dict(doc)
    assert [d.handoff_s for d in c.devices] == [0.0, 0.002, 0.0]
    written = c.to_dict()
    assert [("handoff_s" in d) for d in written["devices"]] == [False, True, False]
    assert Cluster.from_dict(written).to_dict() == written


def test_the_host_workers_call_cost_is_written_only_where_set_and_read_back():
    doc = _doc()
    doc["devices"][0]["step_call_s"] = 5e-5
    c = Cluster.from_dict(doc)
    assert c.step_call_s.tolist() == [5e-5, STEP_CALL_S, STEP_CALL_S]
    written = c.to_dict()
    assert [("step_call_s" in d) for d in written["devices"]] == [True, False, False]
    assert Cluster.from_dict(written).to_dict() == written


def test_with_profile_takes_measured_links(tmp_path):
    doc = {
        "format": "placer-profile/1",
        "graph_hash": "",
        "ops": [],
        "devices": {},
        "links": [{"src": "cpu", "dst": "cuda:0", "latency_s": 2e-5, "bandwidth_bytes_per_s": 2e10}],
    }
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(doc))
    c = Cluster.preset("k80x2")
    for calibrated in (cluster_with_profile(c, str(path)), cluster_with_profile(c, doc)):
        assert calibrated.bandwidth_bytes_per_s[0, 1] == 2e10 and calibrated.latency_s[0, 1] == 2e-5
        assert calibrated.bandwidth_bytes_per_s[1, 2] == c.bandwidth_bytes_per_s[1, 2]
    with pytest.raises(PlacerError, match="no such file"):
        cluster_with_profile(c, str(tmp_path / "nope.json"))


def test_a_tiny_rate_is_refused_before_it_can_simulate_an_infinite_ok_step(tmp_path, capsys):
    # Before, flops_per_s=1e-300 passed validation and `simulate` said status ok
    # with an infinite step time.
    import graphs
    from graphs.synthetic import random_dag
    from placer.cli import main

    g = random_dag(30, seed=2, name="g")
    graphs.save(g, tmp_path / "g.json")
    doc = _doc()
    for dev in doc["devices"]:
        dev["flops_per_s"] = 1e-300
    (tmp_path / "c.json").write_text(json.dumps(doc))
    rc = main(
        [
            "place",
            str(tmp_path / "g.json"),
            "--cluster",
            str(tmp_path / "c.json"),
            "--method",
            "single",
            "-o",
            str(tmp_path / "p.json"),
        ]
    )
    err = capsys.readouterr().err
    assert (
        rc == 2 and err.count("\n") == 1 and "flops_per_s must be at least 1" in err and str(tmp_path / "c.json") in err
    )


def test_rates_at_the_floor_keep_simulated_times_finite():
    from envs import simulate
    from graphs.synthetic import random_dag
    from placer.methods import place

    doc = _doc()
    for dev in doc["devices"]:
        dev.update(flops_per_s=1.0, mem_bw_bytes_per_s=1.0, launch_overhead_s=1e6)
    for link in doc["links"]:
        link.update(bandwidth_bytes_per_s=1.0, latency_s=1e6)
    c = Cluster.from_dict(doc)
    g = random_dag(40, seed=3, name="g")
    r = simulate(g, place("m_etf", g, c), c)
    assert np.isfinite(r.step_time_s)
