"""The graph-network policy: order invariance, any cluster size, policy files (weights_only, sidecar checks)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import envs
from graphs import OpGraph, PlacerError
from graphs.dag import random_order
from graphs.ir import permute
from graphs.synthetic import attention_dag, branch_dag, moe_dag, random_dag
from policies import POLICIES, policy_file
from policies.gnn import GNNNet, GNNPolicy


def _random_topological_order(g: OpGraph, seed: int) -> np.ndarray:
    return random_order(g, np.random.default_rng(seed))


def _reordered(g: OpGraph, order: np.ndarray) -> OpGraph:
    fields = {f.name: getattr(g, f.name) for f in dataclasses.fields(OpGraph) if f.init}
    return OpGraph(**permute(fields, order))


@pytest.mark.parametrize("make", [lambda: moe_dag(120, seed=3), lambda: branch_dag(150, seed=1)])
def test_node_order_does_not_change_the_distribution(make):
    g = make()
    order = _random_topological_order(g, seed=7)
    assert not np.array_equal(order, np.arange(g.num_ops))  # really another order
    g2 = _reordered(g, order)
    c = envs.resolve_cluster("k80x4")
    torch.manual_seed(0)
    p1 = GNNPolicy(g, c.num_devices, cluster=c, hidden=16, decoder="independent")
    p2 = GNNPolicy(g2, c.num_devices, cluster=c, net=p1.net)
    # row j of g2 is op order[j] of g
    assert torch.allclose(p2.log_probs(), p1.log_probs()[torch.as_tensor(order)], atol=1e-5)


@pytest.mark.parametrize("make", [lambda: moe_dag(120, seed=3), lambda: branch_dag(150, seed=1)])
def test_schedule_decoder_does_not_depend_on_node_order(make):
    g = make()
    order = _random_topological_order(g, seed=7)
    g2 = _reordered(g, order)
    c = envs.resolve_cluster("k80x4")
    torch.manual_seed(0)
    p1 = GNNPolicy(g, c.num_devices, cluster=c, hidden=16, decoder="schedule")
    with torch.no_grad():  # weights far from the initial ones, so that greedy decoding uses several devices
        for w in p1.net.parameters():
            w.normal_(0.0, 0.5)
    p2 = GNNPolicy(g2, c.num_devices, cluster=c, net=p1.net)
    greedy = p1.greedy()
    assert len(np.unique(greedy)) > 1  # the test means something only if the decisions differ
    assert np.array_equal(p2.greedy(), greedy[order])  # the same decisions, numbered as g2 numbers its ops
    some = np.random.default_rng(0).integers(0, c.num_devices, size=(3, g.num_ops))
    lp1, ent1 = p1.log_prob({"devices": torch.as_tensor(some)})
    lp2, ent2 = p2.log_prob({"devices": torch.as_tensor(some[:, order])})
    assert torch.allclose(lp1, lp2, atol=1e-3) and torch.allclose(ent1, ent2, atol=1e-5)


@pytest.mark.parametrize("decoder", ["independent", "schedule"])
def test_one_policy_places_on_2_4_and_8_gpus(decoder):
    g = attention_dag(120, seed=2)
    net = GNNNet(hidden=16, rounds=2, decoder=decoder)
    for name in ("k80x2", "k80x4", "h100x8"):
        c = envs.resolve_cluster(name)
        p = GNNPolicy(g, c.num_devices, cluster=c, net=net)
        s = p.sample(5, generator=torch.Generator().manual_seed(0))
        assert s.op_devices.shape == (5, g.num_ops)
        assert s.op_devices.min() >= 0 and s.op_devices.max() < c.num_devices
        assert len(np.unique(s.op_devices)) > 1
        lp, _ = p.log_prob(s.actions)
        assert torch.allclose(lp, s.log_prob, atol=1e-4)
        t, failed = envs.SimEnv(g, c).step_times(np.concatenate([p.greedy()[None], s.op_devices]))
        assert len(t) == 6
        loss = p.imitation_loss(np.full(g.num_ops, c.num_devices - 1))
        loss.backward()
        assert all(w.grad is not None for w in net.parameters() if w.requires_grad)
        net.zero_grad()


def test_registered_and_needs_a_cluster():
    assert POLICIES["gnn"] is GNNPolicy
    with pytest.raises(PlacerError, match="needs the cluster"):
        GNNPolicy(random_dag(10), 3)
    with pytest.raises(PlacerError, match="5 devices"):
        GNNPolicy(random_dag(10), 5, cluster=envs.resolve_cluster("k80x2"))


def _sidecar(**over):
    from policies.gnn_features import feature_spec

    doc = {
        "architecture": {"hidden": 8, "rounds": 1, "logit_cap": 10.0},
        "features": feature_spec(),
        "clusters": ["k80x2"],
        "corpus": ["x"],
        "seed": 0,
        "date": "2025-01-01T00:00:00+00:00",
    }
    doc.update(over)
    return doc


def test_policy_file_round_trip_loads_with_weights_only(tmp_path):
    net = GNNNet(hidden=8, rounds=1)
    path = tmp_path / "p.pt"
    policy_file.save(path, net, _sidecar())
    state = torch.load(path, weights_only=True)
    assert set(state) == set(net.state_dict()) and all(isinstance(v, torch.Tensor) for v in state.values())
    loaded = policy_file.load(path)
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.net.state_dict()[k], v)
    assert json.loads((tmp_path / "p.json").read_text())["format"] == "placer-policy/1"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d.pop("seed"), "missing field"),
        (lambda d: d.update(format="placer-policy/9"), "format"),
        (lambda d: d["architecture"].update(hidden=16), "do not fit"),
        (lambda d: d["architecture"].update(hidden="8"), "architecture.hidden"),
        (lambda d: d["features"].update(version="gnn-features/0"), "features"),
        (lambda d: d.update(policy="seq2seq"), "only 'gnn'"),
    ],
)
def test_bad_sidecar_is_one_placer_error(tmp_path, damage, message):
    path = tmp_path / "p.pt"
    policy_file.save(path, GNNNet(hidden=8, rounds=1), _sidecar())
    doc = json.loads((tmp_path / "p.json").read_text())
    damage(doc)
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(PlacerError, match=message):
        policy_file.load(path)


def test_missing_sidecar_and_pickled_weights_are_refused(tmp_path):
    path = tmp_path / "p.pt"
    policy_file.save(path, GNNNet(hidden=8, rounds=1), _sidecar())
    (tmp_path / "p.json").rename(tmp_path / "other.json")
    with pytest.raises(PlacerError, match="sidecar"):
        policy_file.load(path)
    (tmp_path / "other.json").rename(tmp_path / "p.json")
    torch.save({"net": GNNNet(hidden=8, rounds=1)}, path)  # a pickled module, not tensors
    with pytest.raises(PlacerError, match="cannot read policy weights"):
        policy_file.load(path)


def test_shipped_policy_loads():
    loaded = policy_file.load()
    assert loaded.sidecar["policy"] == "gnn" and loaded.net.decoder == "schedule"
    g = random_dag(40, seed=1)
    c = envs.resolve_cluster("v100x4")
    assert GNNPolicy(g, c.num_devices, cluster=c, net=loaded.net).greedy().shape == (40,)


def test_a_policy_file_without_a_decoder_is_an_independent_one(tmp_path):
    path = tmp_path / "p.pt"
    policy_file.save(path, GNNNet(hidden=8, rounds=1, decoder="independent"), _sidecar())
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["architecture"]["decoder"] == "independent"
    del doc["architecture"]["decoder"]  # as written before the schedule decoder existed
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert policy_file.load(path).net.decoder == "independent"
    doc["architecture"]["decoder"] = "beam"
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(PlacerError, match="architecture.decoder 'beam'"):
        policy_file.load(path)
    policy_file.save(path, GNNNet(hidden=8, rounds=1), _sidecar())  # the default net: schedule, recorded as such
    assert policy_file.load(path).net.decoder == "schedule"


def test_the_network_reads_shared_parameters_as_edges():
    # c reads the weight a owns: placing them apart copies it (the simulator charges that), so the
    # network sees an edge a -> c carrying the weight's bytes, beside the data edges
    g = OpGraph.from_edges(
        ["a", "b", "c"], [("a", "b", 4), ("b", "c", 4)], flops=[1e9] * 3, param_bytes=[1 << 20, 0, 0]
    )
    c = envs.resolve_cluster("v100x4")
    plain = GNNPolicy(g, c.num_devices, cluster=c, net=GNNNet(hidden=8, rounds=1))
    assert plain.graph.num_edges == 2
    g.params = [["w"], [], ["w"]]
    g.invalidate()
    shared = GNNPolicy(g, c.num_devices, cluster=c, net=plain.net)
    assert sorted(
        zip(shared.graph.edge_src.tolist(), shared.graph.edge_dst.tolist(), shared.graph.edge_bytes.tolist())
    ) == [(0, 1, 4), (0, 2, 1 << 20), (1, 2, 4)]
    assert not torch.equal(shared.x_edge, plain.x_edge) and shared.greedy().shape == (3,)


def test_switch_share_splits_the_imitation_loss_between_switches_and_the_other_ops():
    g, c = branch_dag(60, seed=3), envs.resolve_cluster("k80x4")
    torch.manual_seed(0)
    p = GNNPolicy(g, c.num_devices, cluster=c, hidden=16, rounds=1)
    label = np.where(np.arange(g.num_ops) < g.num_ops // 2, 1, 2)  # a two-GPU split: some ops change device
    with torch.no_grad():
        nll = -p._logp_along(label[None])[0].gather(1, torch.as_tensor(label)[:, None]).squeeze(1).numpy()
        sw = p.switch_mask(label)[0]
        assert 0 < sw.sum() < g.num_ops / 4
        plain = float(p.imitation_loss(label))
        half = float(p.imitation_loss(label, switch_share=0.5))
    assert plain == pytest.approx(nll.mean(), rel=1e-5)
    assert half == pytest.approx(0.5 * nll[sw].mean() + 0.5 * nll[~sw].mean(), rel=1e-5)
    with pytest.raises(PlacerError, match="schedule decoder"):
        GNNPolicy(g, c.num_devices, cluster=c, hidden=16, rounds=1, decoder="independent").switch_mask(label)


def test_a_given_grouping_is_what_the_policy_places():
    from envs.sim.sim_graph import schedule_graph
    from graphs.module_tree import module_grouping

    g, c = branch_dag(200, seed=2), envs.resolve_cluster("k80x4")
    grouping = module_grouping(schedule_graph(g), 1)
    p = GNNPolicy(g, 5, cluster=c, hidden=8, rounds=1, grouping=grouping)
    assert p.num_items == grouping.num_groups < p.num_ops
    s = p.sample(6, generator=torch.Generator().manual_seed(0))
    assert s.op_devices.shape == (6, g.num_ops)
    for row in s.op_devices:  # every group's ops on one device
        per_group = {}
        for i, d in enumerate(row.tolist()):
            per_group.setdefault(int(grouping.op_group[i]), set()).add(d)
        assert max(len(v) for v in per_group.values()) == 1
    # refined along a placement that splits the groups, the items can express it exactly
    split = np.arange(g.num_ops) % 2
    refined = GNNPolicy(g, 5, cluster=c, hidden=8, rounds=1, grouping=grouping, refine=split)
    np.testing.assert_array_equal(refined.expand(refined.contract(split)), split)
    # a grouping of another graph (here: the graph without its shared-parameter edges) is refused
    if schedule_graph(g).content_hash != g.content_hash:
        with pytest.raises(PlacerError, match="schedule_graph"):
            GNNPolicy(g, 5, cluster=c, hidden=8, rounds=1, grouping=module_grouping(g, 1))
    with pytest.raises(PlacerError, match="schedule_graph"):
        GNNPolicy(branch_dag(200, seed=3), 5, cluster=c, hidden=8, rounds=1, grouping=grouping)


@pytest.mark.parametrize("decoder", ["schedule", "independent"])
def test_decode_at_temperature(decoder):
    g, c = branch_dag(120, seed=4), envs.resolve_cluster("k80x4")
    p = GNNPolicy(g, 5, cluster=c, hidden=8, rounds=1, decoder=decoder)
    cold = p.decode(16, temperature=1e-6, generator=torch.Generator().manual_seed(0))
    hot = p.decode(16, temperature=50.0, generator=torch.Generator().manual_seed(0))
    assert cold.shape == hot.shape == (16, g.num_ops)
    # near 0 every draw is the greedy placement; a high temperature spreads each op over several devices
    np.testing.assert_array_equal(cold, np.repeat(p.greedy()[None], 16, axis=0))
    assert np.mean([len(set(hot[:, i].tolist())) for i in range(g.num_ops)]) > 2
    if decoder == "schedule":  # at 1, decode draws what sample draws from the same generator
        s = p.sample(8, generator=torch.Generator().manual_seed(0))
        np.testing.assert_array_equal(s.op_devices, p.decode(8, generator=torch.Generator().manual_seed(0)))
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(PlacerError, match="temperature"):
            p.decode(2, temperature=bad)
