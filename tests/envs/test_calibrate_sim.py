"""scripts/calibrate_sim.py: the --json summary the issue asks for, and one-line errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "calibrate_sim.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    "args, option",
    [
        (["--models", "nope"], "--models"),
        (["--placements", "0"], "--placements"),
        (["--executor", "warp"], "--executor"),
    ],
)
def test_bad_options_are_one_line_errors(args, option, tmp_path):
    proc = run(*args, "--out-dir", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and option in proc.stderr
    assert not os.listdir(tmp_path)  # refused before any profiling or measuring


@pytest.mark.slow
def test_calibrate_sim_json_on_a_small_model(tmp_path):
    proc = run(
        "--models",
        "rnnlm",
        "--size",
        "small",
        "--placements",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--cpus",
        "1",
        "--json",
        "--out-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    (row,) = doc["models"]
    assert set(row) == {"model", "executor", "mape", "spearman", "n"}
    assert row["model"] == "rnnlm" and row["n"] == 2 and isinstance(row["executor"], str)
    assert math.isfinite(row["mape"]) and row["mape"] >= 0
    assert row["spearman"] is None  # every logical device is the one CPU: one simulated time, no ranking
    saved = json.loads((tmp_path / "calibration.json").read_text())["results"][0]
    assert saved["profile_method"] == "context" and len(saved["real_step_s"]) == 2
    prof = json.loads((tmp_path / "rnnlm" / "profile.json").read_text())
    assert prof["devices"]["cpu"]["method"] == "context" and prof["devices"]["cpu"]["update_s"] > 0
