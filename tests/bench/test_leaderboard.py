"""The leaderboard: entries written by running commands, tables rendered from them, recorded commands that still run."""

from __future__ import annotations

import json

import pytest

from bench import leaderboard
from graphs import PlacerError, io
from graphs.synthetic import FAMILIES


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "moe.json"
    io.save(FAMILIES["moe"](40, seed=0), path)
    return str(path)


def test_a_compare_run_writes_one_entry_per_heuristic_and_a_rerun_replaces_them(graph_file, tmp_path):
    command = f"placer compare {graph_file} --cluster k80x2 --methods m_topo,m_etf,round_robin"
    entries = leaderboard.record(command, tmp_path)
    assert [e["method"] for e in entries] == ["m_topo", "m_etf", "round_robin"]
    assert all(e["command"] == command and e["kind"] == "heuristic" for e in entries)
    (path,) = tmp_path.glob("*.json")
    assert path.name == leaderboard.table_path(graph_file, "k80x2", tmp_path).name
    leaderboard.record(command + " --json", tmp_path)  # the same command: its entries replaced, not added
    table = json.loads(path.read_text())
    assert len(table["entries"]) == 3 and table["lower_bound_s"] > 0
    text = leaderboard.markdown(leaderboard.tables(tmp_path))
    best = min(entries, key=lambda e: e["step_time_s"])
    assert f"by {best['method']}" in text and f"**{best['step_time_s'] * 1e3:,.3f}**" in text


@pytest.mark.slow  # two short training runs
def test_learners_and_agents_are_entries_with_their_budget(graph_file, tmp_path):
    train = f"placer train {graph_file} --cluster k80x2 --algo reinforce --iterations 2 --samples 3 --heuristics m_topo"
    (learner,) = leaderboard.record(f"{train} --logdir {tmp_path / 'run'} --no-progress", tmp_path)
    assert learner["method"] == "reinforce" and learner["placements"] == 6 and learner["step_time_s"] > 0
    moves = f"placer train {graph_file} --cluster k80x2 --iterations 2 --heuristics m_topo --no-progress"
    (search,) = leaderboard.record(f"{moves} --logdir {tmp_path / 'moves'}", tmp_path)
    assert search["method"] == "moves" and search["placements"] > 0
    agent = f"python -m bench.gym_agents random --graph {graph_file} --cluster k80x2 --placements 5"
    (random_agent,) = leaderboard.record(agent, tmp_path)
    assert random_agent["placements"] == 5 and random_agent["kind"] == "agent"
    assert len(json.loads(leaderboard.table_path(graph_file, "k80x2", tmp_path).read_text())["entries"]) == 3


def test_the_ppo_recipes_report_reads_as_its_best_placement():
    doc = {
        "best_step_time_s": 0.3,
        "greedy_step_time_s": 0.25,
        "placements": 64,
        "wall_s": 3.0,
        "env_runners": 2,
        "first_return_mean": -2.0,
        "last_return_mean": -1.5,
    }
    (entry,) = leaderboard.ppo_entries(doc, None)
    assert entry["step_time_s"] == 0.25 and entry["placements"] == 64
    (none_fits,) = leaderboard.ppo_entries({**doc, "best_step_time_s": None, "greedy_step_time_s": None}, None)
    assert none_fits["step_time_s"] is None


@pytest.mark.parametrize(
    "command, message",
    [
        ("ls -l", "not a placer command"),
        ("placer compare g.json --cluster k80x2 --nope", "unrecognized argument --nope"),
        ("placer simulate g.json p.json --cluster k80x2", "the leaderboard reads"),
    ],
)
def test_a_command_it_cannot_record_is_one_line_and_exit_status_2(command, message, capsys):
    assert leaderboard.main(["run", "--", *command.split()]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_command_that_no_longer_parses_is_found(tmp_path):
    table = {"format": leaderboard.FORMAT, "graph": "g", "cluster": "c", "entries": []}
    table["entries"] = [{"command": "placer compare nmt-2 --cluster k80x4 --no-such-option", "step_time_s": 1.0}]
    (tmp_path / "g@c.json").write_text(json.dumps(table))
    (problem,) = leaderboard.check(directory=tmp_path)
    assert "--no-such-option" in problem


def test_a_command_that_parses_but_no_longer_runs_is_found(tmp_path):
    table = {"format": leaderboard.FORMAT, "graph": "g", "cluster": "c", "entries": []}
    table["entries"] = [{"command": f"placer compare {tmp_path / 'gone.json'} --cluster k80x2", "step_time_s": 1.0}]
    (tmp_path / "g@c.json").write_text(json.dumps(table))
    assert leaderboard.check(directory=tmp_path) == []
    (problem,) = leaderboard.check(run=True, directory=tmp_path)
    assert "exit status 2" in problem and "gone.json: no such file" in problem


def test_the_tiny_budget_of_each_kind_of_command():
    tiny = leaderboard.tiny
    assert tiny(["placer", "compare", "nmt-2", "--cluster", "k80x4"], "d")[-2:] == ["--methods", "single"]
    train = tiny("placer train nmt-2 --cluster k80x4 --algo reinforce --time-budget 300".split(), "d")
    assert "--time-budget" not in train and train[train.index("--iterations") + 1] == "1"
    assert train[-1] == "--no-equal-budget-search" and train[train.index("--logdir") + 1] == "d"
    assert tiny("python -m bench.gym_agents random --placements 4096".split(), "d")[-2:] == ["--placements", "2"]
    assert tiny("python -m bench.rllib_ppo --iterations 16".split(), "d") is None


def test_every_recorded_command_parses_and_the_tables_are_rendered():
    assert leaderboard.check() == []
    assert leaderboard.render(check=True) == []  # docs/leaderboard.md and BENCHMARKS.md are generated, up to date


def test_every_method_placer_ships_has_a_row():
    methods = {e["method"] for t in leaderboard.tables() for e in t["entries"]}
    from placer.compare.comparison import default_methods

    assert set(default_methods()) <= methods
    assert {"moves", "reinforce", "RLlib PPO (placer/PlaceAll-v0)", "random agent (placer/PlaceAll-v0)"} <= methods


@pytest.mark.slow  # runs every recorded command (but the RLlib recipe) with a tiny budget, nmt-2 captured
def test_every_recorded_command_still_runs_with_a_tiny_budget(zoo_cache):
    assert leaderboard.check(run=True) == []


def test_an_unreadable_leaderboard_file_is_one_placer_error(tmp_path):
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(PlacerError, match="not a leaderboard file"):
        leaderboard.tables(tmp_path)
