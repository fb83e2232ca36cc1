"""``--executor eager|dataflow`` on placer simulate, compare and train, and "executor" in their JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

import envs
import graphs
from graphs.plan import Placement
from graphs.synthetic import random_dag
from placer.cli import main
from placer.compare import compare
from placer.learn.config import TrainConfig
from placer.learn.run_scorers import sim_env as _sim_env


@pytest.fixture
def files(tmp_path):
    g = random_dag(60, seed=4, name="rand")
    gpath = tmp_path / "g.json"
    graphs.save(g, gpath)
    c = envs.Cluster.preset("k80x4")
    place = np.random.default_rng(0).integers(0, c.num_devices, g.num_ops)
    ppath = tmp_path / "p.json"
    Placement.from_indices(g, c.device_names, place).save(ppath)
    return g, c, place, str(gpath), str(ppath)


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_executor(capsys, files):
    g, c, place, gpath, ppath = files
    docs = {}
    for ex in ("eager", "dataflow"):
        rc, out, _ = run(capsys, "simulate", gpath, ppath, "--cluster", "k80x4", "--executor", ex, "--json")
        docs[ex] = json.loads(out)
        assert rc == 0 and docs[ex]["executor"] == ex and docs[ex]["extra"]["executor"] == ex
        assert docs[ex]["step_time_s"] == envs.simulate(g, place, c, executor=ex).step_time_s
    rc, out, _ = run(capsys, "simulate", gpath, ppath, "--cluster", "k80x4", "--json")
    assert json.loads(out)["executor"] == "eager" and json.loads(out)["step_time_s"] == docs["eager"]["step_time_s"]
    assert docs["eager"]["step_time_s"] != docs["dataflow"]["step_time_s"]
    rc, out, _ = run(capsys, "simulate", gpath, ppath, "--cluster", "k80x4", "--executor", "dataflow")
    assert rc == 0 and "dataflow executor" in out
    rc, _, err = run(capsys, "simulate", gpath, ppath, "--cluster", "k80x4", "--executor", "tf")
    assert rc == 2 and "--executor 'tf'" in err and len(err.strip().splitlines()) == 1


def test_compare_executor(capsys, files):
    g, c, place, gpath, ppath = files
    for ex in ("eager", "dataflow"):
        rc, out, _ = run(
            capsys,
            "compare",
            gpath,
            "--cluster",
            "k80x4",
            "--methods",
            "round_robin,m_topo",
            "--placement",
            ppath,
            "--executor",
            ex,
            "--json",
        )
        doc = json.loads(out)
        assert rc == 0 and doc["executor"] == ex
        row = next(r for r in doc["rows"] if r["kind"] == "placement")
        assert row["step_time_s"] == envs.simulate(g, place, c, executor=ex).step_time_s
    report = compare(g, c, methods=["round_robin"], executor="dataflow")
    assert report.executor == "dataflow" and report.to_dict()["executor"] == "dataflow"
    rc, _, err = run(capsys, "compare", gpath, "--cluster", "k80x4", "--methods", "round_robin", "--executor", "x")
    assert rc == 2 and "--executor 'x'" in err and len(err.strip().splitlines()) == 1


def test_train_config_executor(files):
    g, c, *_ = files
    assert TrainConfig().executor == "eager"
    assert _sim_env(TrainConfig(executor="dataflow"), g, c, "").executor == "dataflow"
    assert _sim_env(TrainConfig(), g, c, "").executor == "eager"
    with pytest.raises(graphs.PlacerError, match="--executor 'tf'"):
        TrainConfig(executor="tf", iterations=1).validate()


def test_train_cli_executor(tmp_path, capsys, files):
    _, _, _, gpath, _ = files
    rc, out, _ = run(
        capsys,
        "train",
        gpath,
        "--cluster",
        "k80x4",
        "--iterations",
        "1",
        "--samples",
        "2",
        "--max-groups",
        "0",
        "--hidden",
        "8",
        "--warm-start",
        "none",
        "--executor",
        "dataflow",
        "--logdir",
        str(tmp_path / "run"),
        "--json",
        "--no-progress",
    )
    assert rc == 0 and json.loads(out)["executor"] == "dataflow"
    rc, _, err = run(
        capsys, "train", gpath, "--cluster", "k80x4", "--iterations", "1", "--executor", "tf", "--no-progress"
    )
    assert rc == 2 and "--executor 'tf'" in err and len(err.strip().splitlines()) == 1
