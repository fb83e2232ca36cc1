"""The move critic pretrained across graphs: its file (tensors only, a sidecar), the search starting from it, and
that it ranks the moves of graphs of families it never saw."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

import envs
from graphs import PlacerError, save
from graphs.synthetic import FAMILIES as SYNTHETIC
from graphs.synthetic import moe_dag
from placer.gym.datasets import HELD_OUT_FAMILIES
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.pretrain_critic import FitOptions, Problem, collect, pretrain_critic, ranking_auc
from policies import policy_file
from policies.moves import NUM_FEATURES, MoveCritic
from policies.policy_file import load_critic


def test_a_critic_file_round_trips_and_holds_tensors_only(tmp_path):
    path = tmp_path / "critic.pt"
    critic = MoveCritic(8)
    policy_file.save_critic(path, critic, {"corpus": ["toy"], "seed": 0, "date": "today"})
    state = torch.load(path, weights_only=True)  # plain tensors: no pickled objects
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    loaded = policy_file.load_critic(path)
    x = torch.randn(5, NUM_FEATURES)
    assert torch.equal(loaded.critic(x), critic(x))
    assert loaded.sidecar["features"]["num_features"] == NUM_FEATURES


def test_a_bad_critic_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "critic.pt"
    policy_file.save_critic(path, MoveCritic(8), {"corpus": [], "seed": 0, "date": "today"})
    side = policy_file.sidecar_path(path)
    doc = json.loads(open(side).read())
    with open(side, "w") as f:
        json.dump({**doc, "features": {**doc["features"], "version": "move-features/0"}}, f)
    with pytest.raises(PlacerError, match="do not match this placer's move features"):
        policy_file.load_critic(path)
    torch.save({"net": MoveCritic(8)}, path)  # a pickled module: weights_only refuses it
    with open(side, "w") as f:
        json.dump(doc, f)
    with pytest.raises(PlacerError, match=str(path)):
        policy_file.load_critic(path)
    with pytest.raises(PlacerError, match="no such critic file"):
        policy_file.load_critic(tmp_path / "missing.pt")


def test_the_shipped_critic_loads_with_weights_only_and_never_saw_a_held_out_family():
    assert os.path.isfile(policy_file.DEFAULT_CRITIC), (
        "the pretrained critic is missing (python -m bench.critic_pretrain)"
    )
    state = torch.load(policy_file.DEFAULT_CRITIC, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    sidecar = policy_file.load_critic().sidecar
    held = {f"{d}/{f}" for d, fams in HELD_OUT_FAMILIES.items() for f in fams}
    assert set(sidecar["excluded"]) == held
    for name in sidecar["corpus"]:
        dataset, _, item = name.partition("/")
        family = item.split("-")[0] if dataset == "synthetic" else item
        assert family not in HELD_OUT_FAMILIES.get(dataset, ()), name


def _problem(family: str = "branches", ops: int = 80):
    return SYNTHETIC[family](ops, seed=3), envs.resolve_cluster("k80x4")


def test_a_pretrained_critic_ranks_from_the_first_round_and_fine_tunes_only_if_asked():
    graph, cluster = _problem()
    env = envs.SimEnv(graph, cluster)
    start = np.zeros(graph.num_ops, dtype=np.int64)
    options = MoveSearchOptions(adaptive=False, module_share=0, starts=0)
    fresh = MoveSearch(graph, cluster, env, options=options, seed=0)
    fresh.run(start, max_evals=options.batch + 1)
    assert fresh.tries[1] == 0  # an untrained critic waits for a round of moves
    for fine_tune in (True, False):
        critic = MoveCritic(8)
        before = [p.detach().clone() for p in critic.parameters()]
        o = dataclasses.replace(options, fine_tune=fine_tune)
        search = MoveSearch(graph, cluster, env, options=o, seed=0, critic=critic)
        search.run(start, max_evals=o.batch + 1)  # one round, as the fresh one above
        assert search.tries[1] > 0  # ranked moves from the first round
        changed = any(not torch.equal(a, b) for a, b in zip(before, search.critic.parameters()))
        assert changed == fine_tune


@pytest.mark.slow  # collects moves on four small graphs (~10 s)
def test_a_critic_pretrained_on_other_families_ranks_a_held_out_family_s_moves():
    problems = [
        Problem(f"synthetic/{f}-120-s{s}", lambda f=f, s=s: SYNTHETIC[f](120, seed=s), "k80x4")
        for f in ("moe", "unet")
        for s in (0, 1)
    ]
    critic, sidecar, report = pretrain_critic(problems, evals=600, options=FitOptions(hidden=16, steps=300))
    assert sidecar["corpus"] == sorted(p.name for p in problems)
    held = collect(*_problem("branches", 120), evals=600, seed=5)
    assert held.faster.sum() > 5
    torch.manual_seed(0)
    untrained = ranking_auc(MoveCritic(16), held)
    pretrained = ranking_auc(critic, held)
    assert pretrained > 0.65 and pretrained > untrained + 0.1
    assert np.median([a for a in report.auc.values() if a is not None]) > 0.65


def test_a_bad_critic_option_is_one_line_and_exit_2(tmp_path, capsys):
    from placer.cli import main

    not_torch = tmp_path / "critic.pt"
    not_torch.write_text("not a torch file")
    for critic, problem in ((str(tmp_path / "nope.pt"), "no such critic file"), (str(not_torch), "sidecar")):
        rc = main(["train", "moe-20", "--cluster", "k80x2", "--iterations", "1", "--critic", critic])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and critic in err and problem in err and len(err.splitlines()) == 1, err


def test_moves_are_collected_from_the_learned_search_on_request():
    graph, cluster = _problem()
    learned = collect(graph, cluster, evals=120, seed=2, search="learned")
    search = MoveSearch(graph, cluster, envs.SimEnv(graph, cluster), options=MoveSearchOptions(), seed=2)
    search.run(None, max_evals=120)
    n = search.replay.size
    assert n > 0 and search.tries[1] > 0  # the critic ranked some of them
    np.testing.assert_array_equal(learned.features, search.replay.features[:n])
    np.testing.assert_array_equal(learned.faster, search.replay.faster[:n])
    uniform = collect(graph, cluster, evals=120, seed=2)
    assert not np.array_equal(uniform.features, learned.features)  # the uniform search's, by default
    with pytest.raises(ValueError, match="unknown"):
        collect(graph, cluster, evals=10, search="critic")


def test_placer_train_starts_from_the_shipped_critic_unless_told_fresh(tmp_path, capsys, monkeypatch):
    from placer.cli import main
    from placer.learn import move_runner
    from placer.learn.runners import RUNNERS

    shipped = load_critic(None).critic.state_dict()
    seen = {}

    class Spy(move_runner.MoveRunner):
        def __init__(self, session, saved):
            super().__init__(session, saved)
            weights = {k: v.clone() for k, v in self.search.critic.state_dict().items()}  # before fine-tuning
            seen[session.config.critic_used] = (self.search.pretrained, weights)

    monkeypatch.setitem(RUNNERS, "moves", Spy)
    graph = tmp_path / "g.json"
    save(moe_dag(60, seed=0), str(graph))
    for extra in ([], ["--critic", "fresh"]):
        argv = [
            "train",
            str(graph),
            "--cluster",
            "k80x2",
            "--iterations",
            "1",
            "--heuristics",
            "m_etf",
            "--no-ablation",
        ]
        assert main([*argv, "--logdir", str(tmp_path / f"run{len(extra)}"), *extra]) == 0
    err = capsys.readouterr().err
    assert "moves ranked by the pretrained critic (fine-tuned as it goes)" in err
    assert "moves ranked by a fresh critic (learned as it goes)" in err
    pretrained, weights = seen["pretrained"]
    assert pretrained and all(torch.equal(weights[k], shipped[k]) for k in shipped)
    summaries = [json.loads((tmp_path / f"run{n}" / "summary.json").read_text())["critic"] for n in (0, 2)]
    assert summaries == ["pretrained", "fresh"]
    fresh, weights = seen["fresh"]
    assert not fresh and not all(torch.equal(weights[k], shipped[k]) for k in shipped)


@pytest.mark.parametrize(
    "options, used",
    [
        (dict(algo="moves"), "pretrained"),
        (dict(algo="moves", ranks=True), "fresh"),
        (dict(algo="moves", env="measured"), "fresh"),
        (dict(algo="corrected", env="measured"), "fresh"),
        (dict(algo="moves", critic="fresh"), "fresh"),
        (dict(algo="moves", ranks=True, critic="pretrained"), "pretrained"),
        (dict(algo="moves", critic="/some/critic.pt"), "/some/critic.pt"),
    ],
)
def test_critic_auto_is_pretrained_only_where_it_was_pretrained_and_measured(options, used):
    from placer.learn.config import TrainConfig
    from placer.learn.move_runner import search_options

    config = TrainConfig(**options)
    assert config.critic_used == used
    assert search_options(config).critic == (None if used == "fresh" else used)


def test_an_unknown_only_item_of_the_pretraining_names_the_option_it_came_from(capsys):
    from bench.critic_pretrain import main

    rc = main(["--only", "nmt-2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: --only: unknown nmt-2") and "zoo/nmt-2" in err, err
