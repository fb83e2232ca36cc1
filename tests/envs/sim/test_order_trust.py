"""The planner keeps an issue order only where its predicted gain beats the margin that orders run for real measured."""

from __future__ import annotations

import pytest

from envs.real.profiler import apply_profile, check_profile
from envs.sim.order_trust import ORDER_MARGIN_META, order_margin, trust_record
from envs.sim.simulator import MODEL_VERSION, SimEnv
from graphs import PlacerError


def planner_case(toy):
    # c0 (cpu, 1) -> c1 (cpu, 10) and c0 -> g2 (gpu:0, 10): node order 45, devices-first 35 (test_eager's hand schedule)
    g = toy.graph(["c0", "c1", "g2"], [("c0", "c1", 1), ("c0", "g2", 1)], [1, 10, 10])
    return g, [toy.CPU, toy.CPU, toy.G0]


def profile_with(graph, record) -> dict:
    return {
        "format": "placer-profile/1",
        "graph_hash": graph.content_hash,
        "ops": graph.names,
        "devices": {},
        "links": [],
        "order_trust": record,
    }


def test_an_order_is_kept_only_where_its_gain_beats_the_margin(toy):
    g, place = planner_case(toy)
    c = toy.cluster()
    assert SimEnv(g, c).planner.plan(place)[1:] == ("devices-first", 35.0)  # 35 / 45 = 0.78: a gain of 22%
    assert SimEnv(g, c, order_margin=0.2).planner.plan(place)[1] == "devices-first"
    order, name, t = SimEnv(g, c, order_margin=0.25).planner.plan(place)
    assert (order.tolist(), name, t) == ([0, 1, 2], "node", 45.0)
    assert (
        SimEnv(g, c, order_margin=0.25, executor="dataflow").planner.plan(place)[1] == "node"
    )  # its eager twin keeps it


def test_a_profiles_record_reaches_the_planner_for_its_own_model_only(toy):
    g, place = planner_case(toy)
    # the checks: an order predicted 3% faster ran 14.3% slower; another was right
    checks = [
        {"model": "nmt-4", "placement": "heft", "order": "schedule", "sim_ratio": 0.97, "real_ratio": 1.143},
        {"model": "rnnlm", "placement": "heft", "order": "devices-first", "sim_ratio": 0.83, "real_ratio": 0.80},
    ]
    record = trust_record(checks, MODEL_VERSION)
    assert record["margin"] == pytest.approx(0.173) == order_margin(checks)
    prof = profile_with(g, record)
    check_profile(prof)
    gp = apply_profile(g, prof)
    assert gp.meta[ORDER_MARGIN_META] == pytest.approx(0.173)
    assert SimEnv(gp, toy.cluster()).planner.plan(place)[1] == "devices-first"  # 22% beats 17.3%
    record["margin"] = 0.3
    assert SimEnv(apply_profile(g, profile_with(g, record)), toy.cluster()).planner.plan(place)[1] == "node"
    old = trust_record(checks, MODEL_VERSION - 1)  # measured against another simulator model: not used
    old["margin"] = 0.3
    assert ORDER_MARGIN_META not in apply_profile(g, profile_with(g, old)).meta


@pytest.mark.parametrize(
    "record, match",
    [
        ({"format": "placer-order-trust/1", "model_version": 4, "margin": -0.1}, "margin"),
        ({"format": "placer-order-trust/1", "model_version": 4, "margin": "big"}, "margin"),
        ({"format": "placer-order-trust/1", "margin": 0.1}, "model_version"),
        ({"format": "something-else/1", "model_version": 4, "margin": 0.1}, "format"),
    ],
)
def test_a_malformed_record_is_a_one_line_error(toy, record, match):
    g, _ = planner_case(toy)
    with pytest.raises(PlacerError, match=match) as e:
        check_profile(profile_with(g, record), source="p.json")
    assert str(e.value).startswith("p.json: order_trust") and "\n" not in str(e.value)
