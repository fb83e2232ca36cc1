"""``placer train --homes``: the run's move search chooses parameter homes with the op placement, and the run's best
placement file carries them (placer.learn.run_scorers.home_codes, placer.learn.session)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import envs
import graphs.io
from envs.cluster import Cluster, Device
from envs.machines import PCIE5
from graphs import OpGraph, PlacerError
from graphs.plan import Placement
from placer.cli import main
from placer.learn.home_moves import HomeCodes, HomeCodeScorer
from placer.learn.rundir import BEST_NAME, adopt_newer_best
from placer.learn.runners import train
from placer.learn.state import RunState
from tests.placer.learn.test_home_moves import every_plan, two_basins_problem
from tests.placer.learn.tiny_runs import spy_on_move_searches, train_config

MB = 1 << 20
CPU, GPU = 0, 1


def offload_problem(frozen: bool = False) -> tuple[OpGraph, Cluster]:
    """6 layers of 100 MB of weights (2.4 GB of training state) against a 1 GB GPU; a layer takes 30 s on the host and
    30 ms on the GPU: the fast plans that fit keep the layers on the GPU with most weights homed on the host.
    ``frozen``: each layer's weights frozen instead (``requires_grad=False``), 200 MB (1.2 GB held, no gradient and
    no optimizer state): homed on the host, they are copied in with no gradient sent back."""
    n = 6
    names = [f"layer{k}" for k in range(n)]
    g = OpGraph.from_edges(
        names,
        [(a, b, MB) for a, b in zip(names, names[1:])],
        flops=[1e11] * n,
        param_bytes=[0 if frozen else 100 * MB] * n,
        buffer_bytes=[200 * MB if frozen else 0] * n,
        name="offload-toy",
    )
    g.params = [[f"w{k}"] for k in range(n)]
    if frozen:
        g.meta["frozen_params"] = [f"w{k}" for k in range(n)]
    devices = [Device("cpu:0", "cpu", 64e9, 1e10, 1e10, 5e-6), Device("gpu:0", "gpu", 1e9, 1e13, 1e12, 6e-6)]
    return g, Cluster("toy-offload", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def runs_with_and_without_homes(tmp_path, g, cluster) -> tuple[dict, Placement]:
    """``placer train`` on ``g`` with ``--homes auto`` and ``off`` (40 move iterations each): the runs, and the best
    placement file of the run with homes, which homes weights on the host with every layer on the GPU."""
    runs = {}
    for homes in ("auto", "off"):
        config = train_config(tmp_path / homes, algo="moves", iterations=40, heuristics=None, homes=homes)
        runs[homes] = train(config, graph=g, cluster=cluster)
    best = Placement.load(str(tmp_path / "auto" / "run" / BEST_NAME))
    assert best.param_homes and set(best.param_homes.values()) == {"cpu:0"}
    assert best.indices(g, cluster.device_names).tolist() == [GPU] * 6
    return runs, best


def test_a_run_on_a_model_that_does_not_fit_homes_its_weights_and_its_file_carries_them(tmp_path):
    g, cluster = offload_problem()
    runs, best = runs_with_and_without_homes(tmp_path, g, cluster)
    result = envs.SimEnv(g, cluster).simulate(best)  # the file's plan, its homes and order, as placer.apply runs it
    # --host-step auto: the run scored stepping during the backward; the file keeps the faster way for its plan
    compared = best.meta["host_step_s"]
    assert compared["backward"] == pytest.approx(runs["auto"].best_step_time_s, rel=1e-6)
    assert best.host_step == min(("after", "backward"), key=lambda way: (compared[way], way != "after"))
    assert result.ok and result.step_time_s == pytest.approx(compared[best.host_step], rel=1e-6)
    # op placements only: the plans that fit run most layers on the host, 100x slower
    off = Placement.load(str(tmp_path / "off" / "run" / BEST_NAME))
    assert not off.param_homes and runs["off"].best_step_time_s > 100 * runs["auto"].best_step_time_s


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_run_on_a_model_whose_frozen_weights_do_not_fit_homes_them(tmp_path):
    """A frozen backbone too large for the GPU: its weights live on the host and are copied in, no gradient sent back
    and no host step; without homes the plans that fit run layers on the host, 100x slower."""
    g, cluster = offload_problem(frozen=True)
    runs, best = runs_with_and_without_homes(tmp_path, g, cluster)
    assert best.homed_bytes(g) >= 2 * 200 * MB  # what cannot stay on the GPU
    schedule = envs.SimEnv(g, cluster).schedule(best)
    assert not schedule.homes.grad_nbytes.any() and not len(schedule.host_steps.owner)
    off = Placement.load(str(tmp_path / "off" / "run" / BEST_NAME))
    assert not off.param_homes and runs["off"].best_step_time_s > 100 * runs["auto"].best_step_time_s


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_the_runs_search_knows_how_far_over_the_memory_a_plan_is_and_crosses_it_to_the_faster_basin(
    tmp_path, monkeypatch
):
    """With home moves the run's scorer says how far over capacity each plan is, as ``plan_with_homes``'s does, so
    the run's move search crosses the memory limit after a kick (``MoveSearchOptions.oscillate``): on the toy of two
    basins it ends at the optimum on most seeds. Without it (a scorer that only says "out of memory") every seed
    stayed in the slower basin, 1.089x the optimum (one at 1.009x). The run's uniform ablation is told too, through
    its own cache: its placements are not the run's."""
    made = spy_on_move_searches(monkeypatch)
    g, cluster = two_basins_problem()
    env = envs.SimEnv(g, cluster)
    env.host_step = "backward"
    _, step_time_s, oom = every_plan(g, env)
    best = float(np.min(np.where(oom, np.inf, step_time_s)))
    found = []
    for seed in range(4):
        config = train_config(
            tmp_path / str(seed),
            algo="moves",
            iterations=200,
            heuristics=None,
            homes="on",
            checkpointing="off",
            seed=seed,
            ablation=seed == 0,  # the ablation once
            equal_budget_search=False,
        )
        found.append(train(config, graph=g, cluster=cluster).best_step_time_s <= best * 1.005)
        if seed == 0:
            learner, ablation = made[-2:]
            assert learner.budget.overflow and ablation.budget.overflow and ablation.options.proposals == "uniform"
            assert ablation.env.scorer is not learner.env.session.scorer and ablation.env.scorer.evaluated > 0
    assert sum(found) >= 3, found  # 4 of 4


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_the_run_scores_and_files_its_homed_parameters_stepped_as_host_step_says(tmp_path):
    """6 layers whose host Adam (70 ms each) is longer than their backward (20 ms each): stepped during the
    backward, the worker starts with the last layer's gradient; stepped after it, with the first's, a backward
    later. The run scores every placement the way ``--host-step`` says, and its file says so too."""
    g, cluster = offload_problem()
    runs, best = {}, {}
    for way in ("backward", "after"):
        config = train_config(tmp_path / way, algo="moves", iterations=40, heuristics=None, host_step=way)
        runs[way] = train(config, graph=g, cluster=cluster)
        best[way] = Placement.load(str(tmp_path / way / "run" / BEST_NAME))
        assert best[way].param_homes and best[way].host_step == way and "host_step_s" not in best[way].meta
        result = envs.SimEnv(g, cluster).simulate(best[way])
        assert result.ok and result.step_time_s == pytest.approx(runs[way].best_step_time_s, rel=1e-6)
    assert runs["backward"].best_step_time_s < 0.95 * runs["after"].best_step_time_s


def test_homes_auto_stays_off_where_the_model_fits_and_on_is_refused_where_homes_cannot_be(tmp_path):
    g, cluster = offload_problem()
    roomy = Cluster("roomy", [cluster.devices[0], Device("gpu:0", "gpu", 8e9, 1e13, 1e12, 6e-6)], dict(cluster.links))
    train(train_config(tmp_path / "roomy", algo="moves", iterations=5, heuristics=None), graph=g, cluster=roomy)
    assert not Placement.load(str(tmp_path / "roomy" / "run" / BEST_NAME)).param_homes
    for fields, message in (
        (dict(algo="moves", env="measured"), "--homes on: --env measured"),
        (dict(algo="reinforce"), "--homes on: --algo reinforce searches op placements only"),
        (dict(algo="moves", ranks=True), "--homes on: --ranks"),
    ):
        with pytest.raises(PlacerError, match=message):
            train_config(tmp_path, homes="on", iterations=1, **fields).validate()
    gpus_only = Cluster("gpus", [Device("gpu:0", "gpu", 1e9, 1e13, 1e12, 6e-6)], {})
    with pytest.raises(PlacerError, match="--homes on: gpus: home moves: the cluster needs a host device and a GPU"):
        train(train_config(tmp_path / "g", algo="moves", iterations=1, homes="on"), graph=g, cluster=gpus_only)


def test_a_best_file_with_homes_is_read_back_into_codes_on_resume(tmp_path):
    """A best written after the last checkpoint (then a kill) is adopted on --resume, its homes included."""
    g, cluster = offload_problem()
    codes = HomeCodes(g, cluster, cluster.gpu_indices())
    homes = np.array([CPU, CPU, -1, CPU, CPU, CPU])
    Placement.from_indices(g, cluster.device_names, [GPU] * 6, homes=homes, meta={"env": "sim"}).save(
        str(tmp_path / BEST_NAME)
    )
    env = envs.SimEnv(g, cluster)
    run = RunState()
    adopt_newer_best(run, str(tmp_path), g, cluster.device_names, HomeCodeScorer(env, codes).step_times, codes=codes)
    assert run.best_indices == [2, 2, GPU, 2, 2, 2] and np.isfinite(run.best_step_time_s)
    skipped = RunState()  # a run without home moves does not adopt a plan with homes apart
    adopt_newer_best(skipped, str(tmp_path), g, cluster.device_names, lambda p: env.step_times(p))
    assert skipped.best_indices is None


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_placer_train_says_what_it_homed(tmp_path, capsys):
    g, cluster = offload_problem()
    graph_path, cluster_path = tmp_path / "g.json", tmp_path / "c.json"
    graphs.io.save(g, str(graph_path))
    cluster_path.write_text(json.dumps(cluster.to_dict()))
    argv = ["train", str(graph_path), "--cluster", str(cluster_path), "--iterations", "40", "--no-progress"]
    assert main([*argv, "--logdir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "homes            " in out and "parameters (" in out and "live on the host, copied to their ops' GPU" in out
    assert "(fsdp2_offload)  (learned " in out  # the best heuristic: FSDP2's offload as a plan
    assert (
        "stepped during the backward (simulated " in out and "placer.apply.step_in_backward(placed, optimizer)" in out
    )
    assert main([*argv, "--logdir", str(tmp_path / "b"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["homes"]["searched"] and doc["homes"]["params"] >= 4 and doc["homes"]["param_bytes"] >= 400 * MB
    assert main([*argv, "--logdir", str(tmp_path / "c"), "--homes", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["homes"] == {
        "searched": False,
        "params": 0,
        "param_bytes": 0.0,
        "host_step": "after",
        "host_step_s": None,
    }


def test_the_equal_budget_line_says_its_search_has_no_home_moves_where_the_run_searched_them():
    from placer.cli.train import equal_budget_line

    eq = {"method": "module_search", "simulated": 1000, "evals": 1000, "step_time_s": 0.02, "wall_s": 1.0}
    doc = {"equal_budget_search": eq, "best_step_time_s": 0.01, "env": "sim", "homes": {"searched": True}}
    assert "op placements only: it has no home moves (the uniform ablation searches them)" in equal_budget_line(doc)
    assert "home moves" not in equal_budget_line({**doc, "homes": {"searched": False}})


def test_the_small_model_note_is_left_out_where_no_single_device_holds_the_model():
    """The best single device's time ignores memory: where no single device holds the model ("single" found no
    placement that fits), a plan slower than it is no sign that the model is too small to split."""
    from placer.cli.train import small_model_line

    doc = {"best_step_time_s": 2.0e-3, "reference_step_time_s": 1.8e-3, "env": "sim", "heuristics": {"single": 3e-3}}
    assert "too small to gain from splitting" in small_model_line(doc)
    assert small_model_line({**doc, "heuristics": {"single": None}}) is None


def test_fsdp2s_offload_as_a_plan_is_among_the_heuristics_of_a_run_with_home_moves():
    """Every op on the GPU, every parameter homed on the host (and, with checkpoint moves, every layer checkpointed
    too): scored as the run scores, stepped as it steps them; the run's best heuristic and start where it is the
    fastest."""
    from dataclasses import replace

    from placer.learn.checkpoint_choice import candidate_blocks
    from placer.learn.checkpoint_moves import BlockCodes
    from placer.learn.run_heuristics import (
        FSDP2_OFFLOAD,
        FSDP2_OFFLOAD_CHECKPOINTED,
        RunHeuristics,
        with_offload_baselines,
    )
    from placer.learn.run_scorers import CachedScorer
    from tests.placer.learn.test_checkpoint_choice import activation_problem

    g, cluster = offload_problem()
    codes = HomeCodes(g, cluster, cluster.gpu_indices())
    env = envs.SimEnv(g, cluster)
    env.host_step = "backward"
    h0 = RunHeuristics({"single": 100.0}, {}, "single", 100.0, np.zeros(6, dtype=np.int32), 100.0, 7)
    h = with_offload_baselines(h0, g, cluster, codes, CachedScorer(HomeCodeScorer(env, codes)))
    plan = Placement.from_indices(g, cluster.device_names, [GPU] * 6, homes=[CPU] * 6, host_step="backward")
    assert h.times[FSDP2_OFFLOAD] == pytest.approx(env.simulate(plan).step_time_s, rel=1e-9)
    assert h.best_name == FSDP2_OFFLOAD and h.time_to_beat_s == h.best_step_time_s == h.times[FSDP2_OFFLOAD]
    assert h.best_op_devices.tolist() == [2] * 6 and h.simulated == 7 and h.times["single"] == 100.0
    fast = replace(h0, best_step_time_s=1e-3, time_to_beat_s=1e-3)  # a faster heuristic stays the best
    assert (
        with_offload_baselines(fast, g, cluster, codes, CachedScorer(HomeCodeScorer(env, codes))).best_name == "single"
    )
    # with checkpoint moves (codes with a bit per op over the home codes): the plan with every layer checkpointed too
    g, cluster = activation_problem()
    g.param_bytes = np.full(g.num_ops, 4 * MB, dtype=np.int64)
    g.params = [[f"w{k}"] for k in range(g.num_ops)]
    names = candidate_blocks(g)
    codes = BlockCodes(g, names, HomeCodes(g, cluster, cluster.gpu_indices()), cluster.num_devices)
    env = envs.SimEnv(g, cluster)
    h = with_offload_baselines(h0, g, cluster, codes, CachedScorer(HomeCodeScorer(env, codes)))
    every = Placement.from_indices(g, cluster.device_names, [GPU] * g.num_ops, homes=[CPU] * g.num_ops)
    assert h.times[FSDP2_OFFLOAD] == pytest.approx(env.simulate(every).step_time_s, rel=1e-9)
    every.checkpoint = names
    assert h.times[FSDP2_OFFLOAD_CHECKPOINTED] == pytest.approx(env.simulate(every).step_time_s, rel=1e-9)
