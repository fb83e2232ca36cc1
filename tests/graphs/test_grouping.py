"""Grouping: co-location, acyclic coarsening, totals, expand/contract, cut bytes, JSON."""

from __future__ import annotations

import json
from collections import defaultdict

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs import GraphFormatError, OpGraph, PlacerError
from graphs.group_graph import cut_bytes
from graphs.grouping import Grouping, coarsen, colocate
from graphs.module_tree import module_grouping, module_levels
from graphs.ops import base_op_name as op_base_name
from graphs.ops import is_inplace_op, is_view_op
from graphs.synthetic import random_dag


def brute_cut(graph: OpGraph, dev) -> int:
    """Cut bytes by the definition: per (producer, other device), the tensor once (largest edge)."""
    per = defaultdict(int)
    for s, d, b in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        if dev[s] != dev[d]:
            per[(s, dev[d])] = max(per[(s, dev[d])], b)
    return sum(per.values())


def brute_group_edges(graph: OpGraph, op_group) -> dict:
    per = {}
    for s, d, b in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        if op_group[s] != op_group[d]:
            per[(s, op_group[d])] = max(per.get((s, op_group[d]), 0), b)
    out = defaultdict(int)
    for (s, gd), b in per.items():
        out[(int(op_group[s]), int(gd))] += b
    return dict(out)


def check_grouping(graph: OpGraph, grouping: Grouping, max_groups: int, *, colocated: bool, seed: int = 0) -> None:
    G, n = grouping.num_groups, graph.num_ops
    gg = grouping.graph
    og = grouping.op_group
    # Every group used, at most max_groups, DAG in id order.
    assert 1 <= G <= max(max_groups, 1) and sorted(set(og.tolist())) == list(range(G))
    assert bool((og[graph.edge_src] <= og[graph.edge_dst]).all())
    assert nx.is_directed_acyclic_graph(gg.to_networkx())
    # Totals preserved.
    assert gg.flops.sum() == pytest.approx(graph.flops.sum(), rel=1e-12)
    assert int(gg.param_bytes.sum()) == int(graph.param_bytes.sum())
    assert int(gg.buffer_bytes.sum()) == int(graph.buffer_bytes.sum())
    assert sum(gg.meta["member_ops"]) == n and sum(gg.meta["member_out_bytes"]) == int(graph.out_bytes.sum())
    # Group edges: distinct source tensors crossing.
    got = {(int(s), int(d)): int(b) for s, d, b in zip(gg.edge_src, gg.edge_dst, gg.edge_bytes)}
    assert got == brute_group_edges(graph, og.tolist())
    # Co-location respected.
    if colocated:
        lab = colocate(graph)
        for c in np.unique(lab):
            assert len(set(og[lab == c].tolist())) == 1
    # expand / contract are inverse; cut bytes agree with the expansion.
    rng = np.random.default_rng(seed)
    P = rng.integers(0, 3, size=(5, G))
    ops = grouping.expand(P)
    assert ops.shape == (5, n)
    np.testing.assert_array_equal(grouping.contract(ops), P)
    np.testing.assert_array_equal(grouping.cut_bytes(P), cut_bytes(graph, ops))
    for k in range(len(P)):
        assert int(grouping.cut_bytes(P[k])) == brute_cut(graph, ops[k].tolist())
    # Each group on a device of its own: the cut is exactly the group edges' bytes.
    assert int(grouping.cut_bytes(np.arange(G))) == int(gg.edge_bytes.sum())


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 250),
    seed=st.integers(0, 10_000),
    max_groups=st.integers(1, 60),
    degree=st.floats(1.0, 3.0),
    colocated=st.booleans(),
)
def test_coarsen_properties(n, seed, max_groups, degree, colocated):
    g = random_dag(n, seed=seed, avg_degree=degree)
    check_grouping(g, coarsen(g, max_groups, colocate=colocated), max_groups, colocated=colocated, seed=seed)


# ------------------------------------------------------------------ co-location
def test_op_type_parsing():
    assert op_base_name("aten.add_.Tensor") == "add_" and op_base_name("_operator.getitem") == "getitem"
    assert is_view_op("aten.view.default") and is_view_op("getitem") and is_view_op("aten.t.default")
    assert not is_view_op("aten.mm.default") and not is_view_op("aten.clone.default")
    assert is_inplace_op("aten.copy_.default") and not is_inplace_op("aten._unsafe_view.default")
    assert not is_inplace_op("aten.__or__.Tensor")


def test_a_view_joins_the_producer_of_its_largest_input():
    # v = view(x) with a tiny sym_size-like second input s; w = getitem(split(x)).
    g = OpGraph.from_edges(
        ["x", "s", "v", "sp", "w", "y"],
        [("x", "v", 400), ("s", "v", 8), ("x", "sp", 400), ("sp", "w", 200), ("v", "y", 400), ("w", "y", 200)],
        op_types=[
            "aten.relu.default",
            "aten.sym_size.int",
            "aten.view.default",
            "aten.split.Tensor",
            "getitem",
            "aten.add.Tensor",
        ],
    )
    lab = colocate(g).tolist()
    x, s, v, sp, w, y = (g.index[k] for k in ["x", "s", "v", "sp", "w", "y"])
    assert lab[v] == lab[x] == lab[sp] == lab[w]  # split is a view of x, getitem of split
    assert lab[s] != lab[x] and lab[y] != lab[x]


def test_an_inplace_op_joins_what_it_mutates_and_shared_params_do_not_join():
    g = OpGraph.from_edges(
        ["a", "b", "c", "p1", "p2"],
        [("a", "c", 64), ("b", "c", 16)],
        op_types=["aten.mm.default", "aten.mm.default", "aten.add_.Tensor", "aten.mm.default", "aten.mm.default"],
    )
    g.params[g.index["p1"]] = ["fc.weight"]
    g.params[g.index["p2"]] = ["fc.weight"]
    lab = colocate(g).tolist()
    assert lab[g.index["c"]] == lab[g.index["a"]] != lab[g.index["b"]]
    assert lab[g.index["p1"]] != lab[g.index["p2"]]
    assert lab == [0, 1, 0, 2, 3]  # numbered by first op


def test_a_parameter_s_views_are_colocated_with_the_op_that_reads_them():
    # x -> mm <- unsqueeze <- t(w): x @ w.T.unsqueeze(0); w.T is a parameter view read by mm through its chain.
    # v is a view of another parameter, read by two ops (y, z): it is joined with both, so that its parameter can
    # live apart from them wherever a search puts them.
    g = OpGraph.from_edges(
        ["x", "t", "u", "mm", "v", "y", "z"],
        [("x", "mm", 8), ("t", "u", 8), ("u", "mm", 8), ("v", "y", 8), ("v", "z", 8), ("mm", "y", 8)],
        op_types=["aten.relu.default", "aten.t.default", "aten.unsqueeze.default", "aten.mm.default"]
        + ["aten.t.default", "aten.mm.default", "aten.mm.default"],
        param_bytes=[0, 8, 0, 0, 8, 0, 0],
    )
    lab = colocate(g).tolist()
    assert lab[g.index["t"]] == lab[g.index["u"]] == lab[g.index["mm"]] != lab[g.index["x"]]
    assert lab[g.index["v"]] == lab[g.index["y"]] == lab[g.index["z"]] != lab[g.index["mm"]]
    check_grouping(g, coarsen(g, 4), 4, colocated=True)


def test_colocation_cycle_is_merged():
    # a -> b -> c and a -> c, c = a.add_(b): joining a with c puts b on a cycle.
    g = OpGraph.from_edges(
        ["a", "b", "c", "d"],
        [("a", "b", 64), ("b", "c", 16), ("a", "c", 64), ("c", "d", 64)],
        op_types=["aten.relu.default", "aten.sum.default", "aten.add_.Tensor", "aten.relu.default"],
        flops=[1, 2, 3, 4],
    )
    grouping = coarsen(g, max_groups=10)
    assert grouping.num_groups == 2 and grouping.graph.meta["merged_cycles"] == 1
    assert grouping.op_group.tolist() == [0, 0, 0, 1]
    check_grouping(g, grouping, 10, colocated=True)


# ------------------------------------------------------------------ coarsening
def test_no_coarsening_needed_keeps_every_op():
    g = random_dag(40, seed=2)
    grouping = coarsen(g, max_groups=40, colocate=False)
    assert grouping.num_groups == 40
    assert sorted(grouping.graph.flops.tolist()) == sorted(g.flops.tolist())
    check_grouping(g, grouping, 40, colocated=False)


def test_one_group():
    g = random_dag(30, seed=3)
    grouping = coarsen(g, max_groups=1)
    assert grouping.num_groups == 1 and grouping.graph.num_edges == 0
    assert int(grouping.graph.out_bytes[0]) == int(g.out_bytes[-1])  # only the graph output leaves
    assert grouping.cut_bytes(np.array([[0], [1]])).tolist() == [0, 0]


def test_bad_max_groups():
    with pytest.raises(PlacerError, match="max_groups must be >= 1"):
        coarsen(random_dag(5), max_groups=0)


def test_groups_are_balanced_by_compute():
    g = random_dag(20_000, seed=4)
    grouping = coarsen(g, max_groups=64, colocate=False)
    assert grouping.num_groups == 64
    flops = grouping.graph.flops
    assert flops.max() <= 2.0 * flops.mean() and flops.min() >= 0.3 * flops.mean()


def test_cuts_prefer_small_tensors():
    # A chain of 8 equal ops; the balanced cut is before o4, but only 4 bytes are
    # live before o3 (bypass edges make every other nearby cut expensive).
    names = [f"o{i}" for i in range(8)]
    edges = [(names[i], names[i + 1], 1000) for i in range(7)]
    edges[2] = ("o2", "o3", 4)
    edges += [("o0", "o2", 5000), ("o3", "o5", 5000), ("o4", "o6", 5000)]
    g = OpGraph.from_edges(names, edges, flops=[1.0] * 8)
    grouping = coarsen(g, max_groups=2, colocate=False)
    assert grouping.op_group.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert grouping.graph.edge_bytes.tolist() == [4]


def test_group_columns():
    g = OpGraph.from_edges(
        ["a", "b", "c", "d"],
        [("a", "b", 8), ("b", "c", 8), ("a", "d", 4), ("c", "d", 8)],
        op_types=["aten.add.Tensor", "aten.mm.default", "aten.add.Tensor", "aten.add.Tensor"],
        flops=[1.0, 10.0, 1.0, 1.0],
        param_bytes=[0, 400, 0, 4],
        module_paths=["enc.l0.fc", "enc.l0.act", "enc.l1", "dec"],
    )
    g.params[1] = ["enc.l0.fc.weight"]
    g.profile = {"gpu": {"fwd_s": np.array([1.0, 2.0, np.nan, 4.0])}}
    grouping = Grouping.from_assignment(g, [0, 0, 0, 1])
    gg = grouping.graph
    assert gg.op_types == ["aten.mm.default", "aten.add.Tensor"]
    assert gg.module_paths == ["enc", "dec"]
    assert gg.params == [["enc.l0.fc.weight"], []]
    assert gg.param_bytes.tolist() == [400, 4]
    # a and c both feed d: two distinct tensors, 4 + 8 bytes; out_bytes likewise; d is the graph output.
    assert gg.edge_bytes.tolist() == [12] and gg.out_bytes.tolist() == [12, int(g.out_bytes[3])]
    assert np.isnan(gg.profile["gpu"]["fwd_s"][0]) and gg.profile["gpu"]["fwd_s"][1] == 4.0
    assert gg.meta["member_ops"] == [3, 1]


def test_from_assignment_renumbers_and_rejects_cycles():
    g = OpGraph.from_edges(["a", "b", "c"], [("a", "b", 8), ("b", "c", 8)])
    assert Grouping.from_assignment(g, [1, 0, 0]).op_group.tolist() == [0, 1, 1]
    with pytest.raises(PlacerError, match="groups form a cycle"):
        Grouping.from_assignment(g, [0, 1, 0])
    with pytest.raises(PlacerError, match="every id used"):
        Grouping.from_assignment(g, [0, 2, 2])


# ------------------------------------------------------------ expand / contract
def test_expand_batched_is_a_fancy_index():
    g = random_dag(200, seed=5)
    grouping = coarsen(g, max_groups=16)
    P = np.random.default_rng(0).integers(0, 4, size=(3, 7, grouping.num_groups))
    out = grouping.expand(P)
    assert out.shape == (3, 7, 200)
    np.testing.assert_array_equal(out, P[..., grouping.op_group])
    for gid in range(grouping.num_groups):
        assert (out[..., grouping.members(gid)] == P[..., gid : gid + 1]).all()
    np.testing.assert_array_equal(
        np.sort(np.concatenate([grouping.members(i) for i in range(grouping.num_groups)])), np.arange(200)
    )


def test_contract_rejects_a_split_group_and_bad_shapes():
    g = random_dag(50, seed=6)
    grouping = coarsen(g, max_groups=4)
    ops = grouping.expand(np.zeros(grouping.num_groups, dtype=int))
    victim = int(grouping.members(2)[-1])
    ops[victim] = 1
    with pytest.raises(PlacerError, match="group g2 is split"):
        grouping.contract(ops)
    with pytest.raises(PlacerError, match="last axis"):
        grouping.expand(np.zeros(grouping.num_groups + 1))
    with pytest.raises(PlacerError, match="last axis"):
        grouping.contract(np.zeros(49))
    with pytest.raises(PlacerError, match="no group"):
        grouping.members(4)


# ---------------------------------------------------------------------- JSON
def test_to_dict_round_trip(tmp_path):
    g = random_dag(300, seed=8)
    grouping = coarsen(g, max_groups=20)
    path = tmp_path / "grouping.json"
    path.write_text(json.dumps(grouping.to_dict()))
    doc = json.loads(path.read_text())
    back = Grouping.from_dict(doc, g)
    np.testing.assert_array_equal(back.op_group, grouping.op_group)
    assert back.graph.content_hash == grouping.graph.content_hash and back.graph.meta == grouping.graph.meta
    P = np.arange(grouping.num_groups) % 3
    assert int(back.cut_bytes(P)) == int(grouping.cut_bytes(P))
    alone = Grouping.from_dict(doc)
    np.testing.assert_array_equal(alone.expand(P), grouping.expand(P))
    with pytest.raises(PlacerError, match="needs the op graph"):
        alone.cut_bytes(P)


def test_from_dict_rejects_mismatches():
    g = random_dag(100, seed=9)
    doc = coarsen(g, max_groups=10).to_dict()
    with pytest.raises(GraphFormatError, match="made for graph"):
        Grouping.from_dict(doc, random_dag(100, seed=10))
    bad = json.loads(json.dumps(doc))
    bad["op_group"][0], bad["op_group"][-1] = bad["op_group"][-1], bad["op_group"][0]
    with pytest.raises(PlacerError):
        Grouping.from_dict(bad, g)
    with pytest.raises(GraphFormatError, match="expected 'placer-grouping/1'"):
        Grouping.from_dict({"format": "other"})


# ---------------------------------------------------------------------- speed
@pytest.mark.slow
def test_coarsen_100k_ops():
    # How long it takes is bench/graph_layer.py's figure (target < 10 s), not a test's assertion.
    g = random_dag(100_000, seed=0)
    grouping = coarsen(g, max_groups=256)
    assert grouping.num_groups == 256


def test_empty_and_single_op_graphs():
    empty = coarsen(OpGraph.from_edges([], []), max_groups=4)
    assert empty.num_groups == 0 and empty.cut_bytes(np.zeros((2, 0), dtype=int)).tolist() == [0, 0]
    one = coarsen(OpGraph.from_edges(["a"], [], flops=[5.0]), max_groups=4)
    assert one.num_groups == 1 and one.graph.flops.tolist() == [5.0] and int(one.cut_bytes([2])) == 0


def test_cut_bytes_keeps_batch_dimensions():
    g = random_dag(80, seed=11)
    grouping = coarsen(g, max_groups=8)
    P = np.random.default_rng(1).integers(0, 3, size=(2, 3, grouping.num_groups))
    got = grouping.cut_bytes(P)
    assert got.shape == (2, 3)
    assert got.tolist() == [[brute_cut(g, grouping.expand(p).tolist()) for p in row] for row in P]
    with pytest.raises(PlacerError, match=">= 0"):
        cut_bytes(g, -np.ones(80, dtype=int))


@pytest.mark.parametrize("heavy", [10, 250, 499])
def test_one_dominant_op_still_gives_max_groups(heavy):
    # A vocabulary projection can hold most of a model's FLOPs; the other ops must
    # still be spread over the remaining groups.
    g = random_dag(500, seed=12)
    flops = g.flops.copy()
    flops[heavy] = 1e6 * flops.sum()
    g2 = OpGraph(
        **{
            **{
                k: getattr(g, k)
                for k in (
                    "names",
                    "op_types",
                    "out_shapes",
                    "out_dtypes",
                    "out_bytes",
                    "param_bytes",
                    "buffer_bytes",
                    "module_paths",
                    "params",
                    "edge_src",
                    "edge_dst",
                    "edge_bytes",
                )
            },
            "flops": flops,
        }
    )
    grouping = coarsen(g2, max_groups=50, colocate=False)
    assert grouping.num_groups == 50
    assert len(grouping.members(int(grouping.op_group[heavy]))) <= 10


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 200), seed=st.integers(0, 10_000), max_groups=st.integers(1, 40), alias_share=st.floats(0.0, 0.6)
)
def test_coarsen_properties_with_many_views_and_inplace_ops(n, seed, max_groups, alias_share):
    # Views with several inputs and in-place ops everywhere: co-location joins far
    # apart ops, so its quotient graph has cycles that coarsen must merge.
    g = random_dag(n, seed=seed, avg_degree=2.0)
    rng = np.random.default_rng(seed)
    draw = rng.random(n)
    types = np.where(
        draw < alias_share / 2, "aten.view.default", np.where(draw < alias_share, "aten.add_.Tensor", "aten.mm.default")
    )
    g2 = OpGraph(
        **{
            **{
                k: getattr(g, k)
                for k in (
                    "names",
                    "out_shapes",
                    "out_dtypes",
                    "out_bytes",
                    "param_bytes",
                    "buffer_bytes",
                    "flops",
                    "module_paths",
                    "params",
                    "edge_src",
                    "edge_dst",
                    "edge_bytes",
                )
            },
            "op_types": types.tolist(),
        }
    )
    check_grouping(g2, coarsen(g2, max_groups), max_groups, colocated=True, seed=seed)


@pytest.mark.slow
def test_captured_model_views_stay_with_their_producers():
    torch = pytest.importorskip("torch")
    from graphs import capture

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8 * 6 * 6 // 2, 4)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            a, b = h.flatten(1).chunk(2, dim=1)
            return (self.fc(a) + self.fc(b).view(-1, 4)).sum()

    g = capture(Net().train(), (torch.randn(2, 3, 8, 8),))
    lab = colocate(g)
    views = [i for i, t in enumerate(g.op_types) if is_view_op(t) or g.names[i] in g.meta.get("alias_ops", [])]
    assert views, g.op_types
    for v in views:
        preds = g.predecessors(v)
        if len(preds):
            assert any(lab[p] == lab[v] for p in preds), (g.names[v], g.op_types[v])
    for max_groups in (1, 3, 100):
        check_grouping(g, coarsen(g, max_groups), max_groups, colocated=True)


@pytest.mark.slow
def test_module_levels_of_a_captured_recurrent_model_put_each_layer_in_one_group():
    torch = pytest.importorskip("torch")
    from graphs import capture

    class Cell(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ih, self.hh = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x, h):
            return torch.tanh(self.ih(x) + self.hh(h))

    class Net(torch.nn.Module):  # two layers unrolled over 4 steps, the weights shared by every step
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Linear(8, 8)
            self.layers = torch.nn.ModuleList([Cell(), Cell()])
            self.head = torch.nn.Linear(8, 2)

        def forward(self, xs):
            h = [torch.zeros(2, 8), torch.zeros(2, 8)]
            outs = []
            for t in range(xs.shape[0]):
                x = self.emb(xs[t])
                for i, cell in enumerate(self.layers):
                    h[i] = x = cell(x, h[i])
                outs.append(x)
            return self.head(torch.stack(outs)).sum()

    from envs.sim.sim_graph import schedule_graph

    g = schedule_graph(capture(Net(), (torch.randn(4, 2, 8),)))
    levels = module_levels(g)
    assert levels and all(lv.source_hash == g.content_hash for lv in levels)
    depths = [lv.graph.meta["module_depth"] for lv in levels]
    assert depths == sorted(set(depths))
    for lv in levels:
        check_grouping(g, lv, lv.num_groups, colocated=True)  # a DAG, totals kept, views with their producers
    layers = next(lv for lv in levels if lv.graph.meta["module_depth"] == 2)
    for i in (0, 1):  # every op of layers.i, over all 4 steps, in one group, and the two layers apart
        members = {int(layers.op_group[j]) for j, p in enumerate(g.module_paths) if p.startswith(f"layers.{i}")}
        assert len(members) == 1, (i, members)
    assert len({int(layers.op_group[j]) for j, p in enumerate(g.module_paths) if p.startswith("layers.")}) == 2


def test_module_levels_need_module_paths_and_reject_a_bad_depth():
    g = random_dag(40, seed=2)
    no_paths = OpGraph.from_edges(
        g.names,
        [
            (g.names[s], g.names[d], b)
            for s, d, b in zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_bytes.tolist())
        ],
    )
    assert not any(no_paths.module_paths) and module_levels(no_paths) == []
    with pytest.raises(PlacerError, match="depth"):
        module_grouping(g, 0)
    g3 = OpGraph.from_edges(
        ["a", "b", "c", "d"], [("a", "b", 8), ("b", "c", 8), ("c", "d", 8)], module_paths=["x.p", "x.q", "y.p", "y.q"]
    )
    # depth 1 joins x and y; depth 2 is every op alone (no coarsening), so it is not a level
    assert [lv.op_group.tolist() for lv in module_levels(g3)] == [[0, 0, 1, 1]]
    assert module_levels(g3, max_groups=1) == []


def test_a_view_across_layers_under_a_wrapper_keeps_the_layers_apart():
    # a wrapper's prefix ("model.") on every path, and each layer viewing the previous layer's output, as a
    # Hugging Face GPT-2 does: the view's co-location group once chained every layer into one group at every depth
    names = ["emb", "v0", "a0", "b0", "v1", "a1", "b1", "head"]
    g = OpGraph.from_edges(
        names,
        [(a, b, 64) for a, b in zip(names, names[1:])],
        op_types=[
            "aten.embedding.default",
            "aten.view.default",
            "aten.mm.default",
            "aten.relu.default",
            "aten.view.default",
            "aten.mm.default",
            "aten.relu.default",
            "aten.mm.default",
        ],
        module_paths=[
            "model.tr.wte",
            "model.tr.h.0",
            "model.tr.h.0",
            "model.tr.h.0",
            "model.tr.h.1",
            "model.tr.h.1",
            "model.tr.h.1",
            "model.lm_head",
        ],
    )
    levels = {lv.graph.meta["module_depth"]: lv.op_group.tolist() for lv in module_levels(g)}
    assert levels[2] == [0, 0, 0, 0, 0, 0, 0, 1]  # model.tr | model.lm_head
    assert levels[4] == [0, 0, 1, 1, 1, 2, 2, 3]  # wte (+ the view of it) | h.0 (+ the view of its output) | h.1 | head
