"""The move search: its item levels, its budget, and a critic that learns which moves make the step faster."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import envs
from graphs import OpGraph, PlacerError
from graphs.grouping import colocate
from graphs.synthetic import moe_dag, random_dag, recurrent_dag
from placer.learn.move_search import MoveSearch, MoveSearchOptions, top_ranked
from policies.moves import NUM_FEATURES, CriticFit, MoveCritic, MoveFeatures, MoveMemory, item_levels


def _without_modules(g: OpGraph) -> OpGraph:
    """``g``'s ops and edges alone: no module paths."""
    names = g.names
    edges = zip([names[i] for i in g.edge_src], [names[i] for i in g.edge_dst], g.edge_bytes.tolist())
    return OpGraph.from_edges(names, list(edges))


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
    bare = _without_modules(random_dag(60, seed=0))  # no module paths: chunks only
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


@pytest.mark.slow  # trains the critic over 6,000 simulated placements (~6 s)
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


@pytest.mark.slow  # trains the critic over 4,000 simulated placements (~4 s)
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


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
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


@pytest.mark.slow  # 9,000 simulated placements of a 150-op graph (~4 s)
def test_module_search_takes_its_share_of_the_budget_first_and_the_moves_start_from_its_best():
    """module_share of max_evals goes to module_search (the same seed gives its placement), counted in the budget;
    the move search then starts from the best of that and the given start, and never ends slower than either.
    A share under MODULE_MIN_EVALS placements is not spent."""
    from placer.learn.move_search import MODULE_MIN_EVALS
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
    bare = _without_modules(random_dag(60, seed=0))
    r = MoveSearch(bare, c, envs.SimEnv(bare, c), seed=0).run(None, max_evals=200)  # no module paths: moves only
    assert r.evals == 200


def test_a_plan_that_fits_is_returned_over_an_out_of_memory_one_ten_times_faster():
    """No op's training state fits a GPU (3.5 GB of weights: 14 GB with gradient and Adam's moments, on 12 GB), and
    the host runs 40x slower than a GPU: everything on a GPU, out of memory, costs 10x its step time and still less
    than everything on the host. The search must return a plan that fits (the host), not the cheaper failure."""
    doc = envs.Cluster.preset("k80x2").to_dict()
    doc["devices"][0]["flops_per_s"] = 1e11  # the host: 40x slower than a K80's 4 TFLOP/s
    c = envs.Cluster.from_dict(doc)
    names = ["a", "b", "c", "d"]
    g = OpGraph.from_edges(
        names, [(x, y, 1024) for x, y in zip(names, names[1:])], flops=[1e12] * 4, param_bytes=[3.5e9] * 4
    )
    env = envs.SimEnv(g, c)
    host, gpu = env.step_times(np.array([[0] * 4, [1] * 4], dtype=np.int32))[0]
    assert env.simulate(np.full(4, 1)).status == "oom" and 10 * gpu < host  # the failure costs less
    result = MoveSearch(g, c, env, seed=0).run(max_evals=60)
    assert not result.oom and env.simulate(result.op_devices).ok and result.op_devices.tolist() == [0, 0, 0, 0]


class _Refusing(envs.SimEnv):
    """The simulator, refusing (an infinite step) every placement on more than two devices, as the simulator of ranks
    refuses a plan of more than one stage per rank."""

    def step_times(self, op_devices, order=None):
        step_time_s, oom = super().step_times(op_devices, order)
        used = sum((np.asarray(op_devices) == d).any(axis=1) for d in range(self.cluster.num_devices))
        return np.where(used > 2, np.inf, step_time_s), oom


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_refused_placements_leave_the_critic_the_move_memory_and_the_incumbent_finite():
    """Refused moves and kicks (an infinite step) once made the change ``(inf - inf) / inf``: NaN and infinities
    reached the move memory, then the critic's features and weights, and a kick into a refused placement became the
    incumbent every move was measured against."""
    g, c = moe_dag(60, seed=4), envs.Cluster.preset("k80x4")
    search = MoveSearch(g, c, _Refusing(g, c), options=MoveSearchOptions(patience=2), seed=0)
    kicked = []
    kick = search._kick
    search._kick = lambda: kicked.append(kick()) or kicked[-1]
    result = search.run(np.full(g.num_ops, 1, dtype=np.int64), max_evals=1500)
    assert len(kicked) >= 3 and np.isfinite(result.step_time_s)
    assert all(np.isfinite(cost) for _, cost in kicked)
    assert all(np.isfinite(d).all() for d in search.memory.delta)
    assert all(bool(torch.isfinite(p).all()) for p in search.critic.parameters())


@pytest.mark.slow  # 4 x 50 steps of imitation (~3 s)
def test_policy_kicks_move_items_to_the_devices_of_the_search_s_local_optima():
    """Expert iteration: fitted to the local optima the descents found, the kicks' policy draws what they chose, and
    a kick moves the items where its draw differs from the best placement to the devices drawn. Untrained (no
    imitation), its draws spread over the devices: the test fails with the learning taken out."""
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    best = np.zeros(g.num_ops, dtype=np.int64)
    optimum = np.full(g.num_ops, 2, dtype=np.int64)  # the optima put every op on gpu 2; the best keeps gpu 0
    shares = {}
    for steps in (50, 0):
        search = MoveSearch(g, c, env, options=MoveSearchOptions(kicks="policy", policy_steps=steps), seed=0)
        search.optima = [(1.1, optimum.tobytes(), optimum)]
        lv = search.levels[-1]
        moved = np.concatenate([search._policy_moves(lv, best, 3)[1] for _ in range(3)])
        shares[steps] = float(np.mean(moved == 2)) if len(moved) else 0.0
        assert len(moved) <= 9  # at most `kick` items a kick
    assert shares[50] >= 0.8 and shares[0] <= 0.4, shares  # 1/3 would be a device drawn at random


def test_policy_kicks_without_optima_are_the_uniform_kicks_and_refuse_home_moves():
    """Before any local optimum there is nothing to imitate: the kick is the uniform one at the same level (policy
    kicks move coarse items by default), draw for draw."""
    g, c = moe_dag(60, seed=0), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    kicks = []
    for k in ("uniform", "policy"):
        search = MoveSearch(
            g, c, env, options=MoveSearchOptions(kicks=k, kick_at="coarse" if k == "uniform" else None), seed=1
        )
        search.begin(None, max_evals=1000)
        kicks.append([search._kick()[0] for _ in range(3)])
        assert search.policy is None  # never built
    assert all(np.array_equal(a, b) for a, b in zip(*kicks))
    with pytest.raises(PlacerError, match="policy kicks"):
        MoveSearch(g, c, env, options=MoveSearchOptions(kicks="policy", homes=True))
    with pytest.raises(PlacerError, match="kicks 'random'"):
        MoveSearch(g, c, env, options=MoveSearchOptions(kicks="random"))


class _StandIn(envs.SimEnv):
    """A stand-in for the simulator whose ``step_times`` a subclass writes; nothing is ever over memory."""

    def overflow(self, op_devices, order=None):
        return (*self.step_times(op_devices, order), np.zeros(len(op_devices)))


class _SingleOpMovesPay(_StandIn):
    """A stand-in for the simulator that knows which moves pay: from the search's incumbent, a move of one op is
    0.1 % faster with probability ``rate`` (slower otherwise), and any other placement is 1 % slower."""

    def __init__(self, graph: OpGraph, cluster: envs.Cluster, rate: float, seed: int = 0) -> None:
        super().__init__(graph, cluster)
        self.rate, self.rng, self.search = rate, np.random.default_rng(seed), None

    def step_times(self, op_devices, order=None):
        rows = np.asarray(op_devices)
        incumbent = getattr(self.search, "op_devices", None)
        if incumbent is None:  # the starts
            return np.ones(len(rows)), np.zeros(len(rows), dtype=bool)
        moved = (rows != incumbent).sum(axis=1)
        pays = (moved == 1) & (self.rng.random(len(rows)) < self.rate)
        return self.search.cost * np.where(pays, 0.999, 1.01), np.zeros(len(rows), dtype=bool)


def _rounds_per_level(levels: str, seed: int) -> tuple[np.ndarray, MoveSearch]:
    g, c = _without_modules(random_dag(60, seed=0)), envs.Cluster.preset("k80x4")
    env = _SingleOpMovesPay(g, c, 0.05, seed)
    env.search = search = MoveSearch(
        g, c, env, options=MoveSearchOptions(proposals="uniform", levels=levels), seed=seed
    )
    rounds = np.zeros(len(search.levels))
    play = search._round
    search._round = lambda: (rounds.__setitem__(search.level, rounds[search.level] + 1), play())
    search.run(np.zeros(g.num_ops, dtype=np.int64), max_evals=2000)
    return rounds, search


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_learned_levels_spend_the_rounds_on_the_level_whose_moves_pay():
    """Only single-op moves ever pay, 5 % of them: the cycle leaves the ops level after 6 fruitless rounds (about
    one stint in four) and spends 6 rounds on each coarse level before it comes back (28-35 % of the rounds on ops,
    seeds 0-2); the learned choice draws the coarse levels only as their posteriors forget their misses (71-73 %),
    and its search ends 5 % faster where the cycle's gained 0.3 %. Without the learned choice (the cycle's levels
    throughout) the ops share is the cycle's."""
    share, best = {}, {}
    for levels in ("cycle", "learned"):
        shares, costs = [], []
        for seed in range(3):
            rounds, search = _rounds_per_level(levels, seed)
            assert [lv.name for lv in search.levels][-1] == "ops"
            shares.append(rounds[-1] / rounds.sum())
            costs.append(search.result().step_time_s)
        share[levels], best[levels] = float(np.mean(shares)), float(np.median(costs))
    assert share["learned"] >= 0.6 and share["learned"] >= share["cycle"] + 0.25, share
    assert best["learned"] < best["cycle"] - 0.01, best


def test_learned_levels_visit_every_level_in_turn_first_and_are_the_critic_s_default_only():
    """The first pass is the cycle's (coarse to fine, each level until it goes stale); the uniform proposals, the
    ablation, cycle by default, and home moves always do; an unknown choice is an error."""
    g, c = _without_modules(random_dag(60, seed=0)), envs.Cluster.preset("k80x4")
    env = _SingleOpMovesPay(g, c, 0.0)  # nothing pays: every level goes stale after `patience` rounds
    env.search = search = MoveSearch(g, c, env, options=MoveSearchOptions(levels="learned"), seed=0)
    visited = []
    play = search._round
    search._round = lambda: (visited.append(search.level), play())
    search.run(np.zeros(g.num_ops, dtype=np.int64), max_evals=18 + 4 * 6 * len(search.levels) + 40)  # 17 starts
    assert visited[: 6 * len(search.levels)] == [k for k in range(len(search.levels)) for _ in range(6)]
    assert not search.first_pass and len(visited) > 6 * len(search.levels)
    assert (
        MoveSearch(g, c, env).learned_levels
        and not MoveSearch(g, c, env, options=MoveSearchOptions(proposals="uniform")).learned_levels
    )
    assert not MoveSearch(g, c, env, options=MoveSearchOptions(homes=True, levels="learned")).learned_levels
    with pytest.raises(PlacerError, match="levels 'bandit': unknown"):
        MoveSearch(g, c, env, options=MoveSearchOptions(levels="bandit"))


def test_kicks_move_single_ops_by_default_and_coarse_items_with_policy_or_home_moves():
    """A kick moves at most ``kick`` items of the finest level (the ops, with those colocated with them) by default:
    on a graph of 1,500 ops a coarse item is up to an eighth of it, and the descent spent its budget repairing such
    kicks. ``kick_at="coarse"`` (the default with policy kicks or home moves) moves whole coarse items."""
    g, c = moe_dag(120, seed=0), envs.Cluster.preset("k80x4")
    env = envs.SimEnv(g, c)
    moved = {}
    for kick_at in ("ops", "coarse"):
        search = MoveSearch(g, c, env, options=MoveSearchOptions(kick_at=kick_at), seed=0)
        search.begin(None, max_evals=1000)
        ops, changed = search.levels[-1].op_group, []
        for _ in range(20):  # each kick from the best so far (a kick may become it)
            best = search.budget.best_op_devices.copy()
            changed.append(search._kick()[0] != best)
        moved[kick_at] = max(int(m.sum()) for m in changed)
        if kick_at == "ops":
            assert all(len(np.unique(ops[m])) <= 3 for m in changed)
    assert moved["ops"] <= 3 * np.bincount(search.levels[-1].op_group).max()
    assert moved["coarse"] > moved["ops"], moved
    assert MoveSearch(g, c, env).kick_at == "ops"
    assert MoveSearch(g, c, env, options=MoveSearchOptions(proposals="uniform")).kick_at == "ops"
    assert MoveSearch(g, c, env, options=MoveSearchOptions(kicks="policy")).kick_at == "coarse"
    assert MoveSearch(g, c, env, options=MoveSearchOptions(homes=True)).kick_at == "coarse"
    with pytest.raises(PlacerError, match="kick_at 'modules': unknown"):
        MoveSearch(g, c, env, options=MoveSearchOptions(kick_at="modules"))


class _AdditiveMoves(_StandIn):
    """A stand-in for the simulator where each op has a device it prefers, and each op on it saves its own share of
    the step, whatever the others do: every faster move is faster in any company."""

    def __init__(self, graph: OpGraph, cluster: envs.Cluster) -> None:
        super().__init__(graph, cluster)
        rng = np.random.default_rng(0)
        self.prefers = rng.integers(0, cluster.num_devices, size=graph.num_ops)
        self.gain = rng.uniform(0.5, 1.5, size=graph.num_ops) / graph.num_ops

    def step_times(self, op_devices, order=None):
        rows = np.asarray(op_devices)
        return 2.0 - ((rows == self.prefers) * self.gain).sum(axis=1), np.zeros(len(rows), dtype=bool)


def test_a_round_s_faster_moves_of_different_items_are_simulated_together_and_taken_when_faster():
    """Where a batch holds faster moves of two or more items, the incumbent with all of them (each item's fastest)
    is one more placement, and on a landscape where moves add up it is taken every time; the search gets further on
    the same budget than without it."""
    g, c = _without_modules(random_dag(60, seed=0)), envs.Cluster.preset("k80x4")
    env = _AdditiveMoves(g, c)
    best = {}
    for combine in (True, False):
        costs = []
        for seed in range(3):
            search = MoveSearch(g, c, env, options=MoveSearchOptions(proposals="uniform", combine=combine), seed=seed)
            checked = []
            combine_moves = search._combine

            def spy(cand, pick, delta, op_devices, costs, j, search=search, checked=checked, inner=combine_moves):
                rows, out_costs, k = inner(cand, pick, delta, op_devices, costs, j)
                if k == len(costs):  # the combination taken: the incumbent with each item's fastest faster move
                    expect = search.op_devices.copy()
                    group = search.levels[cand.level].op_group
                    for w in np.argsort(-delta, kind="stable"):  # the fastest last, so each item keeps its fastest
                        if delta[w] < 0:
                            expect[group == cand.item[pick[w]]] = cand.device[pick[w]]
                    assert np.array_equal(rows[k], expect)
                    checked.append(k)
                return rows, out_costs, k

            search._combine = spy
            search.run(np.zeros(g.num_ops, dtype=np.int64), max_evals=600)
            if combine:
                assert search.combined[1] == search.combined[0] >= 3 and len(checked) == search.combined[1]
            else:
                assert search.combined == [0, 0]
            costs.append(search.result().step_time_s)
        best[combine] = float(np.median(costs))
    assert best[True] < best[False], best


def test_a_level_s_moves_kept_from_the_incumbent_count_what_other_levels_tried_since():
    """Moves of different levels can make the same placement (an item of one level may be an item of another). A
    level's moves kept from the incumbent and drawn again mark as tried what the other levels simulated in between,
    so no placement is simulated twice from one incumbent."""
    g, c = _without_modules(random_dag(60, seed=0)), envs.Cluster.preset("k80x4")
    search = MoveSearch(g, c, envs.SimEnv(g, c), options=MoveSearchOptions(levels="learned"), seed=0)
    search.begin(np.zeros(g.num_ops, dtype=np.int64), max_evals=1000)
    kept = search._level_cands[search.level]
    first = search.level
    search.level = first + 1
    search._fresh_candidates()
    untried = int(np.flatnonzero(~kept.tried)[0])
    search._tried_keys.add(float(kept.keys[untried]))  # the same placement, simulated from another level
    search.first_pass = False
    search.level_hits[:] = 0.5
    search.level_hits[first] = 1e6  # the draw takes the first level again
    search._learned_level()
    assert search.level == first and search.cand is kept and kept.tried[untried]


def test_the_moves_ranked_first_are_those_a_stable_sort_of_every_score_gives():
    """top_ranked partitions instead of sorting every move: the same positions as the full stable sort, ties in
    position order and NaN last, on many sizes (the partition path from 8 scores per pick)."""
    rng = np.random.default_rng(0)
    for t in range(600):
        n = int(rng.integers(1, 3000))
        k = int(rng.integers(1, min(n, 40) + 1))
        scores = (rng.integers(0, 20, n) if t % 2 else rng.standard_normal(n)).astype(np.float32)  # ties, or none
        if t % 5 == 0:
            scores[rng.integers(0, n, 3)] = np.nan
        assert top_ranked(scores, k).tolist() == np.argsort(-scores, kind="stable")[:k].tolist(), (n, k)


def test_the_critic_ranks_rows_into_its_workspaces_as_its_forward_does():
    """MoveCritic.rank (the search's ranking, into workspaces kept between calls) gives forward's logits to the bit,
    for rows picked in any order, when the workspaces grow, shrink back to fewer rows and the weights change."""

    torch.manual_seed(0)
    critic = MoveCritic(16)
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((5000, NUM_FEATURES)).astype(np.float32)
    optimizer = torch.optim.Adam(critic.parameters(), lr=0.1)
    for m in (3, 700, 4000, 20, 4000, 1):
        rows = rng.choice(len(feats), size=m, replace=False)
        got = critic.rank(feats, rows).copy()
        with torch.no_grad():
            want = critic(torch.from_numpy(feats[rows])).numpy()
        assert got.shape == (m,) and np.array_equal(got, want), m
        loss = critic(torch.from_numpy(feats[rows])).square().mean()  # the weights move between calls
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert not critic.rank(feats, rows).flags.owndata  # a view of the workspace, as documented


@pytest.mark.parametrize(
    "hidden,batch,lr,threads",
    [(16, 128, 0.1, 1), (64, 128, 1e-3, 1), (8, 1, 0.05, 1), (4, 33, 0.3, 1), (64, 512, 2e-3, 2)],
)
def test_the_critic_s_fit_steps_its_weights_as_autograd_and_adam_do_to_the_bit(hidden, batch, lr, threads):
    """CriticFit (the search's critic updates, gradients written by hand, Adam on one flat tensor) gives the weights
    and Adam's moments of binary_cross_entropy_with_logits, backward() and Adam over the six tensors, to the bit,
    step after step: rows of zeros, and large learning rates that kill ReLUs, included; on two threads too (the
    pretraining's batch of 512)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _fit_against_autograd(hidden, batch, lr)
    finally:
        torch.set_num_threads(before)


def _fit_against_autograd(hidden: int, batch: int, lr: float) -> None:
    torch.manual_seed(3)
    ours = MoveCritic(hidden)
    torch.manual_seed(3)
    ref = MoveCritic(hidden)
    fit, optimizer = CriticFit(ours, lr), torch.optim.Adam(ref.parameters(), lr=lr)
    rng = np.random.default_rng(4)
    for step in range(60):
        x = rng.standard_normal((batch, NUM_FEATURES)).astype(np.float32) * (1 + step % 3)
        x[: batch // 4] = 0.0
        y = (rng.random(batch) < 0.3).astype(np.float32)
        fit.step(torch.from_numpy(x), torch.from_numpy(y))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(torch.from_numpy(x)), torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a, b), (step, name, (a - b).abs().max())
    for key in ("exp_avg", "exp_avg_sq"):
        moments = torch.cat([optimizer.state[p][key].reshape(-1) for p in ref.parameters()])
        assert torch.equal(fit.optimizer.state[fit.flat][key], moments), key


def test_a_critic_fit_follows_weights_loaded_in_place_and_refuses_weights_replaced(tmp_path):
    """A state dict loaded into the fitted critic (in place) is what the next step starts from; weights replaced
    by other tensors are refused, not silently left behind. A fitted critic saves each tensor on its own."""
    from policies import policy_file

    critic, other = MoveCritic(8), MoveCritic(8)
    fit = CriticFit(critic, 0.01)
    critic.load_state_dict(other.state_dict())
    assert torch.equal(fit.flat[: 8 * NUM_FEATURES], other.net[0].weight.reshape(-1))
    x, y = torch.ones(4, NUM_FEATURES), torch.ones(4)
    fit.step(x, y)
    assert not torch.equal(critic.net[0].weight, other.net[0].weight)  # stepped from the loaded weights
    path = tmp_path / "critic.pt"
    policy_file.save_critic(path, critic, {"corpus": [], "seed": 0, "date": "today"})
    saved = torch.load(path, weights_only=True)
    assert all(v.untyped_storage().nbytes() == v.numel() * v.element_size() for v in saved.values())
    assert torch.equal(policy_file.load_critic(path).critic(x), critic(x))
    critic.net[0].weight.data = critic.net[0].weight.data.clone()
    with pytest.raises(RuntimeError, match="replaced"):
        fit.step(x, y)
