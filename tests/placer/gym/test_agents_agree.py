"""Agents run through the environment agree with placer's own commands on the same graph and budget.

* a heuristic's placement stepped through ``placer/PlaceAll-v0`` scores what ``placer compare`` prints;
* placer's REINFORCE scored through the environment (:class:`placer.gym.EnvScorer`) reproduces
  ``placer train --algo reinforce`` with the same seed and iterations;
* the random agent's best placement scores, under ``placer simulate``, what the agent reported.
"""

from __future__ import annotations

import json

import gymnasium
import numpy as np
import pytest

import envs
import placer.gym  # noqa: F401  (registers the environments)
from bench import gym_agents
from graphs import io
from graphs.synthetic import FAMILIES
from placer.cli import main
from placer.methods import place

GRAPH = FAMILIES["moe"](40, seed=0)
CLUSTER = "k80x2"


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "moe.json"
    io.save(GRAPH, path)
    return str(path)


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_heuristic_through_the_env_scores_its_compare_row(graph_file, capsys):
    methods = ["m_etf", "m_topo", "round_robin"]
    report = _json(capsys, ["compare", graph_file, "--cluster", CLUSTER, "--methods", ",".join(methods), "--json"])
    rows = {r["method"]: r for r in report["rows"]}
    env = gymnasium.make("placer/PlaceAll-v0", graph=graph_file, cluster=CLUSTER, groups=0)
    cluster = envs.resolve_cluster(CLUSTER)
    for method in methods:
        env.reset()
        op_devices = place(method, GRAPH, cluster).indices(GRAPH, cluster.device_names)
        _, _, _, _, info = env.step(op_devices.astype(np.int64))
        assert info["step_time_s"] == rows[method]["step_time_s"], method
        assert info["peak_bytes"] == rows[method]["peak_bytes"], method
    assert env.unwrapped.problem.scorer.lower_bound() == report["lower_bound_s"]


@pytest.mark.slow  # trains a policy twice
@pytest.mark.parametrize("score_order", ["planned", "node"])
def test_reinforce_through_the_env_reproduces_placer_train(graph_file, tmp_path, capsys, score_order):
    common = ["--cluster", CLUSTER, "--iterations", "4", "--samples", "4", "--seed", "3", "--heuristics", "m_topo"]
    reference = _json(
        capsys,
        ["train", graph_file, "--algo", "reinforce", *common, "--score-order", score_order]
        + ["--logdir", str(tmp_path / "cli"), "--no-progress", "--no-equal-budget-search", "--json"],
    )
    argv = ["reinforce", "--graph", graph_file, *common, "--score-order", score_order]
    assert gym_agents.main([*argv, "--logdir", str(tmp_path / "gym"), "--json"]) == 0
    through_env = json.loads(capsys.readouterr().out)
    for key in ("best_step_time_s", "policy_step_time_s", "found_by", "iterations", "reference_step_time_s"):
        assert through_env[key] == reference[key], key
    assert through_env["heuristics"] == reference["heuristics"]
    best_cli = json.loads((tmp_path / "cli" / "best_placement.json").read_text())
    best_gym = json.loads((tmp_path / "gym" / "best_placement.json").read_text())
    assert best_gym["assignment"] == best_cli["assignment"] and best_gym.get("order") == best_cli.get("order")


def test_the_random_agents_best_scores_the_same_under_placer_simulate(graph_file, tmp_path, capsys):
    out = tmp_path / "best.json"
    argv = ["random", "--graph", graph_file, "--cluster", CLUSTER, "--placements", "30", "--seed", "4"]
    assert gym_agents.main([*argv, "--placement-out", str(out), "--json"]) == 0
    agent = json.loads(capsys.readouterr().out)
    simulated = _json(capsys, ["simulate", graph_file, str(out), "--cluster", CLUSTER, "--json"])
    assert simulated["step_time_s"] == agent["best_step_time_s"] and agent["placements"] == 30
    # the same seed draws the same placements
    assert gym_agents.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best_step_time_s"] == agent["best_step_time_s"]
