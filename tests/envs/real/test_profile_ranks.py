"""``placer profile SOURCE --ranks N``: this machine's gloo ranks measured into a cluster (profile_ranks.py)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from envs.cluster import Cluster
from envs.devices import Device
from envs.real.distributed.profile_ranks import (
    SIZES,
    calibrate,
    calibration_plans,
    fit_link,
    handoff_step_s,
    microbatch_program,
    ranks_cluster,
    with_action_overhead,
    with_device_fields,
)
from envs.sim.ranks import RankSim
from graphs import OpGraph, sources
from placer.cli import main

TINY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Tiny(nn.Module):  # large enough that its compute, not only its per-op cost, shows in a step
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(2)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x.square().mean()


    def build():
        torch.manual_seed(0)
        return Tiny(), (torch.randn(256, 256),)
    """
)


def test_a_link_is_fitted_exactly_to_a_latency_and_a_bandwidth():
    times = {n: 5e-5 + n / 2e9 for n in SIZES}
    latency_s, bandwidth = fit_link(times)
    assert latency_s == pytest.approx(5e-5) and bandwidth == pytest.approx(2e9)


def test_one_slow_message_does_not_make_the_link_slow_to_start():
    # a measured ping-pong (docs/ranks/cpu2/own_profile/profile_unet.json): the 1 KB message's median was slow
    # (1.5 ms) once; every other size says tens of microseconds. An unweighted fit made the latency 0.57 ms.
    one_way_s = {1024: 1.5256e-3, 65536: 6.80e-5, 1048576: 3.513e-4, 8388608: 2.799e-3}
    latency_s, bandwidth = fit_link(one_way_s)
    assert 2e-5 < latency_s < 1e-4 and 2e9 < bandwidth < 6e9


def test_the_rates_are_scaled_so_the_models_simulated_step_is_the_measured_one():
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 2e9], op_types=["aten.mm.default"] * 2)
    rates = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.0}
    # forward 3 s, backward 6 s at 1 GFLOP/s: a step of 18 s means half that rate
    assert calibrate(g, rates, 18.0)["flops_per_s"] == pytest.approx(0.5e9)


def test_a_microbatch_step_separates_the_work_from_the_cost_per_op():
    """Two steps measured, whole (10 s) and one of 4 microbatches (4 s): the work shrinks with the microbatch, the
    cost per op does not; the fit recovers both, so the simulator's step of either is the measured one."""
    from envs.sim.cost import op_times

    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 3e9], op_types=["aten.mm.default"] * 2)
    rates = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.0}
    # at 1 GFLOP/s the roofline's work is 12 s whole, 3 s a microbatch: 10 = a*12 + 6*o, 4 = a*3 + 6*o
    fitted = calibrate(g, rates, 10.0, (4, 4.0))
    assert fitted["flops_per_s"] == pytest.approx(1.5e9) and fitted["launch_overhead_s"] == pytest.approx(1 / 3)
    cluster = Cluster(name="fit", devices=[Device("cpu:0", "cpu", 1e12, **fitted)], links={})
    for M, measured_s in ((1, 10.0), (4, 4.0)):
        fwd, bwd = op_times(g, cluster, M)
        assert fwd.sum() + bwd.sum() == pytest.approx(measured_s)
    one_factor = calibrate(g, rates, 10.0)  # the whole step alone: the microbatch comes out too cheap
    fwd, bwd = op_times(g, Cluster(name="one", devices=[Device("cpu:0", "cpu", 1e12, **one_factor)], links={}), 4)
    assert fwd.sum() + bwd.sum() < 3.0
    # a microbatch step no cheaper than the whole one gives no positive work: one factor, as without it
    assert calibrate(g, rates, 10.0, (4, 10.5)) == one_factor


def test_the_ranks_measurements_make_a_cluster_file():
    g = OpGraph.from_edges(["a"], [], flops=[1e9], op_types=["aten.mm.default"])
    rates = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e10, "launch_overhead_s": 1e-6}
    link = {str(n): 1e-4 + n / 1e9 for n in SIZES}
    parts = [
        {"rank": 0, "rates": rates, "step_s": 3.0, "links": {"0,1": link}},
        {"rank": 1, "rates": rates, "step_s": 6.0, "links": {}},
    ]
    cluster = ranks_cluster(g, parts)
    assert cluster.device_names == ["cpu:0", "cpu:1"]
    assert cluster.devices[0].flops_per_s == pytest.approx(2 * cluster.devices[1].flops_per_s)  # twice as fast
    lk = cluster.links[("cpu:1", "cpu:0")]
    assert lk.latency_s == pytest.approx(1e-4) and lk.bandwidth_bytes_per_s == pytest.approx(1e9)
    again = Cluster.from_dict(json.loads(json.dumps(cluster.to_dict())))
    assert again.device_names == cluster.device_names


def test_the_pipeline_runs_set_the_compute_of_every_rank():
    """Two ranks ran a and b (1 and 3 GFLOP) over 1 and 4 microbatches; their forward and backward seconds are twice
    the roofline's at 1 GFLOP/s plus 1 ms per op launch: the fit finds 0.5 GFLOP/s and 1 ms for every rank, and the
    one-process steps are not used."""
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 3e9], op_types=["aten.mm.default"] * 2)
    rates = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.0}

    def run(M, work_s):  # 3 launches per op and microbatch (the roofline's backward is twice its forward)
        total = 2 * work_s + 3e-3 * M
        return {"microbatches": M, "phases": {"forward_s": total / 3, "backward_s": 2 * total / 3, "step_s": 99.0}}

    # a: 1 s forward + 2 s backward at 1 GFLOP/s = 3 s; b: 9 s (per step, whatever the microbatches)
    link = {str(n): 1e-4 + n / 1e9 for n in SIZES}
    parts = [
        {"rank": 0, "rates": rates, "step_s": 99.0, "links": {"0,1": link}, "pipelines": [run(1, 3.0), run(4, 3.0)]},
        {"rank": 1, "rates": rates, "step_s": 99.0, "links": {}, "pipelines": [run(1, 9.0), run(4, 9.0)]},
    ]
    cluster = ranks_cluster(g, parts, split=np.array([0, 1]))
    for d in cluster.devices:
        assert d.flops_per_s == pytest.approx(0.5e9) and d.launch_overhead_s == pytest.approx(1e-3)
    assert "fitted to pipeline compute" in cluster.description
    # the runs' steps as the simulator of ranks gives them with 2 s per action: the fit finds the 2 s, on every rank
    truth = with_action_overhead(cluster, 2.0)
    for k, M in enumerate((1, 4)):
        step_s = RankSim(g, truth, microbatches=M).simulate([0, 1]).step_time_s
        for p in parts:
            p["pipelines"][k]["phases"]["step_s"] = step_s
    cluster = ranks_cluster(g, parts, split=np.array([0, 1]))
    assert [d.action_overhead_s for d in cluster.devices] == pytest.approx([2.0, 2.0])
    assert cluster.devices[0].update_bw_bytes_per_s == 0  # no parameters: the update's bandwidth is not measured
    assert [d.split_backward_factor for d in cluster.devices] == [1.0, 1.0]  # no rank timed a split backward
    # the second rank's stage took 1.3x as long with its backward split: every device's factor, in the file too
    parts[1]["split_backward"] = {"whole_s": 0.010, "split_s": 0.013}
    cluster = ranks_cluster(g, parts, split=np.array([0, 1]))
    assert [d.split_backward_factor for d in cluster.devices] == pytest.approx([1.3, 1.3])
    assert Cluster.from_dict(json.loads(json.dumps(cluster.to_dict()))).devices[1].split_backward_factor == 1.3
    del parts[1]["split_backward"]
    # a pipeline that could not run (the same error on every rank): the one-process steps are the fit
    parts[1]["pipelines"][1] = {"microbatches": 4, "error": "stage 1 receives a int64 tensor"}
    cluster = ranks_cluster(g, parts, split=np.array([0, 1]))
    assert cluster.devices[0].flops_per_s == pytest.approx(calibrate(g, rates, 99.0)["flops_per_s"])
    assert "fitted to one-process steps" in cluster.description
    assert all(d.action_overhead_s == 0 for d in cluster.devices)  # nothing to fit it to


def test_the_calibration_pipelines_cut_the_ops_into_runs_of_equal_work():
    g = OpGraph.from_edges(
        [f"op{i}" for i in range(6)], [(f"op{i}", f"op{i + 1}", 8) for i in range(5)], flops=[1, 1, 1, 1, 4, 0]
    )
    split, plans = calibration_plans(g, 2, None, 8)
    assert split.tolist() == [0, 0, 0, 0, 1, 1]  # work 1,1,1,1 | 4,0 (each op counts one FLOP more)
    assert [(p.microbatches, p.schedule, len(p.stages)) for p in plans] == [(1, "gpipe", 2)]
    with pytest.raises(Exception, match="cannot be cut into 7 runs"):
        calibration_plans(g, 7, None, 8)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ranks", "1"], "--ranks"),
        (["--ranks", "2", "--devices", "cuda:0"], "--ranks: measures gloo ranks"),
        (["--ops", "ops.json"], "--ops: only with --ranks"),
        (["--ranks", "2", "--ops", "RANKS"], "the same file as -o"),
        (["--ranks", "2", "--ops", "no/such/dir/ops.json"], "--ops"),
        (["--ranks", "2", "--ops", "ops.json", "--microbatches", "0"], "--microbatches"),
    ],
)
def test_bad_ranks_options_are_one_line(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / "ranks.json") if a == "RANKS" else a for a in argv]
    rc = main(["profile", "nmt-2", "-o", str(tmp_path / "ranks.json"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_microbatches_whose_program_has_other_ops_than_the_whole_batch_are_passed_over():
    """A batch of 8 cut 8 ways is 8 samples of one, and a model may export other ops for a sample alone (here a
    branch on the batch size; torch's specialisation of size-1 dimensions does the same): the calibration's plan
    would be refused for it. So the program of fewer microbatches is taken, the largest with the whole batch's ops."""
    import torch
    from torch import nn

    from graphs.torch_capture import capture

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            if x.shape[0] > 1:  # a sample alone skips the centring
                y = y - y.mean(0)
            return y.square().mean()

    model, inputs = Branchy(), (torch.randn(8, 4),)
    graph = capture(model, inputs)
    M, program = microbatch_program(model, inputs, graph)
    assert M == 4 and program.names == graph.names and program.op_types == graph.op_types
    assert microbatch_program(model, inputs)[0] == 8  # without the whole batch's graph to compare: the largest M


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_two_ranks_of_this_machine_are_measured_into_a_cluster_the_simulator_takes(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny_ranks_model.py").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    import torch

    from envs.real import profiler

    threads = []  # the threads the per-op profile (--ops) ran on
    profile_model = profiler.profile_model
    monkeypatch.setattr(
        profiler, "profile_model", lambda *a, **k: threads.append(torch.get_num_threads()) or profile_model(*a, **k)
    )
    before = torch.get_num_threads()
    argv = ["profile", "tiny_ranks_model:build", "--ranks", "2", "-o", "ranks.json", "--repeats", "2", "--json"]
    assert main([*argv, "--ops", "ops.json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # --ops: every op also timed here, on one thread as a rank runs it, on the whole batch and one of 4 microbatches
    assert threads == [1] and torch.get_num_threads() == before
    ops = profiler.load_profile("ops.json")
    assert summary["ops"]["output"] == "ops.json" and summary["ops"]["microbatches"] == 4
    assert summary["ops"]["ops"] == len(ops["ops"]) > 0 and summary["ops"]["micro_fwd_s"] > 0
    assert set(ops["devices"]["cpu"]["micro_m"]) == {4}
    graph = sources.resolve_graph("tiny_ranks_model:build")
    assert summary["ops"]["graph_hash"] == ops["graph_hash"] == graph.content_hash
    cluster = Cluster.load(tmp_path / "ranks.json")
    assert cluster.device_names == ["cpu:0", "cpu:1"] and summary["output"] == "ranks.json"
    assert all(p["step_s"] > 0 and p["microbatches"] == 8 and p["micro_step_s"] > 0 for p in summary["measured"])
    # the model run as a pipeline across both ranks, 1 and 8 microbatches: its compute is what the rates are fitted to
    assert [[run["microbatches"] for run in p["pipelines"]] for p in summary["measured"]] == [[1, 8], [1, 8]]
    assert all(run["phases"]["forward_s"] > 0 for p in summary["measured"] for run in p["pipelines"])
    assert "fitted to pipeline compute" in cluster.description
    # the second rank's stage timed with its backward whole and split (zero-bubble schedules): the devices' factor
    first, second = (p["split_backward"] for p in summary["measured"])
    assert first is None and second["whole_s"] > 0 and second["split_s"] > 0
    factor = min(max(second["split_s"] / second["whole_s"], 0.1), 100.0)  # within the cluster file's bounds: on a
    # busy host the split backward measured 0.089x the whole one, and the file holds 0.1
    assert [d.split_backward_factor for d in cluster.devices] == pytest.approx([factor, factor], rel=1e-5)
    # the optimizer steps the pipelines measured set the update's own bandwidth, and the summary says it
    assert all(run["phases"]["optimizer_s"] > 0 for p in summary["measured"] for run in p["pipelines"])
    assert all(d.update_bw_bytes_per_s > 0 for d in cluster.devices)
    link = cluster.links[("cpu:0", "cpu:1")]
    assert 0 <= link.latency_s < 0.1 and link.bandwidth_bytes_per_s > 1e6
    # a looped pipeline (4 stages, Interleaved 1F1B, 8 microbatches) on both ranks: the hand-off is fitted to it
    assert all(p["looped"]["microbatches"] == 8 and p["looped"]["phases"]["step_s"] > 0 for p in summary["measured"])
    assert cluster.devices[0].handoff_s == cluster.devices[1].handoff_s >= 0


def test_the_optimizer_steps_the_pipelines_measured_set_the_update_bandwidth():
    """b holds 4 MB of parameters on rank 1; its optimizer step took 14 ms in both calibration pipelines, past a
    1 ms launch: Adam's 7 passes over 4 MB in 13 ms. The cluster's update bandwidth is that, its memory bandwidth
    (the compute fit's) stays, and the simulator of ranks then gives rank 1's optimizer step as measured."""
    g = OpGraph.from_edges(
        ["a", "b"], [("a", "b", 4)], flops=[1e9, 3e9], op_types=["aten.mm.default"] * 2, param_bytes=[0, 4_000_000]
    )
    rates = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.0}

    def run(M, work_s, optimizer_s):
        total = 2 * work_s + 3e-3 * M
        phases = {"forward_s": total / 3, "backward_s": 2 * total / 3, "optimizer_s": optimizer_s, "step_s": 99.0}
        return {"microbatches": M, "phases": phases}

    link = {str(n): 1e-4 + n / 1e9 for n in SIZES}
    parts = [
        {"rank": 0, "rates": rates, "step_s": 99.0, "links": {"0,1": link}, "pipelines": [run(1, 3.0, 0.0)]},
        {"rank": 1, "rates": rates, "step_s": 99.0, "links": {}, "pipelines": [run(1, 9.0, 0.014), run(4, 9.0, 0.014)]},
    ]
    parts[0]["pipelines"].append(run(4, 3.0, 0.0))
    split = np.array([0, 1])
    assert ranks_cluster(g, parts).devices[0].update_bw_bytes_per_s == 0  # the one-process fit: none
    cluster = ranks_cluster(g, parts, split=split)
    launch_s = cluster.devices[1].launch_overhead_s
    expected = 7 * 4_000_000 / (0.014 - launch_s)
    assert [d.update_bw_bytes_per_s for d in cluster.devices] == pytest.approx([expected, expected])
    assert cluster.devices[1].mem_bw_bytes_per_s != pytest.approx(expected)
    assert Cluster.from_dict(json.loads(json.dumps(cluster.to_dict()))).update_bw_bytes_per_s[1] == pytest.approx(
        expected
    )
    from envs.sim.cost import update_times_s

    assert update_times_s(np.array([0.0, 4e6]), cluster)[1] == pytest.approx(0.014)
    _, events = RankSim(g, cluster).timeline(split)
    assert [e.end_s - e.start_s for e in events if e.kind == "O" and e.rank == 1] == [pytest.approx(0.014)]


def test_the_looped_pipeline_measured_sets_the_hand_off_of_every_rank():
    """Four ops of 1 s on two ranks. The one-stage pipelines measured faster than simulated (no action overhead); the
    looped pipeline (ops a b c d on ranks 0 1 0 1, 2 microbatches) as slow as the simulator gives it with a hand-off
    of 4 ms per message: that is the hand-off fitted, on every rank, and the cluster file keeps it. A looped pipeline
    that did not run, or none, leaves it 0."""
    g = OpGraph.from_edges(
        ["a", "b", "c", "d"],
        [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)],
        flops=[1e9] * 4,
        op_types=["aten.mm.default"] * 4,
    )
    rates = {"flops_per_s": 1e9, "mem_bw_bytes_per_s": 1e15, "launch_overhead_s": 0.0}

    def run(M, work_s):
        phases = {"forward_s": work_s / 3, "backward_s": 2 * work_s / 3, "optimizer_s": 0.0, "step_s": 1e-3}
        return {"microbatches": M, "phases": phases}

    link = {str(n): 1e-4 + n / 1e9 for n in SIZES}
    parts = [
        {"rank": r, "rates": rates, "step_s": 1.0, "links": {"0,1": link} if r == 0 else {}, "pipelines": [run(1, 6.0)]}
        for r in (0, 1)
    ]
    split = np.array([0, 0, 1, 1])
    base = ranks_cluster(g, parts, split=split)
    assert base.devices[0].action_overhead_s == 0 and base.devices[0].handoff_s == 0
    looped_split = np.array([0, 1, 0, 1])
    measured_s = handoff_step_s(g, with_device_fields(base, handoff_s=0.004), looped_split, 2)
    assert measured_s > handoff_step_s(g, base, looped_split, 2)
    for p in parts:
        p["looped"] = {"microbatches": 2, "phases": {"step_s": measured_s}}
    cluster = ranks_cluster(g, parts, split=split, looped=looped_split)
    assert [d.handoff_s for d in cluster.devices] == pytest.approx([0.004, 0.004], rel=1e-6)
    assert handoff_step_s(g, cluster, looped_split, 2) == pytest.approx(measured_s)
    assert Cluster.from_dict(json.loads(json.dumps(cluster.to_dict()))).devices[1].handoff_s == pytest.approx(0.004)
    assert ranks_cluster(g, parts, split=split).devices[0].handoff_s == 0  # no looped pipeline given
    parts[1]["looped"] = {"microbatches": 2, "error": "stage cut: ..."}
    assert ranks_cluster(g, parts, split=split, looped=looped_split).devices[0].handoff_s == 0
