"""scripts/bench_sim.py runs and reports the figures BENCHMARKS.md quotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_bench_sim_json():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "bench_sim.py"),
            "--ops",
            "300",
            "--batch",
            "4",
            "--seconds",
            "0.2",
            "--json",
            "--executor",
            "both",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    both = json.loads(out)
    assert sorted(both) == ["dataflow", "eager"]
    for executor, doc in both.items():
        assert doc["executor"] == executor
        assert doc["num_ops"] == 300 and doc["cluster"] == "k80x4"
        assert doc["op_placements_per_s"] > 0 and doc["scalar_simulate_s"] > 0
        assert 0 < doc["lower_bound_s"] <= doc["median_step_time_s"]
