"""OpGraph: construction, topological reordering, CSR adjacency, networkx, validation."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from graphs import GraphFormatError, OpGraph
from graphs.dag import find_cycle as _find_cycle
from graphs.synthetic import random_dag


def _columns(g: OpGraph, **override) -> dict:
    cols = dict(
        names=list(g.names),
        op_types=list(g.op_types),
        out_shapes=g.out_shapes,
        out_dtypes=g.out_dtypes,
        out_bytes=g.out_bytes,
        param_bytes=g.param_bytes,
        buffer_bytes=g.buffer_bytes,
        flops=g.flops,
        module_paths=list(g.module_paths),
        params=g.params,
        edge_src=g.edge_src,
        edge_dst=g.edge_dst,
        edge_bytes=g.edge_bytes,
        profile=g.profile,
        name=g.name,
    )
    cols.update(override)
    return cols


def test_from_edges_reorders_topologically_and_carries_columns():
    # Given in reverse order: c consumes b, b consumes a.
    g = OpGraph.from_edges(
        ["c", "b", "a"], [("b", "c", 8), ("a", "b", 4)], flops=[3.0, 2.0, 1.0], op_types=["tc", "tb", "ta"]
    )
    assert g.names == ["a", "b", "c"]
    assert g.flops.tolist() == [1.0, 2.0, 3.0]
    assert g.op_types == ["ta", "tb", "tc"]
    assert bool((g.edge_src < g.edge_dst).all())
    assert {(g.names[s], g.names[d], int(b)) for s, d, b in zip(g.edge_src, g.edge_dst, g.edge_bytes)} == {
        ("a", "b", 4),
        ("b", "c", 8),
    }
    assert g.out_bytes.tolist() == [4, 8, 0]  # default: largest outgoing edge


def test_from_edges_keeps_an_order_that_is_already_topological():
    g = OpGraph.from_edges(["x", "z", "y"], [("x", "y", 1), ("z", "y", 1)])
    assert g.names == ["x", "z", "y"]


def test_from_edges_cycle_names_the_ops_on_it():
    with pytest.raises(
        GraphFormatError,
        match=r"cycle \('b' -> 'c' -> 'a' -> 'b'\)|cycle \('a' -> 'b' -> 'c' -> 'a'\)|cycle \('c' -> 'a' -> 'b' -> "
        r"'c'\)",
    ):
        OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 1), ("b", "c", 1), ("c", "a", 1), ("c", "d", 1)])


def test_from_edges_self_loop_is_a_cycle():
    with pytest.raises(GraphFormatError, match="cycle"):
        OpGraph.from_edges(["a", "b"], [("a", "b", 1), ("b", "b", 1)])


def test_from_edges_unknown_op_and_duplicate_names():
    with pytest.raises(GraphFormatError, match="unknown op 'q'"):
        OpGraph.from_edges(["a"], [("a", "q", 1)])
    with pytest.raises(GraphFormatError, match="not unique"):
        OpGraph.from_edges(["a", "a"], [])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_find_cycle_returns_a_real_cycle(seed):
    g = random_dag(60, seed=seed)
    rng = np.random.default_rng(seed)
    # One backward edge between two ops joined by a forward path makes a cycle.
    d = int(rng.integers(30, 59))
    src = np.append(g.edge_src, d + 1)  # d -> d+1 is a chain edge, so d+1 -> d closes a cycle
    dst = np.append(g.edge_dst, d)
    cycle = _find_cycle(g.num_ops, src, dst)
    assert cycle[0] == cycle[-1] and len(cycle) >= 3
    edges = set(zip(src.tolist(), dst.tolist()))
    assert all((u, v) in edges for u, v in zip(cycle, cycle[1:]))
    assert _find_cycle(g.num_ops, g.edge_src, g.edge_dst) == []


def test_csr_successors_and_predecessors_match_networkx():
    g = random_dag(300, seed=3)
    G = g.to_networkx()
    for i in range(g.num_ops):
        assert sorted(g.names[j] for j in g.successors(i)) == sorted(G.successors(g.names[i]))
        assert sorted(g.names[j] for j in g.predecessors(i)) == sorted(G.predecessors(g.names[i]))
    indptr, dst, eid = g.out_csr
    assert indptr[-1] == g.num_edges and (g.edge_src[eid] == np.repeat(np.arange(g.num_ops), np.diff(indptr))).all()
    assert (g.edge_dst[eid] == dst).all()
    indptr, src, eid = g.in_csr
    assert (g.edge_src[eid] == src).all() and (
        g.edge_dst[eid] == np.repeat(np.arange(g.num_ops), np.diff(indptr))
    ).all()


def test_csr_of_a_graph_without_edges():
    g = OpGraph.from_edges(["a", "b"], [])
    assert g.successors(0).tolist() == [] and g.predecessors(1).tolist() == []


def test_networkx_round_trip_keeps_everything():
    g = random_dag(200, seed=4)
    g.profile = {
        "gpu": {
            "fwd_s": np.where(np.arange(200) % 3 == 0, np.nan, 1e-3),
            "bwd_s": np.full(200, 2e-3),
            "issue_fwd_s": np.full(200, 1e-5),
            "issue_bwd_s": np.full(200, 3e-5),
        }
    }
    g.invalidate()
    g2 = OpGraph.from_networkx(g.to_networkx())
    assert g2.content_hash == g.content_hash
    assert g2.names == g.names and g2.params == g.params and g2.module_paths == g.module_paths
    np.testing.assert_array_equal(g2.profile["gpu"]["fwd_s"], g.profile["gpu"]["fwd_s"])  # NaN-aware
    np.testing.assert_array_equal(g2.profile["gpu"]["issue_bwd_s"], g.profile["gpu"]["issue_bwd_s"])
    np.testing.assert_array_equal(g2.edge_bytes, g.edge_bytes)


def test_from_networkx_of_a_plain_digraph_sorts_topologically():
    G = nx.DiGraph()
    G.add_nodes_from(["out", "mid", "in"])
    G.add_edge("in", "mid", bytes=16)
    G.add_edge("mid", "out", bytes=4)
    g = OpGraph.from_networkx(G)
    assert g.names == ["in", "mid", "out"]
    assert g.edge_bytes.tolist() == [16, 4]  # sorted by (src, dst)


def test_from_networkx_rejects_a_cycle():
    G = nx.DiGraph([("a", "b"), ("b", "a")])
    with pytest.raises(GraphFormatError, match="cycle"):
        OpGraph.from_networkx(G)


def test_hash_ignores_profile_meta_and_name_but_not_columns():
    g = random_dag(50, seed=5)
    h = g.content_hash
    g2 = OpGraph(**_columns(g, name="other", profile={"cpu": {"fwd_s": np.ones(50)}}))
    g2.meta["note"] = "x"
    assert g2.content_hash == h
    g3 = OpGraph(**_columns(g, flops=g.flops * 2))
    assert g3.content_hash != h


BAD_COLUMNS = [
    ({"out_bytes": "neg"}, "negative or non-finite out_bytes"),
    ({"flops": "nan"}, "negative or non-finite flops"),
    ({"edge_bytes": "neg"}, "has negative bytes"),
    ({"edge_dst": "dangling"}, "dangling"),
    ({"edge_src": "short"}, "edge arrays have different lengths"),
    ({"op_types": "short"}, "column 'op_types' has 49 entries, expected 50"),
    ({"out_shapes": "neg"}, "output shape .* sizes >= 0"),
    ({"out_dtypes": "short_inner"}, "a dtype string per shape"),
    ({"edge_src": "backward"}, "not in topological order"),
    ({"edge_src": "cycle"}, "contain a cycle"),
]


@pytest.mark.parametrize("change,message", BAD_COLUMNS)
def test_validate_names_the_problem(change, message):
    g = random_dag(50, seed=6, name="toy")
    ((col, how),) = change.items()
    cols = _columns(g)
    if how == "neg":
        if col == "out_shapes":
            cols[col] = [list(s) for s in g.out_shapes]
            cols[col][7] = [[3, -1]]
        else:
            cols[col] = getattr(g, col).copy()
            cols[col][7] = -4
    elif how == "nan":
        cols[col] = g.flops.copy()
        cols[col][7] = np.nan
    elif how == "dangling":
        cols[col] = g.edge_dst.copy()
        cols[col][3] = 50
    elif how == "short":
        cols[col] = cols[col][:-1]
    elif how == "short_inner":
        cols[col] = [list(x) for x in g.out_dtypes]
        cols[col][7] = []
    elif how == "backward":
        # Swap two ops' names' positions by pointing one chain edge backwards, without a cycle:
        cols["edge_src"], cols["edge_dst"] = np.array([1]), np.array([0])
        cols["edge_bytes"] = np.array([4])
    elif how == "cycle":
        cols["edge_src"], cols["edge_dst"] = np.array([0, 1]), np.array([1, 0])
        cols["edge_bytes"] = np.array([4, 4])
    with pytest.raises(GraphFormatError, match=message) as info:
        OpGraph(**cols)
    text = str(info.value)
    assert text.startswith("toy: ") and "\n" not in text


def test_totals_and_repr():
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1.5, 2.5], param_bytes=[8, 0])
    assert g.total_flops == 4.0 and g.total_param_bytes == 8
    assert len(g) == 2 and "ops=2" in repr(g)


def test_networkx_round_trip_keeps_an_unsorted_edge_order():
    g = OpGraph.from_edges(["a", "b", "c"], [("b", "c", 2), ("a", "c", 3), ("a", "b", 1)])
    assert OpGraph.from_networkx(g.to_networkx()).content_hash == g.content_hash
