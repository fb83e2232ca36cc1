"""placer.apply runs a program captured on the CPU on other devices: nothing the capture device decided leaks.

Five classes of failure were seen on a real GPU (issue 30); each is reproduced here
on the CPU:

* device arguments (``arange(device=cpu)``, ``to(x, cpu)``, ``_assert_tensor_metadata``)
  inside the program and inside its ``no_grad`` regions: the placed device is the
  ``meta`` device, where any tensor left on the capture device makes the step fail;
* a failing call inside a ``no_grad`` region must not leave grad mode off;
* a kernel that returns another memory layout than the capture saw (a custom op
  whose real kernel's strides differ from its fake kernel's, as CUDA's attention
  kernels differ from the CPU's) must not break a ``view`` after it;
* host->GPU copies through the pinned staging path, and GPU->GPU peer copies, with
  the copy kind forced (every logical device is the CPU here), for expanded tensors
  and with gradients flowing through;
* a Hugging Face Llama at batch 4 in 2 and 4 microbatches (batch 1 specialises its export);
* the programs a placed module exports for inputs at other sizes (:mod:`envs.real.programs`), device arguments
  included.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import envs.real.placing as runtime
import envs.real.transfers as transfers
from envs.real.alignment import ProgramPlan, carry_plan
from graphs.models.corpus import build
from graphs.plan import Placement
from graphs.torch_capture import capture, export_program
from placer.apply import apply
from tests.conftest import fast_first

DEVICES = ["cpu:0", "gpu:0", "gpu:1", "gpu:2"]


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def _assert_same_step(placed_loss, placed, ref_model, inputs, rtol=1e-5, atol=1e-6):
    ref_loss = ref_model(*inputs)
    ref_loss.backward()
    torch.testing.assert_close(placed_loss.detach().cpu(), ref_loss.detach(), rtol=rtol, atol=atol)
    got, want = _grads(placed), _grads(ref_model)
    assert want and set(want) <= set(got)
    for k in want:
        torch.testing.assert_close(got[k].cpu(), want[k], rtol=rtol, atol=atol, msg=k)


class Rotary(nn.Module):
    """A rotary-embedding-like block: a no_grad region making tensors on the input's device."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.table = nn.Embedding(10, 8)
        self.register_buffer("inv_freq", torch.rand(8))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            pos = torch.arange(x.shape[0], device=x.device, dtype=torch.float32)
            angle = pos[:, None] * self.inv_freq.to(x.device)[None, :]
            cos = torch.cat([angle[:, :4], angle[:, 4:]], dim=-1).cos() + self.table(idx).sum()
        return (self.lin(x) * cos).square().mean()


# ------------------------------------------------------------- 1. device arguments
def _device_args_of(node: torch.fx.Node) -> set[torch.device]:
    found: set[torch.device] = set()
    torch.fx.node.map_aggregate(
        (node.args, node.kwargs), lambda v: found.add(v) if isinstance(v, torch.device) else None
    )
    return found


def _device_args(gm: nn.Module) -> set[torch.device]:
    """Every device argument of every op in ``gm`` and in its higher-order ops' bodies."""
    found: set[torch.device] = set()
    for module in gm.modules():
        for node in getattr(getattr(module, "graph", None), "nodes", ()):
            if node.op == "call_function":
                found |= _device_args_of(node)
    return found


def test_device_arguments_inside_no_grad_regions_name_the_placed_device():
    torch.manual_seed(0)
    model, x, idx = Rotary(), torch.randn(6, 8), torch.tensor([1, 2])
    g = capture(model, (x, idx))
    placed = apply(model, {n: "gpu:0" for n in g.names}, (x, idx), device_map={"gpu:0": "meta"})
    assert _device_args(placed) == {torch.device("meta")}
    loss = placed(x, idx)  # a tensor left on the CPU meets a meta tensor: the op raises
    assert loss.device.type == "meta"
    loss.backward()


class CausalMix(nn.Module):
    """A causal mask made on the input's device from its length, as a decoder makes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        mask = torch.ones(L, L, device=x.device).tril()[None].expand(B, L, L)
        return (mask @ self.lin(x)).square().mean()


def test_the_programs_for_other_sizes_name_the_placed_device_too():
    """The programs exported for other sizes are captured on the CPU as well: none of their devices may leak."""
    torch.manual_seed(0)
    model, x = CausalMix(), torch.randn(2, 5, 8)
    g = capture(model, (x,))
    placed = apply(model, {n: "gpu:0" for n in g.names}, (x,), device_map={"gpu:0": "meta"})
    for length in (3, 1):  # 1: the dynamic program's guard (L != 1) refuses it, a program of that size runs
        loss = placed(torch.randn(2, length, 8))  # a tensor left on the CPU meets a meta tensor: the op raises
        assert loss.device.type == "meta"
        loss.backward()
    programs = placed.placer_programs.mode(True)
    others = [programs.dynamic, *programs.specialized.values()]
    assert len(others) == 2 and all(_device_args(m) == {torch.device("meta")} for m in others)
    for name, p in placed.named_parameters():  # every program reads the first one's tensors
        assert all(m.get_parameter(name) is p for m in others)


def test_placing_one_program_twice_leaves_the_first_placement_s_bodies_alone():
    """Placing one exported program twice: the second placement must not see the first one's devices.

    ``ep.module()`` shares the higher-order ops' bodies with the exported program, so placing a body in
    place wrote the first placement's device into every later module built from that program. On an H100,
    Llama all on the host then failed with "Tensor device mismatch! Expected: cuda:0, Got: cpu" after a
    placement on the GPU had been built from the same export (validate_gpu.py measures many)."""
    torch.manual_seed(0)
    model, x, idx = Rotary(), torch.randn(6, 8), torch.tensor([1, 2])
    ep = export_program(model, (x, idx))
    ops = [n.name for n in ep.graph.nodes if n.op == "call_function"]
    on_meta = runtime.place_module(ep, {n: "gpu:0" for n in ops}, {"gpu:0": "meta"})
    on_cpu = runtime.place_module(ep, {n: "cpu:0" for n in ops}, {"cpu:0": "cpu"})
    assert _device_args(on_meta) == {torch.device("meta")}
    assert _device_args(on_cpu) == {torch.device("cpu")}
    assert _device_args(ep.module()) == {torch.device("cpu")}  # the export itself is untouched
    torch.testing.assert_close(on_cpu(x, idx), model(x, idx))


@pytest.mark.slow
def test_hugging_face_llama_runs_on_another_device_than_the_capture():
    pytest.importorskip("transformers")
    model, inputs = build("llama")
    g = capture(model, inputs)
    split = Placement.from_indices(g, ["cpu:0", "gpu:0"], (np.arange(g.num_ops) >= g.num_ops // 3).astype(int))
    placed = apply(model, split, inputs, device_map={"gpu:0": "meta"})
    where = {"cpu:0": torch.device("cpu"), "gpu:0": torch.device("meta")}
    for node in placed.graph.nodes:  # each op's device arguments name the device it is placed on
        if node.op == "call_function" and runtime.DEVICE_META in node.meta:
            assert _device_args_of(node) <= {where[node.meta[runtime.DEVICE_META]]}, node.format_node()
    assert placed(*inputs).device.type == "meta"  # forward only: a meta gradient cannot be copied to the host


# ------------------------------------------------------------- 2. global state
@pytest.mark.parametrize("microbatches,inflight", [(1, None), (2, 1)])
def test_a_call_that_raises_inside_no_grad_restores_grad_mode(microbatches, inflight):
    torch.manual_seed(0)
    model, x, idx = Rotary(), torch.randn(6, 8), torch.tensor([1, 2])
    g = capture(model, (x, idx))
    p = Placement.from_indices(g, DEVICES, np.arange(g.num_ops) % 2, microbatches=microbatches, inflight=inflight)
    placed = apply(model, p, (x, idx), device_map="*=cpu", batch_dim=0)
    assert torch.is_grad_enabled()
    with pytest.raises(IndexError):
        placed(x, torch.tensor([1, 99]))  # out of the table's range: raises inside the no_grad region
    assert torch.is_grad_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False), pytest.raises(IndexError):
        placed(x, torch.tensor([1, 99]))
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
    placed(x, idx).backward()  # and the module still works


class AutocastTable(nn.Module):
    """A lookup inside an autocast region: an index out of range raises there, with autocast on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.table = nn.Embedding(10, 8)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.lin(x) + self.table(idx).sum()
        return h.float().square().mean()


@pytest.mark.parametrize("microbatches,inflight", [(1, None), (2, 1)])
def test_a_call_that_raises_inside_an_autocast_region_restores_autocast(microbatches, inflight):
    torch.manual_seed(0)
    model, x, idx = AutocastTable(), torch.randn(6, 8), torch.tensor([1, 2])
    g = capture(model, (x, idx))
    assert any("autocast" in t for t in g.op_types)  # the region is an op of the program
    p = Placement.from_indices(g, DEVICES, np.arange(g.num_ops) % 2, microbatches=microbatches, inflight=inflight)
    placed = apply(model, p, (x, idx), device_map="*=cpu")
    with pytest.raises(IndexError):
        placed(x, torch.tensor([1, 99]))  # raises inside the region, which switched autocast on
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # the default, as before the call
    placed(x, idx).backward()  # and the module still works


_LEAK = {"on": False}  # the op below switches autocast on and raises, as a region left by an error does


@torch.library.custom_op("placer_test::autocast_then_raise", mutates_args=())
def autocast_then_raise(x: torch.Tensor) -> torch.Tensor:
    """``x`` copied; switched on, it enters an autocast region and raises inside it (nothing restores the state)."""
    if _LEAK["on"]:
        torch.set_autocast_enabled("cpu", True)
        torch.set_autocast_dtype("cpu", torch.float16)
        raise RuntimeError("failed inside an autocast region")
    return x.clone()


autocast_then_raise.register_fake(lambda x: torch.empty_like(x))


class LeavesAutocastOn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return autocast_then_raise(self.lin(x)).square().mean()


@pytest.fixture
def autocast_leaks():
    yield _LEAK
    _LEAK["on"] = False
    torch.set_autocast_enabled("cpu", False)
    torch.set_autocast_dtype("cpu", torch.bfloat16)


@pytest.mark.parametrize("microbatches,inflight", [(1, None), (2, 1)])
def test_a_call_that_raises_with_autocast_switched_on_restores_it(microbatches, inflight, autocast_leaks):
    """Whatever a call leaves switched on when it raises (an older torch's autocast region does), it is restored."""
    model, x = LeavesAutocastOn(), torch.randn(6, 8)
    g = capture(model, (x,))
    p = Placement.from_indices(g, DEVICES, np.arange(g.num_ops) % 2, microbatches=microbatches, inflight=inflight)
    placed = apply(model, p, (x,), device_map="*=cpu")
    autocast_leaks["on"] = True
    with pytest.raises(RuntimeError, match="inside an autocast region"):
        placed(x)
    assert not torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


# ------------------------------------------------------------- 3. layouts
_OTHER_LAYOUT = {"on": False}  # the "device" the program runs on returns another layout than the capture's


@torch.library.custom_op("placer_test::heads_first", mutates_args=())
def heads_first(x: torch.Tensor) -> torch.Tensor:
    """``x`` [B, L, H, D] as [B, H, L, D]: a transposed view's copy with the input's layout, or (switched)
    contiguous."""
    out = x.transpose(1, 2)
    return out.contiguous() if _OTHER_LAYOUT["on"] else out.clone(memory_format=torch.preserve_format)


@heads_first.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x).transpose(1, 2)  # the capture's layout: [B, L, H, D] in memory


heads_first.register_autograd(lambda ctx, grad: grad.transpose(1, 2))


class HeadsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        h = heads_first(self.qkv(x).view(B, L, 2, 4))  # [B, 2, L, 4]
        return self.out(h.transpose(1, 2).view(B, L, 8)).square().mean()  # a view legal only in the capture's layout


@pytest.fixture
def other_layout():
    yield _OTHER_LAYOUT
    _OTHER_LAYOUT["on"] = False


def test_a_view_survives_a_kernel_that_returns_another_layout(other_layout):
    torch.manual_seed(0)
    model, x = HeadsModel(), torch.randn(3, 5, 8)
    ref = copy.deepcopy(model)
    g = capture(model, (x,))
    placed = apply(model, {n: "gpu:0" for n in g.names}, (x,), device_map="*=cpu")
    other_layout["on"] = True
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        model(x)  # eager code breaks on it too: the view really depends on the layout
    loss = placed(x)
    loss.backward()
    other_layout["on"] = False
    _assert_same_step(loss, placed, ref, (x,))


def test_a_view_whose_storage_is_written_in_place_stays_a_view():
    class Writes(nn.Module):
        def forward(self, x):
            y = x.clone()
            v = y.view(-1)
            v.add_(1)
            return y.sum() + x.view(-1).sum()

    x = torch.randn(2, 3)
    g = capture(Writes(), (x,))
    placed = apply(Writes(), {n: "cpu:0" for n in g.names}, (x,), device_map="*=cpu")
    targets = {n.name: n.target for n in placed.graph.nodes if n.op == "call_function"}
    assert targets["view"] is torch.ops.aten.view.default  # y is written through it
    assert targets["view_1"] is torch.ops.aten.reshape.default  # x is not written
    torch.testing.assert_close(placed(x), Writes()(x))


# ------------------------------------------------------------- 4. copies
@pytest.mark.parametrize(
    "make", [lambda t: t.expand(3, 4), lambda t: t.expand(3, 4)[:, ::2], lambda t: t.expand(3, 4).t()]
)
def test_staging_buffer_takes_any_strided_tensor(make):
    base = torch.randn(3, 1, requires_grad=True)
    t = make(base)
    s = transfers.staged(t)
    assert s.is_contiguous() and torch.equal(s, t) and s.data_ptr() != base.data_ptr()
    s.sum().backward()
    torch.testing.assert_close(base.grad, torch.autograd.grad(make(base).sum(), base)[0])


@pytest.mark.parametrize("kind", fast_first(["pinned", "peer", "sync"]))
def test_forced_copy_paths_keep_every_gradient(kind, monkeypatch):
    """Every cross-device copy takes the ``kind`` path (as between the host and a GPU, or two GPUs)."""
    pytest.importorskip("transformers")
    model, inputs = build("bert")  # its padding mask is expanded before the attention reads it
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    split = Placement.from_indices(g, DEVICES, np.minimum(np.arange(g.num_ops) * 3 // g.num_ops, 2))
    calls = []
    real = transfers.copy_kind

    def forced(src, dst):
        calls.append(kind)
        return kind if real(src, dst) == "same" else real(src, dst)

    monkeypatch.setattr(transfers, "copy_kind", forced)
    placed = apply(model, split, inputs, device_map="*=cpu")
    loss = placed(*inputs)
    loss.backward()
    assert len(calls) > 10
    _assert_same_step(loss, placed, ref, inputs)


# ------------------------------------------------------------- 5. microbatches
@pytest.mark.parametrize(
    "microbatches,inflight",
    [(2, None), *(pytest.param(M, W, marks=pytest.mark.slow) for M, W in ((4, None), (4, 1), (4, 2)))],
)
def test_llama_at_batch_4_runs_in_microbatches_with_the_unsplit_gradients(microbatches, inflight):
    pytest.importorskip("transformers")
    model, inputs = build("llama")
    ref = copy.deepcopy(model)
    g = capture(model, inputs)
    blocks = np.minimum(np.arange(g.num_ops) * 4 // g.num_ops, 3)
    p = Placement.from_indices(g, DEVICES, blocks, microbatches=microbatches, inflight=inflight)
    placed = apply(model, p, inputs, device_map="*=cpu")
    loss = placed(*inputs)
    loss.backward()
    _assert_same_step(loss, placed, ref, inputs)


def test_a_carried_plan_places_the_ops_only_the_small_batch_has_with_their_input():
    from graphs import OpGraph

    whole = OpGraph.from_edges(
        ["a", "b", "c"],
        [("a", "b", 8), ("b", "c", 8)],
        op_types=["aten.mm.default", "aten.relu.default", "aten.sum.default"],
    )
    part = OpGraph.from_edges(
        ["a", "x", "b", "c"],
        [("a", "x", 8), ("x", "b", 8), ("b", "c", 8)],
        op_types=["aten.mm.default", "aten.squeeze.dim", "aten.relu.default", "aten.sum.default"],
    )
    plan = carry_plan(whole, ProgramPlan({"a": "gpu:0", "b": "gpu:1", "c": "gpu:2"}, ["a", "b", "c"], ["b", "c"]), part)
    assert plan.assignment == {"a": "gpu:0", "x": "gpu:0", "b": "gpu:1", "c": "gpu:2"}
    assert plan.order == ["a", "b", "c"] and plan.stages == ["b", "c"]
