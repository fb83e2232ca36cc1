"""Smoke tests of the benchmark scripts with tiny budgets, so they cannot silently rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphs
from graphs.synthetic import random_dag

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("g") / "tiny.json"
    graphs.save(random_dag(50, seed=0, name="tiny"), path)
    return str(path)


def test_reproduce_paper_rejects_bad_input_in_one_line():
    proc = run("reproduce_paper.py", "--time-budget", "0")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--time-budget" in proc.stderr


@pytest.mark.slow
def test_reproduce_paper_tiny(tiny, tmp_path):
    out = tmp_path / "t.md"
    proc = run(
        "reproduce_paper.py",
        "--graphs",
        tiny,
        "--clusters",
        "k80x2",
        "--policies",
        "seq2seq",
        "--time-budget",
        "2",
        "--ilp-time-limit",
        "2",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert "| tiny | 50 | k80x2 |" in proc.stdout and "[1/1] tiny" in proc.stderr
    assert out.read_text().strip() == proc.stdout.strip()
    proc = run(
        "reproduce_paper.py",
        "--graphs",
        tiny,
        "--clusters",
        "v100x4",
        "--policies",
        "hierarchical",
        "--time-budget",
        "1",
        "--warm-start",
        "none",
        "--ilp-time-limit",
        "2",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["cluster"] == "v100x4" and row["rl"]["hierarchical"] >= row["lower_bound_s"] * (1 - 1e-9)


@pytest.mark.slow
def test_bench_search_tiny(tiny, tmp_path):
    png = tmp_path / "c.png"
    proc = run(
        "bench_search.py",
        "--graphs",
        tiny,
        "--budget",
        "1",
        "--methods",
        "annealing,random_search,rl-seq2seq",
        "--plot",
        str(png),
    )
    assert proc.returncode == 0, proc.stderr
    assert "| tiny | annealing |" in proc.stdout and "| tiny | rl-seq2seq |" in proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert run("bench_search.py", "--methods", "nope").returncode == 2


@pytest.mark.slow
def test_bench_scale_tiny():
    proc = run("bench_scale.py", "--sizes", "200,400", "--policies", "seq2seq", "--samples", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["ops"] for r in rows] == [200, 400] and all(r["iteration_s"] > 0 for r in rows)
    assert run("bench_scale.py", "--sizes", "1").returncode == 2


@pytest.mark.slow
def test_plot_placement_tiny(tiny, tmp_path):
    png, trace = tmp_path / "p.png", tmp_path / "t.json"
    proc = run(
        "plot_placement.py",
        tiny,
        "--cluster",
        "k80x2",
        "--method",
        "round_robin",
        "--color-by",
        "kind",
        "-o",
        str(png),
        "--trace",
        str(trace),
    )
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and json.loads(trace.read_text())["traceEvents"]
    proc = run(
        "plot_placement.py", tiny, "--cluster", "k80x2", "--time-budget", "1", "--warm-start", "none", "-o", str(png)
    )
    assert proc.returncode == 0, proc.stderr
    assert "RL seq2seq" in proc.stderr
    assert run("plot_placement.py", "no-such-graph", "-o", str(png)).returncode == 2


def test_bench_throughput_tiny(tiny):
    proc = run(
        "bench_throughput.py",
        tiny,
        "--samples",
        "2,4",
        "--policies",
        "seq2seq,hierarchical",
        "--max-groups",
        "8",
        "--hidden",
        "8",
        "--repeats",
        "1",
        "--order",
        "planned",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["policy"], r["samples"]) for r in rows] == [
        ("seq2seq", 2),
        ("seq2seq", 4),
        ("hierarchical", 2),
        ("hierarchical", 4),
    ]
    for r in rows:
        parts = r["sample_s"] + r["simulate_s"] + r["update_s"]
        assert r["iteration_s"] == pytest.approx(parts) and r["placements_per_s"] == pytest.approx(r["samples"] / parts)
    proc = run("bench_throughput.py", tiny, "--samples", "0")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--samples" in proc.stderr


@pytest.mark.slow
def test_bench_pipeline_tiny_llama_with_host_input_free_rows():
    pytest.importorskip("transformers")
    proc = run(
        "bench_pipeline.py",
        "--models",
        "llama-tiny",
        "--clusters",
        "h100x8",
        "--microbatches",
        "1,2",
        "--inflight",
        "1,all",
        "--methods",
        "gpipe,m_topo",
        "--seq",
        "32",
        "--batch",
        "4",
        "--host-input-free",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    (res,) = json.loads(proc.stdout)
    rows = {(r["method"], r["microbatches"], r["inflight"]): r for r in res["rows"]}
    methods = ("gpipe", "m_topo", "gpipe+host-input-free", "m_topo+host-input-free")
    assert set(rows) == {(m, M, W) for m in methods for M, W in ((1, 1), (2, 1), (2, 2))}
    rows = {(m, M): r for (m, M, W), r in rows.items() if W == M}
    assert all(
        r["status"] == "ok" and r["step_time_s"] >= res["lower_bound_s"][str(r["microbatches"])] * (1 - 1e-9)
        for r in rows.values()
    )
    assert rows[("gpipe+host-input-free", 2)]["moved_ops"] > 0
    assert run("bench_pipeline.py", "--inflight", "0").returncode == 2


@pytest.mark.slow
def test_probe_imitation_prints_agreement_rows():
    proc = run("probe_imitation.py", "resnet50", "--cluster", "k80x2", "--steps", "4", "--every", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["step"] for r in doc["rows"]] == [0, 2, 4] and doc["ops"] == 229
    assert all(0.0 <= r["agreement"] <= 1.0 and sum(r["ops_per_device"]) == 229 for r in doc["rows"])
    assert run("probe_imitation.py", "no-such-graph").returncode == 2
    proc = run(
        "probe_imitation.py",
        "resnet50",
        "--cluster",
        "k80x2",
        "--steps",
        "2",
        "--every",
        "2",
        "--decoder",
        "schedule",
        "--dagger",
        "1",
        "--switch-share",
        "0.5",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["decoder"] == "schedule" and [r["step"] for r in doc["rows"]] == [0, 2]
    assert doc["switch_share"] == 0.5 and 0 <= doc["switches"] < 229
    assert all(0.0 <= r["switch_agreement"] <= 1.0 for r in doc["rows"])
    assert run("probe_imitation.py", "resnet50", "--switch-share", "1").returncode == 2


def test_bench_modules_compares_draws_with_search_at_equal_budget(tiny, tmp_path):
    proc = run("bench_modules.py", "--graphs", tiny, "--clusters", "k80x4", "--n", "40", "--seeds", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["n"] == 40 and len(row["random_modules_by_seed"]) == len(row["module_search_by_seed"]) == 2
    assert row["module_search_step_time_s"] > 0 and row["ratio_median"] > 0
    flat = tmp_path / "flat.json"  # no module paths: nothing to draw or search
    g = random_dag(30, seed=1, name="flat")
    graphs.save(
        graphs.OpGraph.from_edges(
            g.names,
            [
                (g.names[s], g.names[d], b)
                for s, d, b in zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_bytes.tolist())
            ],
            flops=g.flops,
            name="flat",
        ),
        flat,
    )
    proc = run("bench_modules.py", "--graphs", str(flat), "--clusters", "k80x2", "--n", "8", "--seeds", "1")
    assert proc.returncode == 0 and "needs module paths" in proc.stdout, proc.stderr
    bad = run("bench_modules.py", "--graphs", tiny, "--n", "0")
    assert bad.returncode == 2 and "--n" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_bench_pretrain_places_with_the_shipped_policy(tiny):
    proc = run("bench_pretrain.py", "default", tiny, "k80x2", "--samples", "2", "--seeds", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.splitlines()[0])
    assert len(row["zero_shot_by_seed"]) == len(row["uniform_modules_by_seed"]) == 2
    assert row["zero_shot_step_time_s"] == pytest.approx(sum(row["zero_shot_by_seed"]) / 2)  # the median of two
    assert row["graph"] == tiny and row["cluster"] == "k80x2" and row["best_heuristic_step_time_s"] > 0
    assert row["zero_shot_step_time_s"] <= row["greedy_step_time_s"]  # greedy is one of the candidates
    assert row["uniform_modules_step_time_s"] > 0 and "modules" in row["groups"]  # random_dag records modules
    assert len(row["module_search_by_seed"]) == 2 and row["module_search_step_time_s"] > 0
    assert all(z <= d for z, d in zip(row["zero_shot_by_seed"], row["best_decode_by_seed"]))  # refining never loses
    assert row["refine"] == 1000
    assert run("bench_pretrain.py", "default", "no-such-graph", "k80x2").returncode == 2
    bad = run("bench_pretrain.py", "default", tiny, "k80x2", "--refine", "-5")
    assert bad.returncode == 2 and "--refine" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad = run("bench_pretrain.py", "default", tiny, "k80x2", "--seeds", "0")
    assert bad.returncode == 2 and "--seeds" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_bench_first_hour_tiny():
    proc = run("bench_first_hour.py", "--models", "encoder_small", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert (
        row["model"] == "encoder_small"
        and row["module_levels"]
        and set(row["methods"]) >= {"module_search", "annealing"}
    )
    assert all(r["status"] == "ok" for r in row["methods"].values())
    bad = run("bench_first_hour.py", "--models", "nope")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--models" in bad.stderr
