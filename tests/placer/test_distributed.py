"""Plans across processes, end to end: ``placer run --nproc-per-node``, torch's launcher, gloo ranks on the CPU.

The model: a small language model whose output head is tied to its embedding, so
a plan that puts them on two ranks must sum the tied weight's gradient across them.
Bad input is one line and exit status 2, before any process starts where it can be
told there (ranks, graph, schedule), and after, for a rank that dies mid-step and a
rendezvous nobody serves. Tests that start processes are slow.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap

import numpy as np
import pytest

from envs.real.distributed.launch import free_port, launch
from graphs.plan import Placement
from placer.cli import main

MODEL_SRC = textwrap.dedent(
    """
    import os
    import torch
    import torch.nn.functional as F
    from torch import nn


    class TiedLM(nn.Module):  # forward returns the loss; the head is the embedding
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.body = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
            self.head = nn.Linear(16, 32, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids, labels):
            h = self.body(self.embed(ids)) + self.embed(ids)
            return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


    def build():
        torch.manual_seed(0)
        ids = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(1))
        return TiedLM(), (ids, ids.roll(1, dims=1))


    @torch.library.custom_op("placer_test::die_on_rank_1", mutates_args=())
    def die_on_rank_1(x: torch.Tensor) -> torch.Tensor:
        # the third call in the process of rank 1 ends it, as a crash of that machine would
        die_on_rank_1.calls = getattr(die_on_rank_1, "calls", 0) + 1
        if os.environ.get("RANK") == "1" and die_on_rank_1.calls >= 3:
            os._exit(7)
        return x.clone()


    @die_on_rank_1.register_fake
    def _(x):
        return torch.empty_like(x)


    die_on_rank_1.register_autograd(lambda ctx, grad: grad)


    class Dying(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x, y):
            return F.cross_entropy(self.b(die_on_rank_1(torch.relu(self.a(x)))), y)


    def dying():
        torch.manual_seed(0)
        return Dying(), (torch.randn(4, 8), torch.randint(0, 2, (4,)))


    class SharedTable(nn.Module):  # a table shared by the batch comes as an input (FLUX's position ids do)
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(32, 16), nn.Linear(16, 32)

        def forward(self, ids, labels, pos):
            h = torch.tanh(self.embed(ids) + pos)  # pos: (6, 16), one row a position, the same for every sequence
            return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


    def shared_table():
        torch.manual_seed(0)
        ids = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(1))
        return SharedTable(), (ids, ids.roll(1, dims=1), torch.randn(6, 16, generator=torch.Generator().manual_seed(2)))


    class Nodes(nn.Module):  # a graph network: node features, and an edge index that is not a batch of samples
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x, edges, y):
            h = torch.zeros_like(x).index_add_(0, edges[1], torch.relu(self.a(x)).index_select(0, edges[0]))
            return F.cross_entropy(self.b(h), y)


    def nodes():
        torch.manual_seed(0)
        return Nodes(), (torch.randn(8, 8), torch.randint(0, 8, (2, 24)), torch.randint(0, 2, (8,)))


    class RankAveraged(nn.Module):  # averages a statistic over data-parallel ranks where it finds a group (LFQ)
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x, y):
            import torch.distributed as dist
            import torch.distributed.nn as dist_nn

            h = torch.relu(self.a(x))
            stat = h.mean(0)
            if dist.is_initialized() and dist.get_world_size() > 1:
                stat = dist_nn.all_reduce(stat) / dist.get_world_size()
            return F.cross_entropy(self.b(h * stat), y)


    def rank_averaged():
        torch.manual_seed(0)
        return RankAveraged(), (torch.randn(4, 8), torch.randint(0, 2, (4,)))


    class Reverse(torch.autograd.Function):  # a gradient reversal: its backward is not its forward's gradient
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return -grad


    class Reversed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x, y):
            return F.cross_entropy(self.c(torch.tanh(self.b(Reverse.apply(torch.relu(self.a(x)))))), y)


    def reversed_model():
        torch.manual_seed(0)
        return Reversed(), (torch.randn(4, 8), torch.randint(0, 2, (4,)))


    class Twice(nn.Module):  # a spectral-normed layer applied to a real and a fake batch, as a GAN's discriminator
        def __init__(self):
            super().__init__()
            self.lin = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8))
            self.out = nn.Linear(8, 1)

        def forward(self, real, fake):
            return torch.relu(1 - self.out(torch.tanh(self.lin(real)))).mean() + self.out(self.lin(fake)).mean()


    def twice():
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        return Twice().train(), (torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g))


    class Siamese(nn.Module):  # one batch norm on two views, as a contrastive network's encoder
        def __init__(self):
            super().__init__()
            self.lin, self.bn, self.head = nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)

        def forward(self, a, b):
            return (self.head(self.bn(self.lin(a))) - self.head(self.bn(self.lin(b)))).pow(2).mean()


    class Dropped(nn.Module):  # dropout in training, and drop path (a bernoulli mask per sample)
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 1)
            self.drop = nn.Dropout(0.3)

        def forward(self, x, y):
            h = self.drop(torch.relu(self.a(x)))
            keep = torch.empty(x.shape[0], 1).bernoulli_(0.8) / 0.8  # drop path
            h = h + self.b(h) * keep
            return (self.c(self.drop(h)) - y).pow(2).mean()


    def dropped():
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        return Dropped().train(), (torch.randn(6, 8, generator=g), torch.randn(6, 1, generator=g))


    def siamese():
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        return Siamese().train(), (torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g) * 3 + 1)


    def script(placement_path, early_receives=None):
        # what a user's script does under torchrun: its own process group, placer's stages and schedule
        import torch.distributed as dist
        from graphs.plan import Placement
        from placer import distributed

        dist.init_process_group("gloo")
        model, inputs = build()
        stages, schedule = distributed.stages(
            model, Placement.load(placement_path), inputs, early_receives=early_receives
        )
        loss = schedule.step(*inputs)
        mine = schedule.named_parameters()
        ref, ref_inputs = build()
        ref(*ref_inputs).backward()
        worst = max(
            float((mine[name].grad - p.grad).abs().max() / p.grad.abs().max())
            for name, p in ref.named_parameters(remove_duplicate=False)
            if name in mine
        )
        out = {"rank": dist.get_rank(), "stages": [s.stage_index for s in stages], "worst": worst, "loss": loss}
        optimizer = torch.optim.Adam(schedule.parameters(), lr=1e-2)
        for _ in range(3):
            optimizer.zero_grad()
            schedule.step(*inputs)
            optimizer.step()
        dist.destroy_process_group()
        return out
    """
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory with the model module, and placements of it: a split over 2 devices (2 microbatches), a loop."""
    path = tmp_path_factory.mktemp("distributed")
    (path / "dist_model.py").write_text(MODEL_SRC)
    sys.path.insert(0, str(path))
    sys.modules.pop("dist_model", None)
    try:
        import dist_model

        from graphs.torch_capture import capture

        graph = capture(*dist_model.build())
        n = graph.num_ops
        devices = ["cpu:0", "gpu:0", "gpu:1"]
        split = np.where(np.arange(n) < n // 2, 1, 2)
        Placement.from_indices(graph, devices, split, cluster="k80x2", microbatches=2).save(path / "split.json")
        looped = np.array([1, 2])[(np.arange(n) * 4 // n) % 2]
        Placement.from_indices(graph, devices, looped, cluster="k80x2", microbatches=2, inflight=1).save(
            path / "looped.json"
        )
        # a V (ranks 0 1 1 0: the tied embedding and head both on rank 0), its second stage on gpu:1 cut at 3/4
        blocks = np.arange(n) * 4 // n
        v = np.array([1, 2, 2, 1])[blocks]
        turn = np.flatnonzero(blocks == 2)[:1]
        for name, M in (("zbv", 2), ("dualpipev", 4)):
            Placement.from_indices(
                graph, devices, v, cluster="k80x2", microbatches=M, schedule=name, stage_starts=turn
            ).save(path / f"{name}.json")
        yield path
    finally:
        sys.path.remove(str(path))


@pytest.fixture
def here(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    return workdir


def run_cli(capsys, *argv):
    rc = main(["run", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------ bad input, before any process
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc-per-node", "3"], "3 processes (1 x 3) for a plan on 2 devices (gpu:0, gpu:1)"),
        (["--nproc-per-node", "1"], "1 process (1 x 1) for a plan on 2 devices"),
        (["--nproc-per-node", "1", "--nnodes", "2"], "--nnodes 2: needs --rdzv-endpoint"),
        (["--rank-map", "gpu:0=1"], "--rank-map: runs across processes; add --nproc-per-node N"),
        (["--trace", "t.json"], "--trace: runs across processes; add --nproc-per-node N"),
        (["--nproc-per-node", "2", "--trace", "no/such/dir/t.json"], "--trace no/such/dir/t.json: directory"),
        (["--profile", "p.json"], "--profile: runs across processes; add --nproc-per-node N"),
        (["--nproc-per-node", "2", "--profile", "p.json"], "prices the simulated side of --trace; add --trace"),
        (["--nproc-per-node", "2", "--rank-map", "gpu:0=0"], "--rank-map: no rank for 'gpu:1'"),
        (["--nproc-per-node", "auto", "--rank-map", "gpu:0=0"], "--rank-map: no rank for 'gpu:1'"),  # auto: 2
        (["--nproc-per-node", "auto", "--nnodes", "2"], "--nproc-per-node auto: one process per device of the plan"),
    ],
)
def test_bad_input_across_processes_is_one_line(here, capsys, argv, message):
    rc, out, err = run_cli(capsys, "dist_model:build", "--placement", "split.json", "--cluster", "k80x2", *argv)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_a_count_of_processes_that_is_not_one_is_one_line(here, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(
            capsys, "dist_model:build", "--placement", "split.json", "--cluster", "k80x2", "--nproc-per-node", "two"
        )
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --nproc-per-node: 'two': a number of processes, or auto" in err
    assert err.count("\n") == 1, err


def test_nccl_ranks_need_the_cuda_devices_they_name(here, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    argv = ["--placement", "split.json", "--cluster", "k80x2", "--nproc-per-node", "2", "--backend", "nccl"]
    rc, out, err = run_cli(capsys, "dist_model:build", *argv)
    assert rc == 2 and "gpu:0 maps to cuda:0, which this machine does not have" in err and err.count("\n") == 1, err


def test_a_placement_made_for_another_model_is_one_line(here, capsys):
    doc = json.loads((here / "split.json").read_text())
    (here / "other.json").write_text(json.dumps({**doc, "graph_hash": "0123456789abcdef"}))
    rc, out, err = run_cli(
        capsys, "dist_model:build", "--placement", "other.json", "--cluster", "k80x2", "--nproc-per-node", "2"
    )
    assert rc == 2 and "made for graph" in err and err.count("\n") == 1, err


def test_a_schedule_that_does_not_fit_the_plan_is_one_line(here, capsys, tmp_path):
    doc = json.loads((here / "split.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps({**doc, "schedule": "interleaved_1f1b"}))
    argv = ["--placement", str(tmp_path / "p.json"), "--cluster", "k80x2", "--nproc-per-node", "2"]
    rc, out, err = run_cli(capsys, "dist_model:build", *argv)
    assert rc == 2 and "schedule 'interleaved_1f1b' runs several stages per rank" in err and err.count("\n") == 1


def test_a_plan_that_checkpoints_blocks_or_homes_parameters_is_refused_across_processes(here, capsys, tmp_path):
    doc = json.loads((here / "split.json").read_text())
    argv = ["--cluster", "k80x2", "--nproc-per-node", "2"]
    (tmp_path / "ck.json").write_text(json.dumps({**doc, "microbatches": 1, "checkpoint": ["0"]}))
    rc, out, err = run_cli(capsys, "dist_model:build", "--placement", str(tmp_path / "ck.json"), *argv)
    assert rc == 2 and "ck.json: checkpointed blocks run in one process" in err and err.count("\n") == 1, err


# ------------------------------------------------------------------ processes
@pytest.mark.slow
def test_auto_starts_one_process_per_device_the_plan_uses(here, capsys, tmp_path):
    """A plan that leaves one of the cluster's ranks idle (all on gpu:1 of k80x2, as ``train --ranks`` may find a
    model faster on fewer ranks) runs on one process with ``auto``, where ``2`` is refused."""
    doc = json.loads((here / "split.json").read_text())
    one = {**doc, "assignment": {op: "gpu:1" for op in doc["assignment"]}, "microbatches": 1}
    (tmp_path / "one.json").write_text(json.dumps(one))
    argv = ["dist_model:build", "--placement", str(tmp_path / "one.json"), "--cluster", "k80x2"]
    rc, out, err = run_cli(capsys, *argv, "--nproc-per-node", "2")
    assert rc == 2 and "2 processes (1 x 2) for a plan on 1 device (gpu:1)" in err, err
    rc, out, err = run_cli(
        capsys, *argv, "--nproc-per-node", "auto", "--steps", "2", "--warmup", "0", "--check", "--json"
    )
    assert rc == 0, out + err
    report = json.loads(out)
    assert report["check"]["ok"] and [(r["rank"], r["device"]) for r in report["ranks"]] == [(0, "gpu:1")]


@pytest.mark.slow
def test_two_processes_train_the_plan_and_check_every_gradient(here, capsys):
    rc, out, err = run_cli(
        capsys,
        "dist_model:build",
        "--placement",
        "split.json",
        "--cluster",
        "k80x2",
        "--nproc-per-node",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--check",
        "--trace",
        "trace.json",
        "--json",
    )
    report = json.loads(out)
    assert rc == 0, out + err
    assert report["check"]["ok"] and report["check"]["worst_ratio"] <= 1
    assert report["schedule"] == "gpipe" and report["microbatches"] == 2 and report["stages"] == 2
    assert [(r["rank"], r["device"], r["stages"]) for r in report["ranks"]] == [(0, "gpu:0", [0]), (1, "gpu:1", [1])]
    assert len(report["step_times_s"]) == 3 and report["step_time_s"] > 0
    assert report["spread_s"][0] <= report["step_time_s"] <= report["spread_s"][1]
    assert all(r["peak_bytes"] >= 0 for r in report["ranks"]) and len(report["losses"]) == 3
    # each rank's step in phases; the median step's actions, in GPipe's order (stage 0: F F B B, then its optimizer)
    for r in report["ranks"]:
        p = r["phases"]
        assert p["forward_s"] > 0 and p["backward_s"] > 0 and p["optimizer_s"] > 0 and p["other_s"] >= 0
        assert max(p["forward_s"], p["backward_s"], p["optimizer_s"], p["other_s"]) < p["step_s"]  # medians each
    events = report["timeline"]["events"]
    assert [(e[1], e[2], e[3]) for e in events if e[0] == 0] == [
        (0, "F", 0),
        (0, "F", 1),
        (0, "B", 0),
        (0, "B", 1),
        (-1, "O", -1),
    ]
    assert all(0 <= e[4] <= e[5] for e in events)
    # the same plan simulated on the cluster, and both timelines in the Chrome trace
    sim = report["simulated"]
    assert sim["cluster"] == "k80x2" and sim["step_time_s"] > 0 and [r["rank"] for r in sim["ranks"]] == [0, 1]
    trace = json.loads((here / "trace.json").read_text())
    rows = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert rows == {"measured rank 0", "measured rank 1", "simulated (k80x2) rank 0", "simulated (k80x2) rank 1"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in spans if e["pid"] < 1000) == sorted(e["name"] for e in spans if e["pid"] >= 1000)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_a_v_plan_runs_under_torchs_v_schedules_with_every_gradient(here, capsys, schedule):
    rc, out, err = run_cli(
        capsys, "dist_model:build", "--placement", f"{schedule}.json", "--cluster", "k80x2", "--nproc-per-node", "2"
    )
    assert rc == 0, out + err
    rc, out, err = run_cli(
        capsys,
        *("dist_model:build", "--placement", f"{schedule}.json", "--cluster", "k80x2", "--nproc-per-node", "2"),
        *("--steps", "2", "--warmup", "1", "--check", "--trace", f"{schedule}_trace.json", "--json"),
    )
    report = json.loads(out)
    assert rc == 0, out + err
    assert report["check"]["ok"] and report["schedule"] == schedule and report["stages"] == 4
    assert [(r["rank"], r["stages"]) for r in report["ranks"]] == [(0, [0, 3]), (1, [1, 2])]
    kinds = {e[2] for e in report["timeline"]["events"]}
    assert {"F", "I", "W"} <= kinds  # the backward split into its input and weight parts
    # the simulator of ranks ran the same actions: every stage's forwards, whole backwards, input and weight parts
    assert report["simulated"]["step_time_s"] > 0
    spans = [e for e in json.loads((here / f"{schedule}_trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    measured = sorted(e["name"] for e in spans if e["pid"] < 1000)
    assert measured == sorted(e["name"] for e in spans if e["pid"] >= 1000) and any(n.startswith("W") for n in measured)


@pytest.mark.slow
def test_a_rank_that_holds_no_parameters_trains_too(here, capsys):
    """More ranks than parameterised layers: a rank whose stage only computes the loss has nothing to step."""
    import dist_model

    from graphs.torch_capture import capture

    graph = capture(*dist_model.build())
    last = max(i for i in range(graph.num_ops) if graph.params[i])
    tail = np.where(np.arange(graph.num_ops) <= last, 1, 2)
    Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], tail, cluster="k80x2").save("tail.json")
    argv = ["--placement", "tail.json", "--cluster", "k80x2", "--nproc-per-node", "2", "--steps", "2", "--json"]
    rc, out, err = run_cli(capsys, "dist_model:build", *argv)
    assert rc == 0, out + err
    assert [r["device"] for r in json.loads(out)["ranks"]] == ["gpu:0", "gpu:1"]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "interleaved_zb"])
def test_an_input_shared_by_the_batch_goes_whole_to_every_microbatch_across_processes(here, capsys, schedule):
    """An input whose dimension 0 is not the batch's (a table of positions) is not cut into the microbatches, as in
    one process: torch's schedule would cut every tensor input. Its gradients equal the one-process step's."""
    import dist_model

    from graphs.torch_capture import capture

    graph = capture(*dist_model.shared_table())
    n = graph.num_ops
    split = np.where(np.arange(n) < n // 2, 1, 2)
    if schedule == "gpipe":
        plan = Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], split, cluster="k80x2", microbatches=2)
    else:  # two stages a rank, weight gradients put off
        looped = np.array([1, 2])[(np.arange(n) * 4 // n) % 2]
        plan = Placement.from_indices(
            graph, ["cpu:0", "gpu:0", "gpu:1"], looped, cluster="k80x2", microbatches=2, schedule=schedule
        )
    plan.save("shared.json")
    argv = ["--placement", "shared.json", "--cluster", "k80x2", "--nproc-per-node", "2", "--steps", "2", "--check"]
    rc, out, err = run_cli(capsys, "dist_model:shared_table", *argv, "--json")
    assert rc == 0, out + err
    report = json.loads(out)
    assert report["check"]["ok"] and report["microbatches"] == 2, report["check"]


@pytest.mark.slow
def test_a_rank_that_dies_mid_step_is_one_line(here, capsys):
    import dist_model

    from graphs.torch_capture import capture

    dying = capture(*dist_model.dying())
    Placement.from_indices(dying, ["cpu:0", "gpu:0", "gpu:1"], [1, 1, 2, 2, 2], cluster="k80x2").save("dying.json")
    rc, out, err = run_cli(
        capsys, "dist_model:dying", "--placement", "dying.json", "--cluster", "k80x2", "--nproc-per-node", "2"
    )
    assert rc == 2 and "rank 1 died (exit code 7)" in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_plan_of_microbatches_on_inputs_that_are_not_a_batch_fails_across_ranks_in_one_line_naming_them(here, capsys):
    # torch's stage wraps the IndexError in a RuntimeError whose first line is empty: the line once said only that
    import dist_model

    from graphs.torch_capture import capture

    graph = capture(*dist_model.nodes())
    split = np.where(np.arange(graph.num_ops) < graph.num_ops // 2, 1, 2)
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], split, cluster="k80x2", microbatches=2)
    plan.save("nodes.json")
    argv = ["--placement", "nodes.json", "--cluster", "k80x2", "--nproc-per-node", "2", "--steps", "1"]
    rc, out, err = run_cli(capsys, "dist_model:nodes", *argv)
    assert rc == 2 and err.count("\n") == 1, err
    assert re.search(r"rank \d failed: the model failed on a microbatch \(IndexError: index out of range", err), err
    assert "inputs 1, 3 (of size 8 there" in err and "input 2 whole" in err


@pytest.mark.slow
def test_a_model_that_looks_for_data_parallel_ranks_is_built_and_captured_as_one_process_s(here, capsys):
    """The ranks' process group is the pipeline's: a model that would average over data-parallel ranks where it
    finds one must not see it (its capture failed on the collective; its reference on rank 0 would wait for rank
    1)."""
    _checked_on_two_ranks(capsys, "rank_averaged", lambda graph: graph.num_ops // 2 - 1)


def _checked_on_two_ranks(capsys, builder: str, last_on_first) -> dict:
    """``dist_model.<builder>``'s model split after op ``last_on_first(graph)``, 2 steps on two ranks with
    ``--check``: it must run and match the one-process step; returns the check's report."""
    import dist_model

    from graphs.torch_capture import capture

    graph = capture(*getattr(dist_model, builder)())
    split = np.where(np.arange(graph.num_ops) <= last_on_first(graph), 1, 2)
    Placement.from_indices(graph, ["cpu:0", "gpu:0", "gpu:1"], split, cluster="k80x2").save(f"{builder}.json")
    argv = ["--placement", f"{builder}.json", "--cluster", "k80x2", "--nproc-per-node", "2", "--steps", "2"]
    rc, out, err = run_cli(capsys, f"dist_model:{builder}", *argv, "--check", "--json")
    assert rc == 0, out + err
    assert json.loads(out)["check"]["ok"], json.loads(out)["check"]
    return json.loads(out)["check"]


@pytest.mark.slow
def test_a_model_s_own_autograd_function_trains_on_its_own_backward_across_ranks(here, capsys):
    """Each rank exports the model itself, so it holds the kept call the stage's op names (graphs.custom_functions);
    the check compares with the eager step, whose backward is the function's."""
    # the function's output crosses to the other rank
    _checked_on_two_ranks(
        capsys, "reversed_model", lambda graph: graph.op_types.index("placer.autograd_function.default")
    )


@pytest.mark.slow
def test_a_buffer_written_in_place_twice_in_a_forward_stays_in_one_stage_and_the_step_is_one_process_s(here, capsys):
    """Spectral norm applied to a real and a fake batch: the second power iteration writes, in place, the vectors the
    first wrote. A plan split between the two (node order) would write the second stage's copy and lose the update
    (it was refused); the stage cut now brings the second iteration up to the first, in stage 0, and the step
    matches the one-process one."""
    _checked_on_two_ranks(capsys, "twice", lambda graph: graph.names.index("wrap_with_set_grad_enabled_1") - 2)


@pytest.mark.slow
def test_a_batch_norm_on_two_views_updates_its_statistics_as_one_process_does_across_ranks(here, capsys):
    """One batch norm applied to two views, the plan split between them: each rank would update its own copy of the
    running statistics once, and neither would hold the step's. ``--check`` compares the buffers after the step too
    (it failed on ``bn.running_mean`` with the cut's rule removed); the cut keeps both updates in one stage."""
    _checked_on_two_ranks(capsys, "siamese", lambda graph: graph.names.index("batch_norm_1") - 1)


@pytest.mark.slow
def test_a_step_with_dropout_and_drop_path_gets_a_verdict_across_ranks_with_every_unit_kept(here, capsys):
    """Each rank's check step and the one-process reference hold their draws at their likeliest values: dropout
    keeps every unit, drop path every path (it said UNCHECKED before: each run drew its own masks)."""
    check = _checked_on_two_ranks(capsys, "dropped", lambda graph: graph.num_ops // 2)
    assert check["fixed"] and not check["draws"]


@pytest.mark.slow
def test_a_rendezvous_nobody_serves_is_one_line(here, capsys):
    endpoint = f"127.0.0.1:{free_port()}"
    argv = ["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint]
    rc, out, err = run_cli(
        capsys, "dist_model:build", "--placement", "split.json", "--cluster", "k80x2", *argv, "--rdzv-timeout", "2"
    )
    assert rc == 2 and f"--rdzv-endpoint {endpoint}: no rendezvous within 2s" in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_torchrun_script_gets_its_stages_and_the_one_process_gradients(here, monkeypatch):
    """placer.distributed.stages in a user's script, as torchrun starts it: a looped plan (2 stages per rank), its
    receives posted early (each rank gets two streams from the other: their tags keep them apart)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    import dist_model

    out = launch(dist_model.script, (str(here / "looped.json"), True), nproc_per_node=2)
    assert [out[r]["stages"] for r in (0, 1)] == [[0, 2], [1, 3]]
    assert out[0]["worst"] < 1e-4 and out[1]["worst"] < 1e-4
    assert out[0]["loss"] is None and out[1]["loss"] > 0  # the loss is on the last stage's rank


def test_the_text_report_says_step_time_spread_memory_and_check(capsys):
    import argparse

    from placer.cli.run_ranks import print_report

    report = {
        "step_time_s": 0.012,
        "step_times_s": [0.011, 0.012, 0.019],
        "schedule": "gpipe",
        "stages": 2,
        "microbatches": 1,
        "stage_table": ["stage 0  gpu:0    rank 0      3 ops  a .. b", "stage 1  gpu:1    rank 1      3 ops  c .. d"],
        "ranks": [
            {"rank": 0, "device": "gpu:0", "torch_device": "cpu", "stages": [0], "peak_bytes": 7_000_000},
            {"rank": 1, "device": "gpu:1", "torch_device": "cpu", "stages": [1], "peak_bytes": 9_000_000},
        ],
        "losses": [1.5, 1.25],
        "check": {"ok": False, "loss_error": 1e-8, "grad_error": 0.5, "worst": "head.weight", "worst_ratio": 12.0},
    }
    print_report(argparse.Namespace(source="m:build"), report)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "m:build across 2 processes (gpipe, 2 stages, 1 microbatch): step time 12.00 ms (median of 3; min 11.00, "
        "max 19.00)"
    )
    assert lines[3].split() == ["rank", "device", "torch", "stages", "peak", "memory"]
    assert lines[5].split() == ["1", "gpu:1", "cpu", "1", "0.009", "GB"]
    assert lines[6] == "loss 1.5000 -> 1.2500"
    assert lines[7].startswith("check against one process: FAIL") and "worst tensor head.weight at 12.00x" in lines[7]
    drew = {**report, "check": {**report["check"], "ok": False, "draws": True}}
    print_report(argparse.Namespace(source="m:build"), drew)  # a Poisson draw: two draws compared, no verdict
    assert capsys.readouterr().out.splitlines()[7].startswith("check against one process: UNCHECKED: the step draws")
    kept = {**report, "check": {**report["check"], "ok": True, "fixed": ["bernoulli_"]}}  # dropout, every unit kept
    print_report(argparse.Namespace(source="m:build"), kept)
    assert (
        capsys.readouterr()
        .out.splitlines()[7]
        .startswith(
            "check against one process (random draws held at their likeliest values: dropout keeps every unit): ok"
        )
    )
    why = "the model's float64 copy, the check's reference, fails (RuntimeError at m.py:7: ...)"
    print_report(argparse.Namespace(source="m:build"), {**report, "check": {"ok": False, "unchecked": why}})
    assert capsys.readouterr().out.splitlines()[7] == f"check against one process: UNCHECKED: {why}"
    mixed = {**report, "check": {**report["check"], "ok": True, "accumulated": 2}}  # batch norm in 2 microbatches
    print_report(argparse.Namespace(source="m:build"), mixed)
    assert (
        capsys.readouterr()
        .out.splitlines()[7]
        .startswith(
            "check against one process (its gradient accumulation over 2 microbatches, the step the plan computes): ok"
        )
    )
    one = {**report, "ranks": report["ranks"][:1], "stages": 1, "stage_table": report["stage_table"][:1]}
    print_report(argparse.Namespace(source="m:build"), one)  # a plan on one rank (a stage merged away)
    assert capsys.readouterr().out.startswith("m:build across 1 process (gpipe, 1 stage, 1 microbatch): ")


def test_the_text_report_puts_each_ranks_phases_beside_the_simulated(capsys):
    import argparse

    from placer.cli.run_ranks import print_report

    def ph(f, b, o, other):
        return {"forward_s": f, "backward_s": b, "optimizer_s": o, "other_s": other, "step_s": f + b + o + other}

    report = {
        "step_time_s": 0.012,
        "step_times_s": [0.012],
        "schedule": "1f1b",
        "stages": 2,
        "microbatches": 4,
        "stage_table": [],
        "ranks": [
            {
                "rank": 0,
                "device": "cpu:0",
                "torch_device": "cpu",
                "stages": [0],
                "peak_bytes": 0,
                "phases": ph(0.002, 0.004, 0.001, 0.005),
            },
            {
                "rank": 1,
                "device": "cpu:1",
                "torch_device": "cpu",
                "stages": [1],
                "peak_bytes": 0,
                "phases": ph(0.003, 0.006, 0.0005, 0.0015),
            },
        ],
        "losses": [],
        "check": None,
        "simulated": {"cluster": "ranks", "ranks": [{"rank": 0, "phases": ph(0.001, 0.002, 0.001, 0.002)}]},
    }
    print_report(argparse.Namespace(source="m:build"), report)
    lines = capsys.readouterr().out.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("each rank's step, ms"))
    assert "simulated on ranks after the /" in lines[at]
    assert lines[at + 1].split() == ["rank", "forward", "backward", "optimizer", "other", "step"]
    assert lines[at + 2].split() == "0 2.0 / 1.0 4.0 / 2.0 1.0 / 1.0 5.0 / 2.0 12.0 / 6.0".split()
    assert lines[at + 3].split() == "1 3.0 / - 6.0 / - 0.5 / - 1.5 / - 11.0 / -".split()
    del report["simulated"]
    print_report(argparse.Namespace(source="m:build"), report)
    lines = capsys.readouterr().out.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("each rank's step, ms"))
    assert lines[at + 2].split() == "0 2.0 4.0 1.0 5.0 12.0".split()


def test_check_compares_a_plan_of_microbatches_of_a_step_that_mixes_its_batch_with_gradient_accumulation():
    """A job's ``--check`` reference: the whole batch's step, unless the plan has microbatches and the step mixes
    the samples of its batch (batch norm in training), where it is gradient accumulation over the same parts."""
    import types

    import torch
    from torch import nn

    from envs.real.conformance import plan_reference

    def check_reference(model, inputs, plan):  # as the job's rank 0 asks it
        return plan_reference(model, inputs, plan.microbatches, plan.loss_reduction)

    class Normed(nn.Module):
        def __init__(self, norm: nn.Module):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(6, 8), norm, nn.Linear(8, 1))

        def forward(self, x, y):
            return nn.functional.mse_loss(self.seq(x).squeeze(-1), y)

    torch.manual_seed(0)
    inputs = (torch.randn(8, 6), torch.randn(8))
    plan = types.SimpleNamespace(microbatches=2, loss_reduction="mean")
    assert check_reference(Normed(nn.BatchNorm1d(8)), inputs, plan).microbatches == 2
    assert check_reference(Normed(nn.LayerNorm(8)), inputs, plan).microbatches == 1  # per sample: the whole batch
    plan.microbatches = 1
    assert check_reference(Normed(nn.BatchNorm1d(8)), inputs, plan).microbatches == 1
