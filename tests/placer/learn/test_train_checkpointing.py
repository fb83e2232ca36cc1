"""``placer train --checkpointing``: the run's placements checkpoint the layers they keep whole, and its best
placement file keeps those that pay (placer.learn.run_scorers.checkpointing_blocks, placer.learn.rundir)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import envs
import graphs.io
from graphs import PlacerError
from graphs.plan import Placement
from placer.cli import main
from placer.learn.checkpoint_moves import BlockCodes
from placer.learn.home_moves import HomeCodeScorer
from placer.learn.rundir import BEST_NAME
from placer.learn.runners import train
from tests.placer.learn.test_checkpoint_choice import GPU, activation_problem, on_gpu
from tests.placer.learn.tiny_runs import train_config


def tight():
    """The activation problem on a GPU that holds the plan with every layer checkpointed, not the plain one."""
    g, big = activation_problem()
    env = envs.SimEnv(g, big)
    names = [f"layers.{k}" for k in range(6)]
    plain, every = env.simulate(on_gpu(g, big)), env.simulate(on_gpu(g, big, names))
    return activation_problem((plain.peak_bytes["gpu:0"] + every.peak_bytes["gpu:0"]) / 2)


def fastest_on_gpu(g, cluster):
    """The fastest plan with every op on the GPU that fits, over every subset of the six layers checkpointed."""
    env = envs.SimEnv(g, cluster)
    names = [f"layers.{k}" for k in range(6)]
    subsets = [sub for k in range(7) for sub in itertools.combinations(names, k)]
    return min(r.step_time_s for sub in subsets if (r := env.simulate(on_gpu(g, cluster, sub))).ok)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_run_s_moves_checkpoint_the_fastest_set_of_layers_that_lets_the_model_run_on_the_gpu(tmp_path):
    g, cluster = tight()
    runs = {}
    for mode in ("on", "off"):
        config = train_config(tmp_path / mode, algo="moves", iterations=30, heuristics=None, checkpointing=mode)
        runs[mode] = train(config, graph=g, cluster=cluster)
    best = Placement.load(str(tmp_path / "on" / "run" / BEST_NAME))
    assert best.indices(g, cluster.device_names).tolist() == [GPU] * g.num_ops and 0 < len(best.checkpoint) < 6
    result = envs.SimEnv(g, cluster).simulate(best)  # the file's plan, as placer.apply runs it
    assert result.ok and result.step_time_s == pytest.approx(best.meta["issue_order_step_time_s"], rel=1e-9)
    # the checkpoint moves chose the fastest set themselves: nothing left for the pruning at the end
    assert result.step_time_s == pytest.approx(fastest_on_gpu(g, cluster), rel=1e-9)
    assert best.meta["checkpoint_pruned"]["from"] == len(best.checkpoint)
    assert runs["on"].best_step_time_s == pytest.approx(result.step_time_s, rel=1e-9)
    assert runs["on"].checkpointing_searched and not runs["off"].checkpointing_searched
    # a planned issue order interleaves layers' ops (none could be checkpointed so): a run that checkpoints scores in
    # node order
    assert runs["on"].score_order == "node" and runs["off"].score_order == "planned"
    # without checkpointing, the plans that fit run layers on the host
    off = Placement.load(str(tmp_path / "off" / "run" / BEST_NAME))
    assert not off.checkpoint and runs["off"].best_step_time_s > 5 * result.step_time_s


def test_a_policy_s_placements_checkpoint_every_layer_and_its_file_keeps_those_that_pay(tmp_path):
    from placer.learn.rundir import run_placement

    g, cluster = tight()
    env = envs.SimEnv(g, cluster)
    names = [f"layers.{k}" for k in range(6)]
    config = train_config(tmp_path, algo="reinforce", checkpointing="on")
    p = run_placement(g, cluster.device_names, cluster, config, [GPU] * g.num_ops, "x", {}, env, None, names, 42)
    assert p.meta["checkpoint_pruned"]["from"] == 6 and 0 < len(p.checkpoint) < 6
    assert env.simulate(p).ok and env.simulate(p).step_time_s < env.simulate(on_gpu(g, cluster, names)).step_time_s


def test_auto_follows_the_homes_and_on_is_refused_where_blocks_cannot_be(tmp_path):
    g, big = activation_problem()  # fits the GPU: no homes, no checkpointing
    train(train_config(tmp_path / "roomy", algo="moves", iterations=3, heuristics=None), graph=g, cluster=big)
    assert not Placement.load(str(tmp_path / "roomy" / "run" / BEST_NAME)).checkpoint
    for fields, message in (
        (dict(env="measured"), "--checkpointing on: --env measured"),
        (dict(ranks=True), "--checkpointing on: --ranks"),
        (dict(microbatches=2), "--checkpointing on: --microbatches 2"),
        (dict(executor="dataflow"), "--checkpointing on: --executor dataflow"),
    ):
        with pytest.raises(PlacerError, match=message):
            train_config(tmp_path, checkpointing="on", iterations=1, **fields).validate()
    g.module_paths = [""] * g.num_ops
    with pytest.raises(PlacerError, match="--checkpointing on: activation-toy has no repeated list of layers"):
        train(train_config(tmp_path / "n", algo="moves", iterations=1, checkpointing="on"), graph=g, cluster=big)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_placer_train_says_what_it_checkpointed(tmp_path, capsys):
    g, cluster = tight()
    graph_path, cluster_path = tmp_path / "g.json", tmp_path / "c.json"
    graphs.io.save(g, str(graph_path))
    cluster_path.write_text(json.dumps(cluster.to_dict()))
    argv = ["train", str(graph_path), "--cluster", str(cluster_path), "--iterations", "20", "--no-progress"]
    assert main([*argv, "--logdir", str(tmp_path / "a"), "--checkpointing", "on"]) == 0
    out = capsys.readouterr().out
    assert "checkpointing    " in out and "run their forward again in the backward" in out
    assert main([*argv, "--logdir", str(tmp_path / "b"), "--checkpointing", "on", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpointing"]["searched"] and doc["checkpointing"]["blocks"]
    assert main([*argv, "--logdir", str(tmp_path / "c"), "--checkpointing", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpointing"] == {"searched": False, "blocks": []}


def test_a_run_that_keeps_every_activation_does_not_adopt_a_best_file_with_checkpointed_layers(tmp_path):
    from placer.learn.rundir import adopt_newer_best
    from placer.learn.state import RunState

    g, big = activation_problem()
    env = envs.SimEnv(g, big)
    p = on_gpu(g, big, ["layers.0"])
    p.meta = {"env": "sim"}
    p.save(str(tmp_path / BEST_NAME))
    kept, skipped = RunState(), RunState()
    adopt_newer_best(kept, str(tmp_path), g, big.device_names, env.step_times, blocks=["layers.0", "layers.1"])
    adopt_newer_best(skipped, str(tmp_path), g, big.device_names, env.step_times)
    assert kept.best_indices == [GPU] * g.num_ops and skipped.best_indices is None
    # a run with checkpoint moves reads the file's layers back into its codes' bits
    codes = BlockCodes(g, ["layers.0", "layers.1"], None, big.num_devices)
    coded = RunState()
    score = HomeCodeScorer(env, codes).step_times
    adopt_newer_best(coded, str(tmp_path), g, big.device_names, score, codes=codes, blocks=codes.names_all)
    assert codes.names(np.asarray(coded.best_indices)) == ["layers.0"]
    assert coded.best_step_time_s == pytest.approx(env.simulate(p).step_time_s, rel=1e-9)
