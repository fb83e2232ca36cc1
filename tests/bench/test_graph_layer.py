"""scripts/bench_graphs.py and bench.graph_layer on a small graph (no zoo capture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import graph_layer as bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_run_and_table_without_capture():
    result = bench.run(2_000, max_groups=32, repeats=1, capture=False)
    assert result["load"]["ops"] == 2_000 and result["coarsen"]["groups"] == 32
    assert result["capture"] == [] and result["memory_measure"] == "tracemalloc"
    table = bench.format_table(result)
    assert "load" in table and "-> 32 groups" in table and "model" not in table


def test_script_prints_json():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "bench_graphs.py"),
            "--ops",
            "1000",
            "--groups",
            "16",
            "--repeats",
            "1",
            "--skip-capture",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    doc = json.loads(out.stdout)
    assert doc["load"]["ops"] == 1000 and doc["coarsen"]["max_groups"] == 16 and doc["load"]["load_s"] > 0
