"""placer.apply runs a plan's parameter homes (envs.real.homes): parameters that live on the host, read on gpu:0.

Every logical device is the CPU here (``device_map="*=cpu"``), and homes are decided on logical devices, so the home
path runs in full: each homed parameter is copied in for its reader as a new tensor, freed after it, made again for
its backward, and its gradient sent home through the end-of-backward callback. The CUDA path's stream protocol (the
side stream waits for the reader two before, then frees its copies) is checked with recording streams. With a plan's
``host_step`` ``"backward"`` (``placer.apply.step_in_backward``) the masters are stepped on the host worker during the
backward, each once all its gradients are home.
"""

from __future__ import annotations

import copy
import threading
import time
import types
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

import envs.real.homes as homes
import placer.apply as placer_apply
from envs.real.transfers import to_device
from envs.sim.homes import copy_pairs, home_readers
from graphs import PlacerError
from graphs.flops import is_alias
from graphs.ops import param_owners
from graphs.plan import Placement
from graphs.torch_capture import capture
from placer.apply import apply
from tests.placer.test_apply import TiedLM

DEVICES = ["cpu:0", "gpu:0"]


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b, self.c = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.c(torch.relu(self.b(self.norm(self.a(x))))).pow(2).mean()


def homed_plan(graph, names, home=0):
    """Every op on gpu:0, the ops that first read ``names`` with their parameters on ``home``."""
    h = np.full(graph.num_ops, -1)
    owners = param_owners(graph)
    for name in names:
        h[owners[name]] = home
    return Placement.from_indices(graph, DEVICES, np.ones(graph.num_ops, dtype=int), homes=h)


#: Adam's learning rate in :func:`train_side_by_side`; a parameter stepped wrongly (not at all, twice, another's
#: state) is off by about this much per step.
LR = 0.05


def train_side_by_side(placed, ref, inputs, steps=3):
    """Adam steps on both; losses and gradients equal at each, parameters equal at the end.

    The parameters are compared to ``LR / 500``: where a gradient is near Adam's ``eps`` (1e-8), its step
    ``lr * g / (|g| + eps)`` turns a rounding difference of 1e-11 in ``g`` (another CPU's kernels) into ~1e-5.
    """
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=LR) for m in (placed, ref))
    for _ in range(steps):
        for o in (opt, ref_opt):
            o.zero_grad()
        loss, ref_loss = placed(*inputs), ref(*inputs)
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss)
        for (name, p), (_, q) in zip(placed.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        opt.step()
        ref_opt.step()
    for (name, p), (_, q) in zip(placed.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, atol=LR / 500, rtol=1e-5, msg=name)


@pytest.mark.parametrize("names", [["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"], ["b.weight"]])
def test_homed_parameters_train_as_the_unplaced_model_does(names):
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(5, 8)
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    p = homed_plan(g, names + (["b.bias"] if names == ["b.weight"] else []))
    placed = apply(model, p, (x,), device_map="*=cpu")
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    assert sorted(n for n, _ in placed.named_parameters()) == sorted(n for n, _ in ref.named_parameters())
    assert {id(m) for m in runtime.masters} <= {id(q) for q in placed.parameters()}  # the optimizer steps them
    train_side_by_side(placed, ref, (x,))
    assert set(placed.state_dict()) == set(ref.state_dict())


@pytest.mark.slow
def test_a_homed_llama_trains_as_the_unplaced_one():
    pytest.importorskip("transformers")
    from graphs.models.corpus import build

    model, inputs = build("llama")
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    owners = param_owners(g)
    linears = [n for n in owners if n.endswith("proj.weight")]  # its LM head is tied to the embedding
    placed = apply(model, homed_plan(g, linears), inputs, device_map="*=cpu")
    assert len(placed.get_submodule(homes.RUNTIME_ATTR).masters) == len(linears) > 4
    train_side_by_side(placed, ref, inputs, steps=2)


class Mean(nn.Module):
    def forward(self, x):
        return x.pow(2).mean()


class Recording(homes.Streams):
    """The CUDA path's stream calls, recorded: ``side_waits(event)`` and ``mark()`` (numbered events)."""

    log: list = []

    def __init__(self, torch_device):
        super().__init__(torch_device)
        self.marks = 0

    def mark(self):
        self.marks += 1
        Recording.log.append(("mark", self.marks))
        return self.marks

    def side_waits(self, event):
        Recording.log.append(("wait", event))


def test_each_copy_waits_for_the_reader_two_before_and_frees_its_memory(monkeypatch):
    """Forward: the copy for the third reader waits for the first reader's mark, then the first's copies are freed;
    the last two readers' copies are kept at the end of the forward for their backward, which makes none; at the end
    of the backward every copy is freed."""
    monkeypatch.setattr(homes, "Streams", Recording)
    Recording.log = []
    freed = []
    real_free = homes.free
    monkeypatch.setattr(homes, "free", lambda t: (freed.append(t.numel()), real_free(t)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Linear(16, 16, bias=False), nn.Linear(16, 4, bias=False))
    model, x = nn.Sequential(model, Mean()), torch.randn(5, 8)
    g = capture(model, (x,))
    placed = apply(model, homed_plan(g, ["0.0.weight", "0.1.weight", "0.2.weight"]), (x,), device_map="*=cpu")
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    filled = []
    real_fill = runtime._fill
    runtime._fill = lambda index, c: (filled.append(runtime.masters[index].shape[0]), real_fill(index, c))
    loss = placed(x)
    # a's reader issued (mark 1), b's (mark 2); c's copy: the side stream waits for mark 1, a's copy is freed
    assert Recording.log[:3] == [("mark", 1), ("mark", 2), ("wait", 1)]
    assert freed == [16 * 8] and filled == [16, 16, 4]  # a's at c's copy; b's and c's kept for the backward
    window = runtime.windows[(torch.device("cpu"), 0)]
    assert not window.live
    freed.clear()
    filled.clear()
    loss.backward()
    # backward: c and b as the forward left them, a made again; a's copy waits for c's reader (the mark after its
    # gradient), c's copy is freed; b's and a's at the backward's end
    assert filled == [16] and ("wait", 4) in Recording.log and freed == [4 * 16, 16 * 16, 16 * 8]
    assert all(m.grad is not None for m in runtime.masters) and not runtime.sent
    # a plan whose copies are all made again (home_copies "again", a file from before the kept copies): every copy
    # is freed at the end of the forward and made again for the backward
    plan = homed_plan(g, ["0.0.weight", "0.1.weight", "0.2.weight"])
    plan.home_copies = "again"
    placed = apply(model, plan, (x,), device_map="*=cpu")
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    real_fill = runtime._fill
    runtime._fill = lambda index, c: (filled.append(runtime.masters[index].shape[0]), real_fill(index, c))
    filled.clear()
    freed.clear()
    loss = placed(x)
    assert freed == [16 * 8, 16 * 16, 4 * 16] and filled == [16, 16, 4]
    filled.clear()
    loss.backward()
    assert filled == [4, 16, 16]


def test_homes_are_refused_where_they_cannot_run():
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(4, 8)
    g = capture(model, (x,))
    p = homed_plan(g, ["a.weight", "a.bias"])
    with pytest.raises(PlacerError, match="one microbatch"):
        apply(model, p, (x,), device_map="*=cpu", microbatches=2)
    p.param_homes = {"a.weight": "cpu:0"}  # a.bias would stay with its op
    with pytest.raises(PlacerError, match="different homes"):
        apply(model, p, (x,), device_map="*=cpu")


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x))).pow(2).sum()


class TiedLm(TiedLM):
    """An embedding and a head tied to it (GPT-2's, Llama-3.2-1B's): one tensor under two names, read by two ops."""

    def forward(self, ids):
        return nn.functional.cross_entropy(super().forward(ids).flatten(0, 1), ids.flatten())


def homed_everywhere(build):
    """``build()``'s model with every parameter that can live apart homed on cpu:0 and every op on gpu:0: ``(placed,
    unplaced copy, inputs, per master the readers it is copied for)``."""
    torch.manual_seed(0)
    model, inputs = build()
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    placed = apply(model, homed_plan(g, list(param_owners(g))), inputs, device_map="*=cpu")
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    return placed, ref, inputs, Counter(id(m) for m in runtime.masters)


@pytest.mark.parametrize(
    "build", [lambda: (Twice(), (torch.randn(2, 4),)), lambda: (TiedLm(), (torch.arange(12).view(2, 6),))]
)
def test_a_parameter_several_ops_read_is_copied_for_each_and_trains_as_the_unplaced_model_does(build):
    placed, ref, inputs, copies = homed_everywhere(build)
    assert max(copies.values()) == 2
    assert sorted(n for n, _ in placed.named_parameters()) == sorted(n for n, _ in ref.named_parameters())
    train_side_by_side(placed, ref, inputs)
    if isinstance(ref, TiedLm):  # the two names stay one tensor, the master
        assert placed.get_parameter("out.weight") is placed.get_parameter("emb.weight")
        assert copies[id(placed.get_parameter("out.weight"))] == 2


def test_a_parameter_two_ops_read_on_two_devices_keeps_its_home_with_them():
    model, x = Twice(), torch.randn(2, 4)
    g = capture(model, (x,))
    devices = np.ones(g.num_ops, dtype=int)
    devices[-1] = 0  # the loss on cpu:0 ...
    second = [i for i, names in enumerate(g.params) if "lin.weight" in names][1]
    devices[second] = 0  # ... and the second linear
    p = Placement.from_indices(g, DEVICES, devices)
    p.param_homes = {"lin.weight": "cpu:0", "lin.bias": "cpu:0"}
    with pytest.raises(PlacerError, match="lin.weight is read by .* which is on another device"):
        apply(model, p, (x,), device_map="*=cpu")


class ThroughViews(nn.Module):
    """Parameters read through views, as Falcon and GPT-style code write them: ``x @ w.T``, ``x @ w.t().unsqueeze(0)``
    and ``w.T.contiguous()`` (the view's reader copies it)."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.w1 = nn.Parameter(torch.randn(16, 8) / 4)
        self.w2 = nn.Parameter(torch.randn(16, 16) / 4)
        self.w3 = nn.Parameter(torch.randn(16, 4) / 4)
        self.b3 = nn.Parameter(torch.randn(4) / 4)

    def forward(self, x):
        w2 = self.w2.t().unsqueeze(0)  # a view taken long before it is read
        h = torch.relu(self.pre(x) @ self.w1.T)
        h = torch.relu(torch.bmm(h.unsqueeze(0), w2).squeeze(0))
        return (h @ self.w3.T.contiguous().T + self.b3).pow(2).mean()


def test_parameters_read_through_views_are_homed_and_train_as_the_unplaced_model_does():
    torch.manual_seed(0)
    model, x = ThroughViews(), torch.randn(5, 8)
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    owners = param_owners(g)
    views = [n for n in ("w1", "w2", "w3") if g.op_types[owners[n]].split(".")[1] in ("t", "numpy_T", "permute")]
    assert len(views) == 3  # each first read by a view
    p = homed_plan(g, ["w1", "w2", "w3", "b3", "pre.weight", "pre.bias"])
    placed = apply(model, p, (x,), device_map="*=cpu")
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    assert len(runtime.masters) == 6
    train_side_by_side(placed, ref, (x,))
    # the views of a homed parameter run right before their reader, on its copy: between a copy and its reader,
    # only the reader's other copies, its inputs' transfers and the views
    nodes = list(placed.graph.nodes)
    viewed = 0
    for release in (n for n in nodes if n.target is homes.release_home):
        fetched, reader = release.args[2], release.args[3]
        between = nodes[nodes.index(fetched) + 1 : nodes.index(reader)]
        assert all(n.target in (homes.fetch_home, to_device) or is_alias(n.target) for n in between)
        viewed += sum(n.target not in (homes.fetch_home, to_device) for n in between)
    assert viewed >= 3
    # a plan that parts a view from its reader cannot home the parameter it views
    apart = Placement.from_indices(g, DEVICES, np.ones(g.num_ops, dtype=int), homes=p.home_indices(g))
    apart.assignment[g.names[home_readers(g)[owners["w1"]]]] = "cpu:0"  # w1.T's reader on the host, w1.T on gpu:0
    with pytest.raises(PlacerError, match="w1 is read by .* which is on another device"):
        apply(model, apart, (x,), device_map="*=cpu")


class Cast(nn.Module):
    """A norm's gain cast to float, then to the activations' dtype, as Gemma's, Cohere's and Mamba's code do: before
    each cast (a view at the same dtype) the export checks the tensor's metadata (``_assert_tensor_metadata``, the
    gain's first reader)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gain = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        h = self.lin(x)
        return (h * self.gain.float().to(h.dtype)).pow(2).mean()


def test_a_parameter_whose_metadata_is_checked_before_it_is_read_is_homed_and_trains_as_the_unplaced_model_does():
    torch.manual_seed(0)
    model, x = Cast(), torch.randn(5, 8)
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    assert g.op_types[param_owners(g)["gain"]] == "aten._assert_tensor_metadata.default"
    placed = apply(model, homed_plan(g, ["gain", "lin.weight", "lin.bias"]), (x,), device_map="*=cpu")
    assert len(placed.get_submodule(homes.RUNTIME_ATTR).masters) == 3
    assert sum("assert_tensor_metadata" in t for t in g.op_types) == 2
    assert not any("assert_tensor_metadata" in str(n.target) for n in placed.graph.nodes)  # they checked the master
    train_side_by_side(placed, ref, (x,))


class SharedView(nn.Module):
    """One view of a parameter read by several ops: ``wt = w.T`` read by a matmul and, through ``wt.unsqueeze(0)``,
    by a batched one."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        wt = self.w.T
        h = torch.tanh(x @ wt)
        h = torch.bmm(h.unsqueeze(0), wt.unsqueeze(0)).squeeze(0)
        return self.out(h).pow(2).mean()


class CrossAttention(nn.Module):
    """``nn.MultiheadAttention`` attending from one sequence to another (``nn.Transformer``'s decoder does): its
    packed input projection is split into the query's part and the keys' and values', each read by a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q, kv):
        return self.attn(q, kv, kv, need_weights=False)[0].pow(2).mean()


def test_a_view_several_ops_read_is_made_again_on_each_op_s_copy_and_trains_as_the_unplaced_model_does():
    placed, ref, inputs, copies = homed_everywhere(lambda: (SharedView(), (torch.randn(5, 8),)))
    assert max(copies.values()) == 2  # the viewed parameter: a copy per op reading its view
    train_side_by_side(placed, ref, inputs)
    # each copy's views run on it, right before its reader: no view is shared by two copies
    nodes = list(placed.graph.nodes)
    for release in (n for n in nodes if n.target is homes.release_home):
        fetched, reader = release.args[2], release.args[3]
        between = nodes[nodes.index(fetched) + 1 : nodes.index(reader)]
        assert all(n.target in (homes.fetch_home, to_device) or is_alias(n.target) for n in between)
    on_copies = [
        n for n in nodes if is_alias(n.target) and any(a.target is homes.fetch_home for a in n.all_input_nodes)
    ]
    assert on_copies and all(len(n.users) == 1 for n in on_copies)
    assert all(part is None for part in placed.get_submodule(homes.RUNTIME_ATTR).parts)


def fetched_bytes(placed, inputs):
    """Per master (by name in the placed module), the bytes of each copy a forward of ``placed`` fetches."""
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    names = {id(p): n for n, p in placed.named_parameters()}
    out: dict[str, list[int]] = {}
    fetch = runtime.fetch

    def counting(index):
        copy = fetch(index)
        out.setdefault(names[id(runtime.masters[index])], []).append(copy.numel() * copy.element_size())
        return copy

    runtime.fetch = counting
    try:
        placed(*inputs)
    finally:
        del runtime.fetch
    return out


def test_each_op_reading_a_part_of_a_packed_parameter_is_copied_that_part_and_trains_as_the_unplaced_model_does():
    # nn.MultiheadAttention from one sequence to another: in_proj_weight (24 x 8) is split into the query's 8 rows
    # and the keys' and values' 16, each read by a linear: the query's copy holds a third of it, the other two
    placed, ref, inputs, copies = homed_everywhere(
        lambda: (CrossAttention(), (torch.randn(2, 3, 8), torch.randn(2, 5, 8)))
    )
    assert max(copies.values()) == 2
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    parts = {tuple(part) for part in runtime.parts if part is not None}
    assert parts == {((8, 8), (8, 1), 0), ((16, 8), (8, 1), 64), ((8,), (1,), 0), ((16,), (1,), 8)}
    fetched = fetched_bytes(placed, inputs)
    assert sorted(fetched["attn.in_proj_weight"]) == [8 * 8 * 4, 16 * 8 * 4]
    # what the simulator charges: the same bytes, copy for copy
    assert sorted(runtime.copy_bytes()) == sorted(b for each in fetched.values() for b in each)
    assert sum(runtime.copy_bytes()) == copy_pairs(capture(ref, inputs))[2].sum()
    # no view runs on a copy: each reader reads its copy, laid out as the view it read without homes
    nodes = list(placed.graph.nodes)
    assert not any(is_alias(n.target) and any(a.target is homes.fetch_home for a in n.all_input_nodes) for n in nodes)
    train_side_by_side(placed, ref, inputs)


class Spline(nn.Module):
    """A KAN layer's habit (pykan): a grid read through slices with gaps (``grid[:, :-2]``, rows of 6 of 8), which
    the runtime copies whole, beside a dense part (``grid[:1]``, its first row), which it copies alone."""

    def __init__(self) -> None:
        super().__init__()
        self.grid = nn.Parameter(torch.randn(3, 8))

    def forward(self, x):
        return (x[:, :6] * self.grid[:, :-2]).sum() + (x * self.grid[:1]).square().sum()


def test_a_part_with_gaps_is_copied_whole_and_simulated_so():
    """The simulator charged the part's bytes where the runtime, which copies only a dense part, copied it all: a
    KAN's copies were simulated 10 % short."""
    placed, ref, inputs, _ = homed_everywhere(lambda: (Spline(), (torch.randn(3, 8),)))
    fetched = fetched_bytes(placed, inputs)
    assert sorted(fetched["grid"]) == [8 * 4, 3 * 8 * 4]  # the first row; all of it for the slice with gaps
    graph = capture(ref, inputs)
    strided = [graph.op_types[graph.index[n]] for n in graph.meta["strided_views"]]
    assert strided == ["aten.slice.Tensor"] * 2  # x[:, :6] and grid[:, :-2] (grid[:1] and grid[:, :] are dense)
    assert sum(placed.get_submodule(homes.RUNTIME_ATTR).copy_bytes()) == copy_pairs(graph)[2].sum()
    train_side_by_side(placed, ref, inputs)


# ------------------------------------------------------------- stepping the homed parameters in the backward
class AttendTwice(nn.Module):
    """``nn.MultiheadAttention`` from one sequence to another (its packed projection read in parts), a linear applied
    twice (one parameter, two readers), and a head that stays with its op (the user's ``step()`` steps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.lin = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, q, kv):
        h = self.attn(q, kv, kv, need_weights=False)[0]
        return self.head(self.lin(torch.tanh(self.lin(h)))).pow(2).mean()


def attend_twice():
    return AttendTwice(), (torch.randn(2, 3, 8), torch.randn(2, 5, 8))


def stepping_in_backward(build, host_step="backward", keep=("head.",), checkpoint=()):
    """``build()``'s model with every parameter but those starting with ``keep`` homed on cpu:0, every op on gpu:0,
    the plan's ``host_step`` as given: ``(placed, unplaced copy, inputs, the names of the homed parameters)``."""
    torch.manual_seed(0)
    model, inputs = build()
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    names = [n for n in param_owners(g) if not n.startswith(tuple(keep))]
    p = homed_plan(g, names)
    p.host_step, p.checkpoint = host_step, list(checkpoint)
    placed = apply(model, p, inputs, device_map="*=cpu")
    return placed, ref, inputs, names


def fused_adams(placed, ref):
    return tuple(torch.optim.Adam(m.parameters(), lr=LR, fused=True) for m in (placed, ref))


def train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt, steps=3, schedulers=()):
    """:func:`train_side_by_side` with ``opt`` registered to step the ``homed`` parameters in the backward: each step,
    right after ``loss.backward()`` the homed parameters have been stepped (as the unplaced model's ``step()`` steps
    them) with their gradients readable, and ``opt.step()`` steps only the others."""
    for _ in range(steps):
        for o in (opt, ref_opt):
            o.zero_grad()
        loss, ref_loss = placed(*inputs), ref(*inputs)
        before = {n: q.detach().clone() for n, q in placed.named_parameters()}
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss)
        after_backward = {n: q.detach().clone() for n, q in placed.named_parameters()}
        for (name, p), (_, q) in zip(placed.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)  # the homed ones' too: readable after backward
            assert torch.equal(before[name], after_backward[name]) == (name not in homed), name
        opt.step()
        ref_opt.step()
        for name, p in placed.named_parameters():  # step() steps the others, not the homed ones again
            assert torch.equal(after_backward[name], p.detach()) == (name in homed), name
        for s in schedulers:
            s.step()
    for (name, p), (_, q) in zip(placed.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, atol=LR / 500, rtol=1e-5, msg=name)


def test_homed_parameters_stepped_in_the_backward_train_as_the_unplaced_model_does(monkeypatch):
    """A packed projection read in parts and a linear applied twice, homed: each master is stepped on the host
    worker once all its readers' gradients are home, before ``backward()`` returns; ``step()`` steps the head."""
    placed, ref, inputs, homed = stepping_in_backward(attend_twice)
    assert placed.meta["placer_host_step"] == "backward"
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    assert len(runtime.masters) == 10 and len(runtime.distinct) == 6  # in_proj's two parts, lin's two readers
    opt, ref_opt = fused_adams(placed, ref)
    assert placer_apply.step_in_backward(placed, opt) == 6
    assert placer_apply.step_in_backward(placed, opt) == 6  # again: nothing more
    with torch.no_grad():  # a forward no backward follows expects no gradient
        placed(*inputs)
    assert not any(runtime.expected)
    calls = []
    step = runtime._step
    monkeypatch.setattr(runtime, "_step", lambda s: (calls.append((threading.current_thread().name, s)), step(s)))
    train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt)
    assert sorted(s for _, slots in calls for s in slots) == sorted(list(range(6)) * 3)  # each once per step
    assert all(name.startswith("placer-host-step") for name, slots in calls if slots)  # on the worker
    # what the worker did, one entry per backward (placer run reports their medians)
    done = runtime.counts.done
    assert [e["stepped"] for e in done] == [6] * 3 and all(1 <= e["calls"] <= 6 for e in done)
    assert all(e["worker_s"] > 0 and e["waited_s"] >= 0 for e in done)
    assert runtime.counts.median(2)["stepped"] == 6 and homes.HostStepCounts().median() is None


def test_the_worker_steps_together_the_masters_whose_gradients_came_while_it_was_busy(monkeypatch):
    """A worker held up (here: its first task of each backward waits) takes every gradient queued meanwhile and
    steps their masters in one call of one optimizer per group: one ``step()`` per backward, not one per master;
    the training is the same."""
    placed, ref, inputs, homed = stepping_in_backward(attend_twice)
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    opt, ref_opt = fused_adams(placed, ref)
    assert placer_apply.step_in_backward(placed, opt) == 6
    drain, calls, steps = runtime._drain, [], []

    def held_drain():
        if not calls:
            time.sleep(0.5)  # the backward queues every gradient meanwhile
        calls.append(len(runtime.inbox))
        drain()

    monkeypatch.setattr(runtime, "_drain", held_drain)
    (sub,) = runtime.subs.values()
    sub_step = sub.step
    monkeypatch.setattr(sub, "step", lambda: (steps.append([id(p) for p in sub.param_groups[0]["params"]]), sub_step()))
    train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt, steps=1)
    assert calls[0] == len(runtime.masters) and not any(calls[1:])  # all ten gradients in the first task
    assert runtime.counts.done[-1]["calls"] == 1 and runtime.counts.done[-1]["stepped"] == 6
    assert len(steps) == 1 and sorted(steps[0]) == sorted(id(m) for m in runtime.distinct)  # one call over the six


def test_homed_parameters_in_checkpointed_blocks_stepped_in_the_backward_train_as_the_unplaced_model_does():
    """The blocks' recompute fetches their masters again: only the first forward's fetches count a gradient."""
    from tests.placer.test_apply_checkpoint import Deep

    torch.manual_seed(0)
    model, x = Deep(), torch.randn(16, 16)
    model.eval()  # dropout off (the program is exported in eval mode: the same program both forwards)
    placed, ref, inputs, homed = stepping_in_backward(lambda: (model, (x,)), checkpoint=["blocks.0", "blocks.1"])
    assert len(placed.get_submodule(homes.RUNTIME_ATTR).masters) == 12
    opt, ref_opt = fused_adams(placed, ref)
    assert placer_apply.step_in_backward(placed, opt) == 12
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    calls = Counter()
    second, step = runtime._recompute_copy, runtime._step
    runtime._recompute_copy = lambda i: (calls.update(["recompute"]), second(i))[1]
    runtime._step = lambda slots: (
        calls.update([threading.current_thread().name.split("_")[0]] * len(slots)),
        step(slots),
    )
    train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt)
    assert calls == {"recompute": 3 * 12, "placer-host-step": 3 * 12}  # each stepped by the worker, as it came


class Aux(nn.Module):
    """A linear read twice, its second reader's output an auxiliary output the loss does not reach."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x))).pow(2).mean(), self.lin(x * 2)


def test_a_parameter_whose_reader_does_not_reach_the_loss_is_stepped_at_the_end_of_the_backward():
    placed, ref, inputs, homed = stepping_in_backward(lambda: (Aux(), (torch.randn(3, 4),)))
    opt, ref_opt = fused_adams(placed, ref)
    assert placer_apply.step_in_backward(placed, opt) == 2
    homed = [f"inner.{n}" for n in homed]
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    stepped_at_end = []
    finish = runtime._finish_steps
    runtime._finish_steps = lambda: (stepped_at_end.append([not d for d in runtime.done]), finish())
    train_stepping_in_backward(First(placed), First(ref), inputs, homed, opt, ref_opt)
    lin = placed.get_parameter("lin.weight")
    slot = runtime.slots[next(i for i, m in enumerate(runtime.masters) if m is lin)]
    assert len(stepped_at_end) == 3 and all(not_done[slot] for not_done in stepped_at_end)  # 1 of its 2 came


class First(nn.Module):
    """A module's first output (the loss)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *a):
        return self.inner(*a)[0]


def test_an_lr_scheduler_on_the_optimizer_steps_the_homed_parameters_too():
    placed, ref, inputs, homed = stepping_in_backward(attend_twice)
    opt, ref_opt = fused_adams(placed, ref)
    # made before the registration (its groups' initial_lr is no argument of Adam's)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.2) for o in (opt, ref_opt)]
    placer_apply.step_in_backward(placed, opt)
    schedulers += [torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1 + k) for o in (opt, ref_opt)]
    train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt, schedulers=schedulers)


def test_the_optimizer_s_state_dict_holds_every_parameter_s_state_and_loads():
    placed, ref, inputs, homed = stepping_in_backward(attend_twice)
    opt, ref_opt = fused_adams(placed, ref)
    placer_apply.step_in_backward(placed, opt)
    train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt, steps=2)
    state, ref_state = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert len(state) == len(list(placed.parameters())) == len(ref_state)
    for k, s in state.items():
        assert float(s["step"]) == 2
        torch.testing.assert_close(s["exp_avg_sq"], ref_state[k]["exp_avg_sq"])
    # a loaded state (here: zeroed moments, a step count of 5) is what the homed parameters step from
    for o in (opt, ref_opt):
        loaded = copy.deepcopy(o.state_dict())
        for s in loaded["state"].values():
            s["step"].fill_(5)
            s["exp_avg"].zero_()
            s["exp_avg_sq"].zero_()
        o.load_state_dict(loaded)
    train_stepping_in_backward(placed, ref, inputs, homed, opt, ref_opt, steps=1)
    assert all(float(s["step"]) == 6 for s in opt.state_dict()["state"].values())


def test_a_worker_s_exception_is_raised_by_backward_and_the_next_step_runs():
    placed, ref, inputs, homed = stepping_in_backward(attend_twice)
    opt, ref_opt = fused_adams(placed, ref)
    placer_apply.step_in_backward(placed, opt)
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    sub = runtime.subs[0]

    def failing():  # on the worker (the end of the backward would step it again on this thread)
        assert threading.current_thread().name.startswith("placer-host-step")
        raise RuntimeError("worker failed")

    sub.step = failing
    with pytest.raises(RuntimeError, match="worker failed"):
        placed(*inputs).backward()
    del sub.step
    opt.zero_grad()
    assert all(n == 0 for n in runtime.expected) and not runtime.futures
    placed(*inputs).backward()
    assert all(m.grad is not None for m in runtime.masters)


def placer_warnings(record):
    return [str(w.message) for w in record if "placer" in str(w.message)]


@pytest.mark.parametrize("host_step", ["after", "backward"])
def test_a_plan_stepping_in_the_backward_without_an_optimizer_registered_warns_once(host_step):
    placed, ref, inputs, homed = stepping_in_backward(attend_twice, host_step)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            placed(*inputs).backward()
    said = placer_warnings(record)
    if host_step == "after":
        assert not said
    else:
        assert len(said) == 1 and "placer.apply.step_in_backward(placed, optimizer)" in said[0]
        assert "\n" not in said[0]
    # registered: no warning
    placed, ref, inputs, homed = stepping_in_backward(attend_twice, host_step)
    placer_apply.step_in_backward(placed, torch.optim.Adam(placed.parameters(), lr=LR, fused=True))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        placed(*inputs).backward()
    assert not placer_warnings(record)


def test_step_in_backward_without_homes_does_nothing_and_refuses_an_optimizer_lacking_a_parameter():
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(5, 8)
    g = capture(model, (x,))
    plain = apply(model, Placement.from_indices(g, DEVICES, np.ones(g.num_ops, dtype=int)), (x,), device_map="*=cpu")
    assert plain.meta["placer_host_step"] == "after"
    opt = torch.optim.Adam(plain.parameters())
    assert placer_apply.step_in_backward(plain, opt) == 0
    assert not opt._optimizer_step_pre_hooks
    placed, ref, inputs, homed = stepping_in_backward(attend_twice)
    lacking = [p for n, p in placed.named_parameters() if n != "lin.weight"]
    with pytest.raises(PlacerError, match="lin.weight is not among the optimizer's parameters"):
        placer_apply.step_in_backward(placed, torch.optim.Adam(lacking))
    # another optimizer replaces the first: its hooks go
    first, second = (torch.optim.Adam(placed.parameters(), lr=LR) for _ in range(2))
    placer_apply.step_in_backward(placed, first)
    assert placer_apply.step_in_backward(placed, second) == 6
    assert not first._optimizer_step_pre_hooks and len(second._optimizer_step_pre_hooks) == 1


@pytest.mark.parametrize("host_step", ["after", "backward"])
def test_the_measurements_adam_steps_the_homed_parameters_when_the_plan_says(host_step):
    """``envs.real.timing.placed_adam`` (``placer run``, bench.offload_homes_measure, bench.home_phases): fused Adam
    on the placed module's parameters, registered to step the homed ones in the backward where the plan says."""
    from envs.real.timing import placed_adam

    placed, ref, inputs, homed = stepping_in_backward(attend_twice, host_step)
    plan = types.SimpleNamespace(host_step=host_step)  # a Placement's field
    opt = placed_adam(placed, plan, lr=LR)
    assert opt.defaults["fused"] and len(opt.param_groups[0]["params"]) == len(list(placed.parameters()))
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    assert (runtime.optimizer is opt) == (host_step == "backward")


def test_the_worker_s_counts_keep_the_last_backwards_only():
    counts = homes.HostStepCounts()
    for k in range(homes.COUNTS_KEPT + 500):  # a long training run's backwards
        counts.calls, counts.stepped = k, 1
        counts.backward_done(waited_s=0.5)
    assert len(counts.done) == homes.COUNTS_KEPT and counts.done[0]["calls"] == 500
    assert counts.median(3) == {"calls": homes.COUNTS_KEPT + 498, "stepped": 1, "worker_s": 0.0, "waited_s": 0.5}
    assert counts.calls == 0 and counts.stepped == 0  # each backward's own


class FrozenMlp(nn.Module):
    """A frozen first layer (no backward: its input takes no gradient), a trainable one, then two frozen layers whose
    backward computes their input's gradient from their weights (a frozen backbone's, LoRA's base layers')."""

    def __init__(self) -> None:
        super().__init__()
        self.f, self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        for layer in (self.f, self.b, self.c):
            layer.requires_grad_(False)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(self.f(x)))))).pow(2).mean()


def test_frozen_parameters_homed_apart_are_copied_again_for_the_backward_and_train_as_the_unplaced_model_does():
    """Frozen weights homed on the host: copied in for their reader, freed, made again where the reader has a
    backward (b and c: their input's gradient reads them), never for f (its input takes none); no gradient goes home,
    and the optimizer steps only the trainable parameters, as on the unplaced model."""
    torch.manual_seed(0)
    model, x = FrozenMlp(), torch.randn(5, 8)
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    frozen = ["f.weight", "f.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
    placed = apply(model, homed_plan(g, frozen), (x,), device_map="*=cpu")
    runtime = placed.get_submodule(homes.RUNTIME_ATTR)
    assert len(runtime.masters) == 6 and not any(m.requires_grad for m in runtime.masters)
    refetched = []
    real = runtime._refetch

    def refetch(index, c):
        refetched.append(index)
        real(index, c)

    runtime._refetch = refetch
    train_side_by_side(placed, ref, (x,))
    read = {runtime.masters[i].shape for i in refetched}
    assert read == {(16, 16), (16,), (4, 16), (4,)}  # b's and c's, each step; never f's
    assert not runtime.sent and all(m.grad is None for m in runtime.masters)
    assert all(not w.live for w in runtime.windows.values())  # every copy let go after the backward


def test_a_frozen_copy_made_again_for_the_backward_is_let_go_once_its_reader_s_backward_is_past(monkeypatch):
    """No gradient marks a frozen copy's reader done in the backward: its backward's end does, so the copy for the
    third reader waits for the first's mark, not for everything on the compute stream."""
    monkeypatch.setattr(homes, "Streams", Recording)
    Recording.log = []
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16)] + [nn.Linear(16, 16, bias=False) for _ in range(3)]
    for layer in layers[1:]:
        layer.requires_grad_(False)
    model, x = nn.Sequential(nn.Sequential(*layers), Mean()), torch.randn(5, 8)
    g = capture(model, (x,))
    placed = apply(model, homed_plan(g, ["0.1.weight", "0.2.weight", "0.3.weight"]), (x,), device_map="*=cpu")
    loss = placed(x)
    forward = len(Recording.log)
    loss.backward()
    waits = [event for kind, event in Recording.log[forward:] if kind == "wait"]
    assert waits and None not in waits
