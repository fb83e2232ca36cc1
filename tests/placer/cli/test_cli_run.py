"""``placer run`` and ``placer profile`` end to end on the CPU."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from envs.real.allocator import thread_cache_off, trim_malloc
from envs.real.profiler import load_profile
from graphs.plan import Placement
from placer.apply import apply
from placer.cli import main
from tests.conftest import importable_module
from tests.envs.real.test_profiler import fake_context_gpu

MODEL_SRC = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Net(nn.Module):  # forward returns the training loss, as `placer run` needs
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.seq(x), y)

    def build():
        torch.manual_seed(0)
        return Net(), (torch.randn(8, 16), torch.randint(0, 4, (8,)))

    def logits():
        torch.manual_seed(0)
        return Net().seq, (torch.randn(8, 16),)

    class NodeNet(nn.Module):  # a graph network: each node's features summed over the edges into it
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 4)

        def forward(self, x, edges, y):
            h = torch.zeros_like(x).index_add_(0, edges[1], x.index_select(0, edges[0]))
            return nn.functional.cross_entropy(self.lin(h), y)

    def nodes():
        torch.manual_seed(0)
        return NodeNet(), (torch.randn(8, 16), torch.randint(0, 8, (2, 24)), torch.randint(0, 4, (8,)))

    def dropped():  # build's net with dropout after its batch norm, in training
        net, inputs = build()
        net.seq.insert(3, nn.Dropout(0.2))
        return net, inputs

    def unnormed():  # build's net without its batch norm: a mean of per-sample losses
        net, inputs = build()
        net.seq[1] = nn.Identity()
        return net, inputs
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    importable_module(tmp_path, monkeypatch, "cli_run_model", MODEL_SRC)
    import cli_run_model

    from graphs.torch_capture import capture

    graph = capture(*cli_run_model.build())
    op_devices = np.random.default_rng(0).integers(0, 3, size=graph.num_ops)
    Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], op_devices, cluster="k80x2").save(tmp_path / "p.json")
    return tmp_path


def run_on_cpu(*argv: str, placement: str = "p.json", source: str = "cli_run_model:build") -> int:
    """``placer run`` of ``source`` on ``placement`` (cluster k80x2), every logical device on the CPU."""
    return main(["run", source, "--placement", placement, "--cluster", "k80x2", "--device-map", "*=cpu", *argv])


def test_run_json_reports_step_time_and_peaks(workdir, capsys):
    rc = run_on_cpu("--steps", "3", "--warmup", "1", "--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "ok" and out["source"] == "measured"
    assert 0 < out["step_time_s"] == statistics.median(out["extra"]["step_times_s"])  # no wall-clock limit
    assert len(out["extra"]["step_times_s"]) == 3
    assert set(out["peak_bytes"]) <= {"cpu:0", "gpu:0", "gpu:1"}
    assert out["extra"]["device_map"]["gpu:1"] == "cpu"


def test_run_times_its_steps_as_the_measured_envs_do(workdir, capsys, monkeypatch):
    """The collector held off and glibc's malloc kept steady (envs.real.timing.Protocol's defaults)."""
    import envs.real.timing

    seen, measure = [], envs.real.timing.measure_steps
    monkeypatch.setattr(
        envs.real.timing, "measure_steps", lambda *a, **k: seen.append(k["protocol"]) or measure(*a, **k)
    )
    assert run_on_cpu("--steps", "2", "--warmup", "0", "--json") == 0
    assert seen == [envs.real.timing.Protocol()] and seen[0].steady_malloc and seen[0].gc_off


def test_run_text_output(workdir, capsys):
    rc = run_on_cpu("--steps", "2")
    text = capsys.readouterr().out
    assert rc == 0 and "step time" in text and "peak memory" in text and "gpu:1" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cluster", "h200x1", "--device-map", "*=cpu"], "not in cluster h200x1"),
        (["--cluster", "k80x2", "--device-map", "gpu:0"], "LOGICAL=TORCH_DEVICE"),
        (["--cluster", "k80x2", "--device-map", "*=cpu", "--steps", "0"], "--steps 0"),
        (["--cluster", "nowhere"], "nowhere"),
    ],
)
def test_run_bad_input_exits_2_with_one_line(workdir, capsys, argv, message):
    rc = main(["run", "cli_run_model:build", "--placement", "p.json", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def _placed(workdir, builder: str, name: str, homes: bool = False) -> str:
    """A placement of ``cli_run_model.<builder>``'s graph over gpu:0 and gpu:1, alternating by op, saved as ``name``;
    ``homes``: the first op's parameters homed on the host."""
    import cli_run_model

    from graphs.torch_capture import capture

    graph = capture(*getattr(cli_run_model, builder)())
    n = graph.num_ops
    Placement.from_indices(
        graph,
        ["cpu:0", "gpu:0", "gpu:1"],
        1 + np.arange(n) % 2,
        cluster="k80x2",
        homes=[0] + [-1] * (n - 1) if homes else None,
    ).save(workdir / name)
    return name


def test_run_check_in_one_process_compares_the_placed_step_with_the_unplaced_one(workdir, capsys, monkeypatch):
    """``--check`` without processes: one step of the placed model (batch norm's statistics, dropout held at its
    likeliest) against the float64 unplaced step, then the timed steps; exit 1 where it fails."""
    placement = _placed(workdir, "dropped", "d.json")
    rc = run_on_cpu("--steps", "2", "--check", placement=placement, source="cli_run_model:dropped")
    out = capsys.readouterr().out.splitlines()
    assert rc == 0 and out[-1].startswith(
        "check against the unplaced step (random draws held at their likeliest values: dropout keeps every unit): ok"
    ), out
    rc = run_on_cpu("--steps", "2", "--check", "--json")
    check = json.loads(capsys.readouterr().out)["extra"]["check"]
    assert rc == 0 and check["ok"] and not check["fixed"] and check["worst_ratio"] <= 1
    # the placed step drawing its own dropout masks (its draws not held) is another step: the check fails
    import contextlib

    import envs.real.fixed_draws

    monkeypatch.setattr(envs.real.fixed_draws, "fixed_draws", lambda: contextlib.nullcontext(set()))
    rc = run_on_cpu("--steps", "2", "--check", placement="d.json", source="cli_run_model:dropped")
    assert rc == 1 and capsys.readouterr().out.splitlines()[-1].startswith("check against the unplaced step (")


def test_run_check_in_one_process_compares_a_homed_parameters_gradient_at_home(workdir, capsys, monkeypatch):
    """A plan whose first op's parameters live on the host, stepped during the backward: the check's step sends their
    gradients home, where they are compared (no warning of a missing optimizer: none steps the check's step); a
    gradient that does not come home right fails the check."""
    name = _placed(workdir, "build", "h.json", homes=True)
    plan = Placement.load(workdir / name)
    plan.host_step = "backward"
    plan.save(workdir / name)
    rc = run_on_cpu("--steps", "2", "--check", "--json", placement=name)
    captured = capsys.readouterr()
    check = json.loads(captured.out)["extra"]
    assert rc == 0 and check["check"]["ok"] and check["host_steps"]["stepped"] >= 1, captured.err
    assert "no optimizer is registered" not in captured.err
    import envs.real.homes

    add_home = envs.real.homes.HomeRuntime._add_home
    monkeypatch.setattr(envs.real.homes.HomeRuntime, "_add_home", lambda self, i, grad: add_home(self, i, 2 * grad))
    rc = run_on_cpu("--steps", "1", "--check", placement=name)
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and out[-1].startswith("check against the unplaced step: FAIL") and "seq.0." in out[-1], out


def test_run_without_the_gpus_it_needs_says_so(workdir, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = main(["run", "cli_run_model:build", "--placement", "p.json", "--cluster", "k80x2"])
    err = capsys.readouterr().err
    assert rc == 2 and "does not have" in err and "--device-map" in err


def test_run_refuses_a_placement_of_another_graph(workdir, capsys):
    doc = json.loads((workdir / "p.json").read_text())
    doc["graph_hash"] = "0123456789abcdef"
    (workdir / "other.json").write_text(json.dumps(doc))
    rc = run_on_cpu(placement="other.json")
    assert rc == 2 and "made for graph 0123456789abcdef" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_writes_a_loadable_profile(workdir, capsys):
    rc = main(["profile", "cli_run_model:build", "--devices", "cpu", "-o", "prof.json", "--repeats", "2", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["ops"] > 0 and summary["devices"]["cpu"]["fwd_s"] > 0
    prof = load_profile(workdir / "prof.json")
    p = Placement.load(workdir / "p.json")
    assert prof["graph_hash"] == p.graph_hash  # the same capture as the placement's graph
    rc = main(["profile", "cli_run_model:build", "--devices", "cpu,warp:9", "-o", "x.json"])
    assert rc == 2 and "--devices" in capsys.readouterr().err
    # compare takes it too (and refuses a profile of another graph)
    rc = main(
        [
            "compare",
            "cli_run_model:build",
            "--cluster",
            "h200x1",
            "--methods",
            "single,m_etf",
            "--profile",
            "prof.json",
            "--json",
        ]
    )
    assert rc == 0 and {r["method"] for r in json.loads(capsys.readouterr().out)["rows"]} >= {"single", "m_etf"}
    doc = json.loads((workdir / "prof.json").read_text())
    doc["graph_hash"] = "0" * 16
    (workdir / "other.json").write_text(json.dumps(doc))
    rc = main(
        ["compare", "cli_run_model:build", "--cluster", "h200x1", "--methods", "single", "--profile", "other.json"]
    )
    assert rc == 2 and "other.json" in capsys.readouterr().err


@pytest.mark.slow  # placer run in a fresh interpreter, started twice (~5-10 s)
@pytest.mark.skipif(not trim_malloc(), reason="glibc only")
def test_the_placer_command_measures_in_its_own_process_with_the_thread_cache_off(workdir, capsys, monkeypatch):
    """A one-process `placer run` times steps with glibc's thread cache off, as in the processes placer starts to
    measure in: the command starts itself again with it. A caller of main keeps its process as it is."""
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)  # the cache on as the command starts
    run = ["run", "cli_run_model:build", "--placement", "p.json", "--cluster", "k80x2", "--device-map", "*=cpu"]
    run += ["--warmup", "0", "--steps", "1", "--json"]
    command = [sys.executable, "-m", "placer", *run]
    out = subprocess.run(command, cwd=workdir, env=os.environ, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["extra"]["thread_cache_off"] is True  # its stdout once, from the process measured
    assert main(run) == 0 and json.loads(capsys.readouterr().out)["extra"]["thread_cache_off"] is thread_cache_off()


class _StartedAgain(Exception):
    pass


@pytest.mark.slow  # a profile and a run in this process (~3 s)
def test_placer_profile_and_run_start_again_once_their_arguments_are_checked(workdir, capsys, monkeypatch):
    """`placer profile` and a one-process `placer run`, as the `placer` command, start themselves again (the
    thread cache off; the restart itself: the test above, and tests/envs/real/test_allocator.py) with their own
    command line, after their arguments are checked (a bad one is still one line, status 2) and before they build
    anything; `placer run --nproc-per-node` measures in the processes it launches, and a caller of main never."""
    import envs.real.allocator as allocator
    from placer.cli import args

    started = []

    def start_again(argv):
        started.append(argv)
        raise _StartedAgain

    monkeypatch.setattr(allocator, "start_again_with_thread_cache_off", start_again)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "placer", "the", "command"])
    profile = ["profile", "cli_run_model:build", "-o", "prof.json", "--warmup", "0", "--repeats", "1"]
    run = ["run", "cli_run_model:build", "--placement", "p.json", "--cluster", "k80x2", "--device-map", "*=cpu"]
    assert main(profile) == 0 and main([*run, "--steps", "1"]) == 0 and not started  # not the placer command
    monkeypatch.setitem(args.CONSOLE, "command", True)
    for argv in (profile, run):
        with pytest.raises(_StartedAgain):
            main(argv)
        assert started.pop() == [sys.executable, "-m", "placer", "the", "command"]
    assert main([*run, "--steps", "0"]) == 2 and main([*profile, "--repeats", "0"]) == 2 and not started
    capsys.readouterr()


def test_run_steps_past_measure_timeout_are_a_timeout_result(workdir, capsys, monkeypatch):
    import time

    import envs.real.timing

    def hang(*args, **kwargs):
        time.sleep(120)

    monkeypatch.setattr(envs.real.timing, "measure_steps", hang)
    rc = run_on_cpu("--measure-timeout", "0.5", "--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["status"] == "timeout" and "0.5s" in out["message"]


def test_run_memory_error_in_a_step_is_oom(workdir, capsys, monkeypatch):
    import envs.real.timing

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(envs.real.timing, "measure_steps", no_memory)
    rc = run_on_cpu("--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["status"] == "oom" and "MemoryError" in out["message"]


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_run_bad_measure_timeout_exits_2_with_one_line(workdir, capsys, value):
    rc = run_on_cpu("--measure-timeout", value)
    err = capsys.readouterr().err
    assert rc == 2 and "--measure-timeout" in err and err.count("\n") == 1


@pytest.mark.slow
def test_profile_prints_a_gpus_issue_times(workdir, capsys, monkeypatch):
    """A GPU profiled in context has the host's issue time beside its kernels': the summary shows both."""
    import envs.real.profiler as profiler

    real = profiler.profile_model

    def with_a_gpu(model, inputs, devices, **kw):
        doc = real(model, inputs, ["cpu"], **kw)
        n = len(doc["ops"])
        doc["devices"]["cuda:0"] = fake_context_gpu(n)
        return doc

    monkeypatch.setattr(profiler, "profile_model", with_a_gpu)
    assert main(["profile", "cli_run_model:build", "--devices", "cpu", "-o", "gpu.json", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    n = len(load_profile(workdir / "gpu.json")["ops"])
    assert f"issue   {n * 3e-5 * 1e3:10.2f} ms" in out and out.count("(host, sum over ops)") == 1  # the GPU only
    assert (
        main(["profile", "cli_run_model:build", "--devices", "cpu", "-o", "gpu.json", "--repeats", "2", "--json"]) == 0
    )
    gpu = json.loads(capsys.readouterr().out)["devices"]["cuda:0"]
    assert gpu["issue_bwd_s"] == pytest.approx(n * 4e-5)


def test_run_refuses_a_model_that_returns_no_scalar_loss_in_one_line(workdir, capsys):
    # a stand-in loss (the mean of the logits) once trained it toward nothing and printed "loss ... -> ..." with rc 0
    import cli_run_model

    from graphs.torch_capture import capture

    graph = capture(*cli_run_model.logits())
    Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], [1] * graph.num_ops, cluster="k80x2").save("l.json")
    rc = run_on_cpu(placement="l.json", source="cli_run_model:logits")
    out, err = capsys.readouterr()
    assert rc == 2 and "loss" not in out and len(err.strip().splitlines()) == 1
    assert "returns a float32 tensor of shape [8, 4], not a scalar loss" in err and "Traceback" not in err


@pytest.mark.parametrize("inflight", [None, 1])
def test_a_plan_of_microbatches_on_inputs_that_are_not_a_batch_is_one_line_naming_the_inputs(workdir, capsys, inflight):
    # a graph's nodes cut in two parts, its edge index given whole to each: an IndexError deep in the program
    import cli_run_model

    from graphs.torch_capture import capture

    graph = capture(*cli_run_model.nodes())
    extra = {} if inflight is None else {"inflight": inflight}
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], [1] * graph.num_ops, microbatches=2, **extra)
    plan.save("m.json")
    rc = run_on_cpu(placement="m.json", source="cli_run_model:nodes")
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("placer: error: cli_run_model:nodes with m.json: the model failed on a microbatch (IndexErr")
    assert "inputs 1, 3 (of size 8 there" in err and "input 2 whole" in err and "microbatches=1" in err
    # placer.apply's module raises what the model raised, with the line as a note on its traceback
    model, inputs = cli_run_model.nodes()
    placed = apply(model, plan, inputs, device_map="*=cpu")
    with pytest.raises(IndexError) as e:
        placed(*inputs).backward()
    assert e.value.__notes__ == ["placer: " + err.split("m.json: ", 1)[1].strip()]


@pytest.mark.slow
def test_a_plan_of_microbatches_warns_where_the_step_mixes_the_samples_of_its_batch(workdir, capsys, monkeypatch):
    # batch norm in training: each microbatch normalised by its own statistics, gradients not the whole batch's
    import cli_run_model

    import placer.distributed
    from graphs.torch_capture import capture

    for source, M, warned in [("build", 2, True), ("build", 1, False), ("unnormed", 2, False)]:
        graph = capture(*getattr(cli_run_model, source)())
        plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], [1] * graph.num_ops, microbatches=M)
        plan.save("m.json")
        rc = run_on_cpu("--steps", "1", "--warmup", "0", placement="m.json", source=f"cli_run_model:{source}")
        out, err = capsys.readouterr()
        assert rc == 0 and "step time" in out, err
        line = f"cli_run_model:{source} with m.json: warning: the step mixes the samples of its batch: its loss on"
        assert (line in err) == warned and err.count("\n") == warned, err
        assert ("a plan of 2 microbatches computes what mixes them" in err) == warned
    # where the plan is made and where plans are compared
    for source, warned in [("build", True), ("unnormed", False)]:
        argv = ["place", f"cli_run_model:{source}", "--cluster", "k80x2", "--method", "gpipe", "-o", "g.json"]
        assert main([*argv, "--option", "microbatches=2"]) == 0
        err = capsys.readouterr().err
        assert (f"cli_run_model:{source} with g.json: warning: the step mixes the samples" in err) == warned, err
    argv = ["compare", "cli_run_model:build", "--cluster", "k80x2", "--methods", "heft", "--no-progress"]
    assert main([*argv, "--microbatches", "1,2"]) == 0
    assert "cli_run_model:build with --microbatches 1,2: warning: the step mixes" in capsys.readouterr().err
    assert main(argv) == 0 and "warning" not in capsys.readouterr().err
    argv = ["train", "cli_run_model:build", "--cluster", "k80x2", "--iterations", "1", "--no-progress"]
    assert main([*argv, "--microbatches", "2", "--logdir", "t2"]) == 0
    assert "cli_run_model:build with --microbatches 2: warning: the step mixes" in capsys.readouterr().err
    assert main([*argv, "--logdir", "t1"]) == 0 and "warning" not in capsys.readouterr().err
    # across processes too, before the ranks start (here they are not started)
    graph = capture(*cli_run_model.build())
    half = [1] * (graph.num_ops // 2) + [2] * (graph.num_ops - graph.num_ops // 2)
    Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], half, microbatches=2).save("r.json")
    monkeypatch.setattr(placer.distributed, "run", lambda *a, **k: None)
    rc = run_on_cpu("--nproc-per-node", "2", placement="r.json")
    out, err = capsys.readouterr()
    assert rc == 0 and "cli_run_model:build with r.json: warning: the step mixes the samples" in err, err


def test_export_names_the_stand_in_loss_and_train_env_measured_refuses_the_model(workdir, capsys):
    rc = main(["export", "cli_run_model:logits", "-o", "l.json"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.startswith("wrote l.json")
    assert (
        len(err.strip().splitlines()) == 1
        and "not a scalar loss" in err
        and "stand-in loss, the sum of the means" in err
    )
    rc = main(
        [
            "train",
            "cli_run_model:logits",
            "--cluster",
            "k80x2",
            "--env",
            "measured",
            "--iterations",
            "1",
            "--no-progress",
            "--logdir",
            "run",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--env measured" in err and "not a scalar loss" in err
    assert main(["export", "cli_run_model:build", "-o", "b.json"]) == 0 and capsys.readouterr().err == ""
