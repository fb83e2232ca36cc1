"""placer.apply: placed modules compute what the model computes, on the placed devices."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from envs.real.devices import parse_device_map, resolve_devices
from envs.real.placing import DEVICE_META, MOVE_META, WRITEBACK_META, transfers
from envs.real.timing import default_loss
from graphs import PlacerError
from graphs.dag import random_order
from graphs.torch_capture import capture, export_program
from placer.apply import apply, apply_program
from placer.placement import Placement

DEVICES = ["cpu:0", "gpu:0", "gpu:1"]
ALL_CPU = "*=cpu"  # three logical devices, one real one: every transfer is built, as a no-op copy


class BNNet(nn.Module):
    """Batch norm (running statistics), an in-place buffer update, two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 12)
        self.bn = nn.BatchNorm1d(12)
        self.l2 = nn.Linear(12, 3)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        h = torch.relu(self.bn(self.l1(x))) * (self.calls * 0.1 + 1)
        self.calls.add_(1)
        return self.l2(h), h.square().mean() + torch.ones(1).sum()


class TiedLM(nn.Module):
    """Embedding and output projection share one weight (read by two ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.mid(self.emb(tokens))))


def _cases():
    torch.manual_seed(0)
    return {
        "bn": (BNNet(), (torch.randn(16, 6),)),
        "tied": (TiedLM(), (torch.randint(0, 20, (4, 5)),)),
    }


def _random_placement(model, inputs, seed, devices=DEVICES):
    g = capture(model, inputs)
    op_devices = np.random.default_rng(seed).integers(0, len(devices), size=g.num_ops)
    return g, Placement.from_indices(g, devices, op_devices)


def _grads(model):
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def assert_same_outputs_and_grads(placed, ref_model, out, ref):
    """``out`` (the placed model's) equals ``ref`` (the unplaced one's), and so do the gradients of their default
    losses."""
    for a, b in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(ref), strict=True):
        torch.testing.assert_close(a, b)
    default_loss(out).backward()
    default_loss(ref).backward()
    got, want = _grads(placed), _grads(ref_model)
    assert got.keys() == want.keys() and got
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k)


def assert_same_loss_and_grads(placed, ref_model, inputs, grad_atol=lambda want: 1e-6):
    """The placed model's loss and gradients are the unplaced one's; both run after one seed, so dropout draws the
    same masks. ``grad_atol(want)``: the absolute tolerance of a gradient ``want``."""
    torch.manual_seed(5)
    loss = placed(*inputs)
    torch.manual_seed(5)
    ref = ref_model(*inputs)
    torch.testing.assert_close(loss, ref)
    loss.backward()
    ref.backward()
    got, want = _grads(placed), _grads(ref_model)
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k, rtol=1e-4, atol=grad_atol(want[k]))


@pytest.mark.parametrize("name", ["bn", "tied"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_and_gradients_equal(name, seed):
    model, inputs = _cases()[name]
    ref_model = copy.deepcopy(model)
    g, p = _random_placement(model, inputs, seed)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    assert_same_outputs_and_grads(placed, ref_model, placed(*inputs), ref_model(*inputs))


@pytest.mark.parametrize("name", ["bn", "tied"])
def test_a_program_exported_once_places_copies_of_the_model_and_refuses_another_model(name):
    model, inputs = _cases()[name]
    ref_model = copy.deepcopy(model)
    g, p = _random_placement(model, inputs, 0)
    program = export_program(model, inputs)
    copied, ep = copy.deepcopy((model, program))  # a fresh pair that share their tensors as the originals do
    placed = apply_program(copied, ep, p, inputs, ALL_CPU, graph=g)
    assert placed.meta["placer_issue_order"] == g.names
    assert_same_outputs_and_grads(placed, ref_model, placed(*inputs), ref_model(*inputs))
    with pytest.raises(PlacerError, match="not the model's own"):  # the model copied without its program
        apply_program(copy.deepcopy(model), program, p, inputs, ALL_CPU, graph=g)
    with pytest.raises(PlacerError, match=r"part_programs\[2\]: its tensor .* not the model's own"):  # nor its part's
        apply_program(copied, ep, p, inputs, ALL_CPU, graph=g, part_programs={2: program})


def test_a_pipelined_plan_runs_on_the_program_at_a_microbatch_s_size_given_to_it(monkeypatch):
    import envs.real.placed_model as placed_model
    from envs.real.pipeline import MicrobatchedModule, split_batch

    model, inputs = _cases()["tied"]  # (no batch norm: a microbatch's statistics are its own)
    ref_model = copy.deepcopy(model)
    g, p = _random_placement(model, inputs, 0)
    p = Placement.from_indices(g, DEVICES, p.indices(g), microbatches=2)
    program, part = export_program(model, inputs), export_program(model, split_batch(inputs, 2)[0])

    def refused(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(placed_model, "export_microbatch", refused)  # the part program given is the one placed
    placed = apply_program(model, program, p, inputs, ALL_CPU, graph=g, part_programs={2: part})
    assert isinstance(placed, MicrobatchedModule) and placed.microbatches == 2
    assert_same_outputs_and_grads(placed, ref_model, placed(*inputs), ref_model(*inputs))


def test_every_crossing_edge_gets_one_copy_per_tensor_and_device():
    model, inputs = _cases()["bn"]
    g, p = _random_placement(model, inputs, seed=3)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    dev_of = {n.name: n.meta.get(DEVICE_META) for n in placed.graph.nodes}
    for n in placed.graph.nodes:
        if n.name in p.assignment:
            assert dev_of[n.name] == p.assignment[n.name]
    # Expected copies: each op output consumed on another device, once per (op, device).
    expected = set()
    for s, d in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
        src, dst = g.names[s], g.names[d]
        if p.assignment[src] != p.assignment[dst]:
            expected.add((src, p.assignment[dst]))
    made = transfers(placed)
    assert len(made) == len(set(made))  # never twice for the same (tensor, device)
    op_copies = {t for t in made if t[0] in p.assignment}
    assert op_copies == expected
    # Every consumer reads a value living on its own device.
    for n in placed.graph.nodes:
        if n.op == "call_function" and n.meta.get(DEVICE_META) and MOVE_META not in n.meta:
            for a in n.all_input_nodes:
                if a.op == "call_function" and a.meta.get(DEVICE_META):
                    assert a.meta[DEVICE_META] == n.meta[DEVICE_META], (a.name, n.name)


def test_tied_weight_has_one_master_and_gradient_accumulates():
    model, inputs = _cases()["tied"]
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs)
    readers = [g.names[i] for i in range(g.num_ops) if "emb.weight" in g.params[i] or "out.weight" in g.params[i]]
    assert len(readers) == 2
    assignment = {n: "cpu:0" for n in g.names}
    assignment[readers[1]] = "gpu:1"  # the second reader runs elsewhere
    placed = apply(model, assignment, inputs, device_map=ALL_CPU)
    params = dict(placed.named_parameters(remove_duplicate=False))
    assert params["emb.weight"] is params["out.weight"]
    assert sum(1 for t in transfers(placed) if t[1] == "gpu:1" and "weight" in t[0]) == 1
    default_loss(placed(*inputs)).backward()
    default_loss(ref_model(*inputs)).backward()
    torch.testing.assert_close(params["emb.weight"].grad, ref_model.emb.weight.grad)


def test_placed_model_trains_like_the_unplaced_one():
    model, inputs = _cases()["bn"]
    ref_model = copy.deepcopy(model)
    _, p = _random_placement(model, inputs, seed=4)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    opt = torch.optim.Adam(placed.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
    for step in range(4):
        x = (torch.randn(16, 6, generator=torch.Generator().manual_seed(step)),)
        losses = []
        for m, o in ((placed, opt), (ref_model, ref_opt)):
            o.zero_grad()
            loss = default_loss(m(*x))
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-7), step
    for key, buf in ref_model.named_buffers():
        torch.testing.assert_close(dict(placed.named_buffers())[key], buf, msg=key)
    assert float(ref_model.calls) == 4.0


def test_buffer_written_on_another_device_is_written_back():
    model, inputs = _cases()["bn"]
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs)
    reader, writer = [g.names[i] for i in range(g.num_ops) if g.params[i] == ["calls"]]
    assert writer.startswith("add_")  # the buffer is read (on cpu:0), then written (on gpu:0)
    assignment = {n: "cpu:0" for n in g.names}
    assignment[writer] = "gpu:0"
    bn = next(n for n in g.names if "batch_norm" in n)
    assignment[bn] = "gpu:1"
    first = g.names[0]
    assignment[first] = "gpu:1"
    placed = apply(model, assignment, inputs, device_map=ALL_CPU)
    assert [n.meta[WRITEBACK_META] for n in placed.graph.nodes if WRITEBACK_META in n.meta] == ["calls"]
    for _ in range(3):
        placed(*inputs)
        ref_model(*inputs)
    bufs = dict(placed.named_buffers())
    for key, buf in ref_model.named_buffers():
        torch.testing.assert_close(bufs[key], buf, msg=key)


class ScatterMax(nn.Module):
    """PyG's max aggregation: zeros made, then ``scatter_reduce_`` (amax) into them in place, whose backward reads
    the result it wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, index):
        h = torch.relu(self.lin(x))
        out = h.new_zeros(3, 4).scatter_reduce_(0, index.view(-1, 1).expand_as(h), h, "amax")
        return out.square().sum()


def test_an_in_place_write_whose_backward_reads_its_result_runs_where_the_copy_is_the_master_itself():
    """Two logical devices on one real one: the copy to the writer's device is the tensor itself, and writing it back
    would be a copy onto itself, which bumps the version of the result the backward reads."""
    torch.manual_seed(0)
    model, x = ScatterMax(), torch.randn(6, 4)
    index = torch.tensor([0, 2, 1, 2, 0, 1])
    g = capture(model, (x, index))
    writer = next(n for n in g.names if n.startswith("scatter_reduce"))
    maker = next(n for n in g.names if n.startswith("new_zeros"))
    assignment = {n: "cpu:0" for n in g.names}
    assignment[writer] = "gpu:0"
    placed = apply(copy.deepcopy(model), assignment, (x, index), device_map=ALL_CPU)
    assert [n.meta[WRITEBACK_META] for n in placed.graph.nodes if WRITEBACK_META in n.meta] == [maker]
    loss, ref = placed(x, index), model(x, index)
    loss.backward()
    ref.backward()
    assert torch.equal(loss, ref)
    for (name, p), q in zip(placed.named_parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_real_second_device_meta():
    """A real device change on a CPU machine: the tail of the model runs on ``meta``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    g = capture(model, (x,))
    op_devices = [0] * (g.num_ops - 1) + [1]
    p = Placement.from_indices(g, ["cpu:0", "gpu:0"], op_devices)
    placed = apply(model, p, (x,), device_map={"gpu:0": "meta"})
    out = placed(x)
    assert out.device.type == "meta"
    assert placed.get_submodule("0").weight.device.type == "cpu"
    assert placed.get_submodule("2").weight.device.type == "meta"


def test_factory_op_device_is_rewritten():
    model, inputs = _cases()["bn"]
    g = capture(model, inputs)
    assignment = {n: "cpu:0" for n in g.names}
    ones = next(n for n in g.names if n.startswith("ones"))
    assignment[ones] = "gpu:0"
    placed = apply(model, assignment, inputs, device_map={"gpu:0": "meta", "*": "cpu"})
    node = next(n for n in placed.graph.nodes if n.name == ones)
    assert node.kwargs["device"] == torch.device("meta")


def test_bad_placements_are_one_line_errors():
    model, inputs = _cases()["bn"]
    g = capture(model, inputs)
    p = Placement.from_indices(g, DEVICES, [0] * g.num_ops)
    with pytest.raises(PlacerError, match="made for graph"):
        apply(model, Placement(p.assignment, "0" * 16, DEVICES), inputs)
    partial = dict(list(p.assignment.items())[1:])
    with pytest.raises(PlacerError, match="have no device"):
        apply(model, partial, inputs)
    with pytest.raises(PlacerError, match="not in the graph"):
        apply(model, {**p.assignment, "nope": "cpu:0"}, inputs)
    with pytest.raises(PlacerError, match="tpu:0"):
        apply(model, {n: "tpu:0" for n in g.names}, inputs)
    with pytest.raises(PlacerError, match="expected a Placement"):
        apply(model, [0] * g.num_ops, inputs)
    other = capture(TiedLM(), (torch.randint(0, 20, (4, 5)),))
    with pytest.raises(PlacerError, match="not the graph of this model"):
        apply(model, p, inputs, graph=other)


def test_device_map_parsing():
    assert parse_device_map("gpu:0=cuda:1,*=cpu") == {"gpu:0": "cuda:1", "*": "cpu"}
    assert resolve_devices(["cpu:0", "gpu:3"]) == {"cpu:0": torch.device("cpu"), "gpu:3": torch.device("cuda:3")}
    with pytest.raises(PlacerError, match="LOGICAL=TORCH_DEVICE"):
        parse_device_map("gpu:0")
    with pytest.raises(PlacerError, match="not a torch device"):
        resolve_devices(["gpu:0"], {"gpu:0": "quantum:9"})


# ------------------------------------------------------------ the zoo, small
def _tiny_zoo():
    """Every zoo architecture at toy sizes (the full sizes take minutes per step on a CPU)."""
    from graphs.models.gpt2 import GPT2
    from graphs.models.inception import InceptionV3
    from graphs.models.nmt import NMT
    from graphs.models.resnet import ResNet50
    from graphs.models.rnnlm import RNNLM

    def tokens(*shape, vocab=50):
        return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))

    def images(side, classes=10):
        g = torch.Generator().manual_seed(1)
        return torch.randn(2, 3, side, side, generator=g), torch.randint(0, classes, (2,), generator=g)

    return {
        "rnnlm": lambda: (RNNLM(vocab_size=50, hidden_size=16, num_layers=2), (tokens(2, 4), tokens(2, 4))),
        "nmt-2": lambda: (
            NMT(num_layers=2, src_vocab=50, tgt_vocab=50, hidden_size=16),
            (tokens(2, 4), tokens(2, 3), tokens(2, 3)),
        ),
        "nmt-4": lambda: (
            NMT(num_layers=4, src_vocab=50, tgt_vocab=50, hidden_size=16),
            (tokens(2, 3), tokens(2, 3), tokens(2, 3)),
        ),
        "inception-v3": lambda: (InceptionV3(num_classes=10), images(299)),  # its aux head needs 299x299
        "gpt2": lambda: (GPT2(vocab_size=50, context=8, width=16, layers=2, heads=2), (tokens(2, 8), tokens(2, 8))),
        "resnet50": lambda: (ResNet50(num_classes=10), images(32)),
    }


def test_tiny_zoo_covers_the_zoo():
    from graphs import zoo

    assert set(_tiny_zoo()) == set(zoo.names())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rnnlm", "nmt-2", "nmt-4", "gpt2"])  # the CNNs: in the issue-order test below
def test_zoo_models_outputs_and_gradients_equal(name):
    torch.manual_seed(0)
    model, inputs = _tiny_zoo()[name]()
    ref_model = copy.deepcopy(model)
    g, p = _random_placement(model, inputs, seed=7)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    assert transfers(placed)  # a random placement over 3 devices crosses edges
    assert_same_loss_and_grads(placed, ref_model, inputs)


@pytest.mark.slow
def test_zoo_model_trains_step_by_step_like_the_unplaced_one():
    torch.manual_seed(0)
    model, inputs = _tiny_zoo()["gpt2"]()
    ref_model = copy.deepcopy(model)
    _, p = _random_placement(model, inputs, seed=8)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    opt = torch.optim.SGD(placed.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        losses = []
        for m, o in ((placed, opt), (ref_model, ref_opt)):
            o.zero_grad()
            loss = m(*inputs)
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5), step


def test_missing_cuda_device_is_a_one_line_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model, inputs = _cases()["bn"]
    g = capture(model, inputs)
    with pytest.raises(PlacerError, match="gpu:0 maps to cuda:0, which this machine does not have"):
        apply(model, {n: "gpu:0" for n in g.names}, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nmt-2", "inception-v3", "gpt2", "resnet50"])
def test_zoo_models_follow_a_random_issue_order(name):
    """A random placement in any topological order keeps outputs and gradients (dropout, batch norm, LSTMs, tied
    weights)."""
    from envs.real.placing import ORDER_META
    from graphs.plan import check_order

    torch.manual_seed(0)
    model, inputs = _tiny_zoo()[name]()
    ref_model = copy.deepcopy(model)
    g = capture(model, inputs)
    rng = np.random.default_rng(11)
    order = random_order(g, rng).tolist()
    p = Placement.from_indices(g, DEVICES, rng.integers(0, len(DEVICES), size=g.num_ops), order=order)
    placed = apply(model, p, inputs, device_map=ALL_CPU)
    assert transfers(placed)  # a random placement over 3 devices crosses edges
    run = [g.index[n] for n in placed.meta[ORDER_META]]
    check_order(run, g)
    assert run != list(range(g.num_ops))  # the order moved ops
    # Autograd sums a tensor's gradient contributions in the order backward runs, which
    # follows the forward's issue order: float32 rounding moves (float64 agrees to 1e-13).
    assert_same_loss_and_grads(placed, ref_model, inputs, grad_atol=lambda want: 1e-5 * float(want.abs().max()))
