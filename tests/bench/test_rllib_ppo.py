"""The RLlib recipe: a short PPO run on a local Ray, its help, and bad input as one line with exit status 2."""

from __future__ import annotations

import json
import math

import pytest

from bench import rllib_ppo
from graphs.synthetic import random_dag
from placer.gym.problem import Problem

TINY = ["--graph", "synthetic/moe-40-s0", "--cluster", "k80x2"]


@pytest.mark.slow  # starts Ray (num_cpus=2) and two env runners, trains two PPO iterations
def test_ppo_trains_on_a_local_ray_with_two_env_runners(capsys):
    import ray

    argv = [*TINY, "--env-runners", "2", "--iterations", "2", "--batch", "32", "--minibatch", "16", "--epochs", "1"]
    assert rllib_ppo.main([*argv, "--hidden", "32", "--num-cpus", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not ray.is_initialized()  # shut down after
    assert [row["iteration"] for row in report["iterations"]] == [1, 2] and report["placements"] == 64
    problem = Problem("synthetic/moe-40-s0", "k80x2", peak_memory=False)
    assert report["t_ref_s"] == problem.t_ref
    best = report["best_step_time_s"]
    assert best is not None and best >= problem.scorer.lower_bound()
    top = max(row["episode_return_max"] for row in report["iterations"])
    assert best == pytest.approx(top**2 * problem.t_ref, rel=1e-12)
    assert report["greedy_step_time_s"] is None or report["greedy_step_time_s"] >= problem.scorer.lower_bound()
    assert report["command"].startswith("python -m bench.rllib_ppo --graph synthetic/moe-40-s0")


def test_a_return_reads_back_as_the_step_time_of_its_placement():
    problem = Problem(random_dag(12, seed=0), "k80x2", groups=0, peak_memory=False)
    outcome = problem.score(problem.expand([1] * 12))
    assert rllib_ppo.step_time_of(problem.reward(outcome), problem) == pytest.approx(outcome.step_time_s, rel=1e-12)
    assert rllib_ppo.step_time_of(-math.sqrt(problem.fail_factor), problem) is None
    assert rllib_ppo.step_time_of(None, problem) is None


def test_help_says_what_it_does_and_how_to_join_a_cluster(capsys):
    with pytest.raises(SystemExit) as e:
        rllib_ppo.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--ray-address" in out and "python -m bench.rllib_ppo --graph nmt-2" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env-runners", "0"], "--env-runners 0: give at least 1"),
        (["--minibatch", "512"], "--minibatch 512: larger than --batch 256"),
        (["--hidden", "wide"], "--hidden 'wide'"),
        (["--lr", "-1"], "--lr -1.0"),
        (["--graph", "nope/x"], "unknown dataset 'nope'"),
        (["--cluster", "missing.json"], "missing.json: no such file"),
        (["--env", "placer/Nope-v0"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(argv, message, capsys):
    code = None
    try:
        code = rllib_ppo.main([*TINY, *argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
