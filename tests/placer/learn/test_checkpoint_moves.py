"""Checkpoint moves: the move search turns each layer's checkpointing on or off, one move each
(placer.learn.checkpoint_moves)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import envs
from graphs import PlacerError
from graphs.plan import checkpoint_blocks
from placer.learn.checkpoint_choice import candidate_blocks
from placer.learn.checkpoint_moves import BlockCodes
from placer.learn.home_moves import HomeCodes, HomeCodeScorer
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from tests.placer.learn.test_checkpoint_choice import CPU, GPU, activation_problem, on_gpu


def tight():
    """The activation problem on a GPU between the plain plan's peak and the every-layer-checkpointed one's."""
    g, big = activation_problem()
    env = envs.SimEnv(g, big)
    names = candidate_blocks(g)
    plain, every = env.simulate(on_gpu(g, big)), env.simulate(on_gpu(g, big, names))
    return activation_problem((plain.peak_bytes["gpu:0"] + every.peak_bytes["gpu:0"]) / 2)


def test_codes_carry_a_bit_per_op_that_moves_keep_and_the_scorer_checkpoints_the_layers_it_names():
    g, cluster = activation_problem()
    names = candidate_blocks(g)
    homes = HomeCodes(g, cluster, cluster.gpu_indices())
    codes = BlockCodes(g, names, homes, cluster.num_devices)
    assert codes.width == 3 and codes.num_codes == 6  # cpu:0, gpu:0, gpu:0 homed; each with the bit or not
    row = codes.flip(codes.flip(np.full(g.num_ops, GPU), 4), 1)  # layers.1 and layers.4
    assert codes.names(row) == ["layers.1", "layers.4"]
    assert codes.checkpoint(row).tolist() == checkpoint_blocks(g, ["layers.1", "layers.4"]).tolist()
    assert codes.names(codes.flip(row, 1)) == ["layers.4"]  # flipped back
    # a move of layer 1's ops to the host keeps their bit; the decoded devices are the move's
    moved = row.copy()
    moved[3:5] = CPU
    kept = codes.keep_bits(moved, row)
    assert codes.names(kept) == ["layers.1", "layers.4"] and codes.decode(kept)[0][3:5].tolist() == [CPU, CPU]
    # encode is decode's inverse, homes included; a name not among the candidates has no code
    devices, homed = np.full(g.num_ops, GPU), np.full(g.num_ops, -1)
    back = codes.encode(devices, homed, ["layers.4", "layers.1"])
    assert back.tolist() == row.tolist()
    assert codes.encode(devices, homed, ["layers.9"]) is None
    # the scorer checkpoints what the bits name (where the placement keeps the layer whole) with the homes
    env = envs.SimEnv(g, cluster)
    scorer = HomeCodeScorer(env, codes)
    rows = np.stack([row, kept])
    t, failed = scorer.step_times(rows)
    ck = codes.checkpoint(rows)
    assert t.tolist() == env.batch(rows % 3, checkpoint=ck, checkpoint_where_possible=True)[0].tolist()
    assert t[0] == env.simulate(on_gpu(g, cluster, ["layers.1", "layers.4"])).step_time_s
    with pytest.raises(PlacerError, match="no layer"):
        BlockCodes(g, [], None, 2)


def test_the_search_finds_the_fastest_set_of_checkpointed_layers_that_fits():
    g, cluster = tight()
    env = envs.SimEnv(g, cluster)
    names = candidate_blocks(g)
    # the optimum on the GPU, every subset of the six layers tried
    subsets = [sub for k in range(7) for sub in itertools.combinations(names, k)]
    fits = [r.step_time_s for sub in subsets if (r := env.simulate(on_gpu(g, cluster, sub))).ok]
    best = min(fits)
    every = env.simulate(on_gpu(g, cluster, names)).step_time_s
    assert best < 0.9 * every and not env.simulate(on_gpu(g, cluster)).ok
    # the block level is visited first: the fastest set within 60 placements, before any kick (kicks flip a layer
    # at random too: without the block level, 150 placements and 4 kicks)
    options = MoveSearchOptions(checkpoint=names, checkpoint_moves=True)
    r = MoveSearch(g, cluster, env, options=options, seed=0).run(max_evals=60)
    assert not r.oom and r.op_devices.tolist() == [GPU] * g.num_ops and r.evals <= 60
    assert r.step_time_s == pytest.approx(best, rel=1e-9) and 0 < len(r.checkpoint) < 6
    assert env.simulate(on_gpu(g, cluster, r.checkpoint)).step_time_s == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.homes is None  # no home moves asked for
    # every layer on in every placement (the older way) stays at every layer's cost, without moves
    r_all = MoveSearch(g, cluster, env, options=MoveSearchOptions(checkpoint=names), seed=0).run(max_evals=60)
    assert r_all.checkpoint is None and r_all.step_time_s > 1.1 * r.step_time_s


def test_with_home_moves_too_the_result_carries_the_homes_and_the_layers():
    g, cluster = tight()
    g.param_bytes = np.full(g.num_ops, 1 << 20)
    g.params = [[f"w{i}"] for i in range(g.num_ops)]
    env = envs.SimEnv(g, cluster)
    options = MoveSearchOptions(homes=True, checkpoint=candidate_blocks(g), checkpoint_moves=True)
    search = MoveSearch(g, cluster, env, options=options, seed=0)
    assert search.num_levels == 2 * len(search.levels) + 1
    r = search.run(max_evals=300)
    assert not r.oom and r.homes is not None and r.homes.shape == (g.num_ops,) and r.checkpoint
    t = env.batch(
        r.op_devices[None],
        homes=r.homes[None],
        checkpoint=checkpoint_blocks(g, r.checkpoint)[None],
        checkpoint_where_possible=True,
    )[0][0]
    assert t == pytest.approx(r.step_time_s, rel=1e-9)
    with pytest.raises(PlacerError, match="checkpoint moves"):
        MoveSearch(g, cluster, env, options=MoveSearchOptions(checkpoint_moves=True))


def test_every_other_kick_turns_every_layer_on_and_the_others_flip_one():
    g, cluster = tight()
    env = envs.SimEnv(g, cluster)
    options = MoveSearchOptions(checkpoint=candidate_blocks(g), checkpoint_moves=True)
    search = MoveSearch(g, cluster, env, options=options, seed=0)
    search.begin(max_evals=1000)
    best = search.budget.best_op_devices.astype(np.int64)
    before = set(search.blocks.names(best))
    search.kicks = 1
    every, _ = search._kick()
    assert search.blocks.names(every) == candidate_blocks(g)
    search.kicks = 2
    one, _ = search._kick()
    assert len(set(search.blocks.names(one)) ^ before) == 1
