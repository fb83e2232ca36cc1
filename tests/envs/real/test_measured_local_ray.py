"""The local Ray that MeasuredEnv starts (loopback only, token authentication, session files kept in the run dir), and
joining a cluster without token authentication while a local run's token is left in ~/.ray."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

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


def test_the_workers_run_at_the_driver_s_priority(env):
    """Ray's default runs its workers at niceness 15: a measured step would lose its core to anything at the normal
    priority. The measured env's workers (its Worker actor, and Ray's idle ones) are not niced."""
    workers = [p for p in _ray_processes() if p.name().startswith("ray::") and "Agent" not in p.name()]
    assert workers and {p.nice() for p in workers} == {psutil.Process().nice()}, [(p.name(), p.nice()) for p in workers]


def test_session_files_are_under_the_run_dir(env):
    ray_dir = os.path.join(env.run_dir, "ray")
    assert any(name.startswith("session_") for name in os.listdir(ray_dir))
    assert env._ray_tmp is None  # no private temp dir was needed


#: A call to the cluster's GCS: refused at once (``ray.init`` would retry for 20 s before it gives up).
GCS_CALL = (
    "import sys; from ray._raylet import GcsClient; from ray.exceptions import AuthenticationError\n"
    "try:\n    GcsClient(address=sys.argv[1]).internal_kv_get(b'placer', None, timeout=30)\n"
    "except AuthenticationError:\n    print('REFUSED')"
)


def test_a_client_without_the_token_is_refused(env):
    address = ray.get_runtime_context().gcs_address
    connect = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); print('CONNECTED')"
    ours = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # else the client swaps 127.0.0.1 for the host's IP
    wrong = {
        **{k: v for k, v in ours.items() if not k.startswith("RAY_AUTH_")},
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "0" * 32,
    }
    clients = {
        name: subprocess.Popen(
            [sys.executable, "-c", code, address], env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for name, code, e in (("our token", connect, ours), ("wrong token", GCS_CALL, wrong))
    }
    out = {name: p.communicate(timeout=300)[0] for name, p in clients.items()}
    assert "CONNECTED" in out["our token"]  # the token the local Ray made lets a client in
    assert out["wrong token"].strip() == "REFUSED"


def test_a_run_dir_too_long_for_ray_sockets_gets_a_private_temp_dir(env, tmp_path):
    long_dir = tmp_path / ("d" * 80)
    other = MeasuredEnv(tiny_builder, env.cluster, graph=env.graph, run_dir=long_dir)
    path = other._ray_temp_dir()
    assert not path.startswith(str(tmp_path)) and len(path) < 40 and os.path.isdir(path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    other.close()
    assert not os.path.exists(path)


REPO = Path(__file__).resolve().parents[3]

# A head node without token authentication, in its own process: it prints its address and runs until stdin closes.
OPEN_HEAD = textwrap.dedent(
    """
    import sys
    from ray.cluster_utils import Cluster

    # (Ray nices its workers to 15: a busy test worker beside them would starve them)
    unniced = {"worker_niceness": 0}
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": unniced}
    )
    print(c.address, flush=True)
    sys.stdin.read()
    c.shutdown()
    """
)
# A driver that joins it twice: with RAY_AUTH_MODE=token set (one line says why it cannot), then as it comes (it
# measures one placement, or says in one line why it cannot). It reads the head's address on stdin, after its imports:
# they take place while the head starts.
DRIVER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from envs import Cluster
    from envs.real.measured import MeasuredEnv, join_cluster
    from graphs import PlacerError

    def build():
        import torch
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),)

    address = sys.stdin.readline().strip()
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        join_cluster(address)
        print("joined in token mode")
    except PlacerError as e:
        print(e)
    del os.environ["RAY_AUTH_MODE"]
    env = MeasuredEnv(build, Cluster.preset("k80x2"), workers=1, device_map="*=cpu", warmup_steps=0, timed_steps=1,
                      ray_address=address, start_timeout_s=60)
    try:
        print(env.evaluate([np.zeros(env.graph.num_ops, dtype=np.int32)])[0].status)
    except PlacerError as e:
        print(e)
    finally:
        env.close()
    """
)


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory):
    """``(head, environment)``: the process of a cluster started without token authentication (it prints its address
    once up), and the environment of a machine where a local ``placer train --env measured`` left its token at
    ``~/.ray/auth_token`` (a temporary HOME)."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("7" * 64)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    environ.update(HOME=str(home), PYTHONPATH=str(REPO), RAY_TMPDIR=tempfile.mkdtemp(prefix="plo", dir="/tmp"))
    head = subprocess.Popen(
        [sys.executable, "-c", OPEN_HEAD],
        env={**environ, "RAY_AUTH_MODE": "disabled"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    yield head, environ
    head.communicate("", timeout=60)  # the head shuts its cluster down


@pytest.fixture(scope="module")
def joined(open_cluster) -> tuple[str, list[str]]:
    """The address, and what the driver printed: its join in token mode, then its measurement."""
    head, environ = open_cluster
    driver = subprocess.Popen(  # started with the head: it imports placer and Ray meanwhile
        [sys.executable, "-c", DRIVER],
        env=environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = head.stdout.readline().strip()
    out, err = driver.communicate(address + "\n", timeout=300)
    assert driver.returncode == 0, err[-3000:]
    return address, out.strip().splitlines()[-2:]


def test_a_cluster_without_token_authentication_is_sent_no_token(joined):
    """The token a local run left in ~/.ray once made every worker of such a cluster die at start."""
    assert joined[1][1] == "ok"


def test_token_authentication_asked_for_by_the_driver_alone_is_one_line_naming_the_mismatch(joined):
    address, (line, _) = joined
    assert line.startswith(f"--ray-address {address}: the Ray cluster does not use token authentication"), line
    assert "RAY_AUTH_MODE=token here" in line
