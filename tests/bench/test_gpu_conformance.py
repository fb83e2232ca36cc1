"""bench.gpu_conformance on the CPU (every logical device mapped to ``cpu``): rows, resume, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from bench import gpu_conformance


@pytest.fixture
def run_here(run_entry):
    """``gpu_conformance.main(ARGS)`` in this process, without ray: ``(status, stdout, stderr)``; the TF32 switches it
    turns off are restored afterwards."""
    switches = (torch.backends.cuda.matmul, torch.backends.cudnn)
    before = [s.allow_tf32 for s in switches]
    yield lambda *args: run_entry(gpu_conformance, *args)
    for switch, value in zip(switches, before):
        switch.allow_tf32 = value


@pytest.mark.slow
def test_runs_the_corpus_writes_rows_and_resumes(tmp_path, run_here):
    out, table = tmp_path / "rows.jsonl", tmp_path / "t.md"
    models, plans = ("--models", "rnn,cnn_bn"), ("--plans", "gpu,split,1f1b")
    status, stdout, stderr = run_here(
        "--device-map", "*=cpu", *models, *plans, "--steps", "1", "--out", str(out), "--table", str(table)
    )
    assert status == 0, stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["model"], r["plan"]) for r in rows] == [
        (m, p) for m in ("rnn", "cnn_bn") for p in ("gpu", "split", "1f1b")
    ]
    assert all(r["ok"] and r["step_time_s"] > 0 for r in rows)
    assert "| rnn | 1f1b | ok |" in stdout and table.read_text().strip() == stdout.strip()
    assert "[2/2] cnn_bn: 3/3 plans pass" in stderr and "6/6 rows pass" in stderr
    status, stdout, stderr = run_here("--device-map", "*=cpu", *models, *plans, "--out", str(out), "--json")
    assert status == 0 and "rnn: already in" in stderr
    assert len(json.loads(stdout)) == 6 and len(out.read_text().splitlines()) == 6  # nothing measured twice


@pytest.mark.parametrize(
    "args,option",
    [
        (["--models", "nope"], "--models"),
        (["--plans", "gpu,zigzag"], "--plans"),
        (["--steps", "-1", "--device-map", "*=cpu"], "--steps"),
        (["--device-map", "*=cuda:7"], "cuda:7"),
    ],
)
def test_bad_options_are_one_line_errors(args, option, tmp_path, run_here):
    status, _, stderr = run_here(*args, "--out", str(tmp_path / "rows.jsonl"))
    assert status == 2 and stderr.count("\n") == 1 and option in stderr, stderr
    assert not list(tmp_path.iterdir())  # refused before anything is written
