"""scripts/validate_gpu.py: the figures it reports, one-line errors, and a CPU-only run end to end (--tiny)."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "validate_gpu.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture
def vg(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "scripts"))
    return importlib.import_module("validate_gpu")


def test_scores_by_hand(vg):
    sim, real = np.array([1.0, 2.0, 3.0, 1.0]), np.array([2.0, 1.0, 4.0, 3.0])
    s = vg.scores(sim, real)
    # ranks: sim (1.5, 3, 4, 1.5), real (2, 1, 4, 3): Spearman = Pearson of the ranks
    assert s["spearman"] == pytest.approx(np.corrcoef([1.5, 3, 4, 1.5], [2, 1, 4, 3])[0, 1])
    assert s["mape"] == pytest.approx((0.5 + 1.0 + 0.25 + 2 / 3) / 4)
    # the simulator's best is placement 0 (first of two tied), which really takes 2.0; the real best takes 1.0
    assert (s["sim_best"], s["sim_best_ties"], s["best_ratio"], s["n"]) == (0, 2, 2.0, 4)
    assert s["pass"] == {"spearman": False, "mape": False, "best_ratio": False}
    good = vg.scores(np.array([1.0, 2.0, 3.0]), np.array([1.1, 2.1, 3.1]))
    assert good["best_ratio"] == 1.0 and good["pass"] == {"spearman": True, "mape": True, "best_ratio": True}


def test_summary_merges_models_across_calls(vg, tmp_path):
    """One model per call (the device tool's 10-minute limit): summary.json keeps the others."""
    args = vg.parse(["--tiny"])
    path = str(tmp_path / "summary.json")
    first = vg.merged_summary(path, [{"model": "rnnlm", "n": 1}, {"model": "nmt-2", "n": 2}], args, "dev")
    (tmp_path / "summary.json").write_text(json.dumps(first))
    doc = vg.merged_summary(path, [{"model": "rnnlm", "n": 3}], args, "dev")
    assert [(m["model"], m["n"]) for m in doc["models"]] == [("nmt-2", 2), ("rnnlm", 3)]


@pytest.mark.parametrize("args, option", [
    (["--models", "nope"], "--models"),
    (["--placements", "1"], "--placements"),
    (["--train-budget", "0"], "--train-budget"),
    (["--order-checks", "-1"], "--order-checks"),
    (["--size", "huge"], "--size"),
    (["--steps", "x"], "--steps"),
])
@pytest.mark.slow
def test_bad_options_are_one_line_errors(args, option, tmp_path):
    proc = run("--tiny", *args, "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and option in proc.stderr, proc.stderr
    assert not os.listdir(tmp_path)  # refused before any profiling or measuring


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_map_without_a_gpu_is_a_one_line_error(tmp_path):
    proc = run("--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "cuda:0" in proc.stderr, proc.stderr
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_tiny_run_end_to_end_and_resumed(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = ("--tiny", "--json", "--out-dir", str(out), "--work-dir", str(work))
    proc = run(*cmd, "--real", "ray")  # measured in a Ray actor; the rerun below measures in-process
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [(m["model"], m["executor"]) for m in doc["models"]] == [("rnnlm", "eager"), ("rnnlm", "dataflow")]
    for m in doc["models"]:
        assert m["n"] >= 6 and math.isfinite(m["mape"]) and m["best_ratio"] >= 1.0
        assert m["spearman"] is None  # every logical device is the one CPU: all placements simulate alike
    (check,) = doc["checks"]
    assert check["apply"]["ok"] and check["apply"]["same_grad_keys"] and check["apply"]["grad_max_rel_err"] <= 1e-3
    (order,) = check["orders"]  # --tiny checks the learned placement's order
    assert order["real_planned_s"] > 0 and order["real_node_s"] > 0 and isinstance(order["ok"], bool)

    rows = [json.loads(line) for line in (out / "rnnlm.jsonl").read_text().splitlines()]
    assert len(rows) == doc["models"][0]["n"] and len({r["placement_hash"] for r in rows}) == len(rows)
    kinds = {r["kind"] for r in rows}
    assert {"learned", "baseline", "single"} <= kinds
    assert all(set(r["sim_step_s"]) == {"eager", "dataflow"} and r["status"] == "ok" and r["real_step_s"] > 0 for r in rows)
    learned = next(r for r in rows if r["kind"] == "learned")
    assert sorted(learned["order"]) == list(range(len(learned["devices"])))  # measured with the order it stores
    summary = json.loads((out / "summary.json").read_text())
    assert [m["model"] for m in summary["models"]] == ["rnnlm"] and summary["models"][0]["measured_ok"] == len(rows)
    assert json.loads((out / "rnnlm.profile.json").read_text())["devices"]["cpu"]["fwd_s"]

    # --rescore: the stored measurements scored again here, with the stored profile, give the same figures
    rescored = run("--tiny", "--json", "--rescore", str(out), "--out-dir", str(tmp_path / "unused"), timeout=300)
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    assert [(m["model"], m["executor"], m["n"], m["mape"], m["best_ratio"]) for m in json.loads(rescored.stdout)["models"]] == \
        [(m["model"], m["executor"], m["n"], m["mape"], m["best_ratio"]) for m in doc["models"]]
    assert not (tmp_path / "unused").exists()  # rescoring writes nothing
    missing = run("--tiny", "--rescore", str(tmp_path / "nowhere"), timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "nowhere" in missing.stderr

    # scripts/gpu_profile.py on the same run: a profile in context, three placements re-measured, apply vs float64
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    gp = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_profile.py"), "--models", "rnnlm", "--size", "small",
                         "--device-map", "*=cpu", "--from", str(out), "--stride", "4", "--remeasure", "3", "--apply-check", "rnnlm",
                         "--repeats", "2", "--steps", "2", "--warmup", "1", "--cpus", "1", "--out-dir", str(tmp_path / "gp"),
                         "--work-dir", str(tmp_path / "gpw")], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert gp.returncode == 0, gp.stderr[-3000:]
    (entry,) = json.loads((tmp_path / "gp" / "gpu_profile.json").read_text())
    assert len(entry["remeasured"]) == 3 and entry["remeasure_ratio_median"] > 0
    assert [r["methods"] for r in entry["remeasured"]] == [rows[k]["methods"] for k in (0, 4, 8)]
    assert set(entry["apply_checks"]) == {"learned (earlier run)", "all on the GPU"}
    assert all(c["placed_worst_norm_rel"] < 1e-3 for c in entry["apply_checks"].values())
    assert json.loads((tmp_path / "gp" / "rnnlm.profile.json").read_text())["devices"]["cpu"]["method"] == "context"
    for bad in (["--models", "nope"], ["--stride", "0"], ["--gpu-name", "gpu:7"]):
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_profile.py"), "--device-map", "*=cpu", *bad],
                              capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and bad[0] in proc.stderr, proc.stderr

    log = (work / "rnnlm" / "measurements.jsonl").read_text()
    # resumed: the profile, learned placement and measurements are reused (--real local reads the Ray run's log)
    again = run(*cmd, "--real", "local")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (work / "rnnlm" / "measurements.jsonl").read_text() == log
    assert "reusing" in again.stderr and json.loads(again.stdout)["models"][0]["n"] == len(rows)


def test_in_process_measurement_is_limited_and_logged(monkeypatch, tmp_path):
    """calibrate_sim.measure_here (validate_gpu's default, no Ray): a placement past --timeout is a "timeout"
    result in the resumable log, not a hang or a crash."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "scripts"))
    cs = importlib.import_module("calibrate_sim")
    import envs
    from graphs.torch_capture import capture

    model, inputs = cs.build("gpt2", "small")
    graph = capture(model, inputs, name="gpt2")
    cluster = envs.resolve_cluster("h200x1")
    placements = cs.random_placements(graph.num_ops, cluster.num_devices, 2, seed=0)
    kw = dict(device_map="*=cpu", warmup=1, steps=1, cpus=1)
    results = cs.measure_here("gpt2", "small", cluster, graph, placements, str(tmp_path), timeout=1e-3, **kw)
    assert [r.status for r in results] == ["timeout", "timeout"]
    assert len((tmp_path / "measurements.jsonl").read_text().splitlines()) == 2


def test_apply_check_allows_float32s_own_error_and_no_more(vg, monkeypatch):
    """Against float64, the placed model passes where its error is within the tolerance or twice the float32
    CPU model's own error (a gradient that is mostly cancellation), and fails on a larger error or a lost gradient."""
    def rows(placed, cpu32, missing=()):
        return {"grads": 2, "missing": list(missing), "extra": [], "loss_placed_rel": 1e-7, "loss_cpu32_rel": 1e-7,
                "rows": [{"param": "bn.bias", "max_abs": 1e-3, "placed_norm_rel": placed, "cpu32_norm_rel": cpu32,
                          "placed_max_rel": placed, "cpu32_max_rel": cpu32},
                         {"param": "fc.weight", "max_abs": 1.0, "placed_norm_rel": 1e-7, "cpu32_norm_rel": 1e-7,
                          "placed_max_rel": 1e-7, "cpu32_max_rel": 1e-7}]}

    args = vg.parse(["--tiny"])

    class P:
        method = "learned"

    for errors, ok in ((rows(0.05, 0.03), True), (rows(5e-4, 1e-7), True), (rows(0.05, 0.01), False),
                       (rows(1e-7, 1e-7, missing=["lost.weight"]), False)):
        monkeypatch.setattr(vg, "grad_errors", lambda *a, e=errors: e)
        check = vg.check_apply("rnnlm", args, P(), None)
        assert check["ok"] is ok, (errors["rows"][0], check)
    assert check["same_grad_keys"] is False
