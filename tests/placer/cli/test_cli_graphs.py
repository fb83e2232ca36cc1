"""``placer graphs``, ``placer export`` and ``placer inspect``: real runs and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import envs
import graphs
from envs.sim import bound, cost
from graphs import zoo
from graphs.ir import OpGraph
from graphs.synthetic import random_dag
from placer.cli import main
from placer.cli.inspect import summarize
from tests.conftest import importable_module

USER_MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(32, 64)
            self.b = nn.Linear(64, 10)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))


    def build():
        return Net(), (torch.randn(16, 32),)


    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x


    def branchy():
        return Branchy(), (torch.randn(3),)
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in the user's working directory; returns its (unique) name."""
    name = f"usermod_{tmp_path.name}"
    importable_module(tmp_path, monkeypatch, name, USER_MODULE)
    yield name
    sys.modules.pop(name, None)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_export_user_module_from_its_directory(tmp_path):
    (tmp_path / "mymod.py").write_text(USER_MODULE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "placer", "export", "mymod:build", "-o", "g.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("wrote g.json: Net, 3 ops, 2 edges")
    g = graphs.load(tmp_path / "g.json")
    assert g.names == ["linear", "relu", "linear_1"]
    assert g.total_param_bytes == (32 * 64 + 64 + 64 * 10 + 10) * 4
    assert g.total_flops == 2 * 16 * 32 * 64 + 16 * 64 + 2 * 16 * 64 * 10


def test_export_json_and_inspect(user_module, capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "export", f"{user_module}:build", "-o", "g.json", "--json")
    assert rc == 0
    info = json.loads(out)
    assert info["ops"] == 3 and info["hash"] == graphs.load(tmp_path / "g.json").content_hash
    rc, out, _ = run_cli(capsys, "inspect", "g.json", "--json")
    s = json.loads(out)
    assert rc == 0 and s["ops"] == 3 and s["critical_path"]["ops"] == ["linear", "relu", "linear_1"]
    assert {r["type"]: r["count"] for r in s["op_types"]} == {"aten.linear.default": 2, "aten.relu.default": 1}
    rc, out, _ = run_cli(capsys, "inspect", "g.json")
    assert rc == 0 and "critical path 3 ops" in out and "aten.linear.default" in out


FROZEN_MODULE = """
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    net[0].requires_grad_(False)  # a frozen backbone, a trainable head
    return net, (torch.randn(16, 32),)
"""


def test_inspect_says_which_parameters_are_frozen(tmp_path, monkeypatch, capsys):
    importable_module(tmp_path, monkeypatch, "frozenmod", FROZEN_MODULE)
    assert run_cli(capsys, "export", "frozenmod:build", "-o", "g.json")[0] == 0
    rc, out, _ = run_cli(capsys, "inspect", "g.json")
    line = next(x for x in out.splitlines() if x.startswith("parameters"))
    assert line == (
        "parameters   2.54 KiB trainable (+ 8.25 KiB buffers and 2 frozen parameters: no gradient, no optimizer state)"
    ), line
    rc, out, _ = run_cli(capsys, "inspect", "g.json", "--json")
    s = json.loads(out)
    assert (s["param_bytes"], s["buffer_bytes"], s["frozen_params"]) == ((64 * 10 + 10) * 4, (32 * 64 + 64) * 4, 2)


def test_export_pt2_with_decompose(user_module, capsys, tmp_path):
    from graphs.sources import load_callable
    from graphs.torch_capture import export_program

    model, inputs = load_callable(f"{user_module}:build")
    torch.export.save(export_program(model, inputs), tmp_path / "net.pt2")
    rc, out, err = run_cli(capsys, "export", "net.pt2", "-o", "core.json", "--decompose")
    assert rc == 0, err
    g = graphs.load(tmp_path / "core.json")
    assert "aten.addmm.default" in g.op_types and g.meta["decomposed"] is True


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placer: error: "), err
    return lines[0]


def test_unimportable_module_callable(user_module, capsys):
    rc, _, err = run_cli(capsys, "export", "no_such_mod_xyz:build", "-o", "g.json")
    assert rc == 2 and "no_such_mod_xyz:build: cannot import module" in one_line_error(err)
    rc, _, err = run_cli(capsys, "export", f"{user_module}:missing", "-o", "g.json")
    assert rc == 2 and "has no attribute 'missing'" in one_line_error(err)


def test_model_that_cannot_be_exported(user_module, capsys):
    rc, _, err = run_cli(capsys, "export", f"{user_module}:branchy", "-o", "g.json")
    line = one_line_error(err)
    assert rc == 2 and f"data-dependent control flow at {user_module}.py:" in line
    assert not os.path.exists("g.json")


def test_missing_and_bad_files(user_module, capsys, tmp_path):
    for argv in (["inspect", "missing.json"], ["export", "missing.pt2", "-o", "g.json"]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and "missing" in one_line_error(err) and "no such file" in err
    (tmp_path / "trunc.json").write_text('{"format": "placer-graph/1", "ops": {')
    rc, _, err = run_cli(capsys, "inspect", "trunc.json")
    assert rc == 2 and "trunc.json: not valid JSON" in one_line_error(err)
    rc, _, err = run_cli(capsys, "export", f"{user_module}:build", "-o", "g.txt")
    assert rc == 2 and "g.txt: output must end in .json" in one_line_error(err)
    rc, _, err = run_cli(capsys, "export", f"{user_module}:build", "-o", "nodir/g.json")
    assert rc == 2 and "does not exist" in one_line_error(err)


def test_graphs_lists_zoo_with_progress(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(zoo, "graph", lambda name, decompose=False: random_dag(40 + len(name), seed=3, name=name))
    rc, out, err = run_cli(capsys, "graphs", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["name"] for r in rows] == zoo.names()
    assert rows[0]["ops"] == 40 + len("rnnlm") and rows[0]["params"] == zoo.num_params("rnnlm")
    assert "capturing rnnlm" in err
    rc, out, _ = run_cli(capsys, "graphs")
    assert rc == 0 and out.splitlines()[0].split()[:3] == ["name", "ops", "edges"] and "nmt-4" in out


def test_critical_path_by_time_and_views_excluded():
    # a -> c, b -> c, c -> v (a free view): the path goes through the heavier b.
    # (Times were a nominal-V100 roofline before; they are the simulator's now.)
    g = OpGraph.from_edges(
        ["a", "b", "c", "v"],
        [("a", "c", 4), ("b", "c", 4), ("c", "v", 4)],
        flops=[1e9, 5e9, 2e9, 0.0],
        out_bytes=[4, 4, 1 << 20, 1 << 20],
    )
    g.meta["alias_ops"] = ["v"]
    fwd, bwd = cost.op_times(g, envs.Cluster.preset("k80x2"))
    t = fwd.min(axis=1) + bwd.min(axis=1)
    assert t[3] == 0.0 and t[1] > t[0]
    s = summarize(g, envs.Cluster.preset("k80x2"))
    assert s["critical_path"]["ops"] == ["b", "c"]
    assert s["activation_bytes"] == 4 + 4 + (1 << 20) and s["view_ops"] == 1
    assert s["critical_path"]["flops"] == 7e9 and s["parallelism"] == pytest.approx(t.sum() / t[[1, 2]].sum())


@pytest.mark.parametrize("name", ["k80x2", "v100x4"])
def test_inspect_figures_are_the_simulators(name):
    g = random_dag(60, seed=4)
    c = envs.Cluster.preset(name)
    env = envs.SimEnv(g, c)
    fmin, bmin = env.fwd_s.min(axis=1), env.bwd_s.min(axis=1)
    s = summarize(g, c)
    assert s["cluster"] == {"name": name, "devices": c.device_names}
    assert s["critical_path"]["est_time_s"] == bound.critical_path_s(g, fmin, bmin)
    assert s["est_total_time_s"] == pytest.approx(float((fmin + bmin).sum()), rel=1e-12)
    assert s["lower_bound_s"] == envs.lower_bound(g, c)
    # the path is a real forward chain whose times add up to the critical path's
    ops = [g.index[x] for x in s["critical_path"]["ops"]]
    assert env.simulate([1] * g.num_ops).step_time_s >= s["lower_bound_s"]
    assert sum(fmin[ops]) + sum(bmin[ops]) >= s["critical_path"]["est_time_s"] * (1 - 1e-12)


def test_inspect_names_its_cluster(capsys, tmp_path):
    graphs.save(random_dag(30, seed=2), tmp_path / "g.json")
    rc, out, _ = run_cli(capsys, "inspect", str(tmp_path / "g.json"), "--json")
    assert rc == 0 and json.loads(out)["cluster"]["name"] == "k80x2"  # the first preset
    rc, out, _ = run_cli(capsys, "inspect", str(tmp_path / "g.json"), "--cluster", "h100x8", "--json")
    s = json.loads(out)
    assert rc == 0 and s["cluster"]["name"] == "h100x8"
    assert s["lower_bound_s"] == envs.lower_bound(graphs.load(tmp_path / "g.json"), envs.Cluster.preset("h100x8"))
    rc, out, _ = run_cli(capsys, "inspect", str(tmp_path / "g.json"), "--cluster", "h100x8")
    assert rc == 0 and "on h100x8" in out
    rc, _, err = run_cli(capsys, "inspect", str(tmp_path / "g.json"), "--cluster", "nope")
    assert rc == 2 and "nope" in one_line_error(err)


# ---------------------------------------------------------------- slow: the real zoo
@pytest.mark.slow
def test_graphs_and_export_on_real_zoo(zoo_cache, capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "graphs", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rc == 0 and set(rows) == set(zoo.names())
    assert rows["nmt-4"]["ops"] > rows["nmt-2"]["ops"] > 1000
    rc, out, _ = run_cli(capsys, "export", "nmt-2", "-o", str(tmp_path / "nmt2.json"))
    assert rc == 0 and graphs.load(tmp_path / "nmt2.json").content_hash == rows["nmt-2"]["hash"]
    rc, out, _ = run_cli(capsys, "inspect", "nmt-2", "--json")
    s = json.loads(out)
    assert rc == 0 and s["hash"] == rows["nmt-2"]["hash"] and s["parallelism"] > 1.0
