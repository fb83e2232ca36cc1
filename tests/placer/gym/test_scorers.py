"""What scores an environment is interchangeable: a name, a SimEnv, any object of the scorer protocol, real steps."""

from __future__ import annotations

import textwrap

import gymnasium
import numpy as np
import pytest

import envs
import placer.gym
from envs.scorer import Scorer
from graphs import PlacerError
from graphs.synthetic import FAMILIES
from tests.conftest import importable_module

GRAPH = FAMILIES["moe"](40, seed=0)
CLUSTER = envs.resolve_cluster("k80x2")
ACTION = np.random.default_rng(5).integers(0, 3, size=GRAPH.num_ops)


class ProtocolOnly:
    """A scorer with the protocol and nothing else (a multi-process runner, say), counting what it scores."""

    def __init__(self, inner: Scorer) -> None:
        self.inner, self.scored = inner, 0

    def evaluate(self, placements):
        self.scored += len(placements)
        return self.inner.evaluate(placements)

    def step_times(self, op_devices, order=None):
        self.scored += len(op_devices)
        return self.inner.step_times(op_devices, order)


def _plain(info):
    return {k: v for k, v in info.items() if not isinstance(v, np.ndarray)}


def _step(scorer, **options):
    env = gymnasium.make("placer/PlaceAll-v0", graph=GRAPH, cluster=CLUSTER, groups=0, scorer=scorer, **options)
    env.reset()
    return env.step(ACTION)


@pytest.mark.parametrize("peak_memory", [True, False])
def test_a_name_a_simenv_and_a_protocol_object_give_the_same_step(peak_memory):
    by_name = _step("sim", peak_memory=peak_memory)
    by_object = _step(envs.SimEnv(GRAPH, CLUSTER), peak_memory=peak_memory)
    fake = ProtocolOnly(envs.SimEnv(GRAPH, CLUSTER))
    by_protocol = _step(fake, peak_memory=peak_memory)
    for other in (by_object, by_protocol):
        assert other[1] == by_name[1]
        assert _plain(other[4]) == _plain(by_name[4])
        assert np.array_equal(other[4]["op_devices"], by_name[4]["op_devices"])
    assert fake.scored == 3 + 1  # the three single-device placements of the reward scale, then the step
    assert ("peak_bytes" in by_protocol[4]) == peak_memory


def test_scorer_options_reach_the_named_scorer():
    eager = _step("sim")[4]["step_time_s"]
    dataflow = _step("sim", scorer_options={"executor": "dataflow"})[4]["step_time_s"]
    assert dataflow == envs.SimEnv(GRAPH, CLUSTER, executor="dataflow").simulate(ACTION).extra["sim_step_time_s"]
    assert dataflow != eager


def test_planned_order_needs_a_scorer_that_plans():
    with pytest.raises(PlacerError, match="plans no issue order"):
        _step(ProtocolOnly(envs.SimEnv(GRAPH, CLUSTER)), order="planned")


def test_env_scorer_needs_items_that_are_the_ops_and_the_environments_order():
    with pytest.raises(PlacerError, match="groups=0"):
        placer.gym.EnvScorer(placer.gym.PlaceAllEnv(GRAPH, CLUSTER))
    scorer = placer.gym.EnvScorer(placer.gym.PlaceAllEnv(GRAPH, CLUSTER, groups=0))
    assert isinstance(scorer, Scorer)
    with pytest.raises(PlacerError, match="scores in 'node' order"):
        scorer.step_times(ACTION[None], order="planned")
    (result,) = scorer.evaluate([ACTION])
    assert result.step_time_s == envs.SimEnv(GRAPH, CLUSTER).simulate(ACTION).step_time_s


@pytest.mark.slow  # real training steps (torch.export, a few Adam steps) in this process
def test_real_training_steps_in_this_process_score_the_same_environment(tmp_path, monkeypatch):
    importable_module(
        tmp_path,
        monkeypatch,
        "tinymodels",
        textwrap.dedent(
            """
            import torch

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)

                def forward(self, x):
                    return self.b(torch.relu(self.a(x))).square().mean()

            def build():
                torch.manual_seed(0)
                return Net(), (torch.randn(8, 16),)
            """
        ),
    )
    options = {"device_map": "*=cpu", "warmup_steps": 1, "timed_steps": 2}
    env = gymnasium.make(
        "placer/PlaceAll-v0", graph="tinymodels:build", cluster="k80x2", scorer="local", scorer_options=options
    )
    env.reset(seed=0)
    n = env.unwrapped.num_items
    _, reward, terminated, _, info = env.step(np.arange(n) % 3)  # every device
    assert terminated and info["status"] == "ok" and info["step_time_s"] > 0 and reward < 0
    assert type(env.unwrapped.problem.scorer).__name__ == "LocalEnv"
    assert set(info["peak_bytes"]) == {"cpu:0", "gpu:0", "gpu:1"} and n >= 3
    env.close()
