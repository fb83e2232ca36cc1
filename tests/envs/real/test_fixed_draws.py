"""Random draws held at their likeliest values (envs/real/fixed_draws.py): each op's value, worked out by hand, and
the same for every sample however the batch is split."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from envs.real.fixed_draws import fixed_draws


def test_each_random_op_takes_its_likeliest_value_and_the_rng_does_not_move():
    state = torch.get_rng_state()
    with fixed_draws() as fixed:
        assert F.dropout(torch.ones(3), p=0.25).tolist() == pytest.approx([4 / 3] * 3)
        assert F.dropout(torch.ones(2), p=0.25, training=False).tolist() == [1.0, 1.0]
        assert torch.empty(4).bernoulli_(0.8).tolist() == [1.0] * 4  # drop path keeps every path
        assert torch.empty(2).bernoulli_(0.2).tolist() == [0.0, 0.0]
        assert torch.bernoulli(torch.tensor([0.3, 0.7])).tolist() == [0.0, 1.0]
        assert torch.rand(2).tolist() == [0.5, 0.5] and torch.empty(1).uniform_(2, 4).tolist() == [3.0]
        assert torch.randn(2, dtype=torch.float64).tolist() == [0.0, 0.0]
        assert torch.normal(torch.tensor([1.0, 2.0]), 3.0).tolist() == [1.0, 2.0]
        assert torch.empty(1).normal_(5, 2).tolist() == [5.0]
        assert torch.randint(3, 9, (2,)).tolist() == [3, 3] and torch.randperm(4).tolist() == [0, 1, 2, 3]
        assert torch.multinomial(torch.tensor([[0.1, 0.6, 0.3]]), 2).tolist() == [[1, 2]]
        assert torch.empty(1).exponential_(2.0).item() == pytest.approx(math.log(2) / 2)
    assert torch.equal(state, torch.get_rng_state())
    assert {"bernoulli_", "rand", "randn", "randperm", "multinomial", "exponential_"} <= fixed


def test_attention_dropout_keeps_every_weight_scaled():
    """Attention runs its math, whose dropout is held: the output is the undropped one scaled by 1 / (1 - p)."""
    q = torch.arange(12.0).reshape(1, 1, 3, 4) / 10
    plain = F.scaled_dot_product_attention(q, q, q)
    state = torch.get_rng_state()
    with fixed_draws() as fixed:
        dropped = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert torch.allclose(dropped, plain * 2) and fixed and torch.equal(state, torch.get_rng_state())
    with fixed_draws():  # on a GPU too: its fused kernels, which would draw their masks inside, are off
        assert not torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # and on again after


def test_a_draw_it_does_not_hold_still_moves_the_rng():
    state = torch.get_rng_state()
    with fixed_draws() as fixed:
        torch.poisson(torch.ones(3))
    assert not torch.equal(state, torch.get_rng_state()) and not fixed


def test_a_step_with_dropout_and_drop_path_is_the_same_on_the_whole_batch_and_its_halves():
    """Per sample, the whole batch's step and each half's agree, and the gradient follows the forward's scaling."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(6, 4)

    def step(part):
        h = F.dropout(lin(part), p=0.5)
        keep = torch.empty(part.shape[0], 1).bernoulli_(0.9) / 0.9
        return (h * keep).sum(1)

    with fixed_draws():
        whole = step(x)
        halves = torch.cat([step(x[:3]), step(x[3:])])
        (g,) = torch.autograd.grad(step(x).sum(), lin.bias)
    assert torch.allclose(whole, halves)
    assert torch.allclose(g, torch.full((4,), 6 * 2 / 0.9))  # each sample: dropout's 1/(1-p), drop path's 1/0.9


def test_a_model_s_own_autograd_function_that_draws_is_held_inside_a_placed_program():
    """A placed program keeps a model's own autograd.Function whole, as one op (graphs.custom_functions); the mode
    does not see the ops an op runs inside, so its draws (a reversible layer's LSH rotations, a dropout by hand) were
    drawn for real in the placed step and held in the eager one: the check failed a right plan (reformer-pytorch)."""
    import numpy as np

    import placer
    from graphs.plan import Placement
    from graphs.torch_capture import capture
    from tests.graphs.test_custom_functions import built

    model, inputs = built("drop")  # dropout written by hand: a Function that draws its mask with rand_like
    graph = capture(model, inputs)
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], np.ones(graph.num_ops, dtype=int))
    placed = placer.apply(model, plan, inputs, device_map="*=cpu", graph=graph)
    state = torch.get_rng_state()
    with fixed_draws() as fixed:
        loss = placed(*inputs)
        loss.backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    assert torch.equal(state, torch.get_rng_state()) and "rand_like" in fixed  # held, not drawn
    model.zero_grad()
    with fixed_draws():
        expected = model(*inputs)
        expected.backward()
    torch.testing.assert_close(loss, expected)
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad)
