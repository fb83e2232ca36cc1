"""envs.real.profiler: real per-op timings on the CPU, link fits, and how the simulator takes them in."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import envs
from envs.real.profiler import (
    FORMAT,
    apply_profile,
    calibrate_cluster,
    check_profile,
    fit_link,
    load_profile,
    profile_model,
    save_profile,
    time_link,
    with_profile,
)
from envs.real.profiler.probe import (
    attribute_intervals,
    autograd_nodes,
    backward_intervals,
    grad_fns,
    remove_probe_cost,
    scale_to,
)
from graphs import PlacerError
from graphs.ops import grad_mask
from graphs.torch_capture import capture


def fake_context_gpu(n: int) -> dict:
    """A profile's entry for a GPU profiled in context over ``n`` ops: kernels of 10 and 20 us (forward, backward),
    issued by the host in 30 and 40 us."""
    return {
        "kind": "gpu",
        "name": "fake",
        "method": "context",
        "fwd_s": [1e-5] * n,
        "bwd_s": [2e-5] * n,
        "issue_fwd_s": [3e-5] * n,
        "issue_bwd_s": [4e-5] * n,
    }


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 8))
    x = torch.randn(64, 64)
    graph = capture(model, (x,))
    prof = profile_model(model, (x,), ["cpu"], warmup=1, repeats=3)
    return graph, prof


def test_every_op_is_timed_forward_and_backward(profiled):
    graph, prof = profiled
    assert prof["format"] == FORMAT and prof["graph_hash"] == graph.content_hash
    assert prof["ops"] == graph.names and prof["errors"] == {}
    cpu = prof["devices"]["cpu"]
    assert cpu["kind"] == "cpu"
    fwd, bwd = np.array(cpu["fwd_s"]), np.array(cpu["bwd_s"])
    assert np.all(fwd > 0) and np.all(fwd < 1.0)
    by_name = dict(zip(graph.names, bwd))
    assert by_name["linear"] > 0 and by_name["batch_norm"] > 0
    assert by_name["add_"] == 0.0  # num_batches_tracked += 1: integers, nothing to differentiate
    assert prof["links"] == []  # one device, no pairs


def test_apply_profile_keeps_the_hash_and_feeds_the_simulator(profiled):
    graph, prof = profiled
    g2 = apply_profile(graph, prof)
    assert g2.content_hash == graph.content_hash and graph.profile == {}
    np.testing.assert_allclose(g2.profile["cpu"]["fwd_s"], prof["devices"]["cpu"]["fwd_s"])
    cluster = envs.Cluster.preset("h200x1")
    all_cpu = [0] * graph.num_ops
    r = envs.simulate(g2, all_cpu, cluster)
    work_s = float(np.nansum(g2.profile["cpu"]["fwd_s"]) + np.nansum(g2.profile["cpu"]["bwd_s"]))
    assert r.ok and r.step_time_s >= work_s * 0.999
    assert r.step_time_s != envs.simulate(graph, all_cpu, cluster).step_time_s


def test_profile_of_another_graph_is_refused(profiled):
    graph, prof = profiled
    other = capture(nn.Linear(3, 3), (torch.randn(2, 3),))
    with pytest.raises(PlacerError, match="profiled graph"):
        apply_profile(other, prof)


def test_fit_link_recovers_a_noisy_line():
    rng = np.random.default_rng(0)
    sizes = np.array([4e3, 2.6e5, 4e6, 3.2e7])
    times = (8e-6 + sizes / 25e9) * rng.uniform(0.97, 1.03, size=4)
    lat, bw = fit_link(sizes, times)
    assert lat == pytest.approx(8e-6, rel=0.1) and bw == pytest.approx(25e9, rel=0.1)
    with pytest.raises(PlacerError):
        fit_link([1.0], [1.0])


def test_time_link_on_the_cpu_is_monotone_and_fits():
    sizes, times = time_link("cpu", "cpu", [64 << 10, 8 << 20, 32 << 20], repeats=3)
    assert times[0] < times[-1]
    lat, bw = fit_link(sizes, times)
    assert lat >= 0 and 1e8 < bw < 1e13  # a memcpy: between 0.1 GB/s and 10 TB/s


def _fake_profile(graph, links):
    n = graph.num_ops
    return {
        "format": FORMAT,
        "graph_hash": graph.content_hash,
        "ops": list(graph.names),
        "devices": {
            "cpu": {"kind": "cpu", "fwd_s": [1e-3] * n, "bwd_s": [2e-3] * n},
            "cuda:0": {"kind": "gpu", "fwd_s": [1e-5] * n, "bwd_s": [None] * n},
        },
        "links": [{"src": s, "dst": d, "latency_s": lat, "bandwidth_bytes_per_s": bw} for s, d, lat, bw in links],
    }


def test_calibrate_cluster_uses_measured_links_then_kind_matches(profiled):
    graph, _ = profiled
    prof = _fake_profile(graph, [("cpu", "cuda:0", 9e-6, 20e9), ("cuda:0", "cpu", 11e-6, 18e9)])
    c = calibrate_cluster(envs.Cluster.preset("k80x2"), prof, graph=graph)
    assert c.links[("cpu:0", "gpu:0")] == envs.Link(20e9, 9e-6)
    assert c.links[("gpu:1", "cpu:0")] == envs.Link(18e9, 11e-6)  # cuda:1 unmeasured: same kinds
    assert c.links[("gpu:0", "gpu:1")] == envs.Cluster.preset("k80x2").links[("gpu:0", "gpu:1")]
    cpu = c.devices[0]
    assert cpu.launch_overhead_s == pytest.approx(1e-3)
    g2 = apply_profile(graph, prof)
    assert np.all(np.isnan(g2.profile["gpu"]["bwd_s"]))  # unknown: the cost model falls back


def test_with_profile_reads_a_file_and_rejects_bad_ones(profiled, tmp_path):
    graph, prof = profiled
    path = tmp_path / "profile.json"
    save_profile(prof, path)
    g2, c2 = with_profile(graph, envs.Cluster.preset("h200x1"), str(path))
    assert "cpu" in g2.profile and c2.name == "h200x1+profile"
    assert with_profile(graph, c2, None) == (graph, c2)
    bad = dict(prof, devices={"cpu": {"kind": "cpu", "fwd_s": [1.0], "bwd_s": [1.0]}})
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlacerError, match="one time per op"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "torn.json").write_text(json.dumps(prof)[:50])
    with pytest.raises(PlacerError, match="not valid JSON"):
        load_profile(tmp_path / "torn.json")
    (tmp_path / "fmt.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(PlacerError, match="placer-profile/1"):
        load_profile(tmp_path / "fmt.json")


def ranks_like(flops_per_s: float = 1e9) -> envs.Cluster:
    """Two CPU ranks with a slow link between them, as `placer profile --ranks` writes them."""
    from envs.devices import Device, Link

    devices = [Device(f"cpu:{r}", "cpu", 8 << 30, flops_per_s, 5e9, 1e-5) for r in range(2)]
    link = Link(1e8, 1e-4)
    return envs.Cluster(name="ranks", devices=devices, links={("cpu:0", "cpu:1"): link, ("cpu:1", "cpu:0"): link})


def test_across_processes_a_profile_gives_its_op_times_and_keeps_the_ranks_cluster(profiled, tmp_path, capsys):
    from envs.sim.ranks import RankSim
    from graphs import save
    from graphs.plan import Placement
    from placer.cli import main

    graph, prof = profiled
    cluster = ranks_like()
    g2, c2 = with_profile(graph, cluster, prof, ranks=True)
    assert c2 is cluster  # its rates and its links, not a one-process calibration (free links between cpu:0, cpu:1)
    assert np.array_equal(g2.profile["cpu"]["fwd_s"], np.asarray(prof["devices"]["cpu"]["fwd_s"], dtype=float))
    _, calibrated = with_profile(graph, cluster, prof)
    assert calibrated.links[("cpu:0", "cpu:1")].latency_s == 0.0  # what --ranks must not get
    split = Placement.from_indices(graph, cluster.device_names, [0] * 2 + [1] * (graph.num_ops - 2))
    with_times = RankSim(g2, cluster).simulate(split).step_time_s
    assert with_times != RankSim(graph, cluster).simulate(split).step_time_s
    # the command line: compare --ranks --profile scores on the profiled graph and the cluster as given
    gpath, ppath, cpath, plan = (str(tmp_path / n) for n in ("g.json", "prof.json", "ranks.json", "p.json"))
    save(graph, gpath)
    save_profile(prof, ppath)
    with open(cpath, "w") as f:
        json.dump(cluster.to_dict(), f)
    split.save(plan)
    argv = ["compare", gpath, "--cluster", cpath, "--ranks", "--methods", "flops_balanced", "--placement", plan]
    assert main([*argv, "--profile", ppath, "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    given = [r for m, r in rows.items() if m != "flops_balanced"][0]
    assert given["step_time_s"] == pytest.approx(with_times, rel=1e-9)
    # and the simulated side of `placer run --trace --profile` (the fixture's model, built again)
    from placer.cli.run_ranks import simulate_plan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 8))
    result, events = simulate_plan(model, (torch.randn(64, 64),), split, cluster, ppath)
    assert result.step_time_s == pytest.approx(with_times, rel=1e-9) and events


@pytest.mark.slow  # a profile of every op at two shapes (~5 s)
def test_a_profile_on_microbatches_times_every_op_on_one_of_them_too(tmp_path):
    torch.manual_seed(0)
    # matmuls of a few ms on the whole batch, so that a quarter of it is measurably less work
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 8))
    x = torch.randn(256, 512)
    graph = capture(model, (x,))
    # medians of 5: a spike of a busy host is outvoted (at 3 it failed once: one matmul at 17 ms against 2 ms)
    prof = profile_model(model, (x,), ["cpu"], warmup=1, repeats=5, microbatches=4)
    entry = prof["devices"]["cpu"]
    assert entry["contention"]["windows"] == 3  # the host's contention probe: the best of at most 3 windows
    timed = [k for k, t in enumerate(entry["fwd_s"]) if t is not None]
    assert timed and all(entry["micro_m"][k] == 4 and entry["micro_fwd_s"][k] is not None for k in timed)
    big = int(np.nanargmax(np.array(entry["fwd_s"], dtype=float)))  # the first matmul: 0.27 GFLOP whole
    assert entry["micro_fwd_s"][big] < 0.75 * entry["fwd_s"][big]
    path = tmp_path / "micro.json"
    save_profile(prof, path)
    g2 = apply_profile(graph, load_profile(path))
    assert np.array_equal(g2.profile["cpu"]["micro_m"][timed], np.full(len(timed), 4.0))
    # the simulator takes them: on 4 microbatches each op costs what it measured on one
    from envs.sim import cost

    fwd, _ = cost.op_times(g2, envs.Cluster.preset("k80x2"), microbatches=4)
    cpu = envs.Cluster.preset("k80x2").index("cpu:0")
    # at M = K the line through both sizes gives the microbatch's own time, whichever way it leans (a microbatch may
    # run faster per sample than the whole batch, its data in cache: a < 0, and the line is kept up to K); choosing
    # only the ops with a >= 0 left none on a host where every op ran so
    micro = np.asarray(entry["micro_fwd_s"], dtype=float)
    assert np.allclose(fwd[timed, cpu], micro[timed])


def test_unavailable_cuda_device_is_a_one_line_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(PlacerError, match="not available"):
        profile_model(nn.Linear(2, 2), (torch.randn(1, 2),), ["cpu", "cuda:0"])


def test_device_map_makes_logical_gpus_on_the_cpu_cpus_with_free_links(profiled):
    graph, prof = profiled
    c = calibrate_cluster(envs.Cluster.preset("k80x2"), prof, graph=graph, device_map="*=cpu")
    assert c.kinds == ["cpu", "cpu", "cpu"]
    assert c.links[("gpu:0", "gpu:1")].latency_s == 0.0 and c.links[("cpu:0", "gpu:0")].bandwidth_bytes_per_s >= 1e18
    g2 = apply_profile(graph, prof)
    # Everything on "gpu:1" (really the CPU) now costs the measured CPU times (only the
    # optimizer update, priced at the device's unmeasured memory bandwidth, differs).
    on_gpu1 = envs.simulate(g2, [2] * graph.num_ops, c)
    on_cpu0 = envs.simulate(g2, [0] * graph.num_ops, c)
    from envs.sim.cost import update_times_s

    total = np.zeros(c.num_devices)
    total[:] = graph.param_bytes.sum()
    update = update_times_s(total, c)
    # the ops cost the same measured times on both; only the optimizer update may differ
    assert abs(on_gpu1.step_time_s - on_cpu0.step_time_s) <= abs(update[2] - update[0]) + 1e-9
    uncalibrated = envs.simulate(g2, [2] * graph.num_ops, envs.Cluster.preset("k80x2"))
    assert uncalibrated.step_time_s < 0.5 * on_gpu1.step_time_s  # a K80 would be much faster than this CPU


# ------------------------------------------------------------ in context
def test_in_context_profile_measures_the_whole_step(profiled):
    graph, prof = profiled
    cpu = prof["devices"]["cpu"]
    assert prof["settings"]["method"] == "context" and cpu["method"] == "context"
    assert cpu["update_bytes"] == graph.param_bytes.sum() == ((64 + 1) * 256 + 2 * 256 + (256 + 1) * 8) * 4
    assert cpu["update_s"] > 0 and cpu["overhead_s"] >= 0 and cpu["step_s"] > 0
    assert set(cpu["phases_s"]) == {"zero_grad", "forward", "loss", "backward", "optimizer"}
    assert 0 <= cpu["probe_s"]["forward"] < 1e-3 and 0 <= cpu["probe_s"]["backward"] < 1e-3
    assert cpu["clock"] == ("thread" if torch.get_num_threads() == 1 else "wall")


@pytest.fixture(scope="module")
def mid_profile():
    """A model whose step (tens of ms) outlasts a busy machine's preemptions (a few ms)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 16))
    x = torch.randn(256, 512)
    return capture(model, (x,)), profile_model(model, (x,), ["cpu"], warmup=1, repeats=5)


@pytest.mark.slow
def test_in_context_parts_add_up_to_the_measured_phases(mid_profile):
    graph, prof = mid_profile
    cpu = prof["devices"]["cpu"]
    fwd, bwd = np.array(cpu["fwd_s"]), np.array(cpu["bwd_s"])
    ph = cpu["phases_s"]
    # The per-op intervals partition the probed steps' forward and backward (less the
    # probes' micro-benchmarked cost); the clean steps, phase by phase, alternate with
    # them in the same second; all are medians of 5. So before scaling to the clean
    # phases they agree far better than a factor of 2 (~5-15% here), while losing the
    # backward's intervals or counting them twice would not (then the factor is 1.0).
    assert 0.5 < cpu["scale"]["forward"] < 2.0 and cpu["scale"]["forward"] != 1.0
    assert 0.5 < cpu["scale"]["backward"] < 2.0 and cpu["scale"]["backward"] != 1.0
    parts = fwd.sum() + bwd.sum() + cpu["update_s"] + cpu["overhead_s"]
    assert parts == pytest.approx(sum(ph.values()), rel=1e-6)
    by_name = dict(zip(graph.names, zip(fwd, bwd)))
    # the big matmul owns much of the time, forward and backward
    big = by_name["linear_1"]
    assert big[0] > 0.2 * fwd.sum() and big[1] > 0.2 * bwd.sum()


@pytest.mark.slow
def test_isolated_method_times_op_by_op():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(4, 8)
    prof = profile_model(model, (x,), ["cpu"], warmup=0, repeats=1, method="isolated")
    cpu = prof["devices"]["cpu"]
    assert cpu["method"] == "isolated" and "update_s" not in cpu
    assert cpu["contention"]["windows"] == 1  # the host's probes repeat as often as the profile asks
    assert all(t > 0 for t in cpu["fwd_s"])
    with pytest.raises(PlacerError, match="context.*isolated"):
        profile_model(model, (x,), ["cpu"], method="guess")


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_the_model_is_copied_only_to_time_ops_alone_and_torch_s_copy_warns_nothing(monkeypatch):
    """In context (the CPU, a GPU) no op is timed alone, so the model is not copied (a large model's memory, twice);
    op by op it is, and torch's own copy of the program (a deprecated pytree spec inside torch) warns the user of
    nothing."""
    import copy
    import warnings

    from torch import fx

    copied, deepcopy = [], copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, *a: copied.append(isinstance(x, fx.GraphModule)) or deepcopy(x, *a))
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*LeafSpec", category=FutureWarning)
        profile_model(model, (x,), ["cpu"], warmup=0, repeats=1)
        assert not any(copied)
        profile_model(model, (x,), ["cpu"], warmup=0, repeats=1, method="isolated")
    assert any(copied)


def test_autograd_nodes_belong_to_the_first_op_that_reaches_them():
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    ops = []  # (op, its outputs' nodes) in forward order, as the probes record them
    h = torch.mm(x, w)
    ops.append(grad_fns(h))
    v = h.view(6)
    ops.append(grad_fns(v))
    r = torch.relu(v)
    ops.append(grad_fns(r))
    loss = r.mean()
    seen: dict = {}
    owned = [sorted(type(fn).__name__ for fn in autograd_nodes(heads, seen)) for heads in ops]
    rest = sorted(type(fn).__name__ for fn in autograd_nodes(grad_fns(loss), seen))
    # the parameter's gradient accumulation goes to its first consumer, each node to one op
    assert owned == [["AccumulateGrad", "MmBackward0"], ["ViewBackward0"], ["ReluBackward0"]]
    assert rest == ["MeanBackward0"]


def test_interval_attribution_on_a_synthetic_trace():
    # forward: three ops stamped at 1, 3, 6 us after the start; op 1 ran twice (two calls)
    t, n = attribute_intervals([0, 1, 1, -1], [1e-6, 2e-6, 3e-6, 0.5e-6], 2)
    assert t.tolist() == pytest.approx([0.5e-6, 1e-6, 5e-6]) and n.tolist() == [1, 1, 2]
    # backward from 10 to 20: autograd starts (1), the loss's node (4), op 1's nodes (2 + 2), op 0's (1)
    owners, secs = backward_intervals(10.0, [(-1, 11.0), (1, 15.0), (0, 17.0), (1, 18.0)], 20.0)
    bt, bn = attribute_intervals(owners, secs, 2)
    assert bt.tolist() == [5.0, 1.0, 4.0] and bt.sum() == 10.0 and bn.tolist() == [2, 1, 2]
    # each probe's cost comes off once per interval, never below zero
    assert remove_probe_cost(bt, bn, 0.5).tolist() == [4.0, 0.5, 3.0]
    assert remove_probe_cost(np.array([0.1, 2.0]), np.array([1, 1]), 0.5).tolist() == [0.0, 1.5]
    # then scaled to the phase timed without probes, unless that is off by more than 2x
    assert scale_to(bt, 12.0)[0].tolist() == pytest.approx([6.0, 1.2, 4.8])
    assert scale_to(bt, 30.0)[1] == 1.0


def test_measured_update_and_overhead_reach_the_simulated_step(profiled):
    graph, _ = profiled
    n = graph.num_ops
    prof = {
        "format": FORMAT,
        "graph_hash": graph.content_hash,
        "ops": list(graph.names),
        "devices": {
            "cpu": {
                "kind": "cpu",
                "fwd_s": [2e-4] * n,
                "bwd_s": [3e-4] * n,
                "update_s": 4e-3,
                "overhead_s": 1e-3,
                "update_bytes": int(graph.param_bytes.sum()),
            }
        },
        "links": [],
    }
    for preset in ("h200x1", "k80x2"):
        c = calibrate_cluster(envs.Cluster.preset(preset), prof, graph=graph, device_map="*=cpu")
        r = envs.simulate(apply_profile(graph, prof), [0] * n, c)
        # one device: the step is the ops (a backward only for those that have one), then the measured
        # update and the rest of the step
        with_bwd = int(grad_mask(graph).sum())
        assert r.step_time_s == pytest.approx(n * 2e-4 + with_bwd * 3e-4 + 4e-3 + 1e-3, rel=1e-9)
    # without the optional fields, the preset's bandwidth prices the update (as before)
    del prof["devices"]["cpu"]["update_s"]
    c = calibrate_cluster(envs.Cluster.preset("h200x1"), prof, graph=graph, device_map="*=cpu")
    assert c.devices[0].mem_bw_bytes_per_s == envs.Cluster.preset("h200x1").devices[0].mem_bw_bytes_per_s


# ------------------------------------------------------ in context, device
class _TickMarks:
    """A device timeline that only marks and sleeps move: each mark costs ``tick`` device seconds, a sleep its
    length rounded up to whole seconds (so the timeline stays exact in floating point)."""

    def __init__(self, tick: float) -> None:
        self.t, self.tick, self.slept = 0.0, tick, 0.0

    def mark(self) -> float:
        self.t += self.tick
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += math.ceil(seconds)
        self.slept += math.ceil(seconds)

    def elapsed(self, a: float, b: float) -> float:
        return b - a

    def sync(self) -> None:
        pass


@pytest.fixture(scope="module")
def small_program():
    from graphs.torch_capture import export_program, graph_from_program

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    ep = export_program(model, (torch.randn(8, 16),))
    return ep, graph_from_program(ep)


def test_device_probes_charge_no_op_for_the_sleeps_or_the_marks(small_program):
    """Kernel seconds come from the device timeline alone: a timeline that only the probes' own marks (1 s each)
    and the sleeps (100 s, every 2 probes) move gives every op 0 after the marks' measured cost is taken off."""
    from envs.real.profiler import device_mark_cost, profile_device_in_context

    ep, graph = small_program
    assert device_mark_cost(_TickMarks(1.0)) == 1.0
    marks = _TickMarks(1.0)
    r = profile_device_in_context(ep, graph, "cpu", marks=marks, warmup=1, repeats=2, every=2)
    assert marks.slept > 0 and r["probe_s"]["device_mark"] == 1.0
    zero = pytest.approx(0.0, abs=1e-9)  # the timeline's sums round in the last bits
    assert r["fwd_s"] == [zero] * graph.num_ops and r["bwd_s"] == [zero] * graph.num_ops
    assert r["outside_s"] == {"forward_kernels": zero, "backward_kernels": zero}
    # the clean step's phases in the timeline: one mark each, no sleeps
    assert list(r["device_phases_s"].values()) == [pytest.approx(1.0)] * 5 and r["update_s"] == pytest.approx(1.0)


def test_device_profile_on_the_host_timeline_adds_up(small_program):
    """With the host as the 'device' (HostMarks), both columns are real per-op seconds: every op is issued
    and runs, and the host issue times are scaled to the clean forward and backward."""
    from envs.real.profiler import HostMarks, profile_device_in_context

    ep, graph = small_program
    r = profile_device_in_context(ep, graph, "cpu", marks=HostMarks(), warmup=1, repeats=3)
    n = graph.num_ops
    for col in ("fwd_s", "bwd_s", "issue_fwd_s", "issue_bwd_s"):
        assert len(r[col]) == n and min(r[col]) >= 0.0
    assert sum(r["issue_fwd_s"]) > 0 and sum(r["fwd_s"]) > 0 and sum(r["bwd_s"]) > 0
    assert r["step_s"] > 0 and set(r["phases_s"]) == set(r["device_phases_s"]) == {
        "zero_grad",
        "forward",
        "loss",
        "backward",
        "optimizer",
    }
    if r["scale"]["forward"] != 1.0:  # scaled: the op columns and the outside interval make up the clean forward
        assert sum(r["issue_fwd_s"]) <= r["phases_s"]["forward"] * (1 + 1e-9)
    with pytest.raises(PlacerError, match="CUDA events"):
        profile_device_in_context(ep, graph, "cpu")  # no marks: only CUDA has events


def test_issue_columns_reach_the_simulator_through_a_profile(profiled):
    """A profile's issue_fwd_s/issue_bwd_s for a kind become the simulator's per-op issue times (cost.issue_times)."""
    from envs.sim import cost

    graph, prof = profiled
    n = graph.num_ops
    doc = json.loads(json.dumps(prof))
    doc["devices"]["cuda:0"] = fake_context_gpu(n)
    g = apply_profile(graph, doc)
    assert g.content_hash == graph.content_hash and np.allclose(g.profile["gpu"]["issue_bwd_s"], 4e-5)
    cluster = envs.Cluster.preset("h200x1")
    fwd, _ = cost.op_times(g, cluster)
    f, b = cost.issue_times(g, cluster, fwd)
    gpu = cluster.device_names.index("gpu:0")
    cpu = cluster.device_names.index("cpu:0")
    assert np.allclose(f[:, gpu], 3e-5) and np.allclose(b[:, gpu], 4e-5)  # views included: measured
    assert not f[:, cpu].any() and not b[:, cpu].any()  # the host runs its own ops
    bad = json.loads(json.dumps(doc))
    bad["devices"]["cuda:0"]["issue_bwd_s"] = [1.0] * (n - 1)
    with pytest.raises(PlacerError, match="issue_bwd_s"):
        check_profile(bad)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_frozen_layer_is_timed_with_no_weight_gradient_and_its_weights_are_not_the_optimizer_s():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    model[0].requires_grad_(False)  # a frozen first layer: the input takes no gradient, so it runs no backward
    model[2].requires_grad_(False)  # and the next: no gradient reaches it either
    x = torch.randn(64, 64)
    graph = capture(model, (x,))
    prof = profile_model(model, (x,), ["cpu"], warmup=1, repeats=3)
    cpu = prof["devices"]["cpu"]
    assert cpu["update_bytes"] == graph.param_bytes.sum() == (256 + 1) * 8 * 4  # the head's alone
    linear = [i for i, t in enumerate(graph.op_types) if t == "aten.linear.default"]
    bwd = np.array(cpu["bwd_s"])[linear]
    assert bwd[0] == 0 and bwd[1] == 0 and bwd[2] > 0
