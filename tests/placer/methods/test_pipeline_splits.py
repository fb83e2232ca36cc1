"""The pipeline splits people use (placer/methods/heuristics/pipeline_splits.py): exact on toy graphs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import envs
from graphs import OpGraph, PlacerError
from placer.methods import registry
from placer.methods.heuristics.pipeline_splits import layer_units
from placer.methods.heuristics.stage_search import split_cuts

SPLITS = ["equal_layers", "flops_balanced", "parameters_balanced"]


@pytest.fixture(scope="module")
def k80x2():
    return envs.Cluster.preset("k80x2")  # a host and 2 GPUs: the splits use the GPUs, devices 1 and 2


def chain(paths, flops=None, param_bytes=None) -> OpGraph:
    names = [f"op{i}" for i in range(len(paths))]
    return OpGraph.from_edges(
        names,
        [(a, b, 64) for a, b in zip(names, names[1:])],
        flops=flops,
        param_bytes=param_bytes,
        module_paths=paths,
        op_types=["aten.mm.default"] * len(paths),
    )


#: embed, four repeated blocks (two ops each), norm and head: six layers
LM = ["embed", "layers.0.a", "layers.0.b", "layers.1.a", "layers.1.b", "layers.2.a", "layers.2.b"]
LM += ["layers.3.a", "layers.3.b", "norm", "head"]


def test_layers_are_the_repeated_modules_with_what_is_before_and_after_as_one_each():
    assert layer_units(chain(LM)).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    # two lists (an encoder's and a decoder's) and a module between them that joins the layer before it
    ed = ["enc.layers.0", "enc.layers.1", "enc.norm", "dec.layers.0", "dec.layers.1", "head"]
    assert layer_units(chain(ed)).tolist() == [0, 1, 1, 2, 3, 4]
    # an op of layer 0 after layer 1's ops joins layer 1: layers stay contiguous in program order
    assert layer_units(chain(["l.0", "l.1", "l.0", "l.2"])).tolist() == [0, 1, 1, 2]


def test_equal_layers_is_torchtitans_split(k80x2):
    got = registry.get("equal_layers")(chain(LM), k80x2)
    assert got.tolist() == [1] * 5 + [2] * 6  # 6 layers: embed + 2 blocks | 2 blocks + norm/head
    looped = registry.get("equal_layers")(chain(LM), k80x2, stages_per_rank=2)
    # 6 layers in 4 stages of 2, 2, 1, 1 layers (embed + L0 | L1 + L2 | L3 | norm + head) on devices 1, 2, 1, 2
    assert looped.tolist() == [1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2]


def test_flops_balanced_finds_the_known_optimal_cut(k80x2):
    # the best contiguous cut of [4, 1, 1, 1, 1, 4] into two is after the third op (6 | 6)
    g = chain(["x"] * 6, flops=[4e9, 1e9, 1e9, 1e9, 1e9, 4e9])
    assert registry.get("flops_balanced")(g, k80x2).tolist() == [1, 1, 1, 2, 2, 2]
    # [5, 1, 1, 1, 1, 1, 2] into three: the largest stage is at least 5 and 5 | 4 | 3 reaches it
    g = chain(["x"] * 7, flops=[5e9, 1e9, 1e9, 1e9, 1e9, 1e9, 2e9])
    three = envs.Cluster.preset("k80x4")
    devices = registry.get("flops_balanced")(g, three, stages_per_rank=1)
    per_stage = np.bincount(devices, weights=g.flops)
    assert per_stage.max() == pytest.approx(5e9)
    assert np.all(np.diff(devices) >= 0)  # contiguous in program order


def test_parameters_balanced_balances_the_layers_parameters(k80x2):
    # layers' parameters [100, 10, 10, 10, 10, 10]: the best cut leaves the embedding alone (100 | 50)
    params = [100, 5, 5, 5, 5, 5, 5, 5, 5, 10, 0]
    assert registry.get("parameters_balanced")(chain(LM, param_bytes=params), k80x2).tolist() == [1] + [2] * 10
    # equal_layers does not look at them
    assert registry.get("equal_layers")(chain(LM, param_bytes=params), k80x2).tolist() == [1] * 5 + [2] * 6
    # without parameters there is nothing to balance: equal layers
    assert registry.get("parameters_balanced")(chain(LM), k80x2).tolist() == [1] * 5 + [2] * 6


@pytest.mark.parametrize("name", SPLITS)
def test_every_split_is_a_registered_method_that_place_runs_with_a_schedule_that_fits(name, k80x2):
    from envs.sim.ranks import RankSim

    g = chain(LM, flops=[1e9] * len(LM))
    p = registry.place(name, g, k80x2, microbatches=2)
    assert p.method == name and set(p.assignment.values()) == {"gpu:0", "gpu:1"}
    res = RankSim(g, k80x2).evaluate([p])[0]
    assert res.ok and res.extra["stages"] == 2 and res.extra["schedule"] == "gpipe"


@pytest.mark.parametrize("name", SPLITS)
def test_more_stages_than_layers_is_one_line(name, k80x2):
    with pytest.raises(PlacerError, match="stages for a model of"):
        registry.get(name)(chain(["a", "b", "c"]), k80x2, stages_per_rank=2)


def test_the_search_on_the_simulator_of_ranks_moves_a_cut_off_a_heavy_tensor(k80x2):
    from envs.sim.ranks import RankSim

    # balanced FLOPs cut after op 3, where a huge tensor crosses; one op later only a small one does
    names = [f"op{i}" for i in range(6)]
    sizes = [1 << 10, 1 << 10, 1 << 30, 1 << 10, 1 << 10]
    g = OpGraph.from_edges(
        names,
        [(a, b, n) for a, b, n in zip(names, names[1:], sizes)],
        flops=[1e11] * 6,
        op_types=["aten.mm.default"] * 6,
    )
    flops = registry.get("flops_balanced")(g, k80x2)
    found = registry.get("stage_search")(g, k80x2)
    assert flops.tolist() == [1, 1, 1, 2, 2, 2] and found.tolist() != flops.tolist()
    sim = RankSim(g, k80x2)
    assert sim.step_times(found[None, :])[0][0] < 0.8 * sim.step_times(flops[None, :])[0][0]


def _six_equal_matmuls() -> OpGraph:
    """A chain of six equal matmuls (1e11 FLOPs each), 1 KiB between each and the next."""
    names = [f"op{i}" for i in range(6)]
    return OpGraph.from_edges(
        names, [(a, b, 1 << 10) for a, b in zip(names, names[1:])], flops=[1e11] * 6, op_types=["aten.mm.default"] * 6
    )


def _slow_second_gpu(k80x2, slowdown: float):
    from placer.learn.stand_in import distorted

    return distorted(k80x2, slow_device="gpu:1", slowdown=slowdown)


def test_with_merges_the_search_leaves_a_rank_much_slower_than_the_other_out(k80x2):
    """Six equal ops (25 ms each on a K80) with gpu:1 20x slower: every split gives gpu:1 one op at least (500 ms),
    so the best split leaves it one, and the whole chain on gpu:0 (150 ms) is faster still; only a cut moved onto the
    sequence's end (``merge``) reaches it."""
    from envs.sim.ranks import RankSim

    g = _six_equal_matmuls()
    cluster = _slow_second_gpu(k80x2, 20.0)
    split = registry.get("stage_search")(g, cluster)
    merged = registry.get("stage_search")(g, cluster, merge=True)
    assert split.tolist() == [1, 1, 1, 1, 1, 2]  # one op on the slow rank: the best a split can do
    assert merged.tolist() == [1] * 6  # the slow rank's stage merged away: a plan on one device
    sim = RankSim(g, cluster)
    assert sim.step_times(merged[None, :])[0][0] < 0.5 * sim.step_times(split[None, :])[0][0]
    # equal GPUs: one microbatch runs the stages one after another, so a split only adds its hand-off and the merge
    # takes one device; four microbatches overlap them, and the split stays
    assert len(set(registry.get("stage_search")(g, k80x2, merge=True).tolist())) == 1
    four = SimpleNamespace(microbatches=4)
    assert registry.get("stage_search")(g, k80x2, merge=True, env=four).tolist() == [1, 1, 1, 2, 2, 2]
    with pytest.raises(PlacerError, match="stage_search: merge must be true or false, got 'yes'"):
        registry.get("stage_search")(g, cluster, merge="yes")


def test_place_with_merges_says_the_plan_runs_on_one_rank(k80x2, tmp_path, capsys):
    from graphs.io import save
    from placer.cli import main

    g = _six_equal_matmuls()
    graph, cluster, out = tmp_path / "g.json", tmp_path / "slow.json", tmp_path / "p.json"
    save(g, str(graph))
    cluster.write_text(json.dumps(_slow_second_gpu(k80x2, 20.0).to_dict()))
    argv = ["place", str(graph), "--cluster", str(cluster), "--method", "stage_search", "-o", str(out), "--ranks"]
    assert main([*argv, "--option", "merge=true"]) == 0
    printed = capsys.readouterr().out
    assert "(1 stage on 1 rank, " in printed and "gpu:0: 6" in printed
    assert main(argv) == 0
    assert "(2 stages on 2 ranks, " in capsys.readouterr().out


def test_place_names_the_schedule_a_plan_runs_under_and_refuses_one_that_does_not_fit(tmp_path, capsys):
    """``--option schedule=S``: the file carries S, the simulated step across processes is S's, and a plan S cannot
    run is refused in one line, no file written."""
    from graphs.io import save
    from graphs.plan import Placement
    from placer.cli import main

    graph, out = tmp_path / "g.json", tmp_path / "p.json"
    save(_six_equal_matmuls(), str(graph))
    argv = ["place", str(graph), "--cluster", "k80x2", "--method", "equal_layers", "-o", str(out), "--ranks"]
    looped = ["--option", "stages_per_rank=2", "--option", "microbatches=4"]
    assert main([*argv, *looped, "--option", "schedule=interleaved_zb"]) == 0
    assert "(4 stages on 2 ranks, interleaved_zb schedule)" in capsys.readouterr().out
    zb = Placement.load(str(out))
    assert zb.schedule == "interleaved_zb" and zb.meta["ranks_schedule"] == "interleaved_zb"
    assert main([*argv, *looped, "--option", "schedule=interleaved_1f1b"]) == 0
    assert Placement.load(str(out)).meta["ranks_step_time_s"] != zb.meta["ranks_step_time_s"]
    capsys.readouterr()
    out.unlink()
    assert main([*argv, "--option", "microbatches=4", "--option", "schedule=interleaved_zb"]) == 2
    err = capsys.readouterr().err
    assert "--option schedule=interleaved_zb: schedule 'interleaved_zb' runs several stages per rank" in err
    assert err.count("\n") == 1 and not out.exists()


def test_under_the_v_schedule_a_split_goes_down_the_devices_and_back_with_its_turn_named(k80x2):
    from envs.real.distributed.cut import StagedSplit

    # six layers (embed, four blocks, norm and head as one) in 4 stages: equal counts 2 2 1 1, the stages on
    # gpu:0 gpu:1 gpu:1 gpu:0 (devices 1 2 2 1); the second stage on gpu:1 begins at layers.3 (op 7)
    out = registry.get("equal_layers")(chain(LM), k80x2, schedule="zbv")
    assert isinstance(out, StagedSplit) and out.starts == (7,)
    assert out.op_devices.tolist() == [1, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1]
    with pytest.raises(PlacerError, match="stages_per_rank=1: schedule 'zbv' runs 2 stages per rank"):
        registry.get("flops_balanced")(chain(LM), k80x2, stages_per_rank=1, schedule="zbv")
    assert isinstance(registry.get("parameters_balanced")(chain(LM), k80x2, schedule="interleaved_zb"), np.ndarray)


def test_the_search_under_the_v_schedule_rebalances_the_rank_that_holds_the_first_and_last_stage(k80x2):
    from envs.real.distributed.cut import StagedSplit
    from envs.sim.ranks import RankSim

    # a heavy head: in the V the first rank runs the embedding's stage and the head's
    g = chain(LM, flops=[1e11] * 10 + [8e11], param_bytes=[1 << 20] * len(LM))
    sim = RankSim(g, k80x2, microbatches=4, schedule="zbv")
    found = registry.get("stage_search")(g, k80x2, schedule="zbv", env=SimpleNamespace(microbatches=4, inflight=None))
    assert isinstance(found, StagedSplit)
    found_s = sim.simulate(found).step_time_s
    splits = {name: sim.simulate(registry.get(name)(g, k80x2, schedule="zbv")).step_time_s for name in SPLITS}
    assert found_s <= min(splits.values()) and found_s < 0.9 * splits["equal_layers"]
    assert sim.simulate(found).extra["stages"] == 4
    with pytest.raises(PlacerError, match="merge=true leaves stages empty"):
        registry.get("stage_search")(g, k80x2, schedule="zbv", merge=True)
    # through place: a Placement that carries the turn as its stage cut, which the simulator reads back
    p = registry.place("stage_search", g, k80x2, microbatches=4, schedule="zbv")
    assert p.schedule == "zbv" and p.stage_cuts == [g.names[found.starts[0]]]
    assert RankSim(g, k80x2).evaluate([p])[0].step_time_s == pytest.approx(found_s)


def test_place_writes_a_v_plan_with_its_stage_cut_and_refuses_a_v_of_one_stage_per_rank(tmp_path, capsys):
    from graphs.io import save
    from graphs.plan import Placement
    from placer.cli import main

    graph, out = tmp_path / "g.json", tmp_path / "p.json"
    save(_six_equal_matmuls(), str(graph))
    argv = ["place", str(graph), "--cluster", "k80x2", "--method", "flops_balanced", "-o", str(out), "--ranks"]
    assert main([*argv, "--option", "microbatches=4", "--option", "schedule=zbv"]) == 0
    assert "(4 stages on 2 ranks, zbv schedule)" in capsys.readouterr().out
    v = Placement.load(str(out))
    assert v.schedule == "zbv" and len(v.stage_cuts) == 1 and v.meta["ranks_schedule"] == "zbv"
    out.unlink()
    assert main([*argv, "--option", "stages_per_rank=1", "--option", "schedule=zbv"]) == 2
    err = capsys.readouterr().err
    assert "schedule 'zbv' runs 2 stages per rank" in err and err.count("\n") == 1 and not out.exists()


def test_compare_across_processes_scores_each_split_under_the_schedule_it_was_placed_for(k80x2):
    from envs.sim.ranks import RankSim
    from placer.compare import compare

    g = chain(LM, flops=[1e11] * 10 + [8e11], param_bytes=[1 << 20] * len(LM))
    names = ["equal_layers", "stage_search"]
    options = {m: {"schedule": "zbv"} for m in names}
    report = compare(g, k80x2, methods=names, microbatches=4, ranks=True, options=options)
    rows = {r.method: r for r in report.rows if r.method in names}
    assert {r.placement.schedule for r in rows.values()} == {"zbv"} and rows["stage_search"].placement.stage_cuts
    sim = RankSim(g, k80x2)
    for r in rows.values():
        assert r.step_time_s == pytest.approx(sim.simulate(r.placement).step_time_s)
        assert sim.simulate(r.placement).extra["schedule"] == "zbv"
    assert rows["stage_search"].step_time_s < rows["equal_layers"].step_time_s


def test_moving_two_neighbouring_cuts_together_finds_what_one_cut_at_a_time_cannot():
    from envs.sim.ranks import RankSim

    # twelve matmuls of uneven work (found by a seeded draw) in 8 stages of a V on 4 GPUs, M = 8: one cut moved at a
    # time stops at a plan that sliding a stage along (two cuts together) beats by 4 %
    names = [f"op{i}" for i in range(12)]
    flops = [f * 1e10 for f in (9, 8, 2, 9, 9, 3, 4, 5, 6, 4, 2, 9)]
    g = OpGraph.from_edges(
        names, [(a, b, 1 << 10) for a, b in zip(names, names[1:])], flops=flops, op_types=["aten.mm.default"] * 12
    )
    k80x4 = envs.Cluster.preset("k80x4")
    env = SimpleNamespace(microbatches=8, inflight=None)
    sim = RankSim(g, k80x4, microbatches=8, schedule="zbv")
    search = registry.get("stage_search")
    with_pairs = sim.simulate(search(g, k80x4, schedule="zbv", env=env)).step_time_s
    one_at_a_time = sim.simulate(search(g, k80x4, schedule="zbv", env=env, pairs=False)).step_time_s
    assert with_pairs < 0.97 * one_at_a_time
    with pytest.raises(PlacerError, match="pairs must be true or false"):
        search(g, k80x4, pairs="yes")


def test_the_search_simulates_each_plan_once_and_finds_what_it_found_scoring_them_all(monkeypatch):
    from envs.sim.ranks import RankSim
    from placer.methods.heuristics import stage_search as search

    # a later round tries again plans an earlier round scored: their steps are remembered, not simulated again
    # (24 matmuls of seeded work, each sending 1 KiB or 4 MiB on: the search moves its cuts in two rounds, then a third)
    names, rng = [f"op{i}" for i in range(24)], np.random.default_rng(3)
    flops = [f * 1e10 for f in rng.integers(1, 10, size=24)]
    edges = [(a, b, int(x)) for a, b, x in zip(names, names[1:], rng.choice([1 << 10, 1 << 22], size=23))]
    g = OpGraph.from_edges(names, edges, flops=flops, op_types=["aten.mm.default"] * 24)
    k80x4 = envs.Cluster.preset("k80x4")
    tried: list[tuple] = []  # every plan a move tried, by its cuts
    rows: list[bytes] = []  # every plan the moves simulated (after the three starting splits)
    started = []
    for name in ("moved_cuts", "shifted_pair"):
        make = getattr(search, name)
        monkeypatch.setattr(
            search, name, lambda *a, make=make, **k: [tried.append(tuple(c)) or c for c in make(*a, **k)]
        )
    start = search.starting_cuts

    def starting(*args):
        out = start(*args)
        started.append(1)  # the moves begin
        return out

    monkeypatch.setattr(search, "starting_cuts", starting)
    step_times = RankSim.step_times

    def recorded(self, op_devices, order=None):
        if started:
            rows.extend(np.asarray(row).tobytes() for row in np.atleast_2d(op_devices))
        return step_times(self, op_devices, order)

    monkeypatch.setattr(RankSim, "step_times", recorded)
    found = search.stage_search(g, k80x4, env=SimpleNamespace(microbatches=4, inflight=None))
    assert len(tried) > len(set(tried))  # later rounds tried plans again
    assert len(rows) == len(set(rows)) == len(set(tried))  # each simulated once
    # the plan is the best of every plan tried, as when each was simulated every time it was tried
    sim = RankSim(g, k80x4, microbatches=4)
    steps = [sim.simulate(np.frombuffer(r, dtype=np.asarray(found).dtype)).step_time_s for r in rows]
    assert sim.simulate(found).step_time_s <= min(steps)


def four_times_heavier_head() -> OpGraph:
    """The LM's layers, its head four times the work of a block: a V is 16 % faster than one stage per rank, M = 4."""
    return chain(LM, flops=[1e11] * 10 + [4e11], param_bytes=[1 << 20] * len(LM))


def test_schedule_auto_keeps_the_fastest_of_the_searches_under_each_schedule_that_fits(k80x2):
    from envs.real.distributed.cut import StagedSplit
    from envs.sim.ranks import RankSim
    from placer.methods.heuristics.stage_search import AUTO_SCHEDULES

    # M = 4: every schedule fits; each one's own search, run alone, is what auto reports for it, and auto keeps the
    # fastest (a V: the rank that holds the head also holds the embedding), 16 % ahead of one stage per rank
    g = four_times_heavier_head()
    env = SimpleNamespace(microbatches=4, inflight=None)
    search = registry.get("stage_search")
    auto = search(g, k80x2, schedule="auto", env=env)
    assert isinstance(auto, StagedSplit)
    assert list(auto.tried) == ["gpipe", *AUTO_SCHEDULES[1:]]
    for name, step_s in auto.tried.items():
        per_rank = 2 if name.startswith("interleaved") else None
        alone = search(g, k80x2, schedule=None if name == "gpipe" else name, stages_per_rank=per_rank, env=env)
        assert RankSim(g, k80x2, microbatches=4, schedule=name).simulate(alone).step_time_s == pytest.approx(step_s)
    assert auto.schedule == min(auto.tried, key=auto.tried.get)
    assert auto.tried[auto.schedule] < 0.9 * auto.tried["gpipe"]  # what choosing gains here: more than the margin
    # through place: the plan carries the chosen schedule, each schedule's step in its meta; the simulator agrees
    p = registry.place("stage_search", g, k80x2, microbatches=4, schedule="auto")
    assert p.schedule == auto.schedule and p.meta["schedules"] == pytest.approx(auto.tried)
    assert RankSim(g, k80x2).evaluate([p])[0].step_time_s == pytest.approx(auto.tried[auto.schedule])
    # a window of 2 of 4 microbatches: one stage per rank runs 1F1B, and GPipe's all-forwards-first does not fit
    assert list(search(g, k80x2, schedule="auto", env=SimpleNamespace(microbatches=4, inflight=2)).tried)[0] == "1f1b"


def test_schedule_auto_keeps_one_stage_per_rank_unless_more_stages_win_by_the_margin(k80x2):
    # the fastest plan of more stages than ranks is ahead of one stage per rank by `gain`; a
    # margin just under it keeps that plan, one just over keeps one stage per rank, and the default is 0.1
    from placer.methods.heuristics.stage_search import AUTO_MARGIN

    g = four_times_heavier_head()
    env = SimpleNamespace(microbatches=4, inflight=None)
    search = registry.get("stage_search")
    tried = search(g, k80x2, schedule="auto", margin=0.0, env=env).tried
    multi = min((k for k in tried if k != "gpipe"), key=tried.get)
    gain = 1 - tried[multi] / tried["gpipe"]
    assert AUTO_MARGIN == 0.1 and gain > 0.1
    assert search(g, k80x2, schedule="auto", margin=gain - 1e-6, env=env).schedule == multi
    kept = search(g, k80x2, schedule="auto", margin=gain + 1e-6, env=env)
    assert kept.schedule == "gpipe" and kept.starts == () and kept.tried == pytest.approx(tried)
    assert len(set(kept.op_devices.tolist())) == 2 and len(split_cuts(kept)) == 1  # one stage per rank
    for bad, message in ((1.0, "a fraction in"), (-0.1, "a fraction in"), ("x", "a fraction in"), (True, "a fraction")):
        with pytest.raises(PlacerError, match=message):
            search(g, k80x2, schedule="auto", margin=bad)
    with pytest.raises(PlacerError, match="margin=0.2: only with schedule=auto"):
        search(g, k80x2, schedule="zbv", margin=0.2)


def test_compare_names_the_schedule_auto_chose_in_the_row(k80x2):
    from placer.compare import compare
    from placer.compare.table import label, markdown

    names = ["equal_layers", "stage_search"]
    options = {"stage_search": {"schedule": "auto"}}
    report = compare(four_times_heavier_head(), k80x2, methods=names, microbatches=4, ranks=True, options=options)
    rows = {r.method: r for r in report.rows if r.method in names}
    chosen = rows["stage_search"].placement.schedule
    assert chosen in rows["stage_search"].placement.meta["schedules"] and chosen != "gpipe"
    assert label(rows["stage_search"]) == f"stage_search (M=4, {chosen})" and label(rows["equal_layers"]) == (
        "equal_layers (M=4)"
    )
    assert f"| stage_search (M=4, {chosen}) | ok |" in markdown(report)


def test_schedule_auto_tries_only_what_fits_and_only_stage_search_takes_it(k80x2):
    search = registry.get("stage_search")
    # three layers: 4 stages (looped, V) are more than the layers, so only one stage per rank runs
    three = chain(["embed", "body", "head"], flops=[1e11, 1e11, 1e11])
    auto = search(three, k80x2, schedule="auto")
    assert auto.schedule == "gpipe" and auto.tried["gpipe"] > 0
    assert {k for k, v in auto.tried.items() if v is None} == {"interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev"}
    # stages_per_rank=1: no looped plan; merge=true: no V (it would leave a stage of the 2R empty)
    assert list(search(chain(LM), k80x2, schedule="auto", stages_per_rank=1).tried) == ["gpipe"]
    assert list(search(chain(LM), k80x2, schedule="auto", merge=True).tried) == [
        "gpipe",
        "interleaved_1f1b",
        "interleaved_zb",
    ]
    with pytest.raises(PlacerError, match="schedule=auto: equal_layers does not choose a schedule"):
        registry.place("equal_layers", chain(LM), k80x2, schedule="auto")


def test_place_with_schedule_auto_says_what_each_schedule_reached(k80x2, tmp_path, capsys):
    from graphs.io import save
    from graphs.plan import Placement
    from placer.cli import main

    graph, out = tmp_path / "g.json", tmp_path / "p.json"
    save(four_times_heavier_head(), str(graph))
    argv = ["place", str(graph), "--cluster", "k80x2", "--method", "stage_search", "-o", str(out), "--ranks"]
    assert main([*argv, "--option", "microbatches=4", "--option", "schedule=auto"]) == 0
    said = capsys.readouterr().out
    p = Placement.load(str(out))
    line = next(line for line in said.splitlines() if "schedule=auto:" in line)
    assert f"; {p.schedule} kept (more stages than ranks only where 10 % faster" in line
    assert all(name in line for name in p.meta["schedules"])
    assert f"{p.meta['ranks_step_time_s'] * 1e3:.1f} ms" in line and p.meta["ranks_schedule"] == p.schedule
    assert main([*argv, "--option", "microbatches=4", "--option", "schedule=auto", "--option", "margin=0"]) == 0
    said = capsys.readouterr().out
    assert "kept (the fastest simulated, no margin)" in said and "10 % faster" not in said
    assert main([*argv[:5], "equal_layers", *argv[6:], "--option", "schedule=auto"]) == 2
    assert "equal_layers does not choose a schedule" in capsys.readouterr().err


def two_views() -> OpGraph:
    """A Siamese step by hand: one encoder (two linear layers, each with a batch norm) on two views, a head. Each
    batch norm's statistics are written by both views' calls (capture's record of them in meta)."""
    names = ["a_lin0", "a_bn0", "a_lin1", "a_bn1", "b_lin0", "b_bn0", "b_lin1", "b_bn1", "head"]
    edges = [("a_lin0", "a_bn0"), ("a_bn0", "a_lin1"), ("a_lin1", "a_bn1"), ("b_lin0", "b_bn0"), ("b_bn0", "b_lin1")]
    edges += [("b_lin1", "b_bn1"), ("a_bn1", "head"), ("b_bn1", "head")]
    paths = ["enc.lin0", "enc.bn0", "enc.lin1", "enc.bn1"] * 2 + ["head"]
    g = OpGraph.from_edges(
        names, [(a, b, 64) for a, b in edges], flops=[1e9, 1e8, 1e9, 1e8] * 2 + [1e8], module_paths=paths
    )
    g.meta["buffer_writes"] = [[op, f"enc.bn{op[-1]}.running_mean", ""] for op in names if "_bn" in op]
    g.meta["buffer_readers"] = {f"enc.bn{k}.running_mean": [f"a_bn{k}", f"b_bn{k}"] for k in (0, 1)}
    return g


@pytest.mark.parametrize("name", ["flops_balanced", "stage_search"])
def test_a_split_of_ops_that_write_a_buffer_twice_cuts_along_the_order_that_brings_them_together(name, k80x2):
    """Split in node order, the first view would be one stage and the second the other, and each batch norm's two
    updates would fall in two stages (the cut would merge them back, leaving fewer stages than asked). Along the
    stage cut's order the two views interleave, layer by layer, and no cut falls between a batch norm's calls:
    exactly the stages asked for (one a rank: each view's layer 0 in the first)."""
    from envs.real.distributed.cut import cut_stages

    g = two_views()
    for per_rank in (1, 2):
        p = registry.place(name, g, k80x2, stages_per_rank=per_rank, microbatches=2)
        stages = cut_stages(g, p.indices(g, k80x2.device_names), k80x2.device_names)
        assert len(stages) == 2 * per_rank
        if per_rank == 1:
            assert {g.names[i] for i in stages[0].ops} == {"a_lin0", "a_bn0", "b_lin0", "b_bn0"}
        for k in (0, 1):  # each batch norm's two calls in one stage
            assert len({s.index for s in stages for i in s.ops if g.names[i] in (f"a_bn{k}", f"b_bn{k}")}) == 1
