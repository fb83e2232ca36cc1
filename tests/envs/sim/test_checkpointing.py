"""Checkpointed blocks (envs.sim.checkpointing): hand-computed schedules and peaks, kernel and reference, errors.

Toy cluster (tests/envs/conftest.py): cpu:0 (host), gpu:0, gpu:1 at 1 FLOP/s, links of 1 byte/s, no latency, no
launch cost: forward = FLOPs, backward = 2 x forward. The toy ops are matmuls: each keeps its input for its backward
(its reader is its consumer), the last one its own output.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from envs.cluster import Cluster
from envs.sim.homes import chain_pairs, homeable, parted
from envs.sim.simulator import SimEnv
from graphs import PlacerError
from graphs.plan import Placement, checkpoint_blocks
from graphs.synthetic import random_dag

BACKENDS = ["kernel", "reference"]
DEVICES = ["cpu:0", "gpu:0", "gpu:1"]


def four(toy):
    """a -> b -> c -> d (1 FLOP each, 4-byte outputs); a and b run in module l0, c and d in l1."""
    g = toy.graph(list("abcd"), [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)], [1, 1, 1, 1])
    g.module_paths = ["l0", "l0.mm", "l1", "l1"]
    g.out_bytes = np.array([4, 4, 4, 4])
    return g


def plan(g, devices, checkpoint=(), homes=None):
    p = Placement.from_indices(g, DEVICES, devices, homes=homes)
    p.checkpoint = list(checkpoint)
    return p


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpointed_block_runs_its_forward_again_before_its_first_backward_and_holds_less(toy, backend):
    g = four(toy)
    env = SimEnv(g, toy.cluster(), backend=backend)
    on_gpu = [toy.G0] * 4
    # without blocks: forward a [0, 1], b [1, 2], c [2, 3], d [3, 4]; backward (the worker is ahead of the stream):
    #   d [4, 6], c [6, 8], b [8, 10], a [10, 12].  Peak at d's backward: four outputs (16) + d's gradient (4) = 20.
    s, r = env.schedule(plan(g, on_gpu)), env.simulate(plan(g, on_gpu))
    assert s.bwd_start_s.tolist() == [10, 8, 6, 4] and r.step_time_s == 12 and r.peak_bytes["gpu:0"] == 20
    # both blocks: picking d (at 0) first runs l1 again: c [max(0, free 4) = 4, 5], d [5, 6]; then d [6, 8] and
    #   c [8, 10]; picking b runs l0 again: a [10, 11], b [11, 12]; then b [12, 14], a [14, 16].
    # memory: a's output is read only inside l0 (freed at b's forward end, 2, held again from 10); b's is read by
    #   c (outside l0) and is l1's input: held to l1's last backward (10), not recomputed (nothing in l0 reads it);
    #   c's and d's are freed at d's forward end (4) and held again from 4 and 5.  The peak: b, c and d again and
    #   d's gradient, 16 at 6.
    p = plan(g, on_gpu, ["l0", "l1"])
    s, r = env.schedule(p), env.simulate(p)
    assert s.recompute_start_s.tolist() == [10, 11, 4, 5]
    assert s.bwd_start_s.tolist() == [14, 12, 8, 6] and s.bwd_end_s.tolist() == [16, 14, 10, 8]
    assert r.step_time_s == 16 and r.peak_bytes["gpu:0"] == 16
    assert r.busy_s["gpu:0"] == 4 + 8 + 4  # forward, backward and the second forward
    # the last block alone is run again right before its backward: no less memory, 2 s more
    r = env.simulate(plan(g, on_gpu, ["l1"]))
    assert r.step_time_s == 14 and r.peak_bytes["gpu:0"] == 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpointing_decides_what_fits_in_the_batch_as_in_the_schedule(toy, backend):
    g = four(toy)
    blocks = np.array([[-1] * 4, [0, 0, 2, 2], [-1, -1, 2, 2]])
    rows = np.full((3, 4), toy.G0)
    for cap, fits in ((15, [False, False, False]), (16, [False, True, False]), (20, [True, True, True])):
        env = SimEnv(g, toy.cluster(memory_bytes=cap), backend=backend)
        t, failed, _ = env.batch(rows, checkpoint=blocks)
        assert t.tolist() == [12, 16, 14] and (~failed).tolist() == fits, cap
        assert env.simulate(plan(g, rows[1], ["l0", "l1"])).ok == fits[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_block_on_the_host_runs_its_forward_again_on_the_calling_thread(toy, backend):
    # all on cpu:0 (the host runs each op: the forward a [0, 1] ... d [3, 4], h = 4).  backward() at 4: d is
    # picked at 4: l1 again on the thread, c [4, 5], d [5, 6]; d [6, 8], c [8, 10]; b: l0 again a [10, 11],
    # b [11, 12]; b [12, 14], a [14, 16].
    g = four(toy)
    s = SimEnv(g, toy.cluster(), backend=backend).schedule(plan(g, [toy.CPU] * 4, ["l0", "l1"]))
    assert s.recompute_start_s.tolist() == [10, 11, 4, 5] and s.bwd_end_s.tolist() == [16, 14, 10, 8]


def test_blocks_come_from_module_paths_and_round_trip_through_the_file(toy, tmp_path):
    g = four(toy)
    assert checkpoint_blocks(g, ["l0"]).tolist() == [0, 0, -1, -1]  # l0.mm is below l0
    assert checkpoint_blocks(g, ["l0.mm", "l1"]).tolist() == [-1, 1, 2, 2]
    p = plan(g, [toy.G0] * 4, ["l1"])
    p.save(tmp_path / "p.json")
    assert Placement.load(tmp_path / "p.json") == p and Placement.load(tmp_path / "p.json").checkpoint == ["l1"]
    p.checkpoint = []
    assert "checkpoint" not in p.to_dict()
    (tmp_path / "p.json").write_text(json.dumps({**p.to_dict(), "checkpoint": ["l2"]}))
    wrong = Placement.load(tmp_path / "p.json")  # read as data, checked against the graph where it is used
    with pytest.raises(PlacerError, match=r"p\.json: checkpoint names module 'l2', which runs no op"):
        wrong.checkpoint_blocks(g)
    with pytest.raises(PlacerError, match="checkpoint names 'l0.mm' and 'l0', one inside the other"):
        checkpoint_blocks(g, ["l0", "l0.mm"])
    with pytest.raises(PlacerError, match="checkpoint names module 'l1' twice"):
        checkpoint_blocks(g, ["l1", "l1"])
    with pytest.raises(PlacerError, match=r"checkpoint\[0\] must be a string"):
        Placement.from_dict({**p.to_dict(), "checkpoint": [3]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_homed_op_of_a_block_has_its_parameters_copied_in_again_by_its_recompute_not_before_its_backward(
    toy, backend
):
    g = four(toy)
    g.param_bytes = np.array([0, 0, 6, 0])
    g.params = [[], [], ["w"], []]
    env = SimEnv(g, toy.cluster(), backend=backend)
    # c on gpu:0 with its 6 bytes on the host, l1 (c, d) checkpointed. forward: a [0, 1], b [1, 2]; c's copy in
    #   [0, 6] (issued with c at host time 0), c [6, 7], d [7, 8].
    # backward: picking d (at 0) runs l1 again: c's copy again, issued right before c at 0, on the link free from
    #   6: [6, 12] (outside the window: nothing to wait for); c [max(0, free 8, 12), 13], d [13, 14]; then d's
    #   backward [14, 16] and c's [16, 18], which makes no copy of its own; c's gradient home [18, 24]; b [18, 20],
    #   a [20, 22]. The step ends with the gradient home, 24.
    s = env.schedule(plan(g, [toy.G0] * 4, ["l1"], homes=[-1, -1, toy.CPU, -1]))
    assert s.fwd_start_s.tolist() == [0, 1, 6, 7]
    assert s.recompute_start_s[2:].tolist() == [12, 13]
    assert s.bwd_start_s.tolist() == [20, 18, 16, 14] and s.bwd_end_s.tolist() == [22, 20, 18, 16]
    h = s.homes
    assert h.op.tolist() == [2] and (h.fetch_start_s[0], h.fetch_end_s[0]) == (0, 6)
    assert (h.refetch_start_s[0], h.refetch_end_s[0]) == (6, 12) and (h.grad_start_s[0], h.grad_end_s[0]) == (18, 24)
    assert s.backward_end_s == 24
    # checkpointed, c's forward copy is let go at the forward's end though c is its last reader (the recompute makes
    # the one its backward reads); not checkpointed, c keeps it for its backward: d [8, 10] (picked at 0), c [10, 12]
    assert not h.kept[0]
    s = env.schedule(plan(g, [toy.G0] * 4, homes=[-1, -1, toy.CPU, -1]))
    assert s.homes.kept.tolist() == [True] and s.homes.refetch_end_s[0] == s.homes.refetch_start_s[0]
    assert s.bwd_start_s[2:].tolist() == [10, 8]


def test_a_block_runs_on_one_device_with_its_parameters_eager_and_whole_batches(toy):
    g = four(toy)
    g.param_bytes = np.array([0, 0, 2, 0])
    g.params = [[], [], ["w"], []]
    env = SimEnv(g, toy.cluster())
    with pytest.raises(PlacerError, match="the block of op 'c' runs on more than one device .op 'd' is elsewhere"):
        env.simulate(plan(g, [toy.G0, toy.G0, toy.G0, toy.G1], ["l1"]))
    with pytest.raises(PlacerError, match="one microbatch, eager"):
        env.with_executor("dataflow").simulate(plan(g, [toy.G0] * 4, ["l1"]))
    with pytest.raises(PlacerError, match=r"expected \[4\] or \[K, 4\] block indices"):
        env.batch(np.full((2, 4), toy.G0), checkpoint=np.zeros((3, 4), dtype=int))
    with pytest.raises(PlacerError, match="the index of the block's first op"):
        env.batch(np.full((1, 4), toy.G0), checkpoint=[-1, 0, 0, 0])
    # a block's ops are issued one after the other: a -> (b, c) -> d with b and d in l0 is not, in node order
    diamond = toy.graph(list("abcd"), [("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1)], [1, 1, 1, 1])
    diamond.module_paths = ["x", "l0", "y", "l0"]
    env_d = SimEnv(diamond, toy.cluster())
    with pytest.raises(PlacerError, match="the block of op 'b' is not issued in one run .op 'c' comes between"):
        env_d.simulate(plan(diamond, [toy.G0] * 4, ["l0"]))
    with pytest.raises(PlacerError, match="not issued in one run"):
        env_d.batch(np.full((1, 4), toy.G0), checkpoint=[-1, 1, -1, 1])
    p = plan(diamond, [toy.G0] * 4, ["l0"])
    p.order = np.array([0, 2, 1, 3])  # a, c, b, d
    assert env_d.simulate(p).ok
    assert env_d.batch(np.full((1, 4), toy.G0), [0, 2, 1, 3], checkpoint=[-1, 1, -1, 1])[0][0] > 0
    # outside the block, and inside it, homes go
    assert env.simulate(plan(g, [toy.G0] * 4, ["l0"], homes=[-1, -1, toy.CPU, -1])).ok
    assert env.simulate(plan(g, [toy.G0] * 4, ["l1"], homes=[-1, -1, toy.CPU, -1])).ok


def random_blocks(n: int, rng) -> tuple[list[str], np.ndarray]:
    """Module paths over ``n`` ops in node order: runs of 2-6 ops in modules ``m.k``, some of them checkpointed."""
    paths, blocks, i, k = [], np.full(n, -1), 0, 0
    while i < n:
        size = int(rng.integers(2, 7))
        paths += [f"m.{k}"] * min(size, n - i)
        if rng.random() < 0.5:
            blocks[i : i + size] = i
        i, k = i + size, k + 1
    return paths, blocks


@pytest.mark.parametrize("seed", range(4))
def test_kernel_and_reference_agree_with_random_blocks_and_homes(seed):
    rng = np.random.default_rng(seed)
    g = random_dag(40, seed=seed)
    g.param_bytes = rng.integers(0, 3, g.num_ops) * rng.integers(1 << 12, 1 << 16, g.num_ops)  # activations weigh
    g.params = [[f"w{i}"] if b else [] for i, b in enumerate(g.param_bytes)]
    g.module_paths, blocks = random_blocks(g.num_ops, rng)
    c = Cluster.preset("h200x1")  # cpu:0 and gpu:0
    p = rng.integers(0, c.num_devices, (12, g.num_ops))
    inside = blocks >= 0
    p[:, inside] = p[:, blocks[inside]]  # a block on its first op's device
    homes = np.where((rng.random((12, g.num_ops)) < 0.3) & (p > 0), 0, -1)  # inside blocks too
    homes[:, homeable(g) <= 0] = -1
    homes[parted(p, chain_pairs(g))] = -1  # a parameter read through views: apart with its views on its reader's
    tiny = Cluster(c.name, [c.devices[0], replace(c.devices[1], memory_bytes=1.0)], c.links)
    peaks = SimEnv(g, tiny).batch(p, overflow=True, homes=homes, checkpoint=blocks)[2]  # gpu:0's peak / 1 byte
    c = Cluster(c.name, [c.devices[0], replace(c.devices[1], memory_bytes=float(np.median(peaks)))], c.links)
    out = [SimEnv(g, c, backend=b).batch(p, overflow=True, homes=homes, checkpoint=blocks) for b in BACKENDS]
    (tk, fk, ok), (tr, fr, orf) = out
    np.testing.assert_array_equal(tk, tr)
    np.testing.assert_array_equal(fk, fr)
    np.testing.assert_allclose(ok, orf, rtol=1e-12)
    assert fk.any() and not fk.all()
    # and checkpointing changes both the times and the peaks (on a random DAG a block's ops are far apart, and the
    # inputs it holds and the outputs it makes again at its first backward can raise them)
    plain = SimEnv(g, tiny).batch(p, overflow=True, homes=homes)
    assert (tk > plain[0]).any() and (peaks != plain[2]).any()
