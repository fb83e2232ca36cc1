"""Issue orders: Placement.order, graphs.plan.check_order, and placed modules that follow them."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

from envs.real.placing import MOVE_META, ORDER_META, place_module, transfers
from envs.real.timing import default_loss
from envs.real.transfers import copy_kind, to_device
from graphs import OpGraph, PlacerError
from graphs.dag import random_order
from graphs.plan import Placement, check_order
from graphs.torch_capture import capture, export_program
from placer.apply import apply
from tests.conftest import fast_first
from tests.placer.test_apply import assert_same_outputs_and_grads

DEVICES = ["cpu:0", "gpu:0", "gpu:1"]
ALL_CPU = "*=cpu"  # three logical devices on one real one: every copy is built, as a no-op


# ------------------------------------------------------------------ models
class Inceptionish(nn.Module):
    """Four parallel branches (1x1, 3x3, pool + 1x1, 1x1 -> 3x3) concatenated, batch norm, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b2 = nn.Conv2d(8, 4, 3, padding=1)
        self.b3 = nn.Conv2d(8, 4, 1)
        self.b4a, self.b4b = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        branches = [
            self.b1(h),
            self.b2(h),
            self.b3(nn.functional.avg_pool2d(h, 3, 1, 1)),
            self.b4b(torch.relu(self.b4a(h))),
        ]
        y = torch.relu(self.bn(torch.cat(branches, 1)))
        return self.head(y.mean((2, 3)))


class TiedBranches(nn.Module):
    """One weight read by two parallel branches and the output projection (tied)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.left, self.right = nn.Linear(8, 8), nn.Linear(8, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        e = self.emb(tokens)
        return self.out(torch.tanh(self.left(e)) + torch.sigmoid(self.right(e))), self.out(e).mean()


class BNCounter(nn.Module):
    """Batch norm, a buffer read by one op and written in place by a later one, parallel tails."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 12)
        self.bn = nn.BatchNorm1d(12)
        self.l2, self.l3 = nn.Linear(12, 3), nn.Linear(12, 3)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        h = torch.relu(self.bn(self.l1(x))) * (self.calls * 0.1 + 1)
        self.calls.add_(1)
        return self.l2(h) - self.l3(h).exp(), h.square().mean()


class TwoDropouts(nn.Module):
    """Two dropouts on parallel branches: reordering them would swap their random masks."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return nn.functional.dropout(self.a(x), 0.5) + nn.functional.dropout(self.b(x), 0.5).sin()


def _cases():
    torch.manual_seed(0)
    return {
        "inception": (Inceptionish(), (torch.randn(2, 3, 8, 8),)),
        "tied": (TiedBranches(), (torch.randint(0, 20, (4, 5)),)),
        "bn": (BNCounter(), (torch.randn(16, 6),)),
        "dropout": (TwoDropouts(), (torch.randn(4, 6),)),
    }


def random_topological_order(graph: OpGraph, rng: np.random.Generator) -> list[int]:
    """A uniformly chosen ready op at each step: any topological order can come out."""
    return random_order(graph, rng).tolist()


def _grads(model):
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _op_order(gm, graph):
    """The graph's ops in the order the placed module runs them (indices)."""
    return [graph.index[n.name] for n in gm.graph.nodes if n.name in graph.index]


# ------------------------------------------------------------ check_order
def _chain_and_branch():
    return OpGraph.from_edges(["a", "b", "c", "d"], [("a", "b", 4), ("a", "c", 4), ("c", "d", 4)])


def test_check_order_accepts_topological_orders():
    g = _chain_and_branch()
    for order in ([0, 1, 2, 3], [0, 2, 1, 3], [0, 2, 3, 1], np.array([0, 2, 3, 1], dtype=np.int64)):
        out = check_order(order, g)
        assert out.dtype == np.int32 and out.tolist() == list(order)


@pytest.mark.parametrize(
    "order, message",
    [
        ([0, 1, 2], "has 3 entries for 4 ops"),
        ([0, 1, 2, 3, 3], "has 5 entries for 4 ops"),
        ([0, 1, 1, 3], "not a permutation of the ops: op 1 appears twice, op 2 never"),
        ([0, 1, 2, 4], "op index 4 out of range"),
        ([0, -1, 2, 3], "op index -1 out of range"),
        ([0, 1.0, 2, 3], "must be a list of op indices, found 1.0"),
        ([0, True, 2, 3], "must be a list of op indices, found True"),
        ([0, "b", 2, 3], "must be a list of op indices, found 'b'"),
        ("abcd", "not str"),
        ({"a": 0}, "not dict"),
        (np.zeros((2, 2), dtype=int), "1-D array"),
        (np.array([0.0, 1.0, 2.0, 3.0]), "1-D array of op indices"),
        ([1, 0, 2, 3], "op 'b' (1) is issued before its input 'a' (0)"),
        ([0, 3, 2, 1], "op 'd' (3) is issued before its input 'c' (2)"),
    ],
)
def test_check_order_rejects_bad_orders_in_one_line(order, message):
    with pytest.raises(PlacerError) as e:
        check_order(order, _chain_and_branch(), source="p.json: order")
    text = str(e.value)
    assert text.startswith("p.json: order: ") and message in text and "\n" not in text


def test_check_order_without_a_graph_checks_all_but_edges():
    assert check_order([1, 0, 2, 3], 4).tolist() == [1, 0, 2, 3]
    with pytest.raises(PlacerError, match="appears twice"):
        check_order([1, 1, 2, 3], 4)


# ------------------------------------------------------------- placements
def test_placement_order_round_trips_through_its_file(tmp_path):
    g = _chain_and_branch()
    p = Placement.from_indices(g, DEVICES, [0, 1, 2, 1], order=[0, 2, 3, 1], method="test")
    assert p.order.tolist() == [0, 2, 3, 1]
    p.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["order"] == [0, 2, 3, 1]
    q = Placement.load(tmp_path / "p.json")
    assert q == p and q.order.tolist() == [0, 2, 3, 1] and q.source == str(tmp_path / "p.json")
    assert q.issue_order(g).tolist() == [0, 2, 3, 1]
    assert q != Placement.from_indices(g, DEVICES, [0, 1, 2, 1], order=[0, 1, 2, 3], method="test")
    assert q != Placement.from_indices(g, DEVICES, [0, 1, 2, 1], method="test")


def test_placement_without_order_keeps_the_old_file_format(tmp_path):
    g = _chain_and_branch()
    p = Placement.from_indices(g, DEVICES, [0, 1, 2, 1])
    assert p.order is None and p.issue_order(g) is None
    assert "order" not in p.to_dict()
    p.save(tmp_path / "p.json")
    q = Placement.load(tmp_path / "p.json")
    assert q.order is None and q == p
    doc = p.to_dict()
    doc["order"] = None  # an explicit null is node order too
    assert Placement.from_dict(doc).order is None


def test_from_indices_checks_the_order_against_the_graph():
    g = _chain_and_branch()
    with pytest.raises(PlacerError, match="placement: order: op 'b' .* before its input 'a'"):
        Placement.from_indices(g, DEVICES, [0, 1, 2, 1], order=[1, 0, 2, 3])
    with pytest.raises(PlacerError, match="has 3 entries for 4 ops"):
        Placement.from_indices(g, DEVICES, [0, 1, 2, 1], order=[0, 1, 2])


@pytest.mark.parametrize(
    "bad, message",
    [
        ([0, 1, 1, 3], "not a permutation"),
        ([0, 1, 2, 9], "out of range"),
        ([0, 1, 2, "d"], "must be a list of op indices"),
        ([0, 1, 2, 3.5], "must be a list of op indices"),
        ("0123", "not str"),
        ({"0": 1}, "not dict"),
    ],
)
def test_bad_order_in_a_file_is_one_line_naming_the_file(tmp_path, bad, message):
    g = _chain_and_branch()
    doc = Placement.from_indices(g, DEVICES, [0, 1, 2, 1]).to_dict()
    doc["order"] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlacerError) as e:
        Placement.load(path)
    assert str(e.value).startswith(f"{path}: 'order': ") and message in str(e.value) and "\n" not in str(e.value)


def test_order_of_the_wrong_length_names_the_file_when_used(tmp_path):
    """Checked against the graph where it is used, after the assignment (a missing op is reported as that)."""
    g = _chain_and_branch()
    doc = Placement.from_indices(g, DEVICES, [0, 1, 2, 1]).to_dict()
    doc["order"] = [0, 1, 2]
    path = tmp_path / "short.json"
    path.write_text(json.dumps(doc))
    p = Placement.load(path)
    with pytest.raises(PlacerError) as e:
        p.issue_order(g)
    assert str(e.value).startswith(f"{path}: order: ") and "has 3 entries for 4 ops" in str(e.value)


def test_non_topological_order_in_a_file_names_the_file_when_used(tmp_path):
    model, inputs = _cases()["bn"]
    g = capture(model, inputs)
    doc = Placement.from_indices(g, DEVICES, [0] * g.num_ops).to_dict()
    doc["order"] = list(range(g.num_ops))[::-1]  # a permutation, but every edge backwards
    path = tmp_path / "rev.json"
    path.write_text(json.dumps(doc))
    p = Placement.load(path)  # a permutation: readable without the graph
    with pytest.raises(PlacerError, match=f"^{path}: order: op .* is issued before its input"):
        p.issue_order(g)
    with pytest.raises(PlacerError, match=f"^{path}: order: op .* is issued before its input"):
        apply(model, p, inputs, device_map=ALL_CPU)


# ------------------------------------------------- the module follows the order
@pytest.mark.parametrize("name", ["inception", "tied", "bn", "dropout"])
@pytest.mark.parametrize("seed", fast_first([0, 1, 2, 3]))
def test_any_order_keeps_outputs_and_gradients(name, seed):
    model, inputs = _cases()[name]
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs)
    rng = np.random.default_rng(seed)
    order = random_topological_order(g, rng)
    p = Placement.from_indices(g, DEVICES, rng.integers(0, len(DEVICES), size=g.num_ops), order=order)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    run = _op_order(placed, g)
    assert sorted(run) == list(range(g.num_ops))
    check_order(run, g)  # what runs is topological
    if name in ("inception", "tied"):  # no in-place write, no random op: exactly the plan
        assert run == order
    torch.manual_seed(7)
    out = placed(*inputs)
    torch.manual_seed(7)
    assert_same_outputs_and_grads(placed, ref_model, out, ref_model(*inputs))
    for key, buf in ref_model.named_buffers():
        torch.testing.assert_close(dict(placed.named_buffers())[key], buf, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_any_order_on_a_decomposed_graph(seed):
    """Core ATen: functional batch norm with getitems, and copy_ write-backs after every op."""
    model, inputs = _cases()["bn"]
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs, decompose=True)
    rng = np.random.default_rng(seed)
    order = random_topological_order(g, rng)
    placed = apply(
        model,
        Placement.from_indices(g, DEVICES, rng.integers(0, 3, size=g.num_ops), order=order),
        inputs,
        device_map=ALL_CPU,
        graph=g,
    )
    nodes = list(placed.graph.nodes)
    last_op = max(i for i, n in enumerate(nodes) if n.name in g.index)
    assert all(
        i > last_op for i, n in enumerate(nodes) if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
    )
    for _ in range(2):
        out, ref = placed(*inputs), ref_model(*inputs)
        for a, b in zip(out, ref, strict=True):
            torch.testing.assert_close(a, b)
    for key, buf in ref_model.named_buffers():
        torch.testing.assert_close(dict(placed.named_buffers())[key], buf, msg=key)


def test_an_in_place_write_waits_for_the_readers_before_it():
    model, inputs = _cases()["bn"]
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs)
    reader, writer = [g.names[i] for i in range(g.num_ops) if g.params[i] == ["calls"]]
    assert writer.startswith("add_")
    order = list(range(g.num_ops))
    order.remove(g.index[writer])
    order.insert(g.index[reader] - 1, g.index[writer])  # the write first: a topological order of the OpGraph
    check_order(order, g)
    placed = apply(model, {n: "cpu:0" for n in g.names}, inputs, device_map=ALL_CPU, order=order)
    run = [g.names[i] for i in _op_order(placed, g)]
    assert run.index(writer) == run.index(reader) + 1  # held back just past the read
    expected = [g.names[i] for i in order if g.names[i] != writer]
    expected.insert(expected.index(reader) + 1, writer)
    assert run == expected == placed.meta[ORDER_META]  # everything else as planned
    torch.testing.assert_close(placed(*inputs), ref_model(*inputs))


def test_copies_are_issued_right_before_their_first_consumer_in_the_order():
    model, inputs = _cases()["inception"]
    g = capture(model, inputs)
    rng = np.random.default_rng(5)
    order = random_topological_order(g, rng)
    p = Placement.from_indices(g, DEVICES, rng.integers(0, 3, size=g.num_ops), order=order)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    assert transfers(placed)
    nodes = list(placed.graph.nodes)
    for i, n in enumerate(nodes):
        if MOVE_META in n.meta:
            nxt = next(m for m in nodes[i + 1 :] if MOVE_META not in m.meta)  # copies for one consumer sit together
            assert nxt in n.users, (n.name, nxt.name)
    # Without an order, the module keeps node order.
    plain = apply(model, p.assignment, inputs, device_map=ALL_CPU)
    assert _op_order(plain, g) == list(range(g.num_ops)) and plain.meta[ORDER_META] == g.names


def test_place_module_takes_the_order_by_name():
    """The Ray worker's path: the exported program, an assignment and the order's op names."""
    model, inputs = _cases()["tied"]
    ep = export_program(model, inputs)
    g = capture(model, inputs)
    order = random_topological_order(g, np.random.default_rng(3))
    assert order != list(range(g.num_ops))
    names = [g.names[i] for i in order]
    gm = place_module(ep, {n: DEVICES[i % 3] for i, n in enumerate(g.names)}, ALL_CPU, order=names)
    assert gm.meta[ORDER_META] == names
    with pytest.raises(PlacerError, match="op 'nope' is not an op"):
        place_module(export_program(model, inputs), {n: "cpu:0" for n in g.names}, ALL_CPU, order=names[:-1] + ["nope"])
    with pytest.raises(PlacerError, match="names it twice"):
        place_module(
            export_program(model, inputs), {n: "cpu:0" for n in g.names}, ALL_CPU, order=names[:-1] + names[:1]
        )


def test_placer_run_runs_the_order_in_the_file(tmp_path, monkeypatch, capsys):
    import sys
    import textwrap

    import envs.real.timing
    from placer.cli import main

    (tmp_path / "order_model.py").write_text(
        textwrap.dedent(
            """
        import torch
        from torch import nn

        class TwoHeads(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 4), nn.Linear(8, 4)

            def forward(self, x):
                h = torch.relu(self.a(x))
                return (self.b(h) * self.c(h).tanh()).sum()  # the loss: `placer run` trains what forward returns

        def build():
            torch.manual_seed(0)
            return TwoHeads(), (torch.randn(4, 6),)
        """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("order_model", None)
    import order_model

    g = capture(*order_model.build())
    order = next(
        o
        for o in (random_topological_order(g, np.random.default_rng(s)) for s in range(50))
        if o != list(range(g.num_ops))
    )
    Placement.from_indices(g, DEVICES, [1] * g.num_ops, cluster="k80x2", order=order).save(tmp_path / "p.json")
    seen = []
    real = envs.real.timing.measure_steps

    def spy(module, *args, **kwargs):
        seen.append(module.meta[ORDER_META])
        return real(module, *args, **kwargs)

    monkeypatch.setattr(envs.real.timing, "measure_steps", spy)
    rc = main(
        [
            "run",
            "order_model:build",
            "--placement",
            str(tmp_path / "p.json"),
            "--cluster",
            "k80x2",
            "--device-map",
            ALL_CPU,
            "--steps",
            "1",
            "--warmup",
            "0",
            "--json",
        ]
    )
    assert rc == 0, capsys.readouterr()
    assert seen == [[g.names[i] for i in order]]
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["order"] = order[::-1]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    rc = main(
        [
            "run",
            "order_model:build",
            "--placement",
            str(tmp_path / "bad.json"),
            "--cluster",
            "k80x2",
            "--device-map",
            ALL_CPU,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad.json: order: op" in err[0]


# --------------------------------------------------------------- copies
def test_copy_kinds():
    cpu, c0, c1, meta = torch.device("cpu"), torch.device("cuda:0"), torch.device("cuda:1"), torch.device("meta")
    assert copy_kind(cpu, cpu) == copy_kind(c1, c1) == "same"
    assert copy_kind(c0, c1) == "peer"
    assert copy_kind(cpu, c1) == "pinned"
    assert copy_kind(c0, cpu) == copy_kind(cpu, meta) == copy_kind(meta, c0) == "sync"


def test_to_device_keeps_containers_and_gradients():
    a = torch.randn(3, requires_grad=True)
    out = to_device((a, [a * 2, 5], "x"), "cpu")
    assert isinstance(out, tuple) and isinstance(out[1], list) and out[1][1] == 5 and out[2] == "x"
    assert out[0] is a  # same device: no copy
    m = to_device([a], "meta")
    assert isinstance(m, list) and m[0].device.type == "meta" and m[0].requires_grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copies_are_non_blocking_and_keep_gradients():
    x = torch.randn(64, 64, requires_grad=True)
    y = to_device(x, "cuda:0")
    assert y.device.type == "cuda" and not x.is_pinned()  # the source is pinned through a copy
    last = f"cuda:{torch.cuda.device_count() - 1}"
    z = to_device(y * 2, last)
    back = to_device(z.sin(), "cpu")
    back.sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(2 * x.detach()), rtol=1e-5, atol=1e-6)
    model, inputs = _cases()["inception"]
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs)
    rng = np.random.default_rng(0)
    p = Placement.from_indices(g, DEVICES, rng.integers(0, 3, size=g.num_ops), order=random_topological_order(g, rng))
    placed = apply(model, p, inputs, device_map={"gpu:0": "cuda:0", "gpu:1": last, "cpu:0": "cpu"})
    out, ref = placed(*inputs), ref_model(*inputs)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    default_loss(out).backward()
    default_loss(ref).backward()
    got, want = _grads(placed), _grads(ref_model)
    for k in want:
        torch.testing.assert_close(got[k].cpu(), want[k], msg=k, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_place_and_train_write_the_order_they_scored(tmp_path, capsys):
    """`placer place` and `placer train` store an issue order; `placer simulate` scores the file as they did."""
    import graphs
    from graphs.synthetic import random_dag
    from placer.cli import main

    gpath = str(tmp_path / "g.json")
    graphs.save(random_dag(60, seed=5, name="r"), gpath)
    ppath = str(tmp_path / "p.json")
    assert main(["place", gpath, "--cluster", "k80x4", "--method", "expert", "-o", ppath]) == 0
    p = Placement.load(ppath)
    assert p.order is not None and p.meta["issue_order"] in ("node", "devices-first", "schedule")
    capsys.readouterr()
    assert main(["simulate", gpath, ppath, "--cluster", "k80x4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(p.meta["step_time_s"], rel=1e-12)
    run = str(tmp_path / "run")
    assert main(["train", gpath, "--cluster", "k80x4", "--iterations", "2", "--no-progress", "--logdir", run]) == 0
    best = Placement.load(os.path.join(run, "best_placement.json"))
    assert best.order is not None and best.meta["issue_order_step_time_s"] <= best.meta["step_time_s"] * (1 + 1e-12)
    capsys.readouterr()
    assert main(["simulate", gpath, os.path.join(run, "best_placement.json"), "--cluster", "k80x4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(
        best.meta["issue_order_step_time_s"], rel=1e-12
    )


def test_step_times_planned_scores_each_row_in_its_schedule_order():
    """order="planned": every row is scored in its own SimEnv.schedule_order, the plan_order candidate."""
    import envs
    from graphs.synthetic import random_dag

    g = random_dag(60, seed=2)
    env = envs.SimEnv(g, envs.resolve_cluster("k80x4"))
    rows = np.random.default_rng(0).integers(0, env.num_devices, size=(4, g.num_ops)).astype(np.int32)
    planned, failed = env.step_times(rows, order="planned")
    for k, row in enumerate(rows):
        order = env.schedule_order(row)
        assert np.array_equal(order, env.order_candidates(row)["schedule"])
        assert planned[k] == pytest.approx(float(env.step_times(row[None], order=order)[0][0]))
    with pytest.raises(PlacerError, match="planned"):
        env.step_times(rows, order="best")
