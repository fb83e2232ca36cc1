"""The move search: its item levels, its budget, and a critic that learns which moves make the step faster."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import envs
from graphs import OpGraph, PlacerError, save
from graphs.grouping import colocate
from graphs.synthetic import moe_dag, random_dag, recurrent_dag
from placer import Placement
from placer.cli import main
from placer.learn.config import TrainConfig
from placer.learn.loop import train
from placer.learn.moves import MoveSearch, MoveSearchOptions
from policies.moves import NUM_FEATURES, MoveFeatures, MoveMemory, item_levels


def test_item_levels_go_from_modules_to_single_groups():
    g = recurrent_dag(150, seed=1)
    levels = item_levels(g)
    sizes = [lv.num_items for lv in levels]
    assert sizes == sorted(sizes) and len({lv.op_group.tobytes() for lv in levels}) == len(levels)
    names = [lv.name for lv in levels]
    assert any(n.startswith("modules ") and " x chunks " in n for n in names) and names[-1] == "ops"
    assert sizes[-1] == int(colocate(g).max()) + 1  # the finest level: every co-location group alone
    for lv in levels:  # a co-location group is never split
        unit = colocate(g)
        assert all(len(set(lv.op_group[unit == u])) == 1 for u in np.unique(unit))
    bare = random_dag(60, seed=0)
    bare = OpGraph.from_edges(
        bare.names,
        list(
            zip(
                [bare.names[i] for i in bare.edge_src], [bare.names[i] for i in bare.edge_dst], bare.edge_bytes.tolist()
            )
        ),
    )  # no module paths: chunks only
    assert [lv.name for lv in item_levels(bare)] == ["chunks 8", "chunks 16", "chunks 32", "ops"]


def test_move_features_describe_every_move_that_changes_the_placement():
    g, c = moe_dag(80, seed=2), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    levels = item_levels(g)
    feats = MoveFeatures(g, c, levels)
    x = np.random.default_rng(0).integers(1, c.num_devices, g.num_ops)
    t = float(env.step_times(x[None])[0][0])
    k = len(levels) // 2
    items, devices, f, keys = feats.features(k, x, t, env.schedule(x), MoveMemory(levels, c.num_devices), 0)
    assert f.shape == (len(items), NUM_FEATURES) and np.isfinite(f).all()
    rows = np.repeat(x[None], len(items), axis=0)
    for r, (i, d) in enumerate(zip(items, devices)):
        rows[r, levels[k].op_group == i] = d
    _, first = np.unique(rows, axis=0, return_index=True)  # one key per distinct placement the moves make
    assert len(np.unique(keys)) == len(first)
    on_device = np.array([np.all(x[levels[k].op_group == i] == d) for i, d in zip(items, devices)])
    assert not on_device.any()  # a move sends at least one op somewhere else
    assert len(items) == sum(
        len(
            set(range(c.num_devices))
            - ({int(x[levels[k].op_group == i][0])} if len(set(x[levels[k].op_group == i])) == 1 else set())
        )
        for i in range(levels[k].num_items)
    )


def test_move_search_spends_its_budget_exactly_and_returns_the_best_it_simulated():
    g, c = moe_dag(80, seed=2), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    start = np.full(g.num_ops, 1, dtype=np.int64)
    t_start = float(env.step_times(start[None])[0][0])
    a = MoveSearch(g, c, env, seed=3).run(start, max_evals=300)
    assert a.evals == 300 and not a.oom
    assert a.step_time_s == pytest.approx(float(env.step_times(a.op_devices[None])[0][0])) and a.step_time_s < t_start
    assert a.curve.best_s == sorted(a.curve.best_s, reverse=True) and a.curve.best_s[-1] == pytest.approx(a.step_time_s)
    b = MoveSearch(g, c, env, seed=3).run(start, max_evals=300)
    assert np.array_equal(a.op_devices, b.op_devices)  # deterministic for a seed


def test_the_critic_learns_which_moves_make_the_step_faster(monkeypatch):
    """Moves the critic ranks first are faster more often than the uniform share of the same batches.

    With the critic's update removed, its ranking is no better than uniform draws (ratio about 0.7).
    """
    g, c = moe_dag(120, seed=1), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    hits, tries = np.zeros(2), np.zeros(2)
    for seed in range(3):
        search = MoveSearch(g, c, env, options=MoveSearchOptions(proposals="critic"), seed=seed)
        search.run(None, max_evals=2000)
        hits, tries = hits + search.hits, tries + search.tries
    uniform, ranked = hits / tries
    assert ranked >= 1.5 * uniform, (ranked, uniform)


@pytest.mark.parametrize("flip", [False, True])
def test_adaptive_rounds_go_to_whichever_proposer_finds_faster_moves(monkeypatch, flip):
    """Thompson sampling between the critic's ranking and uniform draws: a critic trained on flipped labels (it ranks
    the slower moves first) loses most rounds to uniform draws; a sound one keeps most of them. Without the
    adaptation the ranked share is fixed at 1 - explore = 0.75 either way."""
    g, c = moe_dag(120, seed=1), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    if flip:
        learn = MoveSearch._learn
        monkeypatch.setattr(MoveSearch, "_learn", lambda self, feats, delta: learn(self, feats, -delta))
    tries, hits = np.zeros(2), np.zeros(2)
    for seed in range(2):
        search = MoveSearch(g, c, env, options=MoveSearchOptions(adaptive=True), seed=seed)
        search.run(None, max_evals=2000)
        tries, hits = tries + search.tries, hits + search.hits
    ranked_share = tries[1] / tries.sum()
    if flip:
        assert hits[1] / tries[1] < hits[0] / tries[0] and ranked_share < 0.4, (ranked_share, hits, tries)
    else:
        assert ranked_share > 0.6, (ranked_share, hits, tries)


def test_uniform_proposals_never_consult_the_critic():
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    search = MoveSearch(g, c, envs.SimEnv(g, c), options=MoveSearchOptions(proposals="uniform"), seed=0)
    before = [p.detach().clone() for p in search.critic.parameters()]
    search.run(None, max_evals=200)
    assert search.tries[1] == 0 and all(
        np.array_equal(p0, p1.detach()) for p0, p1 in zip(before, search.critic.parameters())
    )


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


def test_the_equal_budget_search_never_takes_longer_than_the_run():
    from placer.cli.train import equal_budget_line
    from placer.learn.move_learner import equal_budget_search

    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    sim = envs.SimEnv(g, c)
    whole = equal_budget_search(g, c, sim, 300, order=None, seed=0)
    assert whole["simulated"] == whole["evals"] == 300 and not whole["stopped"]
    # a limit already past: one round of draws and its descent, far short of the placements it was given
    cut = equal_budget_search(g, c, sim, 10**6, order=None, seed=0, time_limit_s=1e-9)
    assert cut["stopped"] and 0 < cut["simulated"] < 10**6 and cut["step_time_s"] > 0
    # a planned-order run's rival searches in the planned order too, every placement it simulates
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
    """The rival at equal budget beat the learner: its placement is written (with its issue order) and the summary
    names the file; best_placement.json stays the learner's. A slower rival writes nothing."""
    import placer.learn.loop as train_mod

    path = tmp_path / "g.json"
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    save(g, str(path))
    rival = np.full(g.num_ops, c.gpu_indices()[-1], dtype=np.int32)
    real = train_mod.equal_budget_search

    def crafted(*a, **kw):  # the real search, its time scaled: faster (0.5) or slower (2.0) than the learner's
        eq = real(*a, **kw)
        best = json.loads((tmp_path / "run" / "checkpoint.json").read_text())["run"]["best_step_time_s"]
        return {**eq, "op_devices": rival, "step_time_s": best * factor}

    monkeypatch.setattr(train_mod, "equal_budget_search", crafted)
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
    assert rc == 0 and kept.exists() == (factor < 1) and ("faster rival" in out) == (factor < 1)
    best = Placement.load(str(tmp_path / "run" / "best_placement.json"))
    assert best.meta["found_by"] != "equal-budget search"
    if factor < 1:
        p = Placement.load(str(kept))
        np.testing.assert_array_equal(p.indices(g, c.device_names), rival)
        assert p.method == "module_search" and p.meta["found_by"] == "equal-budget search" and p.order is not None
        assert p.meta["step_time_s"] == pytest.approx(best.meta["step_time_s"] * factor) and str(kept) in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["equal_budget_search"]
    assert "op_devices" not in summary and (summary.get("placement") == str(kept)) == (factor < 1)


def test_accepting_slower_moves_is_off_by_default_and_keeps_the_best():
    """options.accept > 0 takes the best of a fruitless batch anyway (cooling to 0 over the budget); the result is
    still the best placement simulated. At 0 (the default) nothing is accepted and the run is the default's."""
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x2")
    runs = {}
    for accept in (0.0, 0.5):
        env = envs.SimEnv(g, c)
        search = MoveSearch(g, c, env, options=MoveSearchOptions(accept=accept), seed=0)
        runs[accept] = (search.run(None, max_evals=600), search.accepted)
    default = MoveSearch(g, c, envs.SimEnv(g, c), seed=0).run(None, max_evals=600)
    assert runs[0.0][1] == 0 and runs[0.0][0].step_time_s == default.step_time_s
    np.testing.assert_array_equal(runs[0.0][0].op_devices, default.op_devices)
    result, accepted = runs[0.5]
    assert accepted > 0  # a hot search moves to slower placements
    t, _ = envs.SimEnv(g, c).step_times(result.op_devices[None])
    assert result.step_time_s == pytest.approx(float(t[0])) and result.step_time_s <= result.curve.best_s[0]
    with pytest.raises(PlacerError, match="bad options"):
        MoveSearch(g, c, envs.SimEnv(g, c), options=MoveSearchOptions(accept=-1.0))


def test_the_move_search_moves_onto_the_host_when_the_gpus_cannot_hold_the_model():
    # 24 GiB of training state on two 12 GB GPUs: every placement on the GPUs alone is out of memory
    from tests.placer.methods.test_heuristics import embedding_and_layers, four_modules

    c = envs.Cluster.preset("k80x2")
    g = embedding_and_layers()
    env = envs.SimEnv(g, c)
    search = MoveSearch(g, c, env, seed=0)
    assert search.devices.tolist() == [0, 1, 2]
    gpu = c.gpu_indices()[0]
    result = search.run(np.full(g.num_ops, gpu, dtype=np.int32), max_evals=200)
    assert envs.simulate(g, result.op_devices, c).status == "ok"
    assert MoveSearch(four_modules(), c, envs.SimEnv(four_modules(), c)).devices.tolist() == c.gpu_indices()


def test_module_search_takes_its_share_of_the_budget_first_and_the_moves_start_from_its_best():
    """module_share of max_evals goes to module_search (the same seed gives its placement), counted in the budget;
    the move search then starts from the best of that and the given start, and never ends slower than either.
    A share under MODULE_MIN_EVALS placements is not spent."""
    from placer.learn.moves import MODULE_MIN_EVALS
    from placer.methods.heuristics.module_search import module_search

    g, c = recurrent_dag(150, seed=1), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    start = np.full(g.num_ops, c.gpu_indices()[0], dtype=np.int64)  # one GPU: far from the best basin
    n = MODULE_MIN_EVALS
    alone = module_search(g, c, seed=4, n=n, env=envs.SimEnv(g, c))
    t_alone = float(env.step_times(alone[None])[0][0])
    search = MoveSearch(g, c, env, options=MoveSearchOptions(module_share=0.25, starts=0), seed=4)
    search.begin(start, max_evals=4 * n)
    assert search.module_evals == n and search.budget.evals == n + 2  # its share, the start, the incumbent's schedule
    assert search.cost == pytest.approx(t_alone) and t_alone < float(env.step_times(start[None])[0][0])
    result = MoveSearch(g, c, env, options=MoveSearchOptions(module_share=0.25), seed=4).run(start, max_evals=4 * n)
    assert result.evals == 4 * n and result.step_time_s <= t_alone
    for share, evals in ((0.0, 4 * n), (0.25, 4 * n - 4)):  # none; a share just under the minimum
        none = MoveSearch(g, c, env, options=MoveSearchOptions(module_share=share, starts=0), seed=4)
        none.begin(start, max_evals=evals)
        assert none.module_evals == 0 and none.budget.evals == 2
    with pytest.raises(PlacerError, match="bad options"):
        MoveSearch(g, c, env, options=MoveSearchOptions(module_share=1.0))


def test_module_search_s_share_in_seconds_and_on_a_graph_without_modules():
    g, c = recurrent_dag(150, seed=1), envs.Cluster.preset("k80x4")
    search = MoveSearch(g, c, envs.SimEnv(g, c), seed=0)
    t0 = __import__("time").perf_counter()
    search.begin(None, time_budget_s=float("inf"), module_s=0.3)  # placer train keeps the run's clock itself
    assert search.module_evals > 0 and __import__("time").perf_counter() - t0 >= 0.3
    inf = MoveSearch(g, c, envs.SimEnv(g, c), seed=0)
    inf.begin(None, time_budget_s=float("inf"))  # no length known: no share
    assert inf.module_evals == 0
    bare = random_dag(60, seed=0)
    bare = OpGraph.from_edges(
        bare.names,
        list(
            zip(
                [bare.names[i] for i in bare.edge_src], [bare.names[i] for i in bare.edge_dst], bare.edge_bytes.tolist()
            )
        ),
    )
    r = MoveSearch(bare, c, envs.SimEnv(bare, c), seed=0).run(None, max_evals=200)  # no module paths: moves only
    assert r.evals == 200


@pytest.mark.parametrize("budget", ["time", "iterations"])
def test_placer_train_gives_module_search_its_share_of_the_time_left(tmp_path, monkeypatch, budget):
    """With a time budget, the move search's first round runs module_search for module_share of the time left,
    through the run's scorer (which cannot say how far over capacity a placement is); without one, not at all."""
    from placer.learn.move_learner import RunScorer

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
        TrainConfig(algo="moves", logdir=str(tmp_path / "run"), progress=False, heuristics=("m_etf",), **limit),
        graph=g,
        cluster=c,
    )
    assert len(seen) == 1
    if budget == "time":  # what module_search found is labelled as its own
        assert 0.2 * 1.5 < seen[0] <= 0.2 * 3.0 and r.best_step_time_s < r.best_heuristic[1]
        assert found_by == {"module_search, the move search's start", "move search"}
    else:
        assert seen[0] == 0.0 and found_by == {"move search"}
