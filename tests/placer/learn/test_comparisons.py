"""After the learner: the equal-budget search, the faster placement it keeps, and the summary's line about it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import envs
from graphs import save
from graphs.synthetic import moe_dag
from placer import Placement
from placer.cli import main
from tests.placer.learn.tiny_runs import spy_on_move_searches


def test_the_equal_budget_search_never_takes_longer_than_the_run():
    from placer.cli.train import equal_budget_line
    from placer.learn.comparisons import equal_budget_search

    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    sim = envs.SimEnv(g, c)
    whole = equal_budget_search(g, c, sim, 300, order=None, seed=0)
    assert whole["simulated"] == whole["evals"] == 300 and not whole["stopped"]
    # a limit already past: one round of draws and its descent, far short of the placements it was given
    cut = equal_budget_search(g, c, sim, 10**6, order=None, seed=0, time_limit_s=1e-9)
    assert cut["stopped"] and 0 < cut["simulated"] < 10**6 and cut["step_time_s"] > 0
    # a planned-order run's equal-budget search searches in the planned order too, every placement it simulates
    seen = []

    class Spy(envs.SimEnv):
        def step_times(self, op_devices, order=None):
            seen.append(order)
            return super().step_times(op_devices, order)

        def overflow(self, op_devices, order=None):
            seen.append(order)
            return super().overflow(op_devices, order)

    planned = equal_budget_search(g, c, Spy(g, c), 200, order="planned", seed=0)
    assert seen and set(seen) == {"planned"} and planned["simulated"] == 200
    doc = {"best_step_time_s": cut["step_time_s"], "equal_budget_search": {**cut, "heuristics_simulated": 5034}}
    line = equal_budget_line(doc)
    assert (
        f"{cut['simulated']:,} of the 1,000,000 placements this run simulated (5,034 of them by the heuristics), "
        "stopped at the run's own time"
    ) in line


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_a_faster_equal_budget_placement_is_kept_beside_the_best(tmp_path, monkeypatch, capsys, factor):
    """The search at equal budget beat the learner: its placement is written (with its issue order) and the summary
    names the file; best_placement.json stays the learner's. A slower one writes nothing."""
    import placer.learn.comparisons as comparisons

    path = tmp_path / "g.json"
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    save(g, str(path))
    searched = np.full(g.num_ops, c.gpu_indices()[-1], dtype=np.int32)
    real = comparisons.equal_budget_search

    def crafted(*a, **kw):  # the real search, its time scaled: faster (0.5) or slower (2.0) than the learner's
        eq = real(*a, **kw)
        best = json.loads((tmp_path / "run" / "checkpoint.json").read_text())["run"]["best_step_time_s"]
        return {**eq, "op_devices": searched, "step_time_s": best * factor}

    monkeypatch.setattr(comparisons, "equal_budget_search", crafted)
    rc = main(
        [
            "train",
            str(path),
            "--cluster",
            "k80x2",
            "--iterations",
            "2",
            "--logdir",
            str(tmp_path / "run"),
            "--no-progress",
            "--heuristics",
            "m_etf",
        ]
    )
    out = capsys.readouterr().out
    kept = tmp_path / "run" / "equal_budget_placement.json"
    assert rc == 0 and kept.exists() == (factor < 1) and ("faster placement" in out) == (factor < 1)
    best = Placement.load(str(tmp_path / "run" / "best_placement.json"))
    assert best.meta["found_by"] != "equal-budget search"
    if factor < 1:
        p = Placement.load(str(kept))
        np.testing.assert_array_equal(p.indices(g, c.device_names), searched)
        assert (
            p.method == "heuristic:module_search"
            and p.meta["found_by"] == "equal-budget search"
            and p.order is not None
        )
        assert p.meta["step_time_s"] == pytest.approx(best.meta["step_time_s"] * factor) and str(kept) in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["equal_budget_search"]
    assert "op_devices" not in summary and (summary.get("placement") == str(kept)) == (factor < 1)


def _doc(learned: float, search: float, heuristic: float) -> dict:
    """A summary document whose equal-budget search found ``search`` and whose best heuristic (m_sct) ``heuristic``."""
    eq = {"method": "module_search", "evals": 5178, "simulated": 3096, "stopped": True, "wall_s": 1.0}
    return {
        "best_step_time_s": learned,
        "best_heuristic": "m_sct",
        "best_heuristic_step_time_s": heuristic,
        "equal_budget_search": {**eq, "step_time_s": search, "heuristics_simulated": 5028},
    }


def test_the_equal_budget_line_compares_with_the_better_of_the_search_and_the_best_heuristic():
    """module_search at equal budget 3x slower than the best heuristic made a 0.5% gain read +68.3%."""
    from placer.cli.train import equal_budget_line

    line = equal_budget_line(_doc(0.043283, 0.136501, 0.043486))
    assert line.startswith("equal budget     43.486 ms  (m_sct, the best heuristic, faster than module_search given")
    assert "136.501 ms" in line and "learned 0.5% faster than m_sct;" in line and "+68" not in line
    line = equal_budget_line(_doc(0.198521, 0.198887, 0.210510))  # the search is the better of the two
    assert line.startswith("equal budget     198.887 ms  (module_search given 3,096 of the 5,178 placements")
    assert "learned 0.2% faster than module_search;" in line and "m_sct" not in line


def test_the_equal_budget_search_shows_its_progress_with_an_eta(tmp_path):
    """After the budget the run printed one line, then nothing for 77 s."""
    import io

    from placer.learn.config import TrainConfig
    from placer.learn.progress import Progress
    from placer.train import train

    out = io.StringIO()
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    config = TrainConfig(algo="moves", iterations=5, logdir=str(tmp_path / "run"), heuristics=("m_etf",))
    r = train(config, graph=g, cluster=c, progress=Progress(out, tty=False, every_s=0.0))
    after = out.getvalue().split("placer: equal budget: module_search given ")[1].splitlines()[1:]
    counts = [line for line in after if line.startswith("placer: equal budget: ")]
    assert counts and all(" placements (" in line for line in counts), after
    assert any(", ETA " in line for line in counts) and r.equal_budget_search["simulated"] > 0


def test_the_uniform_ablation_is_the_learner_s_search_with_nothing_learned_given_its_placements(
    tmp_path, monkeypatch, capsys
):
    """After a run of the move search: the same search with uniform moves and the levels in turn, from the same start,
    given the placements the learner's search simulated; its line in the summary; the run's best untouched by it.
    --no-ablation skips it."""

    path = tmp_path / "g.json"
    save(moe_dag(60, seed=0), str(path))
    made = spy_on_move_searches(monkeypatch)
    argv = ["train", str(path), "--cluster", "k80x2", "--iterations", "4", "--no-progress", "--heuristics", "m_etf"]
    assert main([*argv, "--logdir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "run" / "summary.json").read_text())
    learner, ablation = made
    assert (learner.options.proposals, learner.options.levels) == ("critic", None)
    assert ablation.options.proposals == "uniform" and not ablation.learned_levels  # the levels in turn
    assert learner.learned_levels
    ab, eq = doc["ablation"], doc["equal_budget_search"]
    learned = eq["evals"] - eq["heuristics_simulated"]  # the learner's search's placements: the run's less theirs
    assert ab["evals"] == learned and 0 < ab["simulated"] <= learned and ab["step_time_s"] is not None
    assert ablation.budget.evals == ab["simulated"]
    assert "uniform ablation " in out and "its ablation" in out
    best = Placement.load(str(tmp_path / "run" / "best_placement.json"))
    assert "uniform" not in best.meta["found_by"]  # the ablation's placements are not the run's
    assert ablation.env.scorer.evaluated > 0 and ablation.env.scorer is not learner.env.session.scorer
    made.clear()
    assert main([*argv, "--logdir", str(tmp_path / "skip"), "--no-ablation"]) == 0
    assert len(made) == 1 and "uniform ablation" not in capsys.readouterr().out
    assert json.loads((tmp_path / "skip" / "summary.json").read_text())["ablation"] is None
