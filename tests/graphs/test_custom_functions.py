"""A model's own torch.autograd.Function, kept whole in its captured program (graphs/custom_functions.py): every plan
trains on the function's own backward, which torch.export alone drops."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench import conformance
from graphs import custom_functions
from graphs.plan import Placement
from graphs.torch_capture import capture


class Reverse(torch.autograd.Function):  # a gradient reversal layer (domain adaptation), with a constant argument
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.scale * grad, None


class RoundThrough(torch.autograd.Function):  # a straight-through estimator: autograd's gradient of round is zero
    @staticmethod
    def forward(x):
        return x.round()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad


class Split(torch.autograd.Function):  # two outputs and a Python value; a backward that is not the forward's gradient
    @staticmethod
    def forward(ctx, x):
        return x.tanh(), x.sigmoid(), 2

    @staticmethod
    def backward(ctx, ga, gb, _):
        return ga + 3.0 * gb


class Drop(torch.autograd.Function):  # dropout written by hand: its backward must use the mask its forward drew
    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype) * 2.0
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask


class Coupled(torch.autograd.Function):
    """A layer given as a module, not as tensors (reversible networks: reformer-pytorch, revtorch): the forward runs
    it without gradients, and the backward runs it again and accumulates its parameters' gradients itself."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x + layer(x).tanh()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            torch.autograd.backward(x + ctx.layer(x).tanh(), grad)
        return x.grad, None


class Recompute(torch.autograd.Function):
    """A library's own activation checkpointing (DeepSpeed's, Megatron's): the layer given as a function (a closure,
    a bound method), whose weights the function reads without being given them."""

    @staticmethod
    def forward(ctx, run, x):
        ctx.run = run
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            torch.autograd.backward(ctx.run(x), grad)
        return None, x.grad


class Noted(torch.autograd.Function):
    """Writes into a dict it is given, which its caller reads after (fairscale's checkpointing: ``parent_ctx_dict``)."""

    @staticmethod
    def forward(ctx, notes, x):
        notes["scale"] = 2.0
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):
        return None, grad * 3.0


class Mimic(torch.autograd.Function):
    """memcnn's invertible coupling's habits: its backward refuses ``autograd.grad``, and sets its input's ``grad`` by
    hand (mimicking a backward) besides returning it."""

    @staticmethod
    def forward(ctx, x):
        ctx.inputs = [x]
        return x * 3.0

    @staticmethod
    def backward(ctx, grad):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("Mimic is not compatible with .grad(), please use .backward()")
        ctx.inputs[0].grad = grad * 2.0
        return grad * 2.0


#: A function's apply bound once, at import (mambapy's ``pscan = PScan.apply``, pytorch-revgrad's ``revgrad``): a call
#: that never looks ``apply`` up on torch.autograd.Function again.
reverse = Reverse.apply


class Net(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
        self.c = nn.Linear(8, 8) if kind in ("module", "closure") else None

    def forward(self, x, y):
        h = self.a(x)
        if self.kind == "reverse":
            h = Reverse.apply(h, 0.5)
        elif self.kind == "round":
            h = RoundThrough.apply(h * 4.0) / 4.0
        elif self.kind == "drop":
            h = Drop.apply(h)
        elif self.kind == "bound":
            h = reverse(h, 0.5)
        elif self.kind == "module":
            h = Coupled.apply(h, self.c)
        elif self.kind == "mimic":
            h = Mimic.apply(h)
        elif self.kind == "notes":
            notes: dict = {}
            h = Noted.apply(notes, h) * notes["scale"]
        elif self.kind == "spectral":  # the function on a complex tensor between FFTs (torch-harmonics' SFNO)
            h = torch.fft.irfft(Reverse.apply(torch.fft.rfft(h), 0.5), n=8)
        elif self.kind == "closure":
            h = Recompute.apply(lambda t: self.c(t).tanh() * self.c.bias.sum(), h)
        else:
            t, s, two = Split.apply(h)
            h = t * s * two
        return F.cross_entropy(self.b(h), y)


def built(kind: str):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return Net(kind), (torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))


@pytest.mark.parametrize(
    "kind", ["reverse", "round", "split", "bound", "module", "closure", "notes", "mimic", "spectral"]
)
def test_every_plan_trains_on_the_function_s_own_backward(kind):
    import placer

    model, inputs = built(kind)
    graph = capture(model, inputs)
    assert custom_functions.KEPT_OP_TYPE in graph.op_types  # one op of the program, the function whole
    half = [1 if k < graph.num_ops // 2 else 2 for k in range(graph.num_ops)]
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], half)
    placed = placer.apply(model, plan, inputs, device_map="*=cpu", graph=graph)
    placed(*inputs).backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model(*inputs).backward()  # eager: the function's own backward
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad)


def test_a_function_that_draws_random_numbers_gets_the_same_ones_in_its_backward():
    """The backward runs the forward again: on the random state the forward drew from, so on the same mask, and
    without moving the process's random state (the step draws what the unplaced one does)."""
    import placer

    model, inputs = built("drop")
    graph = capture(model, inputs)
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], [1] * graph.num_ops)
    placed = placer.apply(model, plan, inputs, device_map="*=cpu", graph=graph)
    torch.manual_seed(7)
    placed(*inputs).backward()
    after = torch.rand(3)
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    torch.manual_seed(7)
    model(*inputs).backward()
    torch.testing.assert_close(after, torch.rand(3))
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad)


def test_a_kept_call_keeps_its_order_among_the_program_s_random_ops():
    """A reordered program (a plan's issue order) draws what the model drew: the kept call may draw."""
    from envs.real.reorder import order_constraints

    class DropTwice(nn.Module):
        def forward(self, x):
            return (F.dropout(Drop.apply(x), 0.5) * 3.0).sum()

    from graphs.export import export_program

    nodes = list(export_program(DropTwice().train(), (torch.randn(4, 4),)).graph.nodes)
    kept = next(n for n in nodes if n.target is torch.ops.placer.autograd_function.default)
    drop = next(n for n in nodes if "dropout" in str(n.target) or "bernoulli" in str(n.target))
    assert (kept, drop) in order_constraints(nodes)


def test_without_keeping_it_the_program_trains_on_other_gradients(monkeypatch):
    """What torch.export alone gives (the check that the test above can fail): the reversal's sign lost."""
    import placer

    monkeypatch.setattr("graphs.export.functions_kept", contextlib.nullcontext)
    model, inputs = built("reverse")
    graph = capture(model, inputs)
    assert "placer.autograd_function.default" not in graph.op_types
    placed = placer.apply(
        model,
        Placement.from_indices(graph, ["cpu:0", "gpu:0"], [1] * graph.num_ops),
        inputs,
        device_map="*=cpu",
        graph=graph,
    )
    placed(*inputs).backward()
    traced = model.a.weight.grad.clone()
    model.zero_grad()
    model(*inputs).backward()
    torch.testing.assert_close(traced, -2.0 * model.a.weight.grad)  # -1/scale times the function's own


@pytest.mark.parametrize("kind", ["reverse", "module", "closure"])
def test_every_conformance_plan_of_a_kept_function_matches_the_float64_step(kind):
    """Microbatches (a program exported again at their size) and one-forward-one-backward included; every plan but
    the first runs a copy of the model on the first's program (the function's module then the copy's too)."""
    rows = conformance.check_model(kind, built=built(kind))
    assert all(r.ok for r in rows), [(r.plan, r.message or r.worst) for r in rows]


@pytest.mark.parametrize("kind", ["module", "closure"])
def test_the_parameters_a_kept_function_reads_are_its_op_s_inputs(kind):
    """Given as a module, or read through a closure: so a plan places them with the op, counts their memory and
    updates them, whichever copy of the model runs."""
    model, inputs = built(kind)
    graph = capture(model, inputs)
    kept = graph.op_types.index(custom_functions.KEPT_OP_TYPE)
    assert set(graph.params[kept]) == {"c.weight", "c.bias"}
    assert graph.param_bytes[kept] == (8 * 8 + 8) * 4


def test_a_call_kept_in_another_process_is_one_line():
    with pytest.raises(RuntimeError, match="kept by a capture in another process"):
        torch.ops.placer.autograd_function([torch.ones(2)], "elsewhere.Reverse:0")


def test_torch_s_own_functions_are_traced_through():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return checkpoint(lambda t: torch.tanh(self.a(t)), x, use_reentrant=True).sum()

    graph = capture(Checkpointed(), (torch.randn(2, 4),))
    assert "placer.autograd_function.default" not in graph.op_types
    assert not any(key.startswith("torch.") for key in custom_functions.KEPT)


class AddOne(torch.autograd.Function):  # writes into its input (mark_dirty)
    @staticmethod
    def forward(ctx, x):
        x.add_(1.0)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_function_that_writes_into_its_input_is_refused_in_one_line():
    from graphs import CaptureError

    class Writes(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return AddOne.apply(self.a(x)).sum()

    with pytest.raises(CaptureError) as e:
        capture(Writes(), (torch.randn(2, 4),))
    message = str(e.value)
    assert "AddOne, a torch.autograd.Function of the model's, writes into a tensor it is given in place" in message
    assert " at test_custom_functions.py:" in message and "\n" not in message  # the model's line, not placer's


class MyLinear(torch.autograd.Function):  # a fused layer of the model's own
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.t() @ x


def test_a_kept_function_costs_what_its_forward_computes():
    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(256, 128))

        def forward(self, x):
            return MyLinear.apply(x, self.w).sum()

    graph = capture(Fused(), (torch.randn(64, 128),))
    kept = graph.op_types.index("placer.autograd_function.default")
    assert graph.flops[kept] == 2 * 64 * 128 * 256  # its matmul, counted on meta tensors


class Scan(torch.autograd.Function):  # elementwise work only (mambapy's parallel scan is such a function)
    @staticmethod
    def forward(ctx, a, b):
        return a * b + a

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


def test_a_kept_function_s_elementwise_work_costs_what_the_same_traced_ops_would():
    """Each op of its forward as the graph counts one (graphs.flops.op_flops: here one FLOP per element each), not
    only what torch's FLOP counter knows (matmuls, convolutions): a scan is not free."""

    class Scanned(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 128))

        def forward(self, x):
            return Scan.apply(x, self.w).sum()

    graph = capture(Scanned(), (torch.randn(64, 128),))
    assert graph.flops[graph.op_types.index("placer.autograd_function.default")] == 2 * 64 * 128


def test_a_kept_function_s_backward_costs_its_forward_once_more():
    from envs.cluster import Cluster
    from envs.sim.cost import BACKWARD_MULTIPLIER, op_times

    model, inputs = built("split")
    graph = capture(model, inputs)
    fwd, bwd = op_times(graph, Cluster.preset("k80x2"))
    kept = graph.op_types.index(custom_functions.KEPT_OP_TYPE)
    linear = graph.op_types.index("aten.linear.default")
    assert bwd[kept, 1] == pytest.approx((BACKWARD_MULTIPLIER + 1) * fwd[kept, 1]) and fwd[kept, 1] > 0
    assert bwd[linear, 1] == pytest.approx(BACKWARD_MULTIPLIER * fwd[linear, 1])
