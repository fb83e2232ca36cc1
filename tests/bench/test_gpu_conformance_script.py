"""scripts/gpu_conformance.py on the CPU (every logical device mapped to ``cpu``): rows, resume, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_conformance.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )


@pytest.mark.slow
def test_runs_the_corpus_writes_rows_and_resumes(tmp_path, without_ray):
    """Without ray, as on the GPU machines."""
    out, table = tmp_path / "rows.jsonl", tmp_path / "t.md"
    proc = run(
        "--device-map",
        "*=cpu",
        "--models",
        "rnn,cnn_bn",
        "--plans",
        "gpu,split,1f1b",
        "--steps",
        "1",
        "--out",
        str(out),
        "--table",
        str(table),
        cwd=tmp_path,
        env_extra=without_ray,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["model"], r["plan"]) for r in rows] == [
        (m, p) for m in ("rnn", "cnn_bn") for p in ("gpu", "split", "1f1b")
    ]
    assert all(r["ok"] and r["step_time_s"] > 0 for r in rows)
    assert "| rnn | 1f1b | ok |" in proc.stdout and table.read_text().strip() == proc.stdout.strip()
    assert "[2/2] cnn_bn: 3/3 plans pass" in proc.stderr and "6/6 rows pass" in proc.stderr
    again = run(
        "--device-map",
        "*=cpu",
        "--models",
        "rnn,cnn_bn",
        "--plans",
        "gpu,split,1f1b",
        "--out",
        str(out),
        "--json",
        cwd=tmp_path,
    )
    assert again.returncode == 0 and "rnn: already in" in again.stderr
    assert len(json.loads(again.stdout)) == 6 and len(out.read_text().splitlines()) == 6  # nothing measured twice


@pytest.mark.parametrize(
    "args,option",
    [
        (["--models", "nope"], "--models"),
        (["--plans", "gpu,zigzag"], "--plans"),
        (["--steps", "-1", "--device-map", "*=cpu"], "--steps"),
        (["--device-map", "*=cuda:7"], "cuda:7"),
    ],
)
def test_bad_options_are_one_line_errors(args, option, tmp_path):
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and option in proc.stderr, proc.stderr
