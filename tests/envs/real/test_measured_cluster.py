"""Measured mode on a real two-node Ray cluster with token authentication, as a user runs it.

The user's module lives in a directory that only the driver has on its path: the
workers get it through the job's runtime environment. One node is killed in the
middle of a run; nothing measured is lost and the run goes on with the other.
The cluster (``ray.cluster_utils.Cluster``: a head and a second node, 1 CPU each,
with their own token and their own Ray temp dir) is started once for the module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

from ray._private.authentication_test_utils import reset_auth_token_state  # noqa: E402, PLC2701
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import envs  # noqa: E402
from envs.real.measured import LOG_NAME, MeasuredEnv, Worker  # noqa: E402
from placer.cli.train import summary  # noqa: E402
from placer.learn.config import TrainConfig  # noqa: E402
from placer.learn.runners import train  # noqa: E402
from tests.conftest import RAY_UNNICED  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MODULE = f"placer_user_model_{uuid.uuid4().hex[:8]}"  # a name nothing else on any path has

USER_MODULE = """
import os
import torch
from torch import nn


class Net(nn.Module):  # forward returns the training loss, as placer train --env measured needs
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.body(x).pow(2).mean()


def build():
    with open(os.environ["PLACER_TEST_IMPORTS"], "a") as f:  # where each process imported this module from
        f.write(f"{os.getpid()} {os.path.abspath(__file__)}\\n")
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 16),)
"""


class StallingWorker(Worker):
    """Measures as a worker does, a little slowly (0.3 s per placement); on the node its control file names, after
    ``after`` measurements, it writes ``marker`` and stalls, so that the node is killed mid-measurement.

    The control file: ``$PLACER_TEST_CONTROL``, JSON ``{"node", "after", "marker"}`` (the nodes inherit the variable).
    """

    measured = 0

    def _steps(self, *args, **kwargs):
        control_file = Path(os.environ["PLACER_TEST_CONTROL"])
        control = json.loads(control_file.read_text()) if control_file.exists() else {}
        self.measured += 1
        if control.get("node") == self.node and self.measured > control["after"]:
            Path(control["marker"]).write_text(str(os.getpid()))
            time.sleep(120)
        time.sleep(0.3)
        return super()._steps(*args, **kwargs)


class StallingEnv(MeasuredEnv):
    worker_cls = StallingWorker


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")
    saved = {
        k: os.environ.get(k)
        for k in (
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
            "RAY_TMPDIR",
            "PLACER_TEST_IMPORTS",
            "PLACER_TEST_CONTROL",
        )
    }
    private = Path(tempfile.mkdtemp(prefix="plc", dir="/tmp"))  # short: Ray's socket paths fit under it
    (private / "token").write_text(uuid.uuid4().hex * 2)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(private / "token"),
        RAY_TMPDIR=str(private),
        PLACER_TEST_IMPORTS=str(private / "imports.txt"),
        PLACER_TEST_CONTROL=str(private / "control.json"),
    )
    # (the nodes inherit these)
    reset_auth_token_state()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    fast_health = {
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
        "health_check_initial_delay_ms": 0,
        **RAY_UNNICED,
    }
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_health}
    )
    second = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    c.private, c.second = private, second
    yield c
    c.shutdown()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    reset_auth_token_state()
    shutil.rmtree(private, ignore_errors=True)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("only-the-driver")
    (d / f"{MODULE}.py").write_text(USER_MODULE)
    return d


def test_a_wrong_token_is_one_line(cluster, user_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_AUTH_TOKEN="0" * 64, PYTHONPATH=os.pathsep.join([str(user_dir), str(REPO)]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "placer",
            "train",
            f"{MODULE}:build",
            "--env",
            "measured",
            "--ray-address",
            cluster.address,
            "--cluster",
            "k80x2",
            "--device-map",
            "*=cpu",
            "--iterations",
            "1",
            "--logdir",
            str(tmp_path / "run"),
            "--no-progress",
        ],  # the error alone on stderr (else the capture's progress lines come first)
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"placer: error: --ray-address {cluster.address}: the Ray cluster refused the authentication token from "
        "RAY_AUTH_TOKEN (not the cluster's token: copy the head node's ~/.ray/auth_token here, or set RAY_AUTH_TOKEN "
        "or RAY_AUTH_TOKEN_PATH)"
    ]


def _nodes_see(cluster, module: str) -> dict[str, bool]:
    """Node id -> whether a process there can import ``module`` without the job's runtime environment."""
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        can_import = ray.remote(num_cpus=0)(lambda m: __import__("importlib.util").util.find_spec(m) is not None)
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        refs = [
            can_import.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(module)
            for n in nodes
        ]
        return dict(zip(nodes, ray.get(refs)))
    finally:
        ray.shutdown()


def _kill_when_stalled(cluster, marker: Path, log: Path, killed: dict) -> threading.Thread:
    """A thread that removes the second node once its worker stalls mid-measurement, noting the log as it was."""

    def kill() -> None:
        while not marker.exists():
            time.sleep(0.05)
        killed["log"] = log.read_text()
        cluster.remove_node(cluster.second)
        killed["at"] = time.time()

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_run_on_two_nodes_survives_losing_one(cluster, user_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(user_dir))  # the driver's path only
    seen = _nodes_see(cluster, MODULE)
    assert len(seen) == 2 and not any(seen.values())  # no node can import the module by itself
    monkeypatch.delenv("RAY_AUTH_MODE")  # the driver turns token authentication on by itself (its token is at hand)
    reset_auth_token_state()
    logdir, marker = tmp_path / "run", tmp_path / "stalled"
    (cluster.private / "imports.txt").write_text("")
    control = cluster.private / "control.json"
    control.write_text(json.dumps({"node": cluster.second.node_id, "after": 1, "marker": str(marker)}))
    killed: dict = {}
    killer = _kill_when_stalled(cluster, marker, logdir / LOG_NAME, killed)
    config = TrainConfig(
        source=f"{MODULE}:build",
        cluster="k80x2",
        env="measured",
        ray_address=cluster.address,
        device_map="*=cpu",
        workers=2,
        iterations=3,
        samples=2,
        heuristics=("single", "m_etf", "round_robin"),
        measure_heuristics=2,
        warm_start="none",
        logdir=str(logdir),
        progress=False,
        hidden=8,
    )
    env = StallingEnv(
        config.source,
        envs.resolve_cluster("k80x2"),
        ray_address=cluster.address,
        workers=2,
        device_map="*=cpu",
        run_dir=logdir,
        warmup_steps=1,
        timed_steps=2,
        start_timeout_s=120,
        measure_timeout_s=200,
    )
    try:
        result = train(config, graph=env.graph, cluster=env.cluster, env=env)
        workers_left = [a for a in env._actors if a is not None] + list(env._starting)  # no replacement pending
    finally:
        env.close()
        control.unlink()
    killer.join(timeout=1)
    records = [json.loads(line) for line in (logdir / LOG_NAME).read_text().splitlines()]
    nodes = [r["result"]["extra"]["node"] for r in records]
    assert "at" in killed, f"the second node was never killed; measurements by node: {nodes}"
    # measurements landed on both nodes; after the kill, only on the head
    assert set(nodes) == {cluster.head_node.node_id, cluster.second.node_id}
    assert all(
        r["result"]["extra"]["node"] == cluster.head_node.node_id for r in records if r["time_unix"] > killed["at"]
    )
    # nothing measured is lost; the measurement cut by the kill was taken again, not failed; the run finished
    assert (logdir / LOG_NAME).read_text().startswith(killed["log"]) and len(records) > killed["log"].count("\n")
    assert all(r["result"]["status"] == "ok" for r in records)
    assert result.iterations == 3 and "measuring with 1 worker(s)" in capsys.readouterr().err and len(workers_left) == 1
    # every worker imported the shipped copy of the module, not the driver's file
    imports = [line.split(" ", 1) for line in (cluster.private / "imports.txt").read_text().splitlines()]
    workers = [path for pid, path in imports if int(pid) != os.getpid()]
    assert len(workers) >= 2 and all("runtime_resources" in p and str(user_dir) not in p for p in workers), workers
    # the summary compares measured with measured
    doc = result.to_dict()
    assert doc["best_heuristic_source"] == "measured" and doc["measured_heuristics"]
    lines = summary(doc).splitlines()
    assert lines[0].split("  ")[2] == "measured" and "  measured  (" in lines[1]
    assert "than it" in lines[1] or "as fast as it" in lines[1]
