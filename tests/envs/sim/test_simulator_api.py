"""The simulator's public surface: placement forms, Result fields, SimEnv.evaluate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import envs
from graphs import PlacerError
from graphs.plan import Placement
from graphs.synthetic import random_dag


@pytest.fixture(scope="module")
def setup():
    g = random_dag(80, seed=7)
    c = envs.Cluster.preset("v100x4")
    place = np.random.default_rng(0).integers(0, c.num_devices, g.num_ops)
    return g, c, place


def test_placement_forms_agree(setup):
    g, c, place = setup
    by_idx = envs.simulate(g, place, c)
    by_map = envs.simulate(g, {n: c.device_names[d] for n, d in zip(g.names, place)}, c)
    by_obj = envs.simulate(g, Placement.from_indices(g, c.device_names, place), c)
    assert by_idx.step_time_s == by_map.step_time_s == by_obj.step_time_s
    assert by_idx.status == "ok" and by_idx.source == "sim" and by_idx.message == ""
    assert set(by_idx.peak_bytes) == set(c.device_names)
    assert set(c.device_names) <= set(by_idx.busy_s) and any("->" in k for k in by_idx.busy_s)
    assert by_idx.extra["sim_step_time_s"] == by_idx.step_time_s and by_idx.extra["oom_devices"] == []


def test_evaluate_and_step_times_agree(setup):
    g, c, place = setup
    env = envs.SimEnv(g, c)
    P = np.stack([place, np.full(g.num_ops, 2), np.roll(place, 3)])
    results = env.evaluate(list(P))
    times, oom = env.step_times(P)
    assert [r.step_time_s for r in results] == times.tolist() and not oom.any()
    assert all(env.lower_bound() <= t for t in times)


def test_oom_result_contract(setup):
    g, c, place = setup
    doc = c.to_dict()
    doc["devices"][3]["memory_bytes"] = 1e3  # gpu:2
    small = envs.Cluster.from_dict(doc)
    place = place.copy()
    place[:10] = 3
    r = envs.simulate(g, place, small)
    assert r.status == "oom" and math.isinf(r.step_time_s) and not r.ok
    assert r.extra["oom_devices"] == ["gpu:2"] and "gpu:2" in r.message and "peak" in r.message
    assert r.peak_bytes["gpu:2"] > 1e3 and r.extra["sim_step_time_s"] < math.inf
    assert r.busy_s["gpu:2"] > 0
    assert r.to_dict()["step_time_s"] is None


def test_bad_placements(setup):
    g, c, place = setup
    with pytest.raises(PlacerError, match="out of range"):
        envs.simulate(g, np.full(g.num_ops, 9), c)
    with pytest.raises(PlacerError, match="no device"):
        envs.simulate(g, {n: "gpu:0" for n in g.names[1:]}, c)
    other = random_dag(80, seed=8)
    with pytest.raises(PlacerError, match="made for graph"):
        envs.simulate(g, Placement.from_indices(other, c.device_names, place), c)


def test_executor_is_chosen_and_reported(setup):
    g, c, place = setup
    eager = envs.simulate(g, place, c)
    dataflow = envs.simulate(g, place, c, executor="dataflow")
    assert eager.extra["executor"] == "eager" and dataflow.extra["executor"] == "dataflow"
    assert envs.SimEnv(g, c).executor == "eager"
    # the same graph and placement, two models: eager adds host dispatch and in-order streams
    assert eager.step_time_s != dataflow.step_time_s
    assert envs.SimEnv(g, c, executor="dataflow").step_times(place[None, :])[0][0] == dataflow.step_time_s
    with pytest.raises(PlacerError, match="executor"):
        envs.simulate(g, place, c, executor="TF")


def test_the_env_counts_every_placement_it_simulates_twins_included():
    g, c = random_dag(30, seed=2), envs.Cluster.preset("k80x2")
    env = envs.SimEnv(g, c)
    rows = np.zeros((5, g.num_ops), dtype=np.int32)
    assert env.simulated == 0
    env.step_times(rows)
    assert env.simulated == 5
    env.simulate(rows[0])
    env.schedule(rows[0])
    assert env.simulated == 7
    twin = env.with_microbatches(2)
    twin.step_times(rows[:3])
    assert env.simulated == twin.simulated == 10  # one count for the env and its twins
    env.step_times(rows[:2], order="planned")  # the planner's orders are not simulations; the two rows are
    assert env.simulated == 12
