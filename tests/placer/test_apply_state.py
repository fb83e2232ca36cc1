"""The placed model is still the user's model: its names, checkpoints both ways, and unwrap()."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from graphs import PlacerError
from graphs.plan import Placement
from graphs.torch_capture import capture
from placer.apply import apply, unwrap

DEVICES = ["cpu:0", "gpu:0", "gpu:1"]


class TiedBN(nn.Module):
    """Tied embeddings, batch-norm statistics and a non-persistent buffer: every kind of state a model has."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 6)
        self.mid = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.out = nn.Linear(6, 12, bias=False)
        self.out.weight = self.emb.weight
        self.register_buffer("scale", torch.full((6,), 0.5), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.mid(self.emb(ids)) * self.scale)
        return nn.functional.cross_entropy(self.out(torch.tanh(h)), ids)


def _placed(model: nn.Module, ids: torch.Tensor, microbatches: int = 1) -> nn.Module:
    g = capture(model, (ids,))
    op_devices = np.random.default_rng(3).integers(0, len(DEVICES), size=g.num_ops)
    return apply(model, Placement.from_indices(g, DEVICES, op_devices, microbatches=microbatches), (ids,), "*=cpu")


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 12, (8,), generator=torch.Generator().manual_seed(seed))


def _train(module: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    for step in range(steps):
        opt.zero_grad()
        module(_ids(step)).backward()
        opt.step()


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_checkpoint_round_trips_both_ways(microbatches, tmp_path):
    torch.manual_seed(0)
    model = TiedBN()
    fresh = copy.deepcopy(model)
    placed = _placed(model, _ids(0), microbatches)
    assert list(placed.state_dict()) == list(fresh.state_dict())
    assert [n for n, _ in placed.named_parameters()] == [n for n, _ in fresh.named_parameters()]
    _train(placed, 3)
    torch.save(placed.state_dict(), tmp_path / "placed.pt")
    fresh.load_state_dict(torch.load(tmp_path / "placed.pt", weights_only=True))  # strict: every key, no other
    # compared in eval mode: batch statistics over microbatches are not the whole batch's
    torch.testing.assert_close(fresh.eval()(_ids(9)), placed.eval()(_ids(9)))
    other = TiedBN()  # placed -> original above; original -> placed here
    _train(other, 2)
    torch.save(other.state_dict(), tmp_path / "model.pt")
    placed.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    torch.testing.assert_close(placed(_ids(10)), other.eval()(_ids(10)))
    assert placed.state_dict()["bn.num_batches_tracked"] == other.bn.num_batches_tracked


def test_unwrap_gives_the_model_back_sharing_every_parameter_and_buffer():
    torch.manual_seed(1)
    model = TiedBN()
    placed = _placed(model, _ids(0))
    _train(placed, 2)
    assert unwrap(placed) is model
    for name, p in placed.named_parameters(remove_duplicate=False):
        assert model.get_parameter(name) is p
    for name, b in placed.named_buffers(remove_duplicate=False):
        assert model.get_buffer(name) is b
    assert model.out.weight is model.emb.weight  # still tied
    torch.testing.assert_close(model(_ids(5)), placed(_ids(5)))
    _train(model, 1)  # training the model trains the placed module: one set of tensors
    torch.testing.assert_close(model(_ids(6)), placed(_ids(6)))
    with pytest.raises(PlacerError, match="not a module placer.apply returned"):
        unwrap(nn.Linear(2, 2))


def test_unwrapped_parameters_live_where_the_plan_put_them():
    """With a real second device (meta, on a CPU machine), unwrap's model holds the tensors on their devices."""
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 4)
    g = capture(model, (x,))
    p = Placement.from_indices(g, ["cpu:0", "gpu:0"], [0] * (g.num_ops - 1) + [1])
    placed = apply(model, p, (x,), device_map={"gpu:0": "meta"})
    assert model[2].weight.device.type == "cpu"  # apply leaves the model as it was
    assert unwrap(placed)[2].weight.device.type == "meta" and model[0].weight.device.type == "cpu"
    assert placed(torch.randn(5, 4)).device.type == "meta"  # another size: a program exported from meta tensors


def test_optimizer_state_and_hooks_carry_over():
    torch.manual_seed(2)
    model = TiedBN()
    placed = _placed(model, _ids(0))
    opt = torch.optim.Adam(placed.parameters(), lr=1e-2)
    placed(_ids(1)).backward()
    opt.step()
    seen = []
    handle = placed.register_forward_hook(lambda module, args, out: seen.append(out.item()))
    loss = placed(_ids(2))
    handle.remove()
    assert seen == [loss.item()]
    again = torch.optim.Adam(unwrap(placed).parameters(), lr=1e-2)  # the same parameters, in the same order
    again.load_state_dict(opt.state_dict())
    assert all(torch.equal(again.state[p]["exp_avg"], opt.state[p]["exp_avg"]) for p in placed.parameters())
