"""``placer train --env measured --json`` in a real process: stdout carries only the result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("ray")

# Builds normally in the driver; the first Ray worker to build it dies (os._exit), once.
MODEL_SRC = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch import nn

    def build():
        ray = sys.modules.get("ray")
        marker = os.environ["DIE_ONCE_MARKER"]
        if ray is not None and ray.is_initialized() and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        torch.manual_seed(0)
        return Net(), (torch.randn(4, 8),)

    class Net(nn.Module):  # forward returns the training loss, as real training steps need
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

        def forward(self, x):
            return self.body(x).pow(2).mean()
    """
)


def test_train_json_stdout_is_json_when_a_worker_dies(tmp_path):
    (tmp_path / "dying_model.py").write_text(MODEL_SRC)
    tmp = tempfile.mkdtemp(prefix="t", dir="/tmp")  # TMPDIR: the private Ray dir must be made and removed here
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), repo, os.environ.get("PYTHONPATH", "")]),
        "DIE_ONCE_MARKER": str(tmp_path / "died"),
        "TMPDIR": tmp,
    }
    logdir = tmp_path / ("run-with-a-long-name-" + "x" * 40)  # too long for Ray's sockets under it
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "placer",
            "train",
            "dying_model:build",
            "--cluster",
            "k80x2",
            "--env",
            "measured",
            "--device-map",
            "*=cpu",
            "--workers",
            "1",
            "--iterations",
            "1",
            "--samples",
            "2",
            "--warm-start",
            "none",
            "--measure-timeout",
            "120",
            # one heuristic measured and no rematch: measurements this test does not need (each a Ray round trip)
            "--heuristics",
            "m_etf",
            "--rematch",
            "0",
            "--logdir",
            str(logdir),
            "--json",
            "--no-progress",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "died").exists()  # a worker really died
    assert "worker died" in proc.stderr  # Ray's message, on stderr
    doc = json.loads(proc.stdout)  # nothing but the result on stdout
    assert doc["iterations"] == 1 and doc["best_step_time_s"] > 0
    assert not [n for n in os.listdir(tmp) if n.startswith("placer-ray-")]  # the private Ray temp dir is gone
    shutil.rmtree(tmp)
