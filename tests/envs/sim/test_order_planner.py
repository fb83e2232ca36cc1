"""The order planner (envs.sim.order_planner): candidate issue orders, the one it keeps, scoring in planned orders."""

from __future__ import annotations

import numpy as np
import pytest

import envs
from envs.sim.order_planner import InOrder, OrderPlanner
from envs.sim.simulator import SimEnv
from graphs import PlacerError
from graphs.plan import Placement
from graphs.synthetic import random_dag

BACKENDS = ["kernel", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_planner_issues_device_work_before_blocking_the_host(toy, backend):
    # c0 (cpu, 1) -> c1 (cpu, 10) and c0 -> g2 (gpu:0, 10) over 1 byte; no launch cost.
    # node order c0 c1 g2: c0 [0, 1]; c1 on the host [1, 11]; copy c0 -> gpu:0 [11, 12]; g2 [12, 22]; h_f = 11
    #   backward g2 c1 c0: g2 [22, 42]; c1 host [11, 31]; grad g2 -> cpu [42, 43]; c0 [43, 45]   -> 45
    # devices-first c0 g2 c1: c0 [0, 1]; copy [1, 2]; g2 [2, 12]; c1 [1, 11]; h_f = 11
    #   backward c1 g2 c0: c1 [11, 31]; g2 [12, 32]; grad [32, 33]; c0 [33, 35]                  -> 35
    # schedule (dataflow starts c0 0, c1 1, g2 2) is the node order again: 45.
    g = toy.graph(["c0", "c1", "g2"], [("c0", "c1", 1), ("c0", "g2", 1)], [1, 10, 10])
    env = SimEnv(g, toy.cluster(), backend=backend)
    place = [toy.CPU, toy.CPU, toy.G0]
    cands = OrderPlanner(env).candidates(place)
    assert {k: v.tolist() for k, v in cands.items()} == {
        "node": [0, 1, 2],
        "devices-first": [0, 2, 1],
        "schedule": [0, 1, 2],
    }
    assert env.simulate(place).step_time_s == 45.0
    order, name, step_time_s = OrderPlanner(env).plan(place)
    assert (order.tolist(), name, step_time_s) == ([0, 2, 1], "devices-first", 35.0)
    assert env.simulate(place, order=order).step_time_s == 35.0
    # judged under eager even from a dataflow env, where the order does not matter
    dataflow = SimEnv(g, toy.cluster(), backend=backend, executor="dataflow")
    assert OrderPlanner(dataflow).plan(place)[1] == "devices-first"
    # all on one GPU: nothing to gain, the node order is kept
    assert OrderPlanner(SimEnv(g, toy.cluster(), backend=backend)).plan([toy.G0] * 3)[1] == "node"


def test_the_env_delegates_to_its_planner_and_plans_a_placement_on_its_microbatch_twin():
    g, c = random_dag(30, seed=2), envs.Cluster.preset("k80x2")
    env = SimEnv(g, c)
    rows = np.random.default_rng(0).integers(0, c.num_devices, size=(3, g.num_ops))
    for row in rows:
        order, name, step_time_s = env.plan_order(row)
        np.testing.assert_array_equal(order, OrderPlanner(env).plan(row)[0])
        assert (name, step_time_s) == OrderPlanner(env).plan(row)[1:]
        np.testing.assert_array_equal(env.schedule_order(row), env.planner.candidates(row)["schedule"])
        assert env.with_executor("eager").step_times(row[None], order)[0][0] == step_time_s
    # a plan of 2 microbatches is judged on the env's twin for them
    plan = Placement.from_indices(g, c.device_names, rows[0], microbatches=2)
    twin = env.with_microbatches(2)
    assert env.plan_order(plan)[2] == twin.step_times(rows[0][None], env.plan_order(plan)[0])[0][0]
    assert env.plan_order(plan)[2] != env.plan_order(rows[0])[2]


def test_the_planners_own_schedule_is_not_counted_as_a_simulated_placement():
    g, c = random_dag(30, seed=2), envs.Cluster.preset("k80x2")
    env = SimEnv(g, c)
    env.planner.schedule_order(np.ones(g.num_ops, dtype=np.int64))
    assert env.simulated == 0
    env.planner.plan(np.ones(g.num_ops, dtype=np.int64))
    assert env.simulated == 3  # the three candidates, scored


def test_in_order_scores_each_row_in_its_planned_order_unless_the_caller_gives_one():
    g, c = random_dag(30, seed=2), envs.Cluster.preset("k80x2")
    env = SimEnv(g, c)
    rows = np.random.default_rng(1).integers(0, c.num_devices, size=(4, g.num_ops))
    planned = env.in_order("planned")
    assert isinstance(planned, InOrder) and env.in_order(None) is env
    step_time_s, _ = planned.step_times(rows)
    orders = np.stack([env.planner.schedule_order(row) for row in rows])
    np.testing.assert_array_equal(step_time_s, env.step_times(rows, orders)[0])
    np.testing.assert_array_equal(planned.step_times(rows, None)[0], step_time_s)
    np.testing.assert_array_equal(planned.overflow(rows)[0], step_time_s)
    node = np.arange(g.num_ops)
    np.testing.assert_array_equal(planned.step_times(rows, node)[0], env.step_times(rows)[0])
    assert planned.with_microbatches(2).env is env.with_microbatches(2)
    with pytest.raises(PlacerError, match="in_order"):
        env.in_order("node")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("microbatches", [1, 3])
def test_the_forward_starts_the_planner_reads_are_those_of_the_full_dataflow_schedule(backend, microbatches):
    """The planner reads the forward starts alone (the compiled executor gives them without the rest of the
    schedule: the planned order of a search's placement cost half as much); they are the full schedule's."""
    g, c = random_dag(60, seed=4), envs.Cluster.preset("k80x4")
    env = SimEnv(g, c, backend=backend, microbatches=microbatches, executor="dataflow")
    rng = np.random.default_rng(0)
    for op_devices in rng.integers(0, c.num_devices, (5, g.num_ops)):
        full = env.schedule(op_devices, count=False).fwd_start_s
        assert len(full) == g.num_ops * microbatches
        np.testing.assert_array_equal(env.forward_starts(op_devices), full)
    assert env.simulated == 0
    # an eager env's are its own schedule's
    eager = SimEnv(g, c, backend=backend, microbatches=microbatches)
    np.testing.assert_array_equal(eager.forward_starts(op_devices), eager.schedule(op_devices).fwd_start_s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_batch_s_planned_orders_sort_each_row_by_its_forward_start_then_host_last_then_node_order(
    backend, microbatches
):
    """The planned orders of a batch (one sort for all its rows) are, row by row, the ops sorted by their forward
    start in the full dataflow schedule (the first microbatch's), host ops after device ops at one start, then by
    index; a whole batch on the host ties every start it shares."""
    g, c = random_dag(50, seed=7), envs.Cluster.preset("k80x4")
    env = SimEnv(g, c, backend=backend, microbatches=microbatches)
    full = SimEnv(g, c, backend="reference", microbatches=microbatches, executor="dataflow")
    host = np.asarray(c.kinds) == "cpu"
    rng = np.random.default_rng(3)
    rows = rng.integers(0, c.num_devices, (6, g.num_ops))
    rows[0] = int(np.flatnonzero(host)[0])  # every op on the host
    rows[1] = int(np.flatnonzero(~host)[0])  # every op on one GPU
    got = env.planner.schedule_orders(rows)
    assert got.shape == rows.shape and got.dtype == np.int64
    for row, order in zip(rows, got):
        start = full.schedule(row, count=False).fwd_start_s[: g.num_ops]
        want = sorted(range(g.num_ops), key=lambda i: (start[i], host[row[i]], i))
        assert order.tolist() == want
        np.testing.assert_array_equal(env.schedule_order(row), order)
    assert env.simulated == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_at_one_forward_start_the_planned_order_issues_device_ops_before_host_ops(toy, backend):
    # h0 -> h1 on the host, d0 -> d1 on gpu:0, all of cost 1: h0 and d0 start at 0, h1 and d1 at 1; node order
    # h0 d0 h1 d1, planned d0 h0 d1 h1 (for each row of a batch)
    g = toy.graph(["h0", "d0", "h1", "d1"], [("h0", "h1", 1), ("d0", "d1", 1)], [1, 1, 1, 1])
    env = SimEnv(g, toy.cluster(), backend=backend)
    place = env.indices([toy.CPU, toy.G0, toy.CPU, toy.G0])
    assert env.planner.schedule_orders(np.stack([place, place])).tolist() == [[1, 0, 3, 2]] * 2
