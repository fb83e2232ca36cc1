"""bench.calibrate_sim: the --json summary the issue asks for, and one-line errors."""

from __future__ import annotations

import json
import math
import os

import pytest

from bench import calibrate_sim


@pytest.mark.parametrize(
    "args, option",
    [
        (["--models", "nope"], "--models"),
        (["--placements", "0"], "--placements"),
        (["--executor", "warp"], "--executor"),
    ],
)
def test_bad_options_are_one_line_errors(args, option, tmp_path, capsys):
    assert calibrate_sim.main([*args, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and option in err
    assert not os.listdir(tmp_path)  # refused before any profiling or measuring


@pytest.mark.slow
def test_calibrate_sim_json_on_a_small_model(tmp_path, capsys):
    argv = ["--models", "rnnlm", "--size", "small", "--placements", "2", "--steps", "2", "--warmup", "1"]
    assert calibrate_sim.main([*argv, "--repeats", "2", "--cpus", "1", "--json", "--out-dir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["models"]
    assert set(row) == {"model", "executor", "mape", "spearman", "n"}
    assert row["model"] == "rnnlm" and row["n"] == 2 and isinstance(row["executor"], str)
    assert math.isfinite(row["mape"]) and row["mape"] >= 0
    assert row["spearman"] is None  # every logical device is the one CPU: one simulated time, no ranking
    saved = json.loads((tmp_path / "calibration.json").read_text())["results"][0]
    assert saved["profile_method"] == "context" and len(saved["real_step_s"]) == 2
    prof = json.loads((tmp_path / "rnnlm" / "profile.json").read_text())
    assert prof["devices"]["cpu"]["method"] == "context" and prof["devices"]["cpu"]["update_s"] > 0
    assert "`python -m bench.calibrate_sim --devices cpu --size small " in (tmp_path / "calibration.md").read_text()
