"""bench.budget run tiny: every method at equal budgets, every simulated placement counted, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import envs
from bench import budget, budget_runs
from bench.budget_env import BudgetEnv, BudgetSpent
from bench.budget_runs import METHODS, PLAN_EVALS
from graphs.synthetic import moe_dag


def test_budget_env_counts_every_row_and_stops_at_the_budget():
    g, c = moe_dag(40, seed=0), envs.Cluster.preset("k80x2")
    rec = BudgetEnv(envs.SimEnv(g, c), max_evals=10)
    op_devices = np.ones((6, g.num_ops), dtype=np.int32)
    op_devices[1:, 0] = 2
    rec.step_times(op_devices)
    with pytest.raises(BudgetSpent):  # the 4 placements left are scored, then the method is stopped
        rec.step_times(op_devices)
    assert rec.evals == 10 and rec.best_op_devices is not None and rec.curve["evals"][0] == 1
    assert (
        rec.curve["best_s"] == sorted(rec.curve["best_s"], reverse=True) and rec.best_key[1] == rec.curve["best_s"][-1]
    )
    with pytest.raises(BudgetSpent):
        rec.step_times(op_devices[:1])
    assert rec.evals == 10


@pytest.mark.slow
def test_tiny_grid_runs_every_method_within_its_budget(tmp_path, capsys):
    plot = tmp_path / "b.png"
    rc = budget.main(
        [
            "--graphs",
            "moe-60",
            "--clusters",
            "k80x2",
            "--evals",
            "300",
            "--seconds",
            "1",
            "--seeds",
            "0",
            "--plot",
            str(plot),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and plot.stat().st_size > 0
    cell = json.loads(out)["cells"][0]
    assert cell["graph"] == "moe-60" and cell["lower_bound_name"] and cell["start"]["method"]
    runs = {(r["budget"]["kind"], r["method"]): r for r in cell["runs"]}
    assert {m for _, m in runs} == set(METHODS)
    for method in ("learned", "uniform", "module_search", "annealing"):
        r = runs[("evals", method)]
        assert r["step_time_s"] is not None and r["evals"] <= 300, (method, r)
    # the learner and its ablation pay for the start (the rule heuristics, each scored once) from the same 300
    assert runs[("evals", "learned")]["evals"] == runs[("evals", "uniform")]["evals"] == 300
    for r in (runs[("evals", "learned")], runs[("seconds", "learned")]):
        assert r["step_time_s"] <= cell["start"]["step_time_s"]
    assert runs[("seconds", "module_search")]["wall_s"] <= 1 + 1.0
    rc = budget.main(
        ["--graphs", "moe-60", "--clusters", "k80x2", "--evals", "200", "--seconds", "", "--methods", "learned,uniform"]
    )
    table = capsys.readouterr().out
    assert rc == 0 and "| moe-60 | k80x2 | 0.2k placements |" in table
    # the acceptance variant and its ablation, on request: their columns and their ratios
    rc = budget.main(
        [
            "--graphs",
            "moe-60",
            "--clusters",
            "k80x2",
            "--evals",
            "200",
            "--seconds",
            "",
            "--methods",
            "learned_accept,uniform_accept,annealing",
            "--json",
        ]
    )
    cells = json.loads(capsys.readouterr().out)["cells"]
    runs = {r["method"]: r for r in cells[0]["runs"]}
    assert (
        rc == 0
        and set(runs) == {"learned_accept", "uniform_accept", "annealing"}
        and "accepted" in runs["learned_accept"]["note"]
    )
    assert runs["learned_accept"]["evals"] <= 200 + PLAN_EVALS
    assert "| learned_accept | uniform_accept |" in budget.markdown_table(
        cells
    ) and "learned_accept / uniform_accept" in budget.markdown_table(cells)


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--evals", "abc"], "--evals"),
        (["--evals", "0"], "--evals"),
        (["--methods", "learned,nope"], "--methods"),
        (["--graphs", "nope"], "nope"),
        (["--evals", "", "--seconds", ""], "--evals"),
        (["--clusters", "zz"], "zz"),
        (["--critic", "/nonexistent/critic.pt"], "/nonexistent/critic.pt"),
    ],
)
def test_bad_options_exit_2_with_one_line(argv, option, capsys):
    rc = budget.main(["--graphs", "moe-40", "--seconds", "", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and option in err and len(err.strip().splitlines()) == 1, err


def test_the_plot_has_a_panel_per_kind_of_budget_run(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from bench import plots

    shapes = []
    real = plots.pyplot()
    subplots = real.subplots
    monkeypatch.setattr(real, "subplots", lambda *a, **kw: shapes.append(a) or subplots(*a, **kw))
    run = lambda kind, method: {"budget": {"kind": kind, "value": 10}, "method": method, "plan_step_time_s": 0.1}  # noqa: E731
    cell = {
        "graph": "g",
        "cluster": "c",
        "lower_bound_s": 0.05,
        "lower_bound_name": "critical path",
        "runs": [run("evals", "learned"), run("evals", "uniform")],
    }
    plots.plot_budget_curves([cell], str(tmp_path / "a.png"))
    cell["runs"].append(run("seconds", "learned"))
    plots.plot_budget_curves([cell], str(tmp_path / "b.png"))
    assert shapes == [(1, 1), (1, 2)]


@pytest.mark.slow  # two move searches on a tiny graph (~3 s)
def test_the_pretrained_critic_s_ablations_run_on_request_with_their_ratios(capsys):
    argv = ["--graphs", "moe-60", "--clusters", "k80x2", "--evals", "200", "--seconds", ""]
    rc = budget.main([*argv, "--methods", "uniform,pretrained,pretrained_frozen", "--json"])
    cells = json.loads(capsys.readouterr().out)["cells"]
    runs = {r["method"]: r for r in cells[0]["runs"]}
    assert rc == 0 and set(runs) == {"uniform", "pretrained", "pretrained_frozen"}
    assert all(r["step_time_s"] is not None and r["evals"] <= 200 + PLAN_EVALS for r in runs.values())
    table = budget.markdown_table(cells)
    assert "| pretrained / uniform | pretrained_frozen / uniform |" in table


def test_the_pretrained_methods_start_from_the_critic_file_given(tmp_path, monkeypatch, capsys):
    from policies import policy_file
    from policies.moves import MoveCritic

    path = tmp_path / "critic.pt"
    policy_file.save_critic(path, MoveCritic(8), {"corpus": ["toy"], "seed": 0, "date": "today"})
    started = []
    real = budget_runs.MoveSearch.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        started.append((self.options.critic, self.options.fine_tune, self.critic.hidden))

    monkeypatch.setattr(budget_runs.MoveSearch, "__init__", spy)
    argv = ["--graphs", "moe-20", "--clusters", "k80x2", "--evals", "60", "--seconds", "", "--json"]
    assert budget.main([*argv, "--methods", "pretrained,pretrained_frozen", "--critic", str(path)]) == 0
    assert started == [(str(path), True, 8), (str(path), False, 8)]  # the file's 8 hidden units, not the shipped 64
    capsys.readouterr()


def _run_methods(capsys, methods: list[str]) -> tuple[list[dict], dict[str, dict]]:
    """``bench.budget``'s cells and each method's run, for ``methods`` on a tiny graph at 300 placements; each ran
    within its budget."""
    argv = ["--graphs", "moe-60", "--clusters", "k80x2", "--evals", "300", "--seconds", ""]
    rc = budget.main([*argv, "--methods", ",".join(methods), "--json"])
    cells = json.loads(capsys.readouterr().out)["cells"]
    runs = {r["method"]: r for r in cells[0]["runs"]}
    assert rc == 0 and set(runs) == set(methods)
    assert all(r["step_time_s"] is not None and r["evals"] <= 300 + PLAN_EVALS for r in runs.values())
    return cells, runs


@pytest.mark.slow  # two move searches on a tiny graph (~3 s)
def test_expert_iteration_runs_on_request_beside_its_ablation_with_their_ratio(capsys):
    """``expert``: the move search whose kicks come from the policy that imitates its local optima; ``learned``, the
    same search with uniform kicks, is its ablation, and the table gives their ratio."""
    cells, runs = _run_methods(capsys, ["learned", "expert"])
    assert "| expert / learned |" in budget.markdown_table(cells)


@pytest.mark.slow  # four move searches on a tiny graph (~4 s)
def test_the_ablation_s_halves_and_an_untrained_critic_run_on_request_with_their_ratios(capsys):
    """``learned_cycle`` (the critic, the levels in turn), ``uniform_levels`` (uniform moves, the levels learned) and
    ``untrained_frozen`` (a critic never trained), each with its ratio to the uniform ablation."""
    cells, _ = _run_methods(capsys, ["uniform", "learned_cycle", "uniform_levels", "untrained_frozen"])
    assert "| learned_cycle / uniform | uniform_levels / uniform | untrained_frozen / uniform |" in (
        budget.markdown_table(cells)
    )


@pytest.mark.slow  # four move searches on a tiny graph (~4 s)
def test_both_loops_as_they_were_run_on_request_with_their_ratios(capsys, monkeypatch):
    """``learned_coarse_kicks`` and ``uniform_coarse_kicks``: the two loops kicking coarse items and never combining
    a round's faster moves, each beside the loop as it is now, with their ratio."""
    import bench.budget_runs as runs_module

    seen = []

    class Recording(runs_module.MoveSearch):
        def __init__(self, *args, options=None, **kwargs):
            super().__init__(*args, options=options, **kwargs)
            seen.append((options.proposals, self.kick_at, options.combine))

    monkeypatch.setattr(runs_module, "MoveSearch", Recording)
    methods = ["learned", "uniform", "learned_coarse_kicks", "uniform_coarse_kicks"]
    cells, runs = _run_methods(capsys, methods)
    assert seen == [
        ("critic", "ops", True),
        ("uniform", "ops", True),
        ("critic", "coarse", False),
        ("uniform", "coarse", False),
    ]
    assert all(runs[m]["note"].endswith(" combinations taken") for m in methods)
    assert "| learned / learned_coarse_kicks | uniform / uniform_coarse_kicks |" in budget.markdown_table(cells)


def _run_file(tmp_path, name: str, start: str, methods: dict[str, float]) -> str:
    """A ``--json`` run of one graph whose every method placed at the given seconds (hand-written)."""
    runs = [
        {"budget": {"kind": "evals", "value": 1000}, "seed": 0, "method": m, "plan_step_time_s": t}
        for m, t in methods.items()
    ]
    cell = {"graph": "g", "cluster": "k80x4", "score_order": "node", "lower_bound_s": 0.05}
    cell.update(lower_bound_name="critical path", runs=runs, start={"method": start, "step_time_s": 0.2})
    path = tmp_path / name
    path.write_text(json.dumps({"machine": "m", "cells": [cell]}))
    return str(path)


def test_the_table_of_earlier_runs_puts_methods_run_apart_in_one_row(tmp_path, capsys):
    """``--table``: two files' runs of one graph and cluster in one row, with the ratios between them; a file that
    is not a run, or one whose graph starts from another placement, is a one-line error naming it."""
    a = _run_file(tmp_path, "a.json", "m_sct", {"learned": 0.097, "uniform": 0.1, "annealing": 0.098})
    b = _run_file(tmp_path, "b.json", "m_sct", {"pretrained": 0.095})
    assert budget.main(["--table", a, b]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| g |")]
    assert len(rows) == 1 and "| 97.00 | 100.00 |" in rows[0] and "| 0.970 | 0.950 |" in rows[0], rows
    other = _run_file(tmp_path, "other.json", "m_etf", {"pretrained": 0.095})
    not_a_run = tmp_path / "cluster.json"
    not_a_run.write_text(json.dumps({"format": "placer-cluster/1"}))
    for files, problem in (([a, other], "starts from another placement"), ([a, str(not_a_run)], "not a")):
        assert budget.main(["--table", *files]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and files[1] in err and problem in err, err
