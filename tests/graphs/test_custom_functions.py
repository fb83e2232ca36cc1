"""A model's own torch.autograd.Function under capture: kept where its backward is its forward's gradient, refused in
one line where it is not (torch.export keeps the forward and drops the backward)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graphs import CaptureError, custom_functions
from graphs.plan import Placement
from graphs.torch_capture import capture


class Reverse(torch.autograd.Function):  # a gradient reversal layer (domain adaptation)
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


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


class Swish(torch.autograd.Function):  # its backward is its forward's gradient, written by hand (BLOOM's GELU is so)
    @staticmethod
    def forward(ctx, x, beta=1.0):
        ctx.save_for_backward(x)
        ctx.beta = beta
        return x * torch.sigmoid(beta * x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(ctx.beta * x)
        return grad * (s + ctx.beta * x * s * (1 - s)), None


class Net(nn.Module):
    def __init__(self, fn: type, write_input: bool = False) -> None:
        super().__init__()
        self.fn, self.write_input = fn, write_input
        self.a, self.norm, self.b = nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, y):
        x = x.mul_(1.0) if self.write_input else x  # (in place into the caller's tensor)
        h = self.drop(self.norm(self.a(x)))
        return F.cross_entropy(self.b(self.fn.apply(h)), y)  # the line named


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)


@pytest.mark.parametrize("fn", [Reverse, RoundThrough])
def test_a_function_whose_backward_is_not_its_forward_s_gradient_is_refused_in_one_line(fn):
    torch.manual_seed(0)
    with pytest.raises(CaptureError) as e:
        capture(Net(fn).eval(), _inputs())
    lines, start = inspect.getsourcelines(Net.forward)
    line = start + next(k for k, text in enumerate(lines) if "the line named" in text)
    message = str(e.value)
    assert message.startswith(f"capture failed: the forward applies {fn.__name__}, a torch.autograd.Function (at ")
    assert f"test_custom_functions.py:{line}) whose backward is not its forward's gradient" in message, message
    assert "\n" not in message


def test_a_function_whose_backward_is_its_forward_s_gradient_is_placed_with_the_model_s_gradients(monkeypatch):
    import placer

    torch.manual_seed(0)
    model, inputs = Net(Swish, write_input=True), _inputs()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    version = inputs[0]._version
    graph = capture(model, inputs)  # train mode: dropout draws, batch norm updates its statistics
    # the check ran the model once: its buffers, the random state and the inputs are as they were
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert inputs[0]._version == version
    model.write_input = False
    model.eval()
    compared = []
    monkeypatch.setattr(custom_functions, "gradient_gap", lambda *args: compared.append(args))
    graph = capture(model, inputs)
    assert compared == []  # checked once in a process: another capture of the model does not compare again
    split = [1 if k < graph.num_ops // 2 else 2 for k in range(graph.num_ops)]
    placed = placer.apply(
        model,
        Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], split),
        inputs,
        device_map="*=cpu",
        graph=graph,
    )
    placed(*inputs).backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model(*inputs).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad)
