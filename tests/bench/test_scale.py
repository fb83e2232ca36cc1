"""bench.scale: growth exponents, the table, and one real measurement."""

from __future__ import annotations

import math

import pytest

from bench import scale
from graphs import PlacerError


def rows():
    def r(n, t, rss):
        return {
            "ops": n,
            "save_s": t,
            "load_s": t,
            "coarsen_s": 0.1 * n / 1000,
            "sim_init_s": 0.01,
            "rss_warm_bytes": 100 << 20,
            "rss_peak_bytes": (100 << 20) + rss,
            "policies": {
                "seq2seq": {
                    "policy_init_s": 0.1,
                    "sample_s": 0.1,
                    "simulate_s": 1e-6 * n,
                    "update_s": 0.1,
                    "iteration_s": 0.2,
                }
            },
        }

    return [r(1000, 0.01, 1 << 20), r(10_000, 1.0, 10 << 20), r(100_000, 100.0, 100 << 20)]


def test_growth_uses_the_two_largest_sizes():
    assert math.isclose(scale.growth(rows(), "save_s"), 2.0)
    assert math.isclose(scale.growth(rows(), "seq2seq/simulate_s"), 1.0)
    assert math.isclose(scale.growth(rows(), "sim_init_s"), 0.0)
    assert math.isclose(scale.growth(rows(), "rss_growth"), 1.0)
    assert scale.growth(rows()[:1], "save_s") is None


def test_table_flags_superlinear_stages():
    text = scale.markdown_table(rows())
    lines = {ln.split("|")[1].strip(): ln for ln in text.splitlines()[2:]}
    assert "**superlinear**" in lines["save (JSON)"] and "superlinear" not in lines["seq2seq: simulate K"]
    assert "100.000 s" in lines["save (JSON)"] and lines["peak RSS"].count("MiB") == 3


def test_bad_sizes():
    with pytest.raises(PlacerError, match="num_ops"):
        scale.measure(1)


@pytest.mark.slow
def test_measure_a_small_graph():
    row = scale.measure(300, samples=2, iterations=2, policies=("seq2seq",))
    assert row["ops"] == 300 and row["groups"] <= row["max_groups"] == 100
    for key in ("save_s", "load_s", "coarsen_s", "sim_init_s", "sample_s", "simulate_s", "update_s"):
        assert row[key] > 0, key
    assert math.isclose(row["iteration_s"], row["sample_s"] + row["simulate_s"] + row["update_s"])
    assert row["rss_peak_bytes"] >= row["rss_warm_bytes"] > 0


@pytest.mark.slow
def test_run_measures_each_size_in_a_fresh_process_from_any_directory(tmp_path, monkeypatch):
    # run() starts `python -m bench.scale --one N`, which must find bench/ whatever the working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (row,) = scale.run([60], samples=2, iterations=1, policies=("seq2seq",))
    assert row["ops"] == 60 and row["samples"] == 2 and list(row["policies"]) == ["seq2seq"]
    assert row["rss_peak_bytes"] >= row["rss_warm_bytes"] > 0


@pytest.mark.slow
def test_a_failed_measurement_is_one_placer_error():
    with pytest.raises(PlacerError, match="the 60-op measurement failed"):
        scale.run([60], policies=("nope",))
