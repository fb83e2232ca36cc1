"""bench.validate_gpu (and bench.gpu_profile on its output): the figures it reports, one-line errors, and a CPU-only
run end to end (--tiny) through scripts/gpu_validate.sh."""

from __future__ import annotations

import gc
import json
import math
import os
import re
import subprocess
import sys
import tarfile

import pytest
import torch

from bench import gpu_profile
from bench import validate_gpu as vg
from bench.fidelity.measuring import measure_here
from bench.fidelity.models import build
from bench.fidelity.report import merged_summary
from bench.fidelity.runs import random_placements

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def run_here(run_entry):
    """``main(ARGS)`` of ``entry`` (validate_gpu or gpu_profile) in this process: ``(status, stdout, stderr)``; without
    ray unless ``ray``."""
    return lambda *args, entry=vg, ray=False: run_entry(entry, *args, ray=ray)


@pytest.fixture
def run_frozen(run_here):
    """:func:`run_here`, each call with the objects alive before it (pytest's, every module imported so far) set aside
    from the garbage collector (``gc.freeze``; the session froze what collection imported, tests/conftest.py), as
    long-lived objects are: the measurement protocol still collects between rounds and placements, and frees what
    the run makes, but no longer walks the whole pytest process each time (0.25-0.5 s a collection here)."""

    def run(*args, **kw):
        gc.freeze()
        return run_here(*args, **kw)

    yield run


def test_summary_merges_models_across_calls(tmp_path):
    """One model per call (the device tool's 10-minute limit): summary.json keeps the others."""
    args = vg.parse(["--tiny"])
    path = str(tmp_path / "summary.json")
    first = merged_summary(path, [{"model": "rnnlm", "n": 1}, {"model": "nmt-2", "n": 2}], args, "dev")
    (tmp_path / "summary.json").write_text(json.dumps(first))
    doc = merged_summary(path, [{"model": "rnnlm", "n": 3}], args, "dev")
    assert [(m["model"], m["n"]) for m in doc["models"]] == [("nmt-2", 2), ("rnnlm", 3)]
    assert first["models"][0]["command"] == "python -m bench.validate_gpu --tiny"


@pytest.mark.parametrize(
    "args, option",
    [
        (["--models", "nope"], "--models"),
        (["--held-out", "rnnlm"], "--held-out"),  # rnnlm is --tiny's tuned model
        (["--placements", "1"], "--placements"),
        (["--train-budget", "0"], "--train-budget"),
        (["--rounds", "0"], "--rounds"),
        (["--warmup-s", "-1"], "--warmup-s"),
        (["--size", "huge"], "--size"),
        (["--steps", "x"], "--steps"),
        (["--heuristics", "m_etf,nope"], "--heuristics"),
        (["--heuristics", ","], "--heuristics"),
    ],
)
def test_bad_options_are_one_line_errors(args, option, tmp_path, run_here):
    status, _, err = run_here("--tiny", *args, "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"))
    assert status == 2 and err.strip().count("\n") == 0 and option in err, err
    assert not os.listdir(tmp_path)  # refused before any profiling or measuring


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_map_without_a_gpu_is_a_one_line_error(tmp_path, run_here):
    status, _, err = run_here("--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"))
    assert status == 2 and err.strip().count("\n") == 0 and "cuda:0" in err, err
    assert not os.listdir(tmp_path)


#: The end-to-end run's options beside --tiny: three heuristics' plans, not all twenty (each plan is one more
#: placed module exported and measured), and 9 placements (random ones fill in): gpu_profile's --stride 4 takes
#: rows 0, 4 and 8. The learned placement trains 1 s (not --tiny's 3: any placement placer.train returns is one
#: more to measure, and the resumed run reuses it) and the profiler times each op once (--repeats 1: the
#: figures of a CPU-only run mean nothing; the repeatability is --repeat-placements', which stays).
QUICK = ("--heuristics", "m_topo,m_etf,module_search", "--placements", "9", "--train-budget", "1", "--repeats", "1")


def run_shell(out, work, without_ray) -> subprocess.CompletedProcess:
    """scripts/gpu_validate.sh --tiny (and :data:`QUICK`): what the GPU machine runs, on the CPU (and, as there,
    without ray): the shell entry point, run as a user runs it."""
    # the script runs `python3`: this interpreter's, as on the GPU machine where it is the one with torch
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {
        **os.environ,
        "PATH": path,
        "OMP_NUM_THREADS": "1",
        "OUT": str(out),
        "WORK": str(work),
        "DEADLINE": "900",
        **without_ray,
    }
    return subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_validate.sh"), "--tiny", *QUICK],
        capture_output=True,
        text=True,
        timeout=1000,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_tiny_run_end_to_end_rescored_and_resumed(tmp_path, without_ray, run_frozen):
    run_here = run_frozen
    back, work = tmp_path / "back", tmp_path / "work"
    proc = run_shell(back, work, without_ray)
    assert proc.returncode == 0, proc.stdout[-3000:]
    # three files come back (the device tool brings at most 8), the folder as one archive
    assert sorted(os.listdir(back)) == ["calibration.tar.gz", "log.txt", "summary.json"]
    with tarfile.open(back / "calibration.tar.gz") as tar:
        assert sorted(tar.getnames()) == [
            "calibration",
            *sorted(
                f"calibration/{f}"
                for f in (
                    "gpt2.jsonl",
                    "gpt2.profile.json",
                    "order_trust.json",
                    "rnnlm.jsonl",
                    "rnnlm.profile.json",
                    "summary.json",
                )
            ),
        ]
    out = work / "calibration"
    doc = json.loads((back / "summary.json").read_text())
    assert doc["format"] == "placer-gpu-validation/2" and "| held-out | gpt2 |" in (back / "log.txt").read_text()
    assert "glibc thread cache off True" in (back / "log.txt").read_text()  # the script starts its processes so
    assert [(m["model"], m["group"]) for m in doc["models"]] == [("gpt2", "held-out"), ("rnnlm", "tuned")]
    assert list(doc["groups"]) == ["held-out", "tuned"] and doc["targets"]["repeat_max"] == 0.03
    for m in doc["models"]:
        e = m["executors"]["eager"]
        assert e["n"] >= 5 and math.isfinite(e["mape"]) and e["best_ratio"] >= 1.0
        assert e["spearman"] is None  # every logical device is the one CPU: all placements simulate alike
        assert m["repeatability"]["n"] >= 1 and m["repeatability"]["median"] >= 0  # built and measured twice
        assert m["memory"]["n"] == 0  # no CUDA device: no allocator peak to compare with
        assert m["checks"]["apply"]["ok"] and m["checks"]["apply"]["grad_max_rel_err"] <= 1e-3
        assert (
            m["profile_fit"]["cpu"]["contention"]["op"] >= 0
            and m["profile_fit"]["cpu"]["staging"]["bandwidth_bytes_per_s"] > 0
        )
    assert doc["orders"]["record"]["format"] == "placer-order-trust/1"

    rows = [json.loads(line) for line in (out / "rnnlm.jsonl").read_text().splitlines()]
    assert len({r["placement_hash"] for r in rows}) == len(rows) and {"learned", "baseline"} <= {
        r["kind"] for r in rows
    }
    assert {"all on cpu:0", "all on gpu:0"} <= {
        m for r in rows for m in r["methods"]
    }  # both singles (maybe as a baseline's)
    for r in rows:
        assert r["status"] == "ok" and r["real_step_s"] > 0 and set(r["sim_step_s"]) == {"eager", "dataflow"}
        assert (
            len(r["round_medians_s"]) == 2 and set(r["sim_peak_bytes"]) == {"cpu:0", "gpu:0"} and r["group"] == "tuned"
        )
    assert sum("repeat" in r for r in rows) >= 1
    trust = json.loads((out / "order_trust.json").read_text())
    assert json.loads((out / "rnnlm.profile.json").read_text())["order_trust"]["margin"] == trust["margin"]

    # --rescore: the stored measurements scored again here, with the stored profiles, give the same figures
    status, stdout, stderr = run_here("--tiny", "--json", "--rescore", str(out), "--out-dir", str(tmp_path / "unused"))
    assert status == 0, stderr[-3000:]

    def figures(d):
        return [(m["model"], m["executors"]["eager"]["mape"], m["repeatability"]["median"]) for m in d["models"]]

    assert figures(json.loads(stdout)) == figures(doc)
    assert not (tmp_path / "unused").exists()  # rescoring writes nothing
    status, _, stderr = run_here("--tiny", "--rescore", str(tmp_path / "nowhere"))
    assert status == 2 and stderr.strip().count("\n") == 0 and "nowhere" in stderr

    # bench.gpu_profile on the same run: a profile in context, three placements re-measured, apply vs float64
    # (it measures as the Ray worker does, in this process: with envs.real.measured, which imports ray)
    argv = ["--models", "rnnlm", "--size", "small", "--device-map", "*=cpu", "--from", str(out), "--stride", "4"]
    argv += ["--remeasure", "3", "--apply-check", "rnnlm", "--repeats", "1", "--steps", "1", "--warmup", "1"]
    argv += ["--cpus", "1", "--out-dir", str(tmp_path / "gp"), "--work-dir", str(tmp_path / "gpw")]
    status, _, stderr = run_here(*argv, entry=gpu_profile, ray=True)
    assert status == 0, stderr[-3000:]
    (entry,) = json.loads((tmp_path / "gp" / "gpu_profile.json").read_text())
    assert len(entry["remeasured"]) == 3 and entry["remeasure_ratio_median"] > 0
    assert [r["methods"] for r in entry["remeasured"]] == [rows[k]["methods"] for k in (0, 4, 8)]
    assert all(c["placed_worst_norm_rel"] < 1e-3 for c in entry["apply_checks"].values())
    for bad in (["--models", "nope"], ["--stride", "0"], ["--gpu-name", "gpu:7"]):
        status, _, stderr = run_here("--device-map", "*=cpu", *bad, entry=gpu_profile, ray=True)
        assert status == 2 and stderr.strip().count("\n") == 0 and bad[0] in stderr, stderr

    # resumed: the profiles, learned placements and measured blocks are reused, nothing is measured again
    blocks = (work / "state" / "rnnlm" / "blocks.jsonl").read_text()
    again = tmp_path / "again"
    status, _, stderr = run_here("--tiny", *QUICK, "--out-dir", str(again), "--work-dir", str(work / "state"))
    assert status == 0, stderr[-3000:]
    assert (work / "state" / "rnnlm" / "blocks.jsonl").read_text() == blocks and "reusing" in stderr
    assert re.search(r"\((\d+) resumed, \1 of them done\)", stderr)  # no placed module built again either
    assert figures(json.loads((again / "summary.json").read_text())) == figures(doc)


def test_in_process_measurement_is_limited_and_logged(tmp_path):
    """bench.fidelity.measuring.measure_here (gpu_profile's, no Ray): a placement past --timeout is a "timeout"
    result in the resumable log, not a hang or a crash."""
    import envs
    from graphs.torch_capture import capture

    model, inputs = build("gpt2", "small")
    graph = capture(model, inputs, name="gpt2")
    cluster = envs.resolve_cluster("h200x1")
    placements = random_placements(graph.num_ops, cluster.num_devices, 2, seed=0)
    kw = dict(device_map="*=cpu", warmup=1, steps=1, cpus=1)
    results = measure_here("gpt2", "small", cluster, graph, placements, str(tmp_path), timeout=1e-3, **kw)
    assert [r.status for r in results] == ["timeout", "timeout"]
    assert len((tmp_path / "measurements.jsonl").read_text().splitlines()) == 2


def test_apply_check_allows_float32s_own_error_and_no_more(monkeypatch):
    from bench.fidelity import apply_check

    """Against float64, the placed model passes where its error is within the tolerance or twice the float32
    CPU model's own error (a gradient that is mostly cancellation), and fails on a larger error or a lost gradient."""

    def rows(placed, cpu32, missing=()):
        return {
            "grads": 2,
            "missing": list(missing),
            "extra": [],
            "loss_placed_rel": 1e-7,
            "loss_cpu32_rel": 1e-7,
            "rows": [
                {
                    "param": "bn.bias",
                    "max_abs": 1e-3,
                    "placed_norm_rel": placed,
                    "cpu32_norm_rel": cpu32,
                    "placed_max_rel": placed,
                    "cpu32_max_rel": cpu32,
                },
                {
                    "param": "fc.weight",
                    "max_abs": 1.0,
                    "placed_norm_rel": 1e-7,
                    "cpu32_norm_rel": 1e-7,
                    "placed_max_rel": 1e-7,
                    "cpu32_max_rel": 1e-7,
                },
            ],
        }

    args = vg.parse(["--tiny"])

    class P:
        method = "learned"

    for errors, ok in (
        (rows(0.05, 0.03), True),
        (rows(5e-4, 1e-7), True),
        (rows(0.05, 0.01), False),
        (rows(1e-7, 1e-7, missing=["lost.weight"]), False),
    ):
        monkeypatch.setattr(apply_check, "grad_errors", lambda *a, e=errors: e)
        check = apply_check.check_apply("rnnlm", args, P(), None)
        assert check["ok"] is ok, (errors["rows"][0], check)
    assert check["same_grad_keys"] is False


def test_a_model_that_fails_is_reported_and_the_others_still_are(monkeypatch, tmp_path, capsys):
    """A model failing on the device (an error, not bad input) loses that model only; the deadline keeps what is
    done."""
    from bench.fidelity.report import model_figures

    args = vg.parse(["--tiny", "--json", "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")])
    vg.check(args)
    row = {
        "model": "rnnlm",
        "kind": "random",
        "methods": ["random 0"],
        "issue_order": "node",
        "status": "ok",
        "real_step_s": 1.0,
        "sim_step_s": {"eager": 1.1, "dataflow": 1.2},
        "ops_per_device": {"cpu:0": 1, "gpu:0": 0},
    }

    def fake(name, group, args):
        if name == "gpt2":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        return (
            {**model_figures(name, group, [row, {**row, "methods": ["random 1"], "real_step_s": 2.0}]), "ops": 1},
            [row],
            {"devices": {}},
            None,
        )

    monkeypatch.setattr(vg, "run_model", fake)
    assert vg.run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in doc["models"]] == ["rnnlm"]
    assert doc["failures"] == ["gpt2: RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["failures"] == doc["failures"]

    def stopped(name, group, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(vg, "run_model", stopped)
    with pytest.raises(vg.PlacerError, match="no model finished: gpt2: stopped at the deadline"):
        vg.run(args)
