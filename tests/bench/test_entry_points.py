"""The benchmarks' entry points (``python -m bench.<module>``) run tiny, in this process, so they cannot silently rot;
every one gives one-line usage errors and is in the README's table; one runs as a user runs it."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphs
from bench import (
    first_hour,
    module_draws,
    pipeline_plans,
    plot_placement,
    probe_imitation,
    reproduce_paper,
    scale,
    sim_model_delta,
    time_to_placement,
    train_throughput,
    zero_shot,
)
from graphs.synthetic import random_dag

ROOT = Path(__file__).resolve().parents[2]
#: Every module of bench/ with a ``main``: the entry points.
ENTRY_POINTS = sorted(
    p.stem
    for p in (ROOT / "bench").glob("*.py")
    if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(p.read_text()).body)
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("g") / "tiny.json"
    graphs.save(random_dag(50, seed=0, name="tiny"), path)
    return str(path)


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ every entry point
def test_the_entry_points_are_found():
    assert len(ENTRY_POINTS) >= 20 and {"budget", "validate_gpu", "gpu_offload", "scale"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_a_usage_error_is_one_line_and_the_readme_lists_it(name, capsys):
    module = importlib.import_module(f"bench.{name}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--no-such-option"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and one_line(err) and err.startswith(f"{name}: "), err
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith(f"usage: python -m bench.{name} ")
    assert f"| `bench.{name}` |" in (ROOT / "README.md").read_text()  # its row in the table of benchmarks


@pytest.mark.slow
def test_an_entry_point_runs_as_a_user_runs_it_from_the_checkout():
    """``python -m bench.graph_layer`` in the root of the checkout: no path set up, the module finds ``bench``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.graph_layer", "--ops", "1000", "--groups", "16", "--repeats", "1"]
        + ["--skip-capture", "--json"],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["load"]["ops"] == 1000 and doc["coarsen"]["max_groups"] == 16 and doc["load"]["load_s"] > 0


# ------------------------------------------------------------------ each, tiny
def test_reproduce_paper_rejects_bad_input_in_one_line(capsys):
    assert reproduce_paper.main(["--time-budget", "0"]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "--time-budget" in err


@pytest.mark.slow
def test_reproduce_paper_tiny(tiny, tmp_path, capsys):
    out = tmp_path / "t.md"
    argv = ["--graphs", tiny, "--clusters", "k80x2", "--policies", "seq2seq", "--time-budget", "2"]
    assert reproduce_paper.main([*argv, "--ilp-time-limit", "2", "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert "| tiny | 50 | k80x2 |" in stdout and "[1/1] tiny" in stderr
    assert out.read_text().strip() == stdout.strip()
    assert f"Command: `python -m bench.reproduce_paper --graphs {tiny} " in stdout
    argv = ["--graphs", tiny, "--clusters", "v100x4", "--policies", "hierarchical", "--time-budget", "1"]
    assert reproduce_paper.main([*argv, "--warm-start", "none", "--ilp-time-limit", "2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["cluster"] == "v100x4" and row["rl"]["hierarchical"] >= row["lower_bound_s"] * (1 - 1e-9)


@pytest.mark.slow
def test_time_to_placement_tiny(tiny, tmp_path, capsys):
    png = tmp_path / "c.png"
    methods = "annealing,random_search,rl-seq2seq"
    assert time_to_placement.main(["--graphs", tiny, "--budget", "1", "--methods", methods, "--plot", str(png)]) == 0
    stdout = capsys.readouterr().out
    assert "| tiny | annealing |" in stdout and "| tiny | rl-seq2seq |" in stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert time_to_placement.main(["--methods", "nope"]) == 2
    assert one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_scale_tiny_measures_each_size_in_a_process_of_its_own(capsys):
    """Each size runs in ``python -m bench.scale --one N`` (its own peak memory): the entry point run as a child."""
    argv = ["--sizes", "200,400", "--policies", "seq2seq", "--samples", "2", "--json"]
    assert scale.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["ops"] for r in rows] == [200, 400] and all(r["iteration_s"] > 0 for r in rows)
    assert all(r["rss_peak_bytes"] >= r["rss_warm_bytes"] > 0 for r in rows)
    assert scale.main(["--sizes", "1"]) == 2
    assert one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_plot_placement_tiny(tiny, tmp_path, capsys):
    png, trace = tmp_path / "p.png", tmp_path / "t.json"
    argv = [tiny, "--cluster", "k80x2", "--method", "round_robin", "--color-by", "kind", "-o", str(png)]
    assert plot_placement.main([*argv, "--trace", str(trace)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and json.loads(trace.read_text())["traceEvents"]
    argv = [tiny, "--cluster", "k80x2", "--time-budget", "1", "--warm-start", "none", "-o", str(png)]
    assert plot_placement.main(argv) == 0
    assert "RL seq2seq" in capsys.readouterr().err
    assert plot_placement.main(["no-such-graph", "-o", str(png)]) == 2
    assert one_line(capsys.readouterr().err)


def test_train_throughput_tiny(tiny, capsys):
    argv = [tiny, "--samples", "2,4", "--policies", "seq2seq,hierarchical", "--max-groups", "8", "--hidden", "8"]
    assert train_throughput.main([*argv, "--repeats", "1", "--order", "planned", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["policy"], r["samples"]) for r in rows] == [
        ("seq2seq", 2),
        ("seq2seq", 4),
        ("hierarchical", 2),
        ("hierarchical", 4),
    ]
    for r in rows:
        parts = r["sample_s"] + r["simulate_s"] + r["update_s"]
        assert r["iteration_s"] == pytest.approx(parts) and r["placements_per_s"] == pytest.approx(r["samples"] / parts)
    assert train_throughput.main([tiny, "--samples", "0"]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "--samples" in err


@pytest.mark.slow
def test_pipeline_plans_tiny_llama_with_host_input_free_rows(capsys):
    pytest.importorskip("transformers")
    argv = ["--models", "llama-tiny", "--clusters", "h100x8", "--microbatches", "1,2", "--inflight", "1,all"]
    argv += ["--methods", "gpipe,m_topo", "--seq", "32", "--batch", "4", "--host-input-free", "--json"]
    assert pipeline_plans.main(argv) == 0
    (res,) = json.loads(capsys.readouterr().out)
    rows = {(r["method"], r["microbatches"], r["inflight"]): r for r in res["rows"]}
    methods = ("gpipe", "m_topo", "gpipe+host-input-free", "m_topo+host-input-free")
    assert set(rows) == {(m, M, W) for m in methods for M, W in ((1, 1), (2, 1), (2, 2))}
    rows = {(m, M): r for (m, M, W), r in rows.items() if W == M}
    assert all(
        r["status"] == "ok" and r["step_time_s"] >= res["lower_bound_s"][str(r["microbatches"])] * (1 - 1e-9)
        for r in rows.values()
    )
    assert rows[("gpipe+host-input-free", 2)]["moved_ops"] > 0
    assert pipeline_plans.main(["--inflight", "0"]) == 2
    assert one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_probe_imitation_prints_agreement_rows(capsys):
    argv = ["resnet50", "--cluster", "k80x2", "--steps", "4", "--every", "2", "--json"]
    assert probe_imitation.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in doc["rows"]] == [0, 2, 4] and doc["ops"] == 229
    assert all(0.0 <= r["agreement"] <= 1.0 and sum(r["ops_per_device"]) == 229 for r in doc["rows"])
    assert probe_imitation.main(["no-such-graph"]) == 2
    assert one_line(capsys.readouterr().err)
    argv = ["resnet50", "--cluster", "k80x2", "--steps", "2", "--every", "2", "--decoder", "schedule"]
    assert probe_imitation.main([*argv, "--dagger", "1", "--switch-share", "0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decoder"] == "schedule" and [r["step"] for r in doc["rows"]] == [0, 2]
    assert doc["switch_share"] == 0.5 and 0 <= doc["switches"] < 229
    assert all(0.0 <= r["switch_agreement"] <= 1.0 for r in doc["rows"])
    assert probe_imitation.main(["resnet50", "--switch-share", "1"]) == 2
    assert one_line(capsys.readouterr().err)


def test_module_draws_compares_draws_with_search_at_equal_budget(tiny, tmp_path, capsys):
    argv = ["--graphs", tiny, "--clusters", "k80x4", "--n", "40", "--seeds", "2", "--json"]
    assert module_draws.main(argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["n"] == 40 and len(row["random_modules_by_seed"]) == len(row["module_search_by_seed"]) == 2
    assert row["module_search_step_time_s"] > 0 and row["ratio_median"] > 0
    flat = tmp_path / "flat.json"  # no module paths: nothing to draw or search
    g = random_dag(30, seed=1, name="flat")
    src, dst, size = g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_bytes.tolist()
    edges = [(g.names[s], g.names[d], b) for s, d, b in zip(src, dst, size)]
    graphs.save(graphs.OpGraph.from_edges(g.names, edges, flops=g.flops, name="flat"), flat)
    assert module_draws.main(["--graphs", str(flat), "--clusters", "k80x2", "--n", "8", "--seeds", "1"]) == 0
    assert "needs module paths" in capsys.readouterr().out
    assert module_draws.main(["--graphs", tiny, "--n", "0"]) == 2
    err = capsys.readouterr().err
    assert "--n" in err and one_line(err)


@pytest.mark.slow
def test_zero_shot_places_with_the_shipped_policy(tiny, capsys, monkeypatch):
    # its best heuristic comes from placer compare: ilp gets 1 s there, not its default minute
    quick = functools.partial(zero_shot.compare, options={"ilp": {"time_limit_s": 1}})
    monkeypatch.setattr(zero_shot, "compare", quick)
    assert zero_shot.main(["default", tiny, "k80x2", "--samples", "2", "--seeds", "2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(row["zero_shot_by_seed"]) == len(row["uniform_modules_by_seed"]) == 2
    assert row["zero_shot_step_time_s"] == pytest.approx(sum(row["zero_shot_by_seed"]) / 2)  # the median of two
    assert row["graph"] == tiny and row["cluster"] == "k80x2" and row["best_heuristic_step_time_s"] > 0
    assert row["zero_shot_step_time_s"] <= row["greedy_step_time_s"]  # greedy is one of the candidates
    assert row["uniform_modules_step_time_s"] > 0 and "modules" in row["groups"]  # random_dag records modules
    assert len(row["module_search_by_seed"]) == 2 and row["module_search_step_time_s"] > 0
    assert all(z <= d for z, d in zip(row["zero_shot_by_seed"], row["best_decode_by_seed"]))  # refining never loses
    assert row["refine"] == 1000
    assert zero_shot.main(["default", "no-such-graph", "k80x2"]) == 2
    assert one_line(capsys.readouterr().err)
    for option, bad in (("--refine", "-5"), ("--seeds", "0")):
        assert zero_shot.main(["default", tiny, "k80x2", option, bad]) == 2
        err = capsys.readouterr().err
        assert option in err and one_line(err)


@pytest.mark.slow
def test_first_hour_tiny(capsys):
    assert first_hour.main(["--models", "encoder_small", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (
        row["model"] == "encoder_small"
        and row["module_levels"]
        and set(row["methods"]) >= {"module_search", "annealing"}
    )
    assert all(r["status"] == "ok" for r in row["methods"].values())
    assert first_hour.main(["--models", "nope"]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "--models" in err


def test_sim_model_delta_compares_two_scores_and_refuses_what_is_not_one(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"model_version": 3, "steps_s": {"nmt-2|k80x4|heft": [0.2, 0.1]}}))
    b.write_text(json.dumps({"model_version": 4, "steps_s": {"nmt-2|k80x4|heft": [0.3, 0.1]}}))
    assert sim_model_delta.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "node: model 3 -> 4" in out and "| nmt-2, k80x4, heft | 200.00 -> 300.00 ms (1.500) |" in out
    b.write_text(json.dumps({"model_version": 4, "steps_s": {}}))
    for argv, problem in (
        (["--compare", str(a), str(b)], f"{b}: no step of nmt-2, k80x4, heft"),
        (["--compare", str(a), str(tmp_path / "none.json")], "none.json: cannot read it"),
        (["--score", str(a)], f"{a}: not --place's placements"),
    ):
        assert sim_model_delta.main(argv) == 2
        err = capsys.readouterr().err
        assert one_line(err) and problem in err, err
