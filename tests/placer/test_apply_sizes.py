"""A placed model in a training loop: other batch sizes and sequence lengths, eval(), one-line shape errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from graphs import PlacerError
from graphs.plan import Placement
from graphs.torch_capture import capture
from placer.apply import apply

DEVICES = ["cpu:0", "gpu:0", "gpu:1"]
VOCAB = 20


class CausalLM(nn.Module):
    """Token ids -> loss, with a causal mask built from the sequence length (as a decoder's is)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, L = ids.shape
        mask = torch.ones(L, L).tril()[None].expand(B, L, L) / L
        h = torch.tanh(self.mix(mask @ self.emb(ids)))
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), labels.reshape(-1))


def _batch(b: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, length), generator=g), torch.randint(0, VOCAB, (b, length), generator=g)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _placed(model: nn.Module, inputs: tuple, seed: int = 0, **options):
    g = capture(model, inputs)
    op_devices = np.random.default_rng(seed).integers(0, len(DEVICES), size=g.num_ops)
    p = Placement.from_indices(g, DEVICES, op_devices, microbatches=options.pop("microbatches", 1))
    return apply(model, p, inputs, device_map="*=cpu", **options)


def _same_step(placed: nn.Module, ref: nn.Module, inputs: tuple) -> None:
    placed.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    loss, want = placed(*inputs), ref(*inputs)
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    got, expected = _grads(placed), _grads(ref)
    assert set(got) == set(expected) and expected
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_placed_model_takes_other_batch_sizes_and_sequence_lengths():
    torch.manual_seed(0)
    model = CausalLM()
    ref = copy.deepcopy(model)
    placed = _placed(model, _batch(4, 6))
    for b, length in [(4, 6), (2, 6), (4, 3), (3, 5), (2, 1), (4, 6)]:  # length 1: the mask's guard (L != 1)
        _same_step(placed, ref, _batch(b, length, seed=b * 10 + length))
    ids, labels = placed.meta["placer_dynamic_dims"]
    assert ids["name"] == "ids" and ids["shape"] == [4, 6] and set(ids["dynamic"]) == {"0", "1"}


@pytest.mark.parametrize("microbatches,inflight", [(2, None), (4, 1)])  # fill-drain; 1F1B, uneven at capture too
def test_a_pipelined_plan_follows_the_batch_given_at_call_time(microbatches, inflight):
    """M microbatches of whatever batch arrives, one apart in size where M does not divide it (6 in 4: 2+2+1+1)."""
    torch.manual_seed(1)
    model = CausalLM()
    ref = copy.deepcopy(model)
    placed = _placed(model, _batch(6, 4), microbatches=microbatches, inflight=inflight)
    for b, length in [(6, 4), (4, 4), (5, 3), (7, 2)]:  # 5: 3+2 or 2+1+1+1; 7: 4+3 or 2+2+2+1
        _same_step(placed, ref, _batch(b, length, seed=b + length))


class ConvBN(nn.Module):
    """A ConvNet with batch norm: images of any size (adaptive pooling), statistics per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(6, 4)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.body(images).flatten(1)), labels)


def test_a_placed_convnet_takes_other_batch_sizes_and_image_sizes():
    torch.manual_seed(3)
    model = ConvBN()
    ref = copy.deepcopy(model)
    placed = _placed(model, (torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))))
    for b, side in [(4, 8), (3, 8), (4, 6), (2, 5)]:
        g = torch.Generator().manual_seed(b * side)
        _same_step(placed, ref, (torch.randn(b, 3, side, side, generator=g), torch.randint(0, 4, (b,), generator=g)))
    for key, buffer in ref.named_buffers():  # the running statistics followed every batch
        torch.testing.assert_close(placed.get_buffer(key), buffer, msg=key)


class FixedWidth(nn.Module):
    """Its input's last dimension is the layer's width: the model fixes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).square().mean()


def test_a_size_the_model_fixes_is_one_line_naming_the_dimension_and_its_captured_size():
    model = FixedWidth()
    placed = _placed(model, (torch.randn(4, 8),))
    torch.testing.assert_close(placed(torch.ones(2, 8)), model(torch.ones(2, 8)))  # the batch may vary
    with pytest.raises(PlacerError) as e:
        placed(torch.randn(4, 5))
    message = str(e.value)
    assert "\n" not in message and type(e.value).__name__ == "ShapeError"
    assert message.startswith("input x: dimension 1 is 5, but the placed program takes only 8 there")
    assert message.split(", and ")[1].startswith("the model cannot be exported at these sizes")
    with pytest.raises(PlacerError) as again:  # not exported again: the answer is kept
        placed(torch.randn(4, 5))
    assert str(again.value) == message and list(placed.placer_programs.mode(True).impossible) == [((4, 5),)]
    with pytest.raises(PlacerError, match="input x: 3 dimensions, but the placed program takes 2"):
        placed(torch.randn(4, 8, 1))


def test_dynamic_false_takes_the_example_sizes_only():
    model = FixedWidth()
    placed = _placed(model, (torch.randn(4, 8),), dynamic=False)
    torch.testing.assert_close(placed(torch.ones(4, 8)), model(torch.ones(4, 8)))
    with pytest.raises(PlacerError, match=r"input x: dimension 0 is 2, .* only 4 there, .* dynamic=False"):
        placed(torch.randn(2, 8))
    with pytest.raises(PlacerError, match="dynamic 'yes': must be 'auto', True or False"):
        _placed(model, (torch.randn(4, 8),), dynamic="yes")


def test_dynamic_true_builds_the_program_at_once_and_says_which_dimensions_vary():
    model = FixedWidth()
    placed = _placed(model, (torch.randn(4, 8),), dynamic=True)
    assert placed.meta["placer_dynamic_dims"] == [{"name": "x", "shape": [4, 8], "dynamic": {"0": [0, None]}}]
    g = capture(model, (torch.randn(4, 8),), dynamic=True)
    assert g.meta["inputs"][0]["dynamic"] == {"0": [0, None]}
    assert "dynamic" not in capture(model, (torch.randn(4, 8),)).meta["inputs"][0]  # only when asked


class Regularised(nn.Module):
    """Dropout and batch norm: eval() changes what it computes."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.drop(self.lin(x))).square().mean()


@pytest.mark.parametrize("microbatches", [1, 2])
def test_eval_and_train_switch_the_placed_model_like_the_model(microbatches):
    torch.manual_seed(2)
    model = Regularised()
    ref = copy.deepcopy(model)
    placed = _placed(model, (torch.randn(8, 6),), microbatches=microbatches)
    placed(torch.randn(8, 6))  # trains: batch statistics, running statistics updated
    assert placed.eval() is placed and not placed.training
    ref.load_state_dict(placed.state_dict())
    ref.eval()
    x = torch.randn(5, 6)
    with torch.no_grad():
        torch.testing.assert_close(placed(x), ref(x))  # no dropout, running statistics
    running = placed.state_dict()["bn.running_mean"].clone()
    placed.train()
    assert placed.training
    placed(torch.randn(8, 6))
    assert not torch.equal(placed.state_dict()["bn.running_mean"], running)  # training again updates them


def test_size_checks_name_ranges_equal_dimensions_and_guards():
    from envs.real.shapes import check_sizes, guard_reason

    specs = [("ids", ["s0", "s1"]), ("labels", ["s0", 6])]
    captured = {"ids": [4, 6], "labels": [4, 6]}
    ranges = {"s0": [2, None], "s1": [0, 64]}
    assert check_sizes(specs, ranges, captured, [torch.zeros(3, 9), torch.zeros(3, 6)]) is None
    assert check_sizes(specs, ranges, captured, [torch.zeros(1, 9), torch.zeros(1, 6)]) == (
        "input ids: dimension 0 is 1; the placed program takes 2 or more (captured at 4)"
    )
    assert "0 to 64" in check_sizes(specs, ranges, captured, [torch.zeros(3, 65), torch.zeros(3, 6)])
    assert "equal to input ids's dimension 0 (3)" in check_sizes(
        specs, ranges, captured, [torch.zeros(3, 9), torch.zeros(2, 6)]
    )
    assert guard_reason("Guard failed: ids.size()[1] != 1", captured) == (
        "the inputs' sizes fail the placed program's shape check `ids.size()[1] != 1` (captured: ids dimension 1 was 6)"
    )
