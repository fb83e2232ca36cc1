"""The RL training loop: learning a known optimum, exact resume, SIGKILL safety, CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import envs
from graphs import OpGraph, save
from placer import Placement
from placer.cli import main
from placer.train import CachedScorer, TrainConfig, train


def two_chains(length: int = 4) -> OpGraph:
    """Two independent chains of heavy ops with tiny tensors: the optimum puts one per GPU."""
    names = [f"{c}{i}" for c in "ab" for i in range(length)]
    edges = [(f"{c}{i}", f"{c}{i + 1}", 1024) for c in "ab" for i in range(length - 1)]
    return OpGraph.from_edges(names, edges, flops=[2e11] * len(names), name="two-chains")


def _config(tmp_path, **kw) -> TrainConfig:
    base = dict(max_groups=0, samples=8, logdir=str(tmp_path / "run"), progress=False, heuristics=(), hidden=16)
    base.update(kw)
    return TrainConfig(**base)


def test_cached_scorer_scores_identical_rows_once():
    g = two_chains()
    c = envs.resolve_cluster("k80x2")
    score = CachedScorer(envs.SimEnv(g, c))
    idx = np.array([[1] * 8, [2] * 8, [1] * 8])
    t, failed = score(idx)
    assert score.evaluated == 2 and t[0] == t[2] and not failed.any()
    score(idx[:1])
    assert score.evaluated == 2


@pytest.mark.parametrize("algo", ["reinforce", "ppo"])
def test_learns_two_chains_from_scratch(tmp_path, algo):
    g = two_chains()
    c = envs.resolve_cluster("k80x2")
    # dataflow: 16 of the 3^8 placements are optimal (the chains may swap GPUs midway);
    # under eager only the 2 chain-per-GPU ones are (a cross-GPU copy synchronises both streams),
    # and PPO's 50 iterations stop at a neighbour (0.75 s).
    env = envs.SimEnv(g, c, executor="dataflow")
    optimum = float(env.step_times(np.array([[1] * 4 + [2] * 4]))[0][0])
    single = float(env.step_times(np.array([[1] * 8]))[0][0])
    assert optimum < 0.7 * single
    start = time.perf_counter()
    iterations = {"reinforce": 150, "ppo": 50}[algo]
    r = train(_config(tmp_path, iterations=iterations, warm_start="none", algo=algo, lr=0.02, executor="dataflow"),
              graph=g, cluster=c)
    assert r.best_step_time_s == pytest.approx(optimum, rel=1e-9)
    assert time.perf_counter() - start < 60
    p = Placement.load(os.path.join(r.logdir, "best_placement.json"))
    assert env.simulate(p).step_time_s == pytest.approx(r.best_step_time_s)
    assert p.meta["found_by"] in ("sample", "greedy") and p.meta["warm_start"] == "none"


@pytest.mark.parametrize("algo", ["reinforce", "ppo"])
def test_hierarchical_policy_trains_and_resumes(tmp_path, algo):
    from graphs.synthetic import random_dag

    g = random_dag(40, seed=2, name="rd40")
    c = envs.resolve_cluster("k80x2")
    cfg = dict(policy="hierarchical", max_groups=6, algo=algo, warm_start="none")
    r = train(_config(tmp_path, iterations=4, **cfg), graph=g, cluster=c)
    assert r.iterations == 4 and np.isfinite(r.best_step_time_s)
    assert envs.SimEnv(g, c).simulate(r.best_placement).step_time_s == pytest.approx(r.best_step_time_s)
    r2 = train(_config(tmp_path, iterations=6, resume=True, **cfg), graph=g, cluster=c)
    assert r2.iterations == 6 and r2.best_step_time_s <= r.best_step_time_s


def test_measured_env_needs_a_runnable_source(tmp_path, capsys):
    path = str(tmp_path / "g.json")
    save(two_chains(), path)
    rc = main(["train", path, "--cluster", "k80x2", "--env", "measured", "--iterations", "1", "--logdir", str(tmp_path / "r")])
    assert rc == 2 and "not runnable" in capsys.readouterr().err


def test_warm_start_reproduces_the_best_heuristic(tmp_path):
    g = two_chains()
    c = envs.resolve_cluster("k80x2")
    r = train(_config(tmp_path, iterations=1, heuristics=None, warm_start="best"), graph=g, cluster=c)
    bh = r.best_heuristic
    assert bh is not None and r.best_step_time_s <= bh[1] * (1 + 1e-9)
    assert "imitation of" in r.best_placement.meta["warm_start"]


def _params(logdir: str) -> dict:
    return torch.load(os.path.join(logdir, "checkpoint.pt"), weights_only=True)["policy"]


def test_resume_continues_exactly(tmp_path):
    g = two_chains()
    c = envs.resolve_cluster("k80x2")
    one = train(_config(tmp_path / "one", iterations=12, warm_start="none"), graph=g, cluster=c)
    train(_config(tmp_path / "two", iterations=5, warm_start="none"), graph=g, cluster=c)
    two = train(_config(tmp_path / "two", iterations=12, warm_start="none", resume=True), graph=g, cluster=c)
    assert two.iterations == one.iterations == 12
    assert two.best_step_time_s == one.best_step_time_s
    assert two.best_placement.assignment == one.best_placement.assignment
    pa, pb = _params(one.logdir), _params(two.logdir)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    sa = json.load(open(os.path.join(one.logdir, "checkpoint.json")))["run"]
    sb = json.load(open(os.path.join(two.logdir, "checkpoint.json")))["run"]
    assert sa["baseline"] == sb["baseline"]


def test_resume_without_checkpoint_is_a_user_error(tmp_path, capsys):
    g = two_chains()
    path = str(tmp_path / "g.json")
    save(g, path)
    rc = main(["train", path, "--cluster", "k80x2", "--iterations", "2", "--logdir", str(tmp_path / "none"), "--resume"])
    assert rc == 2 and "no checkpoint to resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "nope"], "--policy 'nope'"),
        (["--algo", "a2c"], "--algo 'a2c'"),
        (["--env", "cloud"], "--env 'cloud'"),
        (["--samples", "0"], "--samples 0"),
        (["--time-budget", "-1"], "--time-budget"),
        (["--cluster", "nosuch"], "nosuch"),
        (["--resume"], "--resume"),
        (["--device", "tpu:9"], "--device"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, capsys, args, message):
    g = two_chains()
    path = str(tmp_path / "g.json")
    save(g, path)
    argv = ["train", path, "--no-progress"] + (["--cluster", "k80x2"] if "--cluster" not in args else []) + args
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1


def test_cli_json_prints_best_step_time(tmp_path, capsys):
    g = two_chains()
    path = str(tmp_path / "g.json")
    save(g, path)
    rc = main(["train", path, "--cluster", "k80x2", "--iterations", "3", "--max-groups", "0", "--hidden", "16",
               "--logdir", str(tmp_path / "run"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["best_step_time_s"] > 0 and os.path.exists(doc["best_placement"])


@pytest.mark.slow
def test_sigkill_then_resume_never_loses_the_best(tmp_path):
    from graphs.synthetic import random_dag

    path = str(tmp_path / "g.json")
    save(random_dag(60, seed=3, name="rd60"), path)
    logdir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "placer", "train", path, "--cluster", "k80x4", "--max-groups", "0", "--hidden", "16",
           "--iterations", "100000", "--logdir", logdir, "--no-progress", "--warm-start", "none"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt = os.path.join(logdir, "checkpoint.json")
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(ckpt) and json.load(open(ckpt))["run"]["iteration"] >= 20):
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.5)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = Placement.load(os.path.join(logdir, "best_placement.json"))
    t_before = before.meta["step_time_s"]
    done = json.load(open(ckpt))["run"]["iteration"]
    rc = subprocess.run(cmd[:cmd.index("--iterations")] + ["--iterations", str(done + 5), "--logdir", logdir,
                        "--no-progress", "--resume", "--json"], env=env, capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    doc = json.loads(rc.stdout)
    assert doc["iterations"] == done + 5
    assert doc["best_step_time_s"] <= t_before


def test_cli_help_defaults_match_train_config():
    from placer.cli_train import HELP_DEFAULTS
    from placer.train import TrainConfig

    config = TrainConfig()
    assert {k: getattr(config, k) for k in HELP_DEFAULTS} == HELP_DEFAULTS


def test_warm_start_is_bounded_by_the_time_budget_and_its_placement_kept(tmp_path):
    """A budget too short for imitation to converge still ends with the warm-started placement."""
    from graphs.synthetic import random_dag

    g = random_dag(300, seed=3)
    c = envs.resolve_cluster("k80x4")
    config = _config(tmp_path, time_budget_s=0.3, heuristics=("m_topo",), warm_start="best",
                     warm_start_steps=100_000, warm_start_nll=0.0, max_groups=None)
    start = time.perf_counter()
    r = train(config, graph=g, cluster=c)
    # imitation may take half the budget; scoring and one iteration fit well within a few seconds
    assert time.perf_counter() - start < 30
    assert np.isfinite(r.best_step_time_s)
    assert os.path.exists(os.path.join(r.logdir, "best_placement.json"))
