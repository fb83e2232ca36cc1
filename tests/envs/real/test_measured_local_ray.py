"""The local Ray that MeasuredEnv starts: loopback only, token authentication, session files kept in the run dir."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from envs import Cluster  # noqa: E402
from envs.real.measured import MeasuredEnv  # noqa: E402

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def tiny_builder():
    import torch
    from torch import nn

    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),)


@pytest.fixture(scope="module")
def env():
    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")
    run_dir = tempfile.mkdtemp(prefix="plr", dir="/tmp")  # short: Ray's sockets fit under it
    e = MeasuredEnv(
        tiny_builder,
        Cluster.preset("k80x2"),
        workers=1,
        device_map="*=cpu",
        warmup_steps=0,
        timed_steps=1,
        run_dir=run_dir,
    )
    e.start()  # starts the local Ray, one worker, builds the model
    yield e
    e.close()


def _ray_processes():
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def test_local_ray_listens_on_loopback_only(env):
    listening = []
    for proc in _ray_processes():
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        listening += [(proc.name(), c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 3, listening  # at least the GCS, the raylet and the worker
    assert {ip for _, ip, _ in listening} <= LOOPBACK, listening


def test_session_files_are_under_the_run_dir(env):
    ray_dir = os.path.join(env.run_dir, "ray")
    assert any(name.startswith("session_") for name in os.listdir(ray_dir))
    assert env._ray_tmp is None  # no private temp dir was needed


def test_a_client_without_the_token_is_refused(env):
    address = ray.get_runtime_context().gcs_address
    probe = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); print('CONNECTED')"
    ours = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # else the client swaps 127.0.0.1 for the host's IP
    wrong = {
        **{k: v for k, v in ours.items() if not k.startswith("RAY_AUTH_")},
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "0" * 32,
    }
    clients = {
        name: subprocess.Popen(
            [sys.executable, "-c", probe, address], env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for name, e in (("our token", ours), ("wrong token", wrong))
    }
    out = {name: p.communicate(timeout=300)[0] for name, p in clients.items()}
    assert "CONNECTED" in out["our token"]  # the probe itself works
    assert "CONNECTED" not in out["wrong token"]


def test_a_run_dir_too_long_for_ray_sockets_gets_a_private_temp_dir(env, tmp_path):
    long_dir = tmp_path / ("d" * 80)
    other = MeasuredEnv(tiny_builder, env.cluster, graph=env.graph, run_dir=long_dir)
    path = other._ray_temp_dir()
    assert not path.startswith(str(tmp_path)) and len(path) < 40 and os.path.isdir(path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    other.close()
    assert not os.path.exists(path)
