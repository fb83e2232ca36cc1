"""The measurement log of envs.real.measured: a torn last line never swallows the next record (no Ray needed)."""

from __future__ import annotations

import json

import pytest

import envs
from envs.real.measured import LOG_NAME, MeasuredEnv, read_log
from envs.result import Result
from graphs import OpGraph


def test_a_record_after_a_torn_line_is_kept(tmp_path, capsys):
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], name="ab")
    log = tmp_path / LOG_NAME
    good = {
        "graph_hash": g.content_hash,
        "placement_hash": "p1",
        "time_unix": 0.0,
        "result": Result(0.5, "ok").to_dict(),
    }
    log.write_text(json.dumps(good) + "\n" + json.dumps(good)[:30])  # a run killed mid-write
    env = MeasuredEnv("unused:build", envs.resolve_cluster("k80x2"), graph=g, run_dir=tmp_path, device_map="*=cpu")
    assert set(env._cache) == {"p1"}
    assert "skipped 1 unreadable line" in capsys.readouterr().err
    env._record("p2", Result(0.25, "ok", source="measured"))
    got = read_log(str(log), g.content_hash)
    assert set(got) == {"p1", "p2"} and got["p2"].step_time_s == 0.25
    assert log.read_text().endswith("\n")
    env._record("p3", Result(float("inf"), "oom", source="measured"))
    assert set(read_log(str(log), g.content_hash)) == {"p1", "p2", "p3"}


def _branchy():
    import torch

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x).relu() + self.b(x).tanh()

    torch.manual_seed(0)
    return Branchy(), (torch.randn(2, 4),)


@pytest.mark.slow
def test_a_placements_issue_order_reaches_the_worker_and_its_key(tmp_path):
    """The measured env runs what was scored: the order is in the log key and in the worker's module."""
    import numpy as np

    from envs.real.measured import Worker
    from envs.real.placing import ORDER_META
    from graphs.plan import Placement
    from graphs.torch_capture import capture

    model, inputs = _branchy()
    g = capture(model, inputs)
    cluster = envs.resolve_cluster("k80x2")
    idx = [i % 2 for i in range(g.num_ops)]
    order = _latest_ready_first(g)  # topological, and not node order on a graph with two branches
    assert order != list(range(g.num_ops))
    plain = Placement.from_indices(g, cluster.device_names, idx)
    ordered = Placement.from_indices(g, cluster.device_names, idx, order=np.array(order))
    env = MeasuredEnv(_branchy, cluster, graph=g, run_dir=tmp_path, device_map="*=cpu")
    (k_plain, a_plain), (k_ord, a_ord) = env.keys([plain, ordered])
    assert a_plain == a_ord and k_plain != k_ord
    assert env._orders[k_plain] is None and env._orders[k_ord] == [g.names[i] for i in order]

    worker = Worker(_branchy, "*=cpu", threads=1)
    seen = {}

    def spy(module, optimizer, devices, warmup_steps, timed_steps):
        seen["order"] = module.meta.get(ORDER_META)
        return {"step_time_s": 0.1, "step_times_s": [0.1], "losses": [0.0], "peak_bytes": {}}

    worker._steps = spy
    r = Result.from_dict(worker.measure(a_ord, g.content_hash, 0, 1, env._orders[k_ord]))
    assert r.ok, r.message
    assert list(seen["order"]) == [g.names[i] for i in order]


def _latest_ready_first(g):
    """Kahn's algorithm taking the highest-numbered ready op first."""
    indeg = [0] * g.num_ops
    for v in g.edge_dst.tolist():
        indeg[v] += 1
    ready = [i for i in range(g.num_ops) if indeg[i] == 0]
    order = []
    while ready:
        u = max(ready)
        ready.remove(u)
        order.append(u)
        for w, v in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
            if w == u:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
    return order


def test_a_plan_with_parameter_homes_is_refused_by_the_measured_envs_not_run_as_its_ops_alone():
    from envs.real.measure_log import placement_key
    from graphs import OpGraph, PlacerError
    from graphs.plan import Placement

    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 1e9], param_bytes=[8, 8])
    g.params = [["w"], ["v"]]
    names = ["cpu:0", "gpu:0"]
    ops_only = Placement.from_indices(g, names, [1, 1])
    assert placement_key(ops_only, g, names, "plan.json")[1] == {"a": "gpu:0", "b": "gpu:0"}
    homed = Placement.from_indices(g, names, [1, 1], homes=[0, -1])  # w lives on the host, its op on the GPU
    with pytest.raises(PlacerError, match="plan.json: parameter homes apart from their ops are run by placer run"):
        placement_key(homed, g, names, "plan.json")
    at_home = Placement.from_indices(g, names, [0, 1], homes=[0, -1])  # a home that is its op's own device
    assert placement_key(at_home, g, names, "plan.json")[1] == {"a": "cpu:0", "b": "gpu:0"}
    checkpointed = Placement.from_indices(g, names, [1, 1])
    checkpointed.checkpoint = ["blk"]
    with pytest.raises(PlacerError, match="plan.json: checkpointed blocks are run by placer run"):
        placement_key(checkpointed, g, names, "plan.json")
