"""bench.gpu_offload's stages on the CPU stand-in (issue 34): the rivals, a fine-tuning killed mid-way and resumed, the
report. A file of its own (the longest of the offload tests), so the two xdist workers share the offload tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import graphs
from bench import gpu_offload, offload
from bench.measured_rl import read_curves
from bench.offload import SCENARIOS
from tests.bench.conftest import freeze_after_importing

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]


#: What the stages import as they go (each of them lazily), imported before the collector is frozen.
STAGE_IMPORTS = (
    "accelerate",
    "bench.fsdp2",
    "bench.host_adam",
    "bench.measured_rl",
    "bench.offload_stages",
    "envs.real.local",
    "networkx",
    "numba",
    "placer.compare",
    "placer.learn.loop",
    "policies.seq2seq",
    "tensorboard",
    "torch.export",
    "transformers.models.llama.modeling_llama",
)


@pytest.fixture
def frozen_gc():
    """The collector frozen on what the stages import (30 collections in this test)."""
    freeze_after_importing(*STAGE_IMPORTS)
    yield


def _logged(out: Path) -> int:
    log = out / "measurements.jsonl"
    return sum(1 for line in log.read_text().splitlines() if line.strip()) if log.exists() else 0


@pytest.mark.slow
def test_the_pipeline_runs_on_the_cpu_stand_in_resumes_and_a_killed_run_loses_no_measurement(
    tmp_path, without_ray, run_entry, frozen_gc
):
    """Without ray, as on the GPU machines."""

    def run_here(*args: str) -> tuple[int, str, str]:
        return run_entry(gpu_offload, *args)

    out = tmp_path / "offload"
    status, stdout, stderr = run_here("rivals", "--tiny", "--out-dir", str(out), "--train-budget", "1", "--json")
    assert status == 0, stderr[-2000:]
    doc = json.loads(stdout)
    rows = {r["label"]: r for r in doc["rows"]}
    assert (
        rows["all on gpu:0"]["sim_status"] == "oom" and rows["accelerate, max_memory = the cap"]["sim_status"] == "oom"
    )
    assert rows["placer, trained on the simulator"]["sim_status"] == "ok"
    assert (
        rows["placer, trained on the simulator"]["status"] == "ok"
        and rows["FSDP2, CPUOffloadPolicy (every parameter on the host)"]["status"] == "ok"
    )
    assert all(
        r["real_peak_gpu_gib"] is None and r["within_cap"] is None for r in doc["rows"]
    )  # no GPU here: no GPU peak
    assert (
        json.loads((out / "cluster.json").read_text())["devices"][1]["memory_bytes"] == SCENARIOS["tiny"].gpu_cap_bytes
    )
    assert graphs.load(out / "graph.json").content_hash == json.loads((out / "plans.json").read_text())["graph_hash"]
    measured = _logged(out)
    assert measured >= 5

    # the fine-tuning, killed mid-way (a process of its own): every placement it recorded had been measured and logged
    env = {**os.environ, "OMP_NUM_THREADS": "1", **without_ray}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.gpu_offload",
            "finetune",
            "--tiny",
            "--out-dir",
            str(out),
            "--budget",
            "300",
            "--exploration",
            "3",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    curves_path = out / "finetune" / "curves.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not curves_path.exists() or len(read_curves(str(curves_path))) < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    records = read_curves(str(curves_path))
    assert len(records) >= 3
    from envs.real.local import LocalEnv

    again = LocalEnv(
        offload.builder(SCENARIOS["tiny"]), offload.scenario_cluster(SCENARIOS["tiny"]), device_map="*=cpu", run_dir=out
    )
    again.evaluate([np.asarray(r["op_devices"], dtype=np.int32) for r in records])
    assert again.measured == 0
    logged = _logged(out)

    # resumed: the rivals measure nothing again; the fine-tuning goes on from its checkpoint and its records
    assert run_here("rivals", "--tiny", "--out-dir", str(out))[0] == 0 and _logged(out) == logged
    status, _, stderr = run_here("finetune", "--tiny", "--out-dir", str(out), "--budget", "2")
    assert status == 0, stderr[-2000:]
    resumed = read_curves(str(curves_path))
    assert resumed[: len(records)] == records and [r["n"] for r in resumed] == list(range(1, len(resumed) + 1))
    assert "placer, fine-tuned on measured rewards" in (out / "table.md").read_text()
    status, stdout, _ = run_here("report", "--out-dir", str(out), "--json")
    assert status == 0 and json.loads(stdout)["curves"]["n"] == len(resumed)
