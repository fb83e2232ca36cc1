"""bench.graph_layer on a small graph (no zoo capture), and its command line."""

from __future__ import annotations

import json

import pytest

from bench import graph_layer as bench


@pytest.mark.slow
def test_run_and_table_without_capture():
    result = bench.run(2_000, max_groups=32, repeats=1, capture=False)
    assert result["load"]["ops"] == 2_000 and result["coarsen"]["groups"] == 32
    assert result["capture"] == [] and result["memory_measure"] == "tracemalloc"
    table = bench.format_table(result)
    assert "load" in table and "-> 32 groups" in table and "model" not in table


@pytest.mark.slow
def test_main_prints_json(capsys):
    assert bench.main(["--ops", "1000", "--groups", "16", "--repeats", "1", "--skip-capture", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["load"]["ops"] == 1000 and doc["coarsen"]["max_groups"] == 16 and doc["load"]["load_s"] > 0
