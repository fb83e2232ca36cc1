"""The structured synthetic families (graphs.synthetic), the recurrent one's weight sharing in detail."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.ops import param_reads
from graphs.synthetic import FAMILIES, Builder, recurrent_dag


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_a_topologically_numbered_dag_near_its_size(family):
    g = FAMILIES[family](300, seed=7)
    assert np.all(g.edge_src < g.edge_dst)  # ops are numbered in a topological order
    assert 150 <= g.num_ops <= 400
    assert g.meta["family"] == family
    assert g.param_bytes.sum() > 0 and np.all(g.flops >= 0)
    # deterministic in the seed
    assert FAMILIES[family](300, seed=7).content_hash == g.content_hash


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_recurrent_layers_share_their_weights_over_time_steps(seed):
    g = recurrent_dag(400, seed=seed)
    owner, reader, nbytes = param_reads(g)
    assert len(owner) > 0
    paths = np.asarray(g.module_paths)
    layers = sorted({p for p in g.module_paths if p.startswith("rnn.layer")})
    assert 2 <= len(layers) <= 6
    # every reader reads an owner of its own layer (or the head's projection), owned by an earlier op
    assert np.all(paths[owner] == paths[reader]) and np.all(owner < reader)
    assert np.all(g.param_bytes[reader] == 0) and np.all(nbytes == g.param_bytes[owner])
    # each layer owns exactly its input matmul and its state matmul: two weights, read at every later step
    for layer in layers:
        own = np.flatnonzero((paths == layer) & (g.param_bytes > 0))
        assert len(own) == 2
        steps = np.sum((paths == layer) & (np.asarray(g.op_types) == "aten.mm.default"))
        assert np.sum(np.isin(owner, own)) == steps - 2
    # the head's projection is owned once and read by every other step
    head = np.flatnonzero((paths == "head") & (g.param_bytes > 0))
    assert len(head) == 1 and np.sum(owner == head[0]) >= 1


def test_a_state_edge_joins_each_layers_consecutive_steps():
    g = recurrent_dag(300, seed=4)
    paths = np.asarray(g.module_paths)
    src, dst = g.edge_src, g.edge_dst
    mm = np.asarray(g.op_types) == "aten.mm.default"
    # a state matmul (not the first step's input one) reads an op of its own layer: the previous step's output
    inner = (paths[src] == paths[dst]) & (paths[dst] != "head") & mm[dst] & np.char.startswith(paths[dst], "rnn.layer")
    assert inner.sum() > 0


def test_a_builder_refuses_to_share_a_weight_nobody_owns():
    b = Builder(np.random.default_rng(0), 16, 16)
    x = b.op("view", [])
    with pytest.raises(ValueError, match="owns no weight"):
        b.op("mm", [x], shares=x)
