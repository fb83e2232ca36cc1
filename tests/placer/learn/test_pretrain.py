"""placer.learn.pretrain: imitation labels made consistent across graphs (interchangeable devices renumbered)."""

from __future__ import annotations

import numpy as np
import pytest

import envs
from envs.cluster import Cluster
from graphs import PlacerError
from graphs.synthetic import branch_dag, random_dag
from placer.learn.pretrain import canonical_label


def _two_halves(graph, early: int, late: int) -> np.ndarray:
    """The first half of the ops (topological order) on ``early``, the rest on ``late``."""
    idx = np.full(graph.num_ops, late, dtype=np.int32)
    idx[: graph.num_ops // 2] = early
    return idx


def test_identical_gpus_are_renumbered_earliest_ops_first_at_the_same_step_time():
    g = branch_dag(120, seed=0)
    c = envs.resolve_cluster("v100x4")  # cpu:0 and four identical, fully linked GPUs
    env = envs.SimEnv(g, c)
    label = _two_halves(g, early=4, late=2)  # gpu:3 first, then gpu:1
    out = canonical_label(g, c, label, env)
    assert out.tolist() == _two_halves(g, early=1, late=2).tolist()  # gpu:0 first, then gpu:1
    t, _ = env.step_times(np.stack([label, out]))
    assert t[0] == t[1]
    assert canonical_label(g, c, out, env).tolist() == out.tolist()  # already canonical: a fixed point
    host = np.zeros(g.num_ops, dtype=np.int32)  # the host is in a class of its own
    assert canonical_label(g, c, host, env).tolist() == host.tolist()


def test_devices_whose_links_differ_keep_their_numbers():
    g = branch_dag(120, seed=0)
    doc = envs.resolve_cluster("v100x4").to_dict()
    for link in doc["links"]:  # gpu:3 reaches the other GPUs over a slow link: not interchangeable
        if "gpu:3" in (link["src"], link["dst"]) and "cpu:0" not in (link["src"], link["dst"]):
            link["bandwidth_bytes_per_s"] = 1e8
    c = Cluster.from_dict(doc)
    label = _two_halves(g, early=4, late=2)
    assert canonical_label(g, c, label).tolist() == label.tolist()


def test_each_group_count_is_a_pair_whose_items_express_the_label_exactly(tmp_path, monkeypatch):
    import graphs
    from placer.learn.pretrain import PretrainConfig, setup_pairs
    from policies.gnn import GNNNet

    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "corpus").mkdir()
    graphs.save(branch_dag(200, seed=1), tmp_path / "corpus" / "b.json")
    config = PretrainConfig(corpus=str(tmp_path / "corpus"), clusters=("k80x2",), groups=(0, 16, 16, "modules"))
    pairs, skipped = setup_pairs(config, GNNNet(hidden=8, rounds=1), lambda s: None)
    # branch_dag records one module per block: one module level, at depth 1
    assert [p.name for p in pairs] == ["b.json", "b.json/16g", "b.json/m1"] and not skipped
    ops, grouped, modules = pairs[0].policy, pairs[1].policy, pairs[2].policy
    assert ops.num_items == ops.num_ops and grouped.grouping is not None and grouped.num_items < ops.num_ops
    # the groups are cut where the label changes device, so imitating them can reach the label itself
    label = pairs[1].label
    for policy in (grouped, modules):
        np.testing.assert_array_equal(policy.expand(policy.contract(label)), label)
    # a module group is only cut where the label changes device: no item mixes two blocks
    g = graphs.load(tmp_path / "corpus" / "b.json")
    block = {p: k for k, p in enumerate(sorted(set(g.module_paths)))}
    owners = {}
    for i, path in enumerate(g.module_paths):
        if path:
            owners.setdefault(int(modules.grouping.op_group[i]), set()).add(block[path])
    assert max(len(b) for b in owners.values()) == 1
    assert grouped.net is ops.net is modules.net  # one network over every pair


def test_cached_labels_are_recomputed_when_the_simulator_model_or_a_baseline_changes(tmp_path, monkeypatch):
    import envs.sim.simulator
    import placer.compare
    from placer.learn.pretrain import imitation_label as best_heuristic

    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = placer.compare.compare
    monkeypatch.setattr(placer.compare, "compare", lambda *a, **k: calls.append(1) or real(*a, **k))
    g, c = random_dag(30, seed=2), envs.resolve_cluster("k80x2")
    first = best_heuristic(g, c, ("single", "heft"))
    assert best_heuristic(g, c, ("single", "heft"))[1] == first[1] and len(calls) == 1  # from the cache
    monkeypatch.setattr(envs.sim.simulator, "MODEL_VERSION", envs.sim.simulator.MODEL_VERSION + 1)
    best_heuristic(g, c, ("single", "heft"))
    assert len(calls) == 2
    import envs.sim.memory

    monkeypatch.setattr(envs.sim.memory, "MEMORY_VERSION", envs.sim.memory.MEMORY_VERSION + 1)  # which plans fit
    best_heuristic(g, c, ("single", "heft"))
    assert len(calls) == 3
    import placer.methods.registry

    monkeypatch.setattr(placer.methods.registry, "VERSION", placer.methods.registry.VERSION + 1)  # a baseline changed
    best_heuristic(g, c, ("single", "heft"))
    assert len(calls) == 4


def test_the_recurrent_family_is_held_out_by_its_own_tag_not_by_lstm():
    from placer.learn.pretrain_corpus import build_corpus

    names = lambda exclude: {it.name for it in build_corpus("synthetic", exclude=exclude, synthetic_sizes=(300,))}  # noqa: E731
    every = names(set())
    assert any(n.startswith("recurrent-") for n in every)
    assert names({"lstm"}) == every  # no synthetic family is an LSTM
    kept = names({"lstm", "recurrent"})
    assert not any(n.startswith("recurrent-") for n in kept) and kept == {
        n for n in every if not n.startswith("recurrent-")
    }
    with pytest.raises(PlacerError, match="--exclude lstn: not a family .*lstm.*recurrent"):
        build_corpus("synthetic", exclude={"lstn"}, synthetic_sizes=(300,))  # a typo holds nothing out silently
