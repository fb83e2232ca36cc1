"""The three Gymnasium views: check_env, the reward rule, what info carries, reproducible resets, bad actions."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
import placer.gym
from graphs import PlacerError
from graphs.synthetic import FAMILIES, random_dag
from placer.learn.algos import reward as reinforce_reward

GRAPH = FAMILIES["moe"](40, seed=0)  # 57 ops, 57 co-location groups
CLUSTER = envs.resolve_cluster("k80x2")


@pytest.fixture(scope="module")
def sim():
    return envs.SimEnv(GRAPH, CLUSTER)


@pytest.mark.parametrize("env_id", sorted(placer.gym.ENV_IDS))
@pytest.mark.parametrize(
    "options", [{}, {"flatten": True}, {"groups": 8, "max_items": 12, "max_edges": 40}, {"groups": 0}]
)
def test_check_env_passes_on_every_view(env_id, options):
    env = gymnasium.make(env_id, graph=GRAPH, cluster=CLUSTER, **options)
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", sorted(placer.gym.ENV_IDS))
def test_no_two_observations_share_an_array(env_id):
    """A user keeps the observations: changing one must not change another (gymnasium >= 1.4's check_env asks)."""
    env = gymnasium.make(env_id, graph=GRAPH, cluster=CLUSTER).unwrapped
    first, _ = env.reset(seed=0)
    second = env.step(env.action_space.sample())[0]
    third, _ = env.reset(seed=0)
    for a, b in [(first, second), (first, third), (second, third)]:
        for key in a:
            assert not np.shares_memory(a[key], b[key]), key


def test_every_id_is_registered_and_makes_its_class():
    for env_id, cls in placer.gym.ENV_IDS.items():
        assert isinstance(gymnasium.make(env_id, graph=GRAPH, cluster=CLUSTER).unwrapped, cls)


def test_place_all_scores_the_placement_as_the_simulator_does(sim):
    env = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, groups=0)
    env.reset(seed=0)
    action = np.random.default_rng(3).integers(0, CLUSTER.num_devices, size=GRAPH.num_ops)
    _, reward, terminated, truncated, info = env.step(action)
    result = sim.simulate(action)
    assert (terminated, truncated) == (True, False)
    assert info["step_time_s"] == result.extra["sim_step_time_s"] and info["failed"] == (not result.ok)
    assert info["peak_bytes"] == result.peak_bytes and info["status"] == result.status
    assert np.array_equal(info["op_devices"], action)
    t_ref = env.unwrapped.problem.t_ref
    assert t_ref == min(sim.step_times(np.repeat(np.arange(3)[:, None], GRAPH.num_ops, axis=1).astype(np.int32))[0])
    expected = reinforce_reward(np.array([info["step_time_s"]]), np.array([info["failed"]]), t_ref, 10.0)[0]
    assert reward == expected


def test_a_placement_out_of_memory_gets_the_failing_reward():
    big = random_dag(30, seed=0, max_bytes=8 << 30, param_fraction=1.0)  # more than a K80 holds
    env = gymnasium.make("placer/PlaceAll-v0", graph=big, cluster=CLUSTER, groups=0, fail_factor=4.0)
    env.reset()
    _, reward, _, _, info = env.step(np.ones(30, dtype=np.int64))
    assert info["failed"] and info["status"] == "oom" and reward == -2.0  # -sqrt(4)


def test_groups_expand_to_every_op_of_the_group():
    env = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, groups=5)
    problem = env.unwrapped.problem
    env.reset()
    action = np.array([0, 1, 2, 1, 0])
    _, _, _, _, info = env.step(action)
    assert np.array_equal(info["op_devices"], action[problem.grouping.op_group])


def test_sequential_view_places_one_item_a_step_and_scores_at_the_end():
    seq = gymnasium.make("placer/PlaceSequential-v0", graph=GRAPH, cluster=CLUSTER, groups=6)
    every = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, groups=6)
    devices = [1, 2, 2, 0, 1, 2]
    obs, _ = seq.reset(seed=0)
    assert obs["cursor"] == 0 and (obs["placement"] == CLUSTER.num_devices).all()
    for k, d in enumerate(devices):
        obs, reward, terminated, _, info = seq.step(d)
        assert terminated == (k == len(devices) - 1)
        if not terminated:
            assert reward == 0.0 and obs["cursor"] == k + 1 and obs["placement"][k] == d
    every.reset()
    _, reward_all, _, _, info_all = every.step(np.array(devices))
    assert reward == reward_all and info["step_time_s"] == info_all["step_time_s"]


def test_move_view_rewards_the_change_and_truncates_after_max_moves():
    env = gymnasium.make("placer/MoveItem-v0", graph=GRAPH, cluster=CLUSTER, groups=6, max_moves=3)
    problem = env.unwrapped.problem
    _, start = env.reset(seed=0)
    assert len(set(start["item_devices"].tolist())) == 1  # every item on the fastest single device
    total, last = 0.0, None
    for k, move in enumerate([(0, 2), (3, 1), (5, 0)]):
        _, reward, terminated, truncated, last = env.step(np.array(move))
        total += reward
        assert not terminated and truncated == (k == 2)
    final = problem.reward(problem.score(last["op_devices"]))
    assert total == pytest.approx(final - problem.reward(problem.score(start["op_devices"])), abs=1e-12)
    with pytest.raises(PlacerError, match="call reset"):
        env.unwrapped.step(np.array([0, 0]))


def test_reset_with_a_seed_is_reproducible():
    env = gymnasium.make("placer/MoveItem-v0", graph=GRAPH, cluster=CLUSTER, start="random")
    a = env.reset(seed=7)[1]["item_devices"]
    b = env.reset(seed=8)[1]["item_devices"]
    c = env.reset(seed=7)[1]["item_devices"]
    assert np.array_equal(a, c) and not np.array_equal(a, b)


def test_a_heuristic_start_is_its_placement_voted_onto_the_items():
    from placer.methods import place

    env = gymnasium.make("placer/MoveItem-v0", graph=GRAPH, cluster=CLUSTER, groups=0, start="m_etf")
    _, info = env.reset()
    want = place("m_etf", GRAPH, CLUSTER).indices(GRAPH, CLUSTER.device_names)
    assert np.array_equal(info["op_devices"], want)


def test_flat_observation_is_the_dict_flattened():
    flat = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, flatten=True).unwrapped
    plain = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER).unwrapped
    got, want = flat.reset()[0], plain.reset()[0]
    assert got.dtype == np.float32 and np.allclose(got, gymnasium.spaces.flatten(plain.observation_space, want))


def test_padding_marks_the_real_items_and_ignores_the_padding_actions():
    env = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, groups=4, max_items=10, max_edges=20)
    obs, _ = env.reset()
    assert obs["mask"].tolist() == [1] * 4 + [0] * 6 and (obs["items"][4:] == 0).all()
    assert (obs["edges"][env.unwrapped.problem.items_graph.num_edges :] == -1).all()
    _, _, _, _, info = env.step(np.array([1, 2, 1, 2] + [0] * 6))
    assert info["item_devices"].tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize(
    "env_id, action",
    [
        ("placer/PlaceAll-v0", np.full(57, 3)),  # device 3 of 3
        ("placer/PlaceAll-v0", np.ones(5)),  # too few entries
        ("placer/PlaceAll-v0", np.full(57, 1.0)),  # not integers
        ("placer/PlaceSequential-v0", -1),
        ("placer/MoveItem-v0", np.array([57, 0])),  # item 57 of 57
    ],
)
def test_an_action_out_of_range_is_one_placer_error(env_id, action):
    env = gymnasium.make(env_id, graph=GRAPH, cluster=CLUSTER)
    env.reset()
    with pytest.raises(PlacerError) as e:
        env.unwrapped.step(action)
    assert "is not in the action space" in str(e.value) and "\n" not in str(e.value)


def test_a_step_before_reset_is_one_placer_error():
    env = placer.gym.PlaceAllEnv(GRAPH, CLUSTER)
    with pytest.raises(PlacerError, match="call reset"):
        env.step(np.zeros(57, dtype=np.int64))


def test_to_placement_saves_what_was_scored(tmp_path):
    from graphs.plan import Placement

    env = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, order="planned")
    env.reset()
    _, _, _, _, info = env.step(env.action_space.sample())
    placement = env.unwrapped.to_placement(info["op_devices"])
    placement.save(tmp_path / "p.json")
    loaded = Placement.load(tmp_path / "p.json")
    r = envs.simulate(GRAPH, loaded, CLUSTER)
    assert r.extra["sim_step_time_s"] == info["step_time_s"] and loaded.order is not None


@pytest.mark.slow  # captures nmt-2 (the test session's cache)
@pytest.mark.parametrize("env_id", sorted(placer.gym.ENV_IDS))
def test_every_id_made_with_no_arguments_is_the_papers_problem_and_passes_check_env(env_id, zoo_cache):
    env = gymnasium.make(env_id)
    problem = env.unwrapped.problem
    assert (problem.graph.name, problem.cluster.name, problem.num_items) == ("nmt-2", "k80x4", 100)
    check_env(env.unwrapped, skip_render_check=True)
