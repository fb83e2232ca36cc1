"""A plan's parameter homes (graphs.plan.Placement.param_homes): saved per parameter, decided per owner op, old files
still load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs import OpGraph, PlacerError
from graphs.plan import Placement

DEVICES = ["cpu:0", "gpu:0"]


@pytest.fixture
def graph():
    g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], param_bytes=[8, 8, 0])
    g.params = [["w", "bias"], ["v"], ["v"]]  # c reads b's parameter too
    return g


def test_homes_round_trip_and_plans_without_them_are_saved_as_before(graph, tmp_path):
    p = Placement.from_indices(graph, DEVICES, [1, 1, 1], homes=[0, -1, -1])
    assert p.param_homes == {"w": "cpu:0", "bias": "cpu:0"}
    p.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["param_homes"] == {"w": "cpu:0", "bias": "cpu:0"}
    back = Placement.load(tmp_path / "p.json")
    assert back == p and back.home_indices(graph).tolist() == [0, -1, -1]
    plain = Placement.from_indices(graph, DEVICES, [1, 1, 1])
    assert "param_homes" not in plain.to_dict() and plain != p
    del doc["param_homes"]  # a file from before homes
    old = Placement.from_dict(doc)
    assert old.param_homes == {} and old.home_indices(graph).tolist() == [-1, -1, -1]


def test_a_home_on_the_op_s_own_device_is_no_home_apart(graph):
    p = Placement.from_indices(graph, DEVICES, [1, 0, 0], homes=[1, 0, -1])
    assert p.home_indices(graph).tolist() == [-1, -1, -1]


@pytest.mark.parametrize(
    "homes,message",
    [
        ({"w": "cpu:0"}, "tensors op 'a' reads first different homes"),  # bias left on the op's device
        ({"x": "cpu:0"}, "names 'x', which no op of the graph reads"),
        ({"w": "gpu:7", "bias": "gpu:7"}, "unknown device 'gpu:7'"),
    ],
)
def test_bad_homes_are_one_line_errors(graph, homes, message):
    p = Placement.from_indices(graph, DEVICES, [1, 1, 1])
    p.param_homes = homes
    with pytest.raises(PlacerError, match=message):
        p.home_indices(graph)


@pytest.mark.parametrize(
    "value,message",
    [([], "param_homes must be an object"), ({"w": 0}, "param_homes.w must be a string"), ({"w": "tpu:0"}, "tpu")],
)
def test_a_file_with_bad_homes_is_rejected_when_read(graph, value, message):
    doc = Placement.from_indices(graph, DEVICES, [1, 1, 1]).to_dict()
    doc["param_homes"] = value
    with pytest.raises(PlacerError, match=message) as e:
        Placement.from_dict(doc, source="p.json")
    assert str(e.value).startswith("p.json") and "\n" not in str(e.value)


def test_homes_by_op_need_one_entry_per_op(graph):
    with pytest.raises(PlacerError, match="2 entries for 3 ops"):
        Placement.from_indices(graph, DEVICES, [1, 1, 1], homes=[0, 0])
    with pytest.raises(PlacerError, match="out of range"):
        Placement.from_indices(graph, DEVICES, [1, 1, 1], homes=np.array([2, -1, -1]))


def test_homes_and_a_schedule_round_trip_together(graph, tmp_path):
    p = Placement.from_indices(graph, DEVICES, [0, 1, 1], microbatches=4, schedule="1f1b", homes=[-1, 0, -1])
    p.save(tmp_path / "p.json")
    back = Placement.load(tmp_path / "p.json")
    assert back == p and back.schedule == "1f1b" and back.param_homes == {"v": "cpu:0"}
    doc = p.to_dict()
    del doc["schedule"], doc["param_homes"]  # a file from before either
    old = Placement.from_dict(doc)
    assert old.schedule is None and old.param_homes == {}


def test_a_plan_with_homes_records_how_its_copies_are_made_and_a_file_from_before_runs_as_it_was_planned(
    graph, tmp_path
):
    """New plans keep the forward's last copies for the backward ("keep-last", saved with the homes); a file with homes
    and without the field was planned when every copy was made again, and loads as "again"."""
    p = Placement.from_indices(graph, DEVICES, [1, 1, 1], homes=[0, -1, -1])
    assert p.home_copies == "keep-last" and p.to_dict()["home_copies"] == "keep-last"
    assert "home_copies" not in Placement.from_indices(graph, DEVICES, [1, 1, 1]).to_dict()  # no homes: as before
    doc = p.to_dict()
    del doc["home_copies"]  # a file from before 2026-12-06
    old = Placement.from_dict(doc)
    assert old.home_copies == "again" and old != p and old.to_dict()["home_copies"] == "again"
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert Placement.load(tmp_path / "old.json") == old
    doc["home_copies"] = "sometimes"
    with pytest.raises(PlacerError, match=r"^p\.json: home_copies 'sometimes': one of keep-last, again$"):
        Placement.from_dict(doc, source="p.json")
