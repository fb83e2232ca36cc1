"""Heuristics: valid, deterministic, memory-aware where they claim, optimal on toy graphs."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import envs
from graphs import OpGraph, PlacerError
from graphs.synthetic import random_dag
from placer.compare import ORDER
from placer.methods import registry
from placer.methods.heuristics.groups import linear_partition
from placer.methods.registry import HeuristicUnavailable

# Every heuristic of the comparison's table but the single device, accelerate's (they need the model) and the ILP
# (a solver): placer's own.
MINE = [m for m in ORDER if m not in ("single", "accelerate", "accelerate_low_0", "accelerate_sequential", "ilp")]
FAST = {"random_search": {"n": 64}, "random_modules": {"n": 64}, "module_search": {"n": 64}, "annealing": {"steps": 64}}


@pytest.fixture(scope="module")
def k80x4():
    return envs.Cluster.preset("k80x4")


@pytest.fixture(scope="module")
def k80x2():
    return envs.Cluster.preset("k80x2")


def run(name, graph, cluster, **kw):
    return np.asarray(registry.get(name)(graph, cluster, **{**FAST.get(name, {}), **kw}))


def two_chains(length: int = 8, flops: float = 4e10, nbytes: int = 1 << 10, param_bytes: int = 0) -> OpGraph:
    """Two independent chains of equal, compute-heavy ops joined by small tensors."""
    names = [f"{c}{i}" for c in "ab" for i in range(length)]
    edges = [(f"{c}{i}", f"{c}{i + 1}", nbytes) for c in "ab" for i in range(length - 1)]
    n = len(names)
    return OpGraph.from_edges(
        names,
        edges,
        flops=[flops] * n,
        op_types=["aten.mm.default"] * n,
        param_bytes=[param_bytes] * n,
        name="two-chains",
    )


def test_registry_has_every_heuristic():
    assert set(MINE + ["accelerate"]) <= set(registry.names())


@pytest.mark.parametrize("name", MINE)
def test_valid_and_deterministic(name, k80x4):
    g = random_dag(150, seed=3)
    a = run(name, g, k80x4, seed=1)
    b = run(name, g, k80x4, seed=1)
    assert a.shape == (g.num_ops,) and np.issubdtype(a.dtype, np.integer)
    assert a.min() >= 0 and a.max() < k80x4.num_devices
    np.testing.assert_array_equal(a, b)
    assert envs.simulate(g, a, k80x4).status in ("ok", "oom")


@pytest.mark.parametrize(
    "name", ["heft", "m_etf", "m_sct", "metis", "scotch", "kernighan_lin", "gpipe", "expert", "m_topo", "annealing"]
)
def test_two_independent_chains_are_split(name, k80x2):
    g = two_chains(param_bytes=1 << 20)
    idx = run(name, g, k80x2)
    a, b = idx[:8], idx[8:]
    assert len(set(a.tolist())) == 1 and len(set(b.tolist())) == 1, idx
    assert a[0] != b[0] and {int(a[0]), int(b[0])} == set(k80x2.gpu_indices())
    split = envs.simulate(g, idx, k80x2).step_time_s
    one = envs.simulate(g, np.full(g.num_ops, 1), k80x2).step_time_s
    assert split < 0.6 * one


@pytest.mark.parametrize("name", ["heft", "m_etf", "m_sct"])
def test_chain_with_heavy_tensors_stays_on_one_gpu(name, k80x4):
    names = [f"x{i}" for i in range(6)]
    g = OpGraph.from_edges(
        names, [(names[i], names[i + 1], 1 << 28) for i in range(5)], flops=[1e9] * 6, op_types=["aten.mm.default"] * 6
    )
    idx = run(name, g, k80x4)
    assert len(set(idx.tolist())) == 1 and k80x4.kinds[int(idx[0])] == "gpu"


@pytest.mark.parametrize("name", ["m_topo", "m_etf", "m_sct", "heft", "expert", "annealing"])
def test_memory_aware_methods_fit_a_graph_too_big_for_one_gpu(name, k80x4):
    n = 40
    names = [f"l{i}" for i in range(n)]
    g = OpGraph.from_edges(
        names,
        [(names[i], names[i + 1], 1 << 20) for i in range(n - 1)],
        flops=[1e9] * n,
        param_bytes=[200 << 20] * n,
        op_types=["aten.mm.default"] * n,
        module_paths=[f"layers.{i}" for i in range(n)],
    )
    assert envs.simulate(g, np.full(n, 1), k80x4).status == "oom"  # precondition
    idx = run(name, g, k80x4)
    res = envs.simulate(g, idx, k80x4)
    assert res.status == "ok", res.message


def test_sct_lp_picks_the_critical_child():
    # a -> b (long) and a -> c (short): b must be a's favourite child.
    from placer.methods.heuristics.baechi import favourite_edges

    g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("a", "c", 8)])
    fav = favourite_edges(g, np.array([1.0, 10.0, 1.0]), np.array([5.0, 5.0]))
    assert fav.tolist() == [True, False]


def test_heft_insertion_fills_a_gap():
    from placer.methods.heuristics.heft import earliest_slot

    assert earliest_slot([0.0, 5.0], [1.0, 6.0], 0.0, 4.0) == (1.0, 1)
    assert earliest_slot([0.0, 5.0], [1.0, 6.0], 0.0, 4.5) == (6.0, 2)


def test_linear_partition_minimises_the_largest_block():
    idx = linear_partition(np.array([5.0, 1, 1, 1, 1, 1]), 2)
    assert idx.tolist() == [0, 1, 1, 1, 1, 1]
    idx = linear_partition(np.array([1.0] * 6), 3, capacity=np.array([1.0, 10, 10]), sizes=np.array([1.0] * 6))
    assert np.bincount(idx).tolist()[0] == 1


def test_round_robin_deals_over_gpus(k80x4):
    names = [f"x{i}" for i in range(10)]
    g = OpGraph.from_edges(names, [(names[i], names[i + 1], 4) for i in range(9)], op_types=["aten.mm.default"] * 10)
    assert run("round_robin", g, k80x4).tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


def recurrent_graph() -> OpGraph:
    paths = [
        "embedding",
        "encoder.layers.0",
        "encoder.layers.1",
        "decoder.layers.0",
        "decoder.layers.1",
        "attention",
        "attention",
        "softmax",
        "softmax",
    ]
    types = [
        "aten.embedding.default",
        "aten.lstm.input",
        "aten.lstm.input",
        "aten.lstm.input",
        "aten.lstm.input",
        "aten.bmm.default",
        "aten.softmax.int",
        "aten.mm.default",
        "aten._log_softmax.default",
    ]
    names = [f"op{i}" for i in range(len(paths))]
    edges = [
        ("op0", "op1", 4),
        ("op1", "op2", 4),
        ("op2", "op3", 4),
        ("op3", "op4", 4),
        ("op4", "op5", 4),
        ("op2", "op5", 4),
        ("op5", "op6", 4),
        ("op6", "op7", 4),
        ("op7", "op8", 4),
    ]
    return OpGraph.from_edges(
        names, edges, op_types=types, module_paths=paths, flops=[1e8] * 9, param_bytes=[1 << 20] * 9
    )


def test_expert_recurrent_layout(k80x4):
    idx = run("expert", recurrent_graph(), k80x4)
    gpu = {k80x4.device_names[int(d)] for d in idx}
    assert "cpu:0" not in gpu
    # layer d of encoder and decoder share GPU d; attention and softmax get the next two
    assert idx[1] == idx[3] == 1 and idx[2] == idx[4] == 2
    assert idx[5] == idx[6] == 3 and idx[7] == idx[8] == 4
    assert idx[0] == idx[1]  # embedding with the first layer


def test_expert_huge_embedding_goes_to_cpu(k80x4):
    g = recurrent_graph()
    g.param_bytes[0] = 6 << 30
    g.invalidate()
    assert run("expert", g, k80x4)[0] == k80x4.index("cpu:0")


def test_expert_feed_forward_blocks_follow_module_paths(k80x4):
    g = random_dag(200, seed=2)  # module paths block{i//50}.layer{...}: 4 equal-size blocks
    idx = run("expert", g, k80x4)
    assert (np.diff(idx) >= 0).all()  # contiguous, in order
    assert len(set(idx.tolist())) == 4


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_accelerate_maps_its_device_map_onto_ops(k80x4):
    pytest.importorskip("accelerate")
    import torch
    from torch import nn

    import graphs

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(512, 512) for _ in range(8)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x.sum()

    model = Net()
    g = graphs.capture(model, (torch.randn(4, 512),))
    idx = run("accelerate", g, k80x4, model=model)
    assert set(idx.tolist()) <= set(k80x4.gpu_indices())
    assert (np.diff(idx) >= 0).all()  # accelerate fills GPUs in module order
    assert len(set(idx.tolist())) > 1


def test_accelerate_map_lookup(k80x4):
    from placer.methods.heuristics.hf_accelerate import map_onto_ops

    g = OpGraph.from_edges(
        ["a", "b", "c", "d"],
        [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)],
        module_paths=["enc.0", "enc.1.fc", "", "head"],
    )
    idx = map_onto_ops(g, {"enc.0": 0, "enc.1": 1, "head": "cpu"}, k80x4)
    assert idx.tolist() == [1, 2, 2, 0]  # "" follows its producer; cpu -> cpu:0


def test_accelerate_without_a_model_says_so(k80x4):
    pytest.importorskip("accelerate")
    with pytest.raises(HeuristicUnavailable) as e:
        run("accelerate", random_dag(10), k80x4)
    assert e.value.status == "needs a model"


@pytest.mark.parametrize("name,module", [("metis", "pymetis"), ("scotch", "pyscotch"), ("accelerate", "accelerate")])
def test_missing_library_is_not_installed(name, module, k80x4, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    with pytest.raises(HeuristicUnavailable) as e:
        run(name, random_dag(20), k80x4)
    assert e.value.status == "not installed" and module in str(e.value)
    assert isinstance(e.value, PlacerError)


def test_annealing_never_worse_than_its_start(k80x4):
    g = random_dag(120, seed=5)
    env = envs.SimEnv(g, k80x4)
    start = min(env.step_times(run(m, g, k80x4)[None])[0][0] for m in ("m_etf", "expert"))
    got = env.step_times(run("annealing", g, k80x4, steps=200)[None])[0][0]
    assert got <= start + 1e-12


def test_random_search_seed_matters(k80x4):
    g = random_dag(80, seed=1)
    a, b = run("random_search", g, k80x4, seed=0, n=8), run("random_search", g, k80x4, seed=1, n=8)
    assert not np.array_equal(a, b)


def test_random_modules_places_whole_modules_and_finds_a_layer_per_gpu(k80x4):
    # two independent compute-heavy chains, each one module: apart they run in parallel
    g = two_chains()
    g = OpGraph.from_edges(
        g.names,
        [
            (g.names[s], g.names[d], b)
            for s, d, b in zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_bytes.tolist())
        ],
        flops=g.flops,
        op_types=g.op_types,
        name="two-chains",
        module_paths=[f"layers.{n[0]}.cell" for n in g.names],
    )
    idx = run("random_modules", g, k80x4, n=16)
    a, b = (
        {int(idx[i]) for i, n in enumerate(g.names) if n[0] == "a"},
        {int(idx[i]) for i, n in enumerate(g.names) if n[0] == "b"},
    )
    assert len(a) == len(b) == 1 and a != b and a | b <= set(k80x4.gpu_indices())
    with pytest.raises(PlacerError, match="random_modules: two-chains records no module paths"):
        run("random_modules", two_chains(), k80x4)
    with pytest.raises(PlacerError, match="n must be"):
        run("random_modules", g, k80x4, n=0)


def four_modules(k: int = 4) -> OpGraph:
    """``k`` independent compute-heavy chains, each one module (``layers.<i>``): best with a chain per GPU."""
    names = [f"c{m}_{i}" for m in range(k) for i in range(4)]
    edges = [(f"c{m}_{i}", f"c{m}_{i + 1}", 1 << 10) for m in range(k) for i in range(3)]
    return OpGraph.from_edges(
        names,
        edges,
        flops=[4e10] * len(names),
        op_types=["aten.mm.default"] * len(names),
        name="four-modules",
        module_paths=[f"layers.{n[1]}" for n in names],
    )


def test_module_search_places_whole_modules_within_its_budget(k80x4):
    g, gpus = four_modules(), set(k80x4.gpu_indices())
    env = envs.SimEnv(g, k80x4)
    per_gpu = np.repeat(np.asarray(sorted(gpus)), 4)  # chain m on GPU m: the optimum (4 equal chains, 4 GPUs)
    opt = float(env.step_times(per_gpu[None])[0][0])
    before = env.simulated
    # one uniform draw per start, then single-module moves: 12 per round (4 modules x 3 other GPUs)
    idx = run("module_search", g, k80x4, n=40, starts=1, env=env)
    assert env.simulated - before == 40
    assert float(env.step_times(idx[None])[0][0]) == pytest.approx(opt)
    assert {int(idx[i]) for i in range(16)} == gpus and all(
        len(set(idx[4 * m : 4 * m + 4].tolist())) == 1 for m in range(4)
    )
    assert np.array_equal(run("module_search", g, k80x4, n=40, seed=3), run("module_search", g, k80x4, n=40, seed=3))
    with pytest.raises(PlacerError, match="module_search: two-chains records no module paths"):
        run("module_search", two_chains(), k80x4)
    with pytest.raises(PlacerError, match="n and starts must be"):
        run("module_search", g, k80x4, starts=0)


def test_descend_spends_no_more_than_its_budget_and_prefers_a_placement_that_fits():
    from placer.methods.heuristics.module_search import descend

    c = envs.Cluster.preset("k80x2")
    gpus = np.asarray(c.gpu_indices())
    g = four_modules(2)
    env = envs.SimEnv(g, c)
    x, key, used = descend(env, np.repeat(np.arange(2), 4), np.array([gpus[0], gpus[0]]), gpus, 2)
    assert used == 2 and not key[0]  # the start, then the one move the budget allows
    assert len(set(x.tolist())) == 2  # ... which was the improving one
    # a start out of memory (two 2 GiB parameters on one 12 GB K80, with their gradients and Adam state) ends fitting
    heavy = OpGraph.from_edges(["a", "b"], [], flops=[1e9, 1e9], param_bytes=[2 << 30, 2 << 30], name="heavy")
    env = envs.SimEnv(heavy, c)
    assert env.step_times(np.array([[gpus[0], gpus[0]]]))[1][0]
    x, key, used = descend(env, np.arange(2), np.array([gpus[0], gpus[0]]), gpus, 10)
    assert not key[0] and len(set(x.tolist())) == 2


@pytest.mark.slow
def test_expert_on_the_zoo_nmt_follows_the_paper(k80x4):
    from graphs import zoo

    g = zoo.graph("nmt-2")
    idx = run("expert", g, k80x4)
    by_path: dict[str, set[int]] = {}
    for path, d in zip(g.module_paths, idx.tolist()):
        by_path.setdefault(path, set()).add(d)
    assert by_path["encoder.layers.0"] == by_path["decoder.layers.0"] == {1}
    assert by_path["encoder.layers.1"] == by_path["decoder.layers.1"] == {2}
    assert by_path["softmax"] == {4} and 3 in by_path["attention"]
    assert envs.simulate(g, idx, k80x4).status == "ok"


@pytest.mark.slow
def test_accelerate_rebuilds_a_zoo_model(k80x4):
    pytest.importorskip("accelerate")
    from graphs import zoo

    g = zoo.graph("resnet50")
    idx = run("accelerate", g, k80x4)
    assert set(idx.tolist()) <= set(k80x4.gpu_indices()) and len(set(idx.tolist())) > 1


def test_scotch_is_reproducible_on_a_large_graph(k80x4):
    # Scotch's threaded default strategy varies from run to run unless told not to.
    pytest.importorskip("pyscotch")
    g = random_dag(3000, seed=2)
    runs = [run("scotch", g, k80x4, seed=0) for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


@pytest.mark.timeout(120)  # a hang guard, not a speed target: 10**9 steps would run for hours
def test_annealing_time_budget_stops_the_chain(k80x4):
    g = random_dag(300, seed=6)
    idx = run("annealing", g, k80x4, steps=10**9, time_budget_s=0.5)
    assert idx.shape == (g.num_ops,)


def _layered(width: int = 512, depth: int = 8):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x.sum()

    return Net(), (torch.randn(4, width),)


def test_accelerate_strategies_follow_from_pretrained(k80x4):
    """balanced_low_0 keeps GPU 0 lighter than balanced; sequential fills GPU 0 first."""
    pytest.importorskip("accelerate")
    import graphs
    from placer.methods.heuristics.hf_accelerate import device_map

    model, inputs = _layered()
    g = graphs.capture(model, inputs)
    maps = {s: device_map(model, k80x4, s) for s in ("balanced", "balanced_low_0", "sequential")}
    assert set(maps["sequential"].values()) == {0}  # 8 MiB of weights fit GPU 0 whole
    per_gpu = {
        s: np.bincount(run(m, g, k80x4, model=model), minlength=5)
        for s, m in (("balanced", "accelerate"), ("balanced_low_0", "accelerate_low_0"))
    }
    assert per_gpu["balanced_low_0"][1] < per_gpu["balanced"][1]  # gpu:0 is device 1
    assert (np.diff(run("accelerate_sequential", g, k80x4, model=model)) == 0).all()


def test_accelerate_on_a_graph_file_says_which_callable_to_pass(k80x4):
    pytest.importorskip("accelerate")
    g = random_dag(10)
    g.meta["source"] = "mypkg.models:build"
    for name in ("accelerate", "accelerate_low_0", "accelerate_sequential"):
        with pytest.raises(HeuristicUnavailable) as e:
            run(name, g, k80x4)
        assert e.value.status == "needs a model" and "mypkg.models:build" in str(e.value)
        assert "\n" not in str(e.value)


def test_single_reports_oom_rather_than_the_cpu(k80x4):
    """No GPU holds the model: single stays on a GPU (oom), and takes the CPU only when asked."""
    g = random_dag(10)
    g.param_bytes[:] = 2 << 30  # 20 GiB of weights: no 11 GiB K80 die holds them
    g.invalidate()
    idx = run("single", g, k80x4)
    assert k80x4.kinds[idx[0]] == "gpu" and envs.simulate(g, idx, k80x4).status == "oom"
    assert k80x4.kinds[run("single", g, k80x4, cpu=True)[0]] == "cpu"
    assert run("single", g, k80x4, device="cpu:0")[0] == 0


def test_accelerate_keeps_a_wrapped_models_blocks_whole(k80x4):
    """A wrapper (for the loss) hides the model's _no_split_modules; from_pretrained would have used them."""
    pytest.importorskip("accelerate")
    from torch import nn

    from placer.methods.heuristics.hf_accelerate import device_map, no_split_modules

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)

    class Model(nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(6)])

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()

    wrapper = Wrapper()
    assert no_split_modules(wrapper) == ["Block"]
    keys = device_map(wrapper, k80x4, "balanced")
    assert keys and all(k.count(".") <= 2 for k in keys)  # model.blocks.i at the deepest: no block split


def _staged_graph_with_a_shared_mask():
    """An input consumer and 4 heavy stages, each reading one mask built from constants (no input reaches it)."""
    S = 4
    names = ["emb"] + [f"s{k}" for k in range(S)] + ["ar", "m1", "m2"]
    edges = [("emb", "s0", 1 << 20)] + [(f"s{k}", f"s{k + 1}", 1 << 20) for k in range(S - 1)]
    edges += [("ar", "m1", 1 << 16), ("m1", "m2", 1 << 20)] + [("m2", f"s{k}", 1 << 20) for k in range(S)]
    g = OpGraph.from_edges(names, edges, flops=[1e9] + [4e11] * S + [1e6, 1e7, 1e7], name="staged-mask")
    g.meta["inputs"] = [{"name": "x", "shape": [8, 4], "bytes": 128, "consumers": ["emb"]}]
    return g


def test_annealing_moves_the_input_free_block_of_a_pipelined_plan(monkeypatch):
    """Pipelined: the mask's peer copies to every stage are stream barriers; from the host they are not.

    Started from one stage per GPU with the mask on the first, zero annealing steps: the block
    variants alone find the plan with the mask on the host; without block moves the start stays.
    """
    import envs
    import placer.methods.heuristics.annealing as annealing_mod

    g = _staged_graph_with_a_shared_mask()
    c = envs.resolve_cluster("v100x4")  # cpu:0, gpu:0..3
    stage = {"emb": 1, "s0": 1, "s1": 2, "s2": 3, "s3": 4}
    on_gpu = np.array([stage.get(x, 1) for x in g.names])
    on_host = np.array([stage.get(x, 0) for x in g.names])
    env = envs.SimEnv(g, c, microbatches=4)
    t_gpu, t_host = env.simulate(on_gpu).step_time_s, env.simulate(on_host).step_time_s
    assert t_host < 0.9 * t_gpu  # the premise
    real_get = annealing_mod.get
    monkeypatch.setattr(
        annealing_mod, "get", lambda name: (lambda *a, **k: on_gpu) if name == "stages" else real_get(name)
    )
    run = lambda **kw: annealing_mod.annealing(g, c, env=env, steps=0, init=("stages",), **kw)  # noqa: E731
    assert run().tolist() == on_host.tolist()  # on by default for a pipelined env
    assert run(block_moves=False).tolist() == on_gpu.tolist()
    # not a pipelined plan: off by default
    assert (
        annealing_mod.annealing(g, c, env=envs.SimEnv(g, c), steps=0, init=("stages",)).tolist()
        == annealing_mod.annealing(g, c, env=envs.SimEnv(g, c), steps=0, init=("stages",), block_moves=False).tolist()
    )


def _fan(param_bytes: int, readers: int = 3) -> OpGraph:
    """``a`` owns a weight that ``readers`` later ops, each fed a small tensor by ``a``, read too."""
    names = ["a"] + [f"r{i}" for i in range(readers)]
    g = OpGraph.from_edges(
        names,
        [("a", f"r{i}", 1024) for i in range(readers)],
        flops=[4e10] * (readers + 1),
        op_types=["aten.mm.default"] * (readers + 1),
        param_bytes=[param_bytes] + [0] * readers,
        name="fan",
    )
    g.params = [["w"]] * (readers + 1)
    return g


@pytest.mark.parametrize("name", ["m_etf", "m_sct", "heft"])
def test_list_schedulers_charge_a_shared_weights_copy(name, k80x2):
    kw = {"devices": "gpus"} if name == "heft" else {}
    # 400 MB of weights: copying them to the second GPU and the gradient back (~80 ms on K80 links) costs far more
    # than the ~10 ms a reader would wait for the first GPU, so every reader stays with the weights
    g = _fan(400_000_000)
    blind = run(name, g, k80x2, param_copies=False, **kw)
    aware = run(name, g, k80x2, **kw)
    assert len(set(blind.tolist())) == 2  # earliest start alone splits the readers
    np.testing.assert_array_equal(run(f"{name}_nocopy", g, k80x2, **kw), blind)  # the copy-blind rule, registered
    assert len(set(aware.tolist())) == 1
    assert envs.simulate(g, aware, k80x2).step_time_s < envs.simulate(g, blind, k80x2).step_time_s
    # a weight of a few bytes costs nothing to copy: both split alike
    small = _fan(64)
    np.testing.assert_array_equal(run(name, small, k80x2, **kw), run(name, small, k80x2, param_copies=False, **kw))
    with pytest.raises(PlacerError, match="param_copies='maybe': expected true or false"):
        run(name, small, k80x2, param_copies="maybe", **kw)


def test_the_registry_lists_the_heuristics_by_module_whoever_imported_one_first():
    """names() is in the order of the heuristics' modules (then of registration in one), not of first import."""
    import pkgutil

    import placer.methods.heuristics as heuristics
    import placer.methods.heuristics.hf_accelerate  # noqa: F401  (imported early, as placer.device_map does)

    modules = [f"{heuristics.__name__}.{m.name}" for m in pkgutil.iter_modules(heuristics.__path__)]
    ranks = [modules.index(registry.get(name).__module__) for name in registry.names()]
    assert ranks == sorted(ranks)


def heavy_layers(k: int = 4, act_bytes: int = 1800 << 20) -> OpGraph:
    """A chain of ``k`` layers (modules ``layers.<i>``) of 3 ops whose ``act_bytes`` outputs are kept for the backward:
    on 12 GB K80s one layer per GPU fits, two on one GPU do not, and all on one GPU is the fastest step (nothing to
    copy between GPUs)."""
    names = [f"l{m}_{i}" for m in range(k) for i in range(3)]
    return OpGraph.from_edges(
        names,
        [(a, b, act_bytes) for a, b in zip(names, names[1:])],
        flops=[4e10] * len(names),
        op_types=["aten.mm.default"] * len(names),
        name="heavy-layers",
        module_paths=[f"layers.{n[1]}" for n in names],
    )


def test_scored_keys_rank_placements_out_of_memory_by_how_far_over_they_are(k80x4):
    from placer.methods.heuristics.ranking import scored_keys

    g, gpus = heavy_layers(), k80x4.gpu_indices()
    env = envs.SimEnv(g, k80x4)
    rows = np.array([[gpus[0]] * 12, [gpus[0]] * 6 + [gpus[1]] * 6, [gpus[m] for m in range(4) for _ in range(3)]])
    (all_oom, all_over), (half_oom, half_over), (fits, t) = scored_keys(env, rows)
    assert all_oom and half_oom and not fits
    assert list(env.step_times(rows)[0]) == sorted(env.step_times(rows)[0])  # all on one GPU is the fastest...
    assert sorted(scored_keys(env, rows)) == scored_keys(env, rows)[::-1]  # ... and the furthest from fitting
    assert all_over > half_over > 1 and t == pytest.approx(env.step_times(rows[2:])[0][0])


def test_a_descent_started_out_of_memory_moves_toward_fitting(k80x4):
    # ranked by step time, placements out of memory led the descent to all on one GPU (the d=2048 encoder's case)
    from placer.methods.heuristics.module_search import descend

    g, gpus = heavy_layers(), np.asarray(k80x4.gpu_indices())
    env = envs.SimEnv(g, k80x4)
    x, key, used = descend(env, np.repeat(np.arange(4), 3), gpus[[0, 0, 0, 0]], gpus, 100)  # no single move fits
    assert not key[0] and envs.simulate(g, x[np.repeat(np.arange(4), 3)], k80x4).status == "ok"
    assert envs.simulate(g, run("module_search", g, k80x4, starts=1, n=100), k80x4).status == "ok"


def test_annealing_returns_a_placement_that_fits_once_it_has_scored_one():
    # the host holds the layer; a GPU is far faster but too small: out of memory, its cost is still below the host's
    g = OpGraph.from_edges(
        ["w"], [], flops=[4e12], param_bytes=[3 << 30], op_types=["aten.mm.default"], name="one-layer"
    )
    c = envs.Cluster.preset("k80x2")
    env = envs.SimEnv(g, c)
    cpu, gpu = c.device_names.index("cpu:0"), c.gpu_indices()[0]
    (t_cpu, t_gpu), oom = env.step_times(np.array([[cpu], [gpu]]))
    over = env.overflow(np.array([[gpu]]))[2][0]
    assert (
        oom.tolist() == [False, True] and t_gpu * 2 * over < t_cpu
    )  # with oom_penalty 1, the chain's cost prefers the GPU
    idx = run("annealing", g, c, devices="all", init=(), steps=32, oom_penalty=1.0)
    assert envs.simulate(g, idx, c).status == "ok"


def test_annealing_returns_the_placement_closest_to_fitting_when_none_fits():
    # six 1 GiB layers (4 GiB each with gradients and Adam state) joined by 1.6 GB activations, on two 12 GB K80s:
    # nothing fits; all on one GPU is the fastest and the furthest from fitting, so a best ranked by step time would
    # be the chain's start, where a placement split over the GPUs is nearer to fitting
    names = [f"l{i}" for i in range(6)]
    g = OpGraph.from_edges(
        names,
        [(a, b, 1600 << 20) for a, b in zip(names, names[1:])],
        flops=[4e10] * 6,
        op_types=["aten.mm.default"] * 6,
        param_bytes=[1 << 30] * 6,
        name="six-layers",
    )
    c = envs.Cluster.preset("k80x2")
    one_gpu = np.full(g.num_ops, c.gpu_indices()[0])
    best = run("annealing", g, c, init=(), steps=64, devices="gpus")
    step_time_s, oom, over = envs.SimEnv(g, c).overflow(np.stack([one_gpu, best]))
    assert oom.all() and step_time_s[0] < step_time_s[1]
    assert over[1] < over[0]


def test_install_hints_name_the_libraries_of_each_extra_in_setup_cfg():
    # `pip install 'placer[plot]'` fetched an unrelated project named placer from the package index
    import configparser
    import pathlib
    import re

    from placer.methods.registry import EXTRAS, install_hint

    cfg = configparser.ConfigParser()
    cfg.read(pathlib.Path(__file__).resolve().parents[3] / "setup.cfg")
    extras = {k: v for k, v in cfg["options.extras_require"].items() if k != "test"}
    assert set(EXTRAS) == set(extras)
    for extra, libs in EXTRAS.items():
        assert set(libs) == {
            re.split(r"[<>=!~ ]", line.strip())[0] for line in extras[extra].split("\n") if line.strip()
        }
        assert "placer[" not in install_hint(extra).replace(f"'.[{extra}]'", "")


def embedding_and_layers() -> OpGraph:
    """A cheap lookup holding 2 GiB of weights, then 4 compute-heavy layers of 1 GiB each: 24 GiB of training state
    (weights, gradients, two Adam moments), more than k80x2's two 12 GB GPUs hold; with the lookup on the host it
    fits."""
    names = ["embed"] + [f"l{m}_{i}" for m in range(4) for i in range(3)]
    edges = [(a, b, 1 << 20) for a, b in zip(names, names[1:])]
    gib = 1 << 30
    return OpGraph.from_edges(
        names,
        edges,
        flops=[1e6] + [4e10] * 12,
        op_types=["aten.mm.default"] * 13,
        param_bytes=[2 * gib] + [gib if n.endswith("_0") else 0 for n in names[1:]],
        name="embedding-and-layers",
        module_paths=["embed"] + [f"layers.{n[1]}" for n in names[1:]],
    )


def test_auto_devices_are_the_gpus_when_the_model_fits_them_and_every_device_when_it_does_not(k80x2):
    from placer.methods.heuristics.costs import candidate_devices, fits_gpus

    small, big = four_modules(), embedding_and_layers()
    assert fits_gpus(small, k80x2) and not fits_gpus(big, k80x2)
    assert candidate_devices(k80x2, "auto", small).tolist() == k80x2.gpu_indices()
    assert candidate_devices(k80x2, "auto", big).tolist() == [0, 1, 2]
    with pytest.raises(PlacerError, match="needs the graph"):
        candidate_devices(k80x2, "auto")
    with pytest.raises(PlacerError, match="'auto', 'gpus' or 'all'"):
        candidate_devices(k80x2, "host")


@pytest.mark.parametrize("name", ["module_search", "random_modules", "random_search", "annealing"])
def test_searches_use_the_host_by_default_when_the_gpus_cannot_hold_the_model(name, k80x2):
    # an H100 capped at 24 GiB and a 1.5 B-parameter Llama: every search over the GPU alone ran out of memory
    g = embedding_and_layers()
    cpu = k80x2.device_names.index("cpu:0")
    assert envs.simulate(g, run(name, g, k80x2, devices="gpus"), k80x2).status == "oom"
    idx = run(name, g, k80x2)
    assert envs.simulate(g, idx, k80x2).status == "ok"
    if name == "module_search":  # the lookup on the host, a layer's module per GPU: what the descent finds
        assert int(idx[0]) == cpu and cpu not in idx[1:]
    small = four_modules()
    assert np.array_equal(run(name, small, k80x2), run(name, small, k80x2, devices="gpus"))


def test_the_copy_delays_kept_between_steps_are_those_computed_afresh():
    """ParamCopies.delays keeps each op's delay until placed() changes where its owners are or which devices hold
    their copies: after every placement of a random schedule, every op's kept delay equals delay() from scratch
    (the list schedulers ask for every ready op's delays at every step)."""
    from graphs.synthetic import recurrent_dag
    from placer.methods.heuristics.scheduling import ParamCopies

    g = recurrent_dag(120, seed=0)  # its recurrent weights are read at every step
    rng = np.random.default_rng(0)
    nd = 3
    spb, lat = rng.uniform(0.0, 1e-9, (nd, nd)), rng.uniform(0.0, 1e-5, (nd, nd))
    np.fill_diagonal(spb, 0.0)
    np.fill_diagonal(lat, 0.0)
    copies = ParamCopies(g, nd)
    assert len(copies.reads) > 20
    dev = np.full(g.num_ops, -1, dtype=np.int64)
    every = np.arange(g.num_ops)
    charged = 0
    for op in rng.permutation(g.num_ops).tolist():  # any order exercises every change of state
        want = np.stack([np.broadcast_to(copies.delay(i, dev, spb, lat), (nd,)) for i in every.tolist()])
        np.testing.assert_array_equal(copies.delays(every, dev, spb, lat), want)
        charged += int((want > 0).any())
        d = int(rng.integers(0, nd))
        dev[op] = d
        copies.placed(op, d)
    assert charged > 50  # copies were charged, and then taken back as readers brought them to each device
