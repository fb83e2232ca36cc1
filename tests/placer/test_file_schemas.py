"""Placement and profile files go through the one schema layer: wrong types exit 2 with one line."""

from __future__ import annotations

import json

import pytest

import graphs
from envs.real.profiler import check_profile
from graphs import PlacerError
from graphs.plan import Placement
from graphs.synthetic import random_dag
from placer.cli import main


@pytest.fixture
def files(tmp_path):
    g = random_dag(20, seed=5, name="g")
    graphs.save(g, tmp_path / "g.json")
    p = Placement.from_indices(
        g,
        ["cpu:0", "gpu:0", "gpu:1"],
        [1] * g.num_ops,
        cluster="k80x2",
        method="single",
        meta={"step_time_s": 0.1, "iteration": 3, "found_by": "policy"},
    )
    return tmp_path, g, p.to_dict()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("meta", [1], "meta must be an object, got [1] (a list)"),
        ("meta", {"iteration": "3"}, "meta.iteration must be an integer, got '3' (a string)"),
        ("meta", {"iteration": True}, "meta.iteration must be an integer, got True (a bool)"),
        ("meta", {"step_time_s": "fast"}, "meta.step_time_s must be a number"),
        ("meta", {"found_by": ["x"]}, "meta.found_by must be a string"),
        ("graph_hash", ["h"], "graph_hash must be a string"),
        ("method", 3, "method must be a string"),
        ("devices", ["cpu:0", 1], "devices[1] must be a string"),
    ],
)
def test_bad_placement_fields(files, capsys, field, value, message):
    tmp, g, doc = files
    doc[field] = value
    path = tmp / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlacerError) as info:
        Placement.load(path)
    assert str(info.value) == f"{path}: {message}" or (
        str(info.value).startswith(f"{path}: {message}") and "\n" not in str(info.value)
    )
    rc = main(["simulate", str(tmp / "g.json"), str(path), "--cluster", "k80x2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err


def test_a_placement_with_an_infinite_step_time_still_loads(files):
    tmp, g, doc = files
    doc["meta"]["step_time_s"] = float("inf")
    (tmp / "p.json").write_text(json.dumps(doc))  # json writes Infinity, as Placement.save does
    assert Placement.load(tmp / "p.json").meta["step_time_s"] == float("inf")


def _profile(n_ops=2):
    return {
        "format": "placer-profile/1",
        "graph_hash": "",
        "ops": [f"op{i}" for i in range(n_ops)],
        "devices": {"cpu": {"kind": "cpu", "fwd_s": [1e-4] * n_ops, "bwd_s": [2e-4] * n_ops}},
        "links": [{"src": "cpu", "dst": "cuda:0", "latency_s": 1e-5, "bandwidth_bytes_per_s": 1e10}],
    }


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["devices"]["cpu"]["fwd_s"].__setitem__(0, True),
            "devices['cpu'].fwd_s[0] must be a number, got True (a bool)",
        ),
        (lambda d: d["devices"]["cpu"]["fwd_s"].__setitem__(0, "0.1"), "devices['cpu'].fwd_s[0] must be a number"),
        (lambda d: d["devices"]["cpu"]["bwd_s"].__setitem__(1, 10**400), "devices['cpu'].bwd_s[1] is too large"),
        (lambda d: d["devices"]["cpu"]["bwd_s"].__setitem__(1, 1e300), "negative or non-numeric time"),
        (lambda d: d["devices"].__setitem__("cpu", [1]), "devices['cpu'] must be an object"),
        (lambda d: d["devices"]["cpu"].__setitem__("kind", ["cpu"]), "devices['cpu'].kind must be a string"),
        (lambda d: d["links"][0].__setitem__("src", ["cpu"]), "links[0].src must be a string"),
        (lambda d: d["links"][0].__setitem__("bandwidth_bytes_per_s", True), "links[0] needs non-negative"),
        (
            lambda d: d["links"][0].__setitem__("bandwidth_bytes_per_s", 1e-300),
            "links[0].bandwidth_bytes_per_s must be >= 1",
        ),
        (lambda d: d["links"].__setitem__(0, "fast"), "links[0] must be an object"),
        (lambda d: d.__setitem__("ops", ["op0", 1]), "ops[1] must be a string"),
    ],
)
def test_bad_profile_fields(tmp_path, edit, message):
    doc = _profile()
    edit(doc)
    with pytest.raises(PlacerError) as info:
        check_profile(doc, source="prof.json")
    assert str(info.value).startswith("prof.json: ") and message in str(info.value) and "\n" not in str(info.value)


def test_the_good_profile_passes():
    check_profile(_profile(), source="prof.json")
