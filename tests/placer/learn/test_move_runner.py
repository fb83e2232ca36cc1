"""``placer train --algo moves``: the move search as the run's learner, what it records, and a resumed run's count."""

from __future__ import annotations

import json
import os

import pytest

import envs
from graphs import save
from graphs.synthetic import moe_dag, recurrent_dag
from placer import Placement
from placer.cli import main
from placer.learn.config import TrainConfig
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.runners import train
from placer.learn.state import MODULE_SHARE, MOVE_SEARCH


@pytest.mark.slow
def test_train_algo_moves_beats_its_start_and_reports_the_equal_budget_search(tmp_path):
    g, c = recurrent_dag(150, seed=1), envs.Cluster.preset("k80x4")
    config = TrainConfig(
        algo="moves",
        iterations=60,
        logdir=str(tmp_path / "run"),
        progress=False,
        heuristics=("m_etf", "expert", "single"),
    )
    r = train(config, graph=g, cluster=c)
    bh = r.best_heuristic
    assert r.iterations == 60 and r.best_step_time_s < bh[1] and r.warm_start == f"move search from {bh[0]}"
    p = Placement.load(os.path.join(r.logdir, "best_placement.json"))
    assert envs.SimEnv(g, c).simulate(p, order=None).step_time_s == pytest.approx(r.best_step_time_s)
    eq = json.loads((tmp_path / "run" / "summary.json").read_text())["equal_budget_search"]
    # every distinct placement the run simulated: 60 rounds of a batch of moves, its start, draws and kicks, a few
    # repeats
    b = MoveSearchOptions().batch
    assert eq["method"] == "module_search" and 0.8 * 60 * b <= eq["simulated"] <= 60 * b + 40 and eq["step_time_s"] > 0
    # the heuristics' own simulations count too: m_etf and expert scored once, single one per GPU and its scoring
    assert eq["heuristics_simulated"] == 1 + 1 + len(c.gpu_indices()) + 1 and eq["evals"] == eq["simulated"]
    # resumed, it continues from the best placement so far and never reports a slower one
    r2 = train(TrainConfig(**{**vars(config), "iterations": 80, "resume": True}), graph=g, cluster=c)
    assert r2.iterations == 80 and r2.best_step_time_s <= r.best_step_time_s


@pytest.mark.slow
def test_placer_train_uses_the_move_search_unless_a_policy_is_given(tmp_path, capsys):
    path = tmp_path / "g.json"
    save(moe_dag(60, seed=0), str(path))
    for extra, algo in (([], "moves"), (["--proposals", "uniform"], "moves"), (["--policy", "seq2seq"], "reinforce")):
        logdir = tmp_path / f"run-{len(extra)}-{algo}"
        rc = main(
            [
                "train",
                str(path),
                "--cluster",
                "k80x2",
                "--iterations",
                "3",
                "--logdir",
                str(logdir),
                "--json",
                "--no-progress",
                "--heuristics",
                "m_etf",
                *extra,
            ]
        )
        doc = json.loads(capsys.readouterr().out)
        assert rc == 0 and json.loads((logdir / "checkpoint.json").read_text())["config"]["algo"] == algo
        assert doc["equal_budget_search"]["method"] == "module_search"
    rc = main(
        [
            "train",
            str(path),
            "--cluster",
            "k80x2",
            "--iterations",
            "1",
            "--proposals",
            "best",
            "--logdir",
            str(tmp_path / "bad"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--proposals" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("budget", [pytest.param("time", marks=pytest.mark.slow), "iterations"])  # a 3 s budget
def test_placer_train_gives_module_search_its_share_of_the_time_left(tmp_path, monkeypatch, budget):
    """With a time budget, the move search's first round runs module_search for module_share of the time left,
    through the run's scorer (which cannot say how far over capacity a placement is); without one, not at all."""
    from placer.learn.session import RunScorer

    seen, found_by = [], set()
    phase = MoveSearch._module_phase
    monkeypatch.setattr(
        MoveSearch,
        "_module_phase",
        lambda self, n, s, module_s: (seen.append(module_s), phase(self, n, s, module_s))[1],
    )
    times = RunScorer.step_times
    monkeypatch.setattr(
        RunScorer, "step_times", lambda self, rows, order=None: (found_by.add(self.source), times(self, rows, order))[1]
    )
    g, c = recurrent_dag(150, seed=1), envs.Cluster.preset("k80x4")
    limit = {"time_budget_s": 3.0} if budget == "time" else {"iterations": 5}
    r = train(
        TrainConfig(
            algo="moves", logdir=str(tmp_path / "run"), progress=False, heuristics=("m_etf",), ablation=False, **limit
        ),
        graph=g,
        cluster=c,
    )
    assert len(seen) == 1
    if budget == "time":  # what module_search found is labelled as its own
        assert 0.2 * 1.5 < seen[0] <= 0.2 * 3.0 and r.best_step_time_s < r.best_heuristic[1]
        assert found_by == {MODULE_SHARE, MOVE_SEARCH}
    else:
        assert seen[0] == 0.0 and found_by == {MOVE_SEARCH}
    best = Placement.load(os.path.join(r.logdir, "best_placement.json"))  # its file names the part that found it
    assert best.method == {MODULE_SHARE: "moves:module_search", MOVE_SEARCH: "moves:critic"}[best.meta["found_by"]]


def _moe_file(tmp_path) -> str:
    path = str(tmp_path / "moe.json")
    save(moe_dag(60, seed=0), path)
    return path


@pytest.mark.parametrize(
    "extra, methods",
    [
        ([], {"move search": "moves:critic"}),
        (["--proposals", "uniform"], {"move search": "moves:uniform"}),
        (
            ["--algo", "reinforce", "--warm-start", "none", "--max-groups", "8", "--hidden", "8"],
            {"sample": "rl:seq2seq", "greedy": "rl:seq2seq", "heuristic:single": "heuristic:single"},
        ),
    ],
)
def test_the_best_placement_file_names_its_true_finder(tmp_path, capsys, extra, methods):
    """The move search's best was labelled rl:seq2seq, a heuristic's by its bare name: each is named as found."""
    logdir = tmp_path / "run"
    argv = ["train", _moe_file(tmp_path), "--cluster", "k80x2", "--iterations", "3", "--heuristics", "single"]
    rc = main(argv + ["--logdir", str(logdir), "--no-progress", "--no-equal-budget-search", *extra])
    assert rc == 0, capsys.readouterr().err
    best = Placement.load(str(logdir / "best_placement.json"))
    assert best.method == methods[best.meta["found_by"]]  # the move search beats one GPU in its first rounds


def test_the_move_search_writes_its_best_step_time_and_device_share_to_tensorboard(tmp_path):
    """The default learner wrote none of the scalars the README lists; its incumbent's curve ended above the best."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    config = TrainConfig(
        algo="moves",
        iterations=6,
        logdir=str(tmp_path / "run"),
        progress=False,
        heuristics=("single",),
        equal_budget_search=False,
    )
    r = train(config, graph=g, cluster=c)
    ea = EventAccumulator(r.logdir)
    ea.Reload()
    best = [e.value for e in ea.Scalars("charts/best_step_time_s")]
    steps = [e.step for e in ea.Scalars("charts/best_step_time_s")]
    assert steps[0] == 0 and steps[-1] == 5 and steps == sorted(set(steps))  # the first round and the last (RoundLog)
    assert best == sorted(best, reverse=True) and best[-1] == pytest.approx(r.best_step_time_s)
    assert best[-1] <= ea.Scalars("charts/incumbent_step_time_s")[-1].value
    shares = [ea.Scalars(f"charts/device_share/{device}")[-1].value for device in c.device_names]
    assert len(shares) == c.num_devices and sum(shares) == pytest.approx(1.0) and max(shares) < 1.0
    documented_in_readme(set(ea.Tags()["scalars"]), c.device_names)


def documented_in_readme(tags: set[str], devices: list[str]) -> None:
    """Every scalar tag a run wrote is named in the README (a device's share as ``<device>``, a policy's credit
    per log-probability term as ``<term>``)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    for tag in tags:
        for device in devices:
            tag = tag.replace(f"/{device}", "/<device>")
        tag = "losses/credit/<term>" if tag.startswith("losses/credit/") else tag
        assert f"`{tag}`" in readme, tag


def test_a_resumed_run_gives_the_equal_budget_search_the_whole_run_s_placements(tmp_path, capsys):
    """--resume gave module_search only the placements its own session simulated (7,188 against 113,373)."""
    logdir = tmp_path / "run"
    argv = ["train", _moe_file(tmp_path), "--cluster", "k80x2", "--heuristics", "m_etf", "--iterations", "20"]
    argv += ["--logdir", str(logdir), "--no-progress", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)["equal_budget_search"]
    assert main(argv + ["--resume"]) == 0  # its 20 iterations are done: this session only sets up and compares
    again = json.loads(capsys.readouterr().out)["equal_budget_search"]
    # the first session's, and the second's (the heuristics scored again)
    assert again["evals"] > first["evals"] and again["heuristics_simulated"] == 2 * first["heuristics_simulated"]


def test_a_run_on_one_device_ends_at_once_with_the_heuristics_best(tmp_path, capsys):
    """With one device there is no move to try: the rounds used to kick for ever (a run never ended, whatever its
    budget). The run now says so and keeps the best heuristic's placement; the search alone ends too."""
    g = moe_dag(30, seed=0)
    one = envs.Cluster("one", [envs.Cluster.preset("k80x2").devices[1]], {})
    assert MoveSearch(g, one, envs.SimEnv(g, one)).run(time_budget_s=60.0).elapsed_s < 30.0
    graph, cluster = tmp_path / "g.json", tmp_path / "one.json"
    save(g, str(graph))
    cluster.write_text(json.dumps(one.to_dict()))
    argv = ["train", str(graph), "--cluster", str(cluster), "--time-budget", "600", "--logdir", str(tmp_path / "r")]
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["iterations"] == 0 and doc["elapsed_s"] < 60 and doc["found_by"].startswith("heuristic:")
    assert "move search: nothing to move, every op can only go on gpu:0" in err


def test_a_round_is_logged_first_when_it_improves_the_best_every_tenth_of_a_second_and_last():
    """Writing every round's dozen scalars took a fifth to a third of the move search's time (the same budget gave
    1.26x the rounds on nmt-2 and 1.58x on inception-v3 without it: docs/round_log)."""
    from placer.learn.move_runner import RoundLog

    now = [0.0]
    log = RoundLog(every_s=0.1, clock=lambda: now[0])
    rounds = [(0.0, 5.0, False), (0.01, 5.0, False), (0.02, 4.0, False), (0.05, 4.0, False), (0.125, 4.0, False)]
    rounds += [(0.13, 4.0, False), (0.14, 3.9, False), (0.15, 3.9, False), (0.16, 3.9, True)]
    logged = []
    for i, (t, best, last) in enumerate(rounds):
        now[0] = t
        if log.due(best, last):
            logged.append(i)
    assert logged == [0, 2, 4, 6, 8]
