"""What ``placer train`` tells its user: a line per phase, a bar that stops at its total, Ctrl-C and --resume,
a best placement never slower than the best heuristic, a warm start cut short, a used --logdir."""

from __future__ import annotations

import io
import json
import os
import re
import shlex

import pytest

import envs
from graphs import save
from placer import Placement
from placer.cli import main
from placer.cli.train import summary
from placer.learn.config import TrainConfig
from placer.learn.progress import Progress
from placer.learn.runners import train
from tests.placer.learn.tiny_runs import train_argv, train_config, two_chains


@pytest.fixture
def graph_file(tmp_path):
    path = str(tmp_path / "g.json")
    save(two_chains(), path)
    return path


def _config(tmp_path, **kw) -> TrainConfig:
    return train_config(tmp_path, **{"heuristics": ("m_etf",), **kw})


def _small(path: str, logdir: str, *more: str) -> list[str]:
    return train_argv(path, logdir, "--heuristics", "m_etf,round_robin", *more)


def test_best_placement_is_never_slower_than_the_best_heuristic(tmp_path):
    # an untrained policy's one sample is slower than m_etf's placement: the file keeps m_etf's, and says whose it is
    c = envs.resolve_cluster("k80x2")
    r = train(_config(tmp_path, iterations=1, samples=1, warm_start="none"), graph=two_chains(), cluster=c)
    doc = r.to_dict()
    best = Placement.load(doc["best_placement"])
    assert r.best_step_time_s <= r.heuristics["m_etf"] and best.meta["step_time_s"] <= r.heuristics["m_etf"]
    assert (
        doc["found_by"] == "heuristic:m_etf"
        and best.method == "heuristic:m_etf"
        and doc["policy_step_time_s"] > r.best_step_time_s
    )
    assert "m_etf's placement, kept: the learner's best" in summary(doc)


def test_a_warm_start_cut_short_by_the_budget_says_so(tmp_path):
    c = envs.resolve_cluster("k80x2")
    cut = train(_config(tmp_path, time_budget_s=1e-3), graph=two_chains(), cluster=c).to_dict()
    assert cut["warm_start_cut_short"] and "warm start       cut short by the time budget" in summary(cut)
    whole = train(
        _config(tmp_path, iterations=1, logdir=str(tmp_path / "whole")), graph=two_chains(), cluster=c
    ).to_dict()
    assert not whole["warm_start_cut_short"] and "cut short" not in summary(whole)


@pytest.mark.parametrize(
    "algo, learning",
    [
        ("moves", ["move search: 3 iterations", "move search: 3/3 it (100%)", "equal budget: module_search given"]),
        ("reinforce", ["warm start: imitating", "warm start: imitation of", "RL: 3 iterations", "RL: 3/3 it (100%)"]),
    ],
)
def test_train_reports_every_phase_on_stderr_when_it_is_not_a_terminal(tmp_path, graph_file, capsys, algo, learning):
    rc = main(_small(graph_file, str(tmp_path / "run"), "--iterations", "3", "--algo", algo))
    out, err = capsys.readouterr()
    assert rc == 0 and out.startswith("best step time")
    phases = ["setting up: two-chains (8 ops) on k80x2", "scoring 2 heuristics", "best heuristic: ", *learning]
    at = [err.find(f"placer: {p}") for p in phases]
    assert -1 not in at and at == sorted(at), err
    if algo == "moves":  # the move search's finds are its own, not a policy's
        assert "(policy)" not in err


@pytest.mark.slow  # two runs of a time budget
def test_a_timed_move_search_says_module_search_goes_first_where_the_graph_has_modules(tmp_path, capsys):
    from graphs.synthetic import recurrent_dag

    path = tmp_path / "rnn.json"
    save(recurrent_dag(150, seed=1), str(path))
    for source, first in ((str(path), True), (None, False)):  # two-chains records no module paths
        args = _small(
            source or str(tmp_path / "two.json"),
            str(tmp_path / f"run-{first}"),
            "--time-budget",
            "1",
            "--algo",
            "moves",
            "--no-equal-budget-search",
        )
        if source is None:
            save(two_chains(), str(tmp_path / "two.json"))
        assert main(args) == 0
        err = capsys.readouterr().err
        assert ("placer: move search: module_search first, for " in err) == first, err
        assert "(policy)" not in err


def test_the_bar_never_runs_past_its_total():
    out = io.StringIO()
    p = Progress(out, tty=True)
    p.start("RL", total=60, unit="s")
    p.update(41, "iteration 7")
    p.update(92, "iteration 9")  # the last iteration of a time budget ends after it
    assert p.bar.n == p.bar.total == 60
    p.close()
    assert "92" not in out.getvalue() and "60/60" in out.getvalue()


def test_ctrl_c_says_the_run_was_interrupted_and_how_to_resume(tmp_path, graph_file, capsys, monkeypatch):
    from placer.learn.move_search import MoveSearch

    real, calls = MoveSearch.step, []

    def step(self):  # the move search's third round: Ctrl-C
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(MoveSearch, "step", step)
    logdir = str(tmp_path / "run")
    assert main(_small(graph_file, logdir, "--iterations", "6", "--no-progress")) == 130
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("interrupted      continue with: placer train ") and first.endswith(" --resume")
    command = shlex.split(first.split("continue with: ")[1])
    assert command[command.index("--logdir") + 1] == logdir and command[command.index("--iterations") + 1] == "6"
    monkeypatch.setattr(MoveSearch, "step", real)
    assert main(command[1:] + ["--json", "--no-progress"]) == 0  # the command as printed, less the program's name
    doc = json.loads(capsys.readouterr().out)
    assert doc["iterations"] == 6 and not doc["interrupted"]


def test_training_again_into_a_used_logdir_needs_resume(tmp_path, graph_file, capsys):
    logdir = str(tmp_path / "run")
    assert main(_small(graph_file, logdir, "--iterations", "1", "--no-progress")) == 0
    capsys.readouterr()
    assert main(_small(graph_file, logdir, "--iterations", "2", "--no-progress")) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and f"--logdir {logdir}: holds an earlier training run" in err and "--resume" in err
    )
    assert len([f for f in os.listdir(logdir) if f.startswith("events.out")]) == 1


def test_the_readme_names_every_file_a_run_writes(tmp_path):
    # it once promised a checkpoint/ folder, and never named summary.json
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    train(_config(tmp_path, iterations=1), graph=two_chains(), cluster=envs.resolve_cluster("k80x2"))
    for name in os.listdir(tmp_path / "run"):
        documented = "`events.out.tfevents.*`" if name.startswith("events.out.tfevents") else f"`{name}`"
        assert documented in readme, name
    assert "`checkpoint/`" not in readme


def test_progress_lines_in_a_file_carry_an_eta(monkeypatch):
    """The plain lines of a file or a pipe said how far a phase had got, not how long it had left."""
    import placer.learn.progress as progress_module

    now = [100.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    p = Progress(out, tty=False, every_s=0.0)
    p.start("equal budget", total=1000, unit="placements")
    now[0] = 110.0
    p.update(250)  # a quarter in 10 s: 30 s left
    now[0] = 120.0
    p.update(1000)
    p.start("equal budget", total=1000, unit="placements", within_s=15.0)  # stopped at 15 s whatever its count
    now[0] = 130.0
    p.update(250)
    assert out.getvalue().splitlines() == [
        "placer: equal budget: 250/1000 placements (25%, ETA 00:30)",
        "placer: equal budget: 1000/1000 placements (100%)",
        "placer: equal budget: 250/1000 placements (25%, ETA 00:05)",
    ]
    # by default a line every tenth of a phase whose length is known (it once waited 30 s in a 30 s phase)
    plain = Progress(out, tty=False)
    plain.start("equal budget", total=1000, unit="placements", within_s=80.0)
    assert plain.interval_s == 8.0
    plain.start("RL", total=120, unit="s")
    assert plain.interval_s == 12.0


def test_train_help_says_what_the_default_learner_is(capsys):
    """It said "Train a placement policy", but the default learner trains no policy network."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Train a placement policy" not in out
    assert "The default learner (--algo moves) is a move search whose moves a learned critic ranks" in out
    assert "--algo reinforce|ppo trains the paper's policy network" in out


@pytest.mark.parametrize("held", [False, True])
def test_a_used_or_busy_logdir_is_refused_before_the_model_is_captured(tmp_path, capsys, monkeypatch, held):
    """`placer train SOURCE --logdir DIR` captured the model (seconds) before saying DIR already holds a run."""
    import fcntl

    import placer.cli.train as train_command

    def captured(*args, **kw):
        raise AssertionError("the model was captured before the --logdir check")

    monkeypatch.setattr(train_command, "captured", captured)
    logdir = tmp_path / "run"
    logdir.mkdir()
    with open(logdir / "train.lock", "w") as lock:
        if held:  # as a run in another process holds it
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:  # an earlier run's
            (logdir / "summary.json").write_text("{}")
        rc = main(["train", "nmt-2", "--cluster", "k80x2", "--iterations", "1", "--logdir", str(logdir)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(logdir) in err
    assert ("another training run" if held else "holds an earlier training run") in err


def test_the_readme_names_every_train_option(capsys):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    options = set(re.findall(r"--[a-z][a-z-]*[a-z]", capsys.readouterr().out))
    assert len(options) > 50 and "--algo" in options
    assert [o for o in sorted(options) if f"`{o}`" not in readme] == []
