"""Home moves in the move search (placer.learn.home_moves): at a cap that holds no layer's training state beside the
others, the only fast plan that fits keeps every layer on the GPU with its weights homed on the host, and the search
finds it within its budget; without home moves it cannot."""

from __future__ import annotations

import numpy as np
import pytest

import envs
from envs.cluster import Cluster, Device
from envs.machines import PCIE5
from graphs import OpGraph, PlacerError
from placer.learn.home_moves import HomeCodes, HomeCodeScorer
from placer.learn.move_search import MoveSearch, MoveSearchOptions

MB = 1 << 20
CPU, GPU = 0, 1


@pytest.fixture(scope="module")
def problem():
    # 6 layers of 100 MB of weights: 2.4 GB of training state (weights, gradients, Adam's two moments) against a
    # 1 GB GPU; a layer on the host takes 30 s, on the GPU 30 ms.
    n = 6
    names = [f"layer{k}" for k in range(n)]
    g = OpGraph.from_edges(
        names, [(a, b, MB) for a, b in zip(names, names[1:])], flops=[1e11] * n, param_bytes=[100 * MB] * n
    )
    g.params = [[f"w{k}"] for k in range(n)]
    devices = [Device("cpu:0", "cpu", 64e9, 1e10, 1e10, 5e-6), Device("gpu:0", "gpu", 1e9, 1e13, 1e12, 6e-6)]
    cluster = Cluster("toy-offload", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})
    return g, cluster


def test_codes_decode_to_a_gpu_with_the_weights_on_the_host(problem):
    g, cluster = problem
    codes = HomeCodes(g, cluster, cluster.gpu_indices())
    op_devices, homes = codes.decode(np.array([[2, 2, 1, 0, 2, 1]]))
    assert op_devices.tolist() == [[GPU, GPU, GPU, CPU, GPU, GPU]]
    assert homes.tolist() == [[CPU, CPU, -1, -1, CPU, -1]]
    items, targets, keys = codes.moves(np.zeros(6, dtype=np.int64), 1, np.array([2, 2, 1, 0, 2, 1]))
    assert sorted(targets.tolist()) == [GPU, 2] and len(set(keys.tolist())) == 2  # all homed, or all back on gpu:0


def test_the_search_homes_the_weights_on_the_host_to_fit_the_gpu(problem):
    g, cluster = problem
    env = envs.SimEnv(g, cluster)
    ops_only = MoveSearch(g, cluster, env, seed=0).run(max_evals=200)
    homed = MoveSearch(g, cluster, env, options=MoveSearchOptions(homes=True), seed=0).run(max_evals=200)
    assert homed.evals == ops_only.evals == 200  # the home moves are counted in the same budget
    assert not homed.oom and homed.op_devices.tolist() == [GPU] * 6
    assert (homed.homes == CPU).sum() >= 4  # the GPU holds at most one layer's state beside the copies
    step_time_s, oom = env.batch(homed.op_devices[None], homes=homed.homes[None])[:2]
    assert not oom[0] and step_time_s[0] == pytest.approx(homed.step_time_s)
    all_homed = env.batch(np.full((1, 6), GPU), homes=np.full((1, 6), CPU))[0][0]  # the homed start: moves improved it
    assert homed.step_time_s < 0.95 * all_homed
    # without homes, a plan that fits runs most layers on the host: the search keeps the one that does not fit
    assert ops_only.homes is None and (ops_only.oom or (ops_only.op_devices == CPU).sum() >= 4)
    assert homed.step_time_s < 0.01 * env.batch(np.array([[GPU, CPU, CPU, CPU, CPU, GPU]]))[0][0]


def test_home_moves_need_the_simulator_and_a_host(problem):
    g, cluster = problem

    class Measured:
        def step_times(self, op_devices, order=None): ...

    with pytest.raises(PlacerError, match="with the simulator"):
        HomeCodeScorer(Measured(), HomeCodes(g, cluster, cluster.gpu_indices()))
    with pytest.raises(PlacerError, match="a host device and a GPU"):
        HomeCodes(g, envs.Cluster.preset("k80x2"), [])


def test_home_moves_search_in_the_planned_issue_order_too(problem):
    g, cluster = problem
    search = MoveSearch(g, cluster, envs.SimEnv(g, cluster), options=MoveSearchOptions(homes=True), order="planned")
    r = search.run(max_evals=120)
    assert not r.oom and r.op_devices.tolist() == [GPU] * 6 and (r.homes == CPU).sum() >= 4
