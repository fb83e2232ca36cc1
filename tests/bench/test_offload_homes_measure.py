"""The offload scenario with homes at one cap, measured (bench.offload_homes_measure), on the CPU stand-in."""

from __future__ import annotations

import json

import pytest

from bench import offload_homes, offload_homes_measure
from bench.offload import Plan
from envs.result import Result
from graphs.plan import Placement
from tests.bench.conftest import freeze_after_importing


def plan(label, kind, status="ok", step_time_s=1.0, placement=True):
    return Plan(label, kind, object() if placement else None, {"status": status, "step_time_s": step_time_s})


def test_placer_s_plans_then_fsdp2_s_then_accelerate_s_fastest_fitting_map_are_measured():
    plans = [
        plan("accelerate, slow", "accelerate", step_time_s=9.0),
        plan("accelerate, oom", "accelerate", status="oom", step_time_s=0.1),
        plan(offload_homes.FSDP2, "fsdp2"),
        plan("accelerate, fast", "accelerate", step_time_s=5.0),
        plan(offload_homes.OPS_ONLY, "placer-ops", placement=False),  # no plan: nothing to measure
        plan(offload_homes.HOMED, "placer"),
    ]
    labels = [p.label for p in offload_homes_measure.measure_order(plans)]
    assert labels == [offload_homes.HOMED, offload_homes.FSDP2, "accelerate, fast"]
    # a plan the simulator puts out of memory is measured after every plan it says fits
    plans[4] = plan(offload_homes.OPS_ONLY, "placer-ops", status="oom", step_time_s=0.1)
    labels = [p.label for p in offload_homes_measure.measure_order(plans)]
    assert labels == [offload_homes.HOMED, offload_homes.FSDP2, "accelerate, fast", offload_homes.OPS_ONLY]
    # where placer's plan checkpoints layers, the same search without checkpointing is measured right after it
    plans.append(plan(offload_homes.NO_CHECKPOINT, "placer-no-checkpoint"))
    assert offload_homes.NO_CHECKPOINT not in [p.label for p in offload_homes_measure.measure_order(plans)]
    plans[5] = Plan(offload_homes.HOMED, "placer", Placement({}, "", [], checkpoint=["layers.0"]), plans[5].sim)
    labels = [p.label for p in offload_homes_measure.measure_order(plans)]
    assert labels[:2] == [offload_homes.HOMED, offload_homes.NO_CHECKPOINT]
    # where placer's plan steps its homed parameters during the backward, the same search stepping them after it
    # is measured right after it
    plans.append(plan(offload_homes.STEP_AFTER, "placer-step-after"))
    assert offload_homes.STEP_AFTER not in [p.label for p in offload_homes_measure.measure_order(plans)]
    homed = Placement({}, "", [], checkpoint=["layers.0"], host_step="backward")
    plans[5] = Plan(offload_homes.HOMED, "placer", homed, plans[5].sim)
    labels = [p.label for p in offload_homes_measure.measure_order(plans)]
    assert labels[:3] == [offload_homes.HOMED, offload_homes.STEP_AFTER, offload_homes.NO_CHECKPOINT]


def test_a_row_holds_the_real_peak_against_the_cap_beside_the_simulated_one():
    r = Result(0.5, "ok", peak_bytes={"gpu:0": 3 << 30}, source="measured")
    row = offload_homes_measure.measured_row("x", {"step_time_s": 0.4, "peak_bytes": {"gpu:0": 2 << 30}}, r, 2 << 30)
    assert (row["real_step_time_s"], row["real_peak_gpu_gib"], row["within_cap"]) == (0.5, 3.0, False)
    assert (row["sim_step_time_s"], row["sim_peak_gpu_gib"]) == (0.4, 2.0)
    assert row["real_reserved_gpu_gib"] is None  # no reserve measured (a CPU run)
    # the allocator's reserve (what a cap limits, fragmentation included) is reported beside the allocation
    r.extra["peak_reserved_bytes"] = {"gpu:0": 7 << 29}
    row = offload_homes_measure.measured_row("x", None, r, 4 << 30)
    assert (row["real_peak_gpu_gib"], row["real_reserved_gpu_gib"], row["within_cap"]) == (3.0, 3.5, True)


@pytest.mark.parametrize(
    "args,message", [(["--scenario", "llama-9b"], "unknown"), (["--cap", "0"], "--cap must be > 0")]
)
def test_bad_input_is_one_line_and_status_2(run_entry, tmp_path, args, message):
    status, _, err = run_entry(offload_homes_measure, "--out-dir", str(tmp_path), *args)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1


#: What the call imports as it goes (lazily), imported before the collector is frozen.
RUN_IMPORTS = (
    "accelerate",
    "bench.fsdp2",
    "deepspeed",
    "envs.real.placed_model",
    "envs.real.timing",
    "networkx",
    "numba",
    "placer.apply",
    "torch.distributed.fsdp",
    "torch.export",
    "transformers.models.llama.modeling_llama",
)


@pytest.fixture
def frozen_gc():
    """The collector frozen on what the call imports (14 collections in this test)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    freeze_after_importing(*RUN_IMPORTS)
    yield


@pytest.mark.slow
def test_the_cpu_stand_in_measures_placer_s_homed_plan_fsdp2_and_deepspeed_and_writes_both_columns(
    run_entry, tmp_path, frozen_gc
):
    status, out, err = run_entry(
        offload_homes_measure,
        *("--scenario", "tiny", "--cap", "0.01", "--device-map", "*=cpu", "--evals", "30"),
        *("--warmup", "0", "--steps", "1", "--out-dir", str(tmp_path), "--no-isolate", "--zero-adam", "torch"),
    )
    assert status == 0, err
    doc = json.loads((tmp_path / "measured-tiny-0.01.json").read_text())
    rows = {r["label"]: r for r in doc["measured"]}
    homed = rows[offload_homes.HOMED]
    assert homed["status"] == "ok" and homed["real_step_time_s"] > 0 and homed["sim_step_time_s"] > 0
    assert rows["FSDP2, CPUOffloadPolicy (measured: torch's FSDP2)"]["status"] == "ok"
    assert rows[offload_homes_measure.FSDP2_AC_MEASURED]["status"] == "ok"  # with every block checkpointed
    for label in offload_homes_measure.DEEPSPEED_ROWS:  # DeepSpeed's ZeRO-Offload at stages 2 and 3, one process
        assert rows[label]["status"] == "ok" and rows[label]["real_step_time_s"] > 0, rows[label]
        assert rows[label]["optimizer"] == "torch.optim.Adam (asked for torch's)"  # which Adam ran, in the row
    assert [r["label"] for r in doc["measured"]][1:5] == list(offload_homes_measure.RIVAL_ROWS)  # after placer's
    placement = next(p for p in doc["plans"] if p["label"] == offload_homes.FSDP2)["placement"]
    assert placement["param_homes"] and rows[offload_homes.FSDP2]["status"] == "ok"  # placer.apply ran the homes
    assert f"{offload_homes.HOMED}: ok" in out
    # the default: each row in a process of its own, the plan read back from the file
    argv = ["--scenario", "tiny", "--cap", "0.01", "--device-map", "*=cpu", "--warmup", "0", "--steps", "1"]
    argv += ["--zero-adam", "torch"]
    args = offload_homes_measure.parse([*argv, "--out-dir", str(tmp_path)])
    path = str(tmp_path / "measured-tiny-0.01.json")
    r = offload_homes_measure.measure_in_child(args, path, offload_homes.HOMED)
    assert r.status == "ok" and r.step_time_s > 0 and r.extra["losses"]
    assert r.extra["protocol"]["steady_malloc"] and r.extra["protocol"]["gc_off"]  # as every placer measurement
    r = offload_homes_measure.measure_in_child(args, path, offload_homes_measure.ZERO3_OFFLOAD_MEASURED)
    assert r.status == "ok" and r.extra["stage"] == 3 and r.extra["optimizer"].startswith("torch.optim.Adam (asked")
    r = offload_homes_measure.measure_in_child(args, path, "no such plan")  # its process exits 2 with one line
    assert r.status == "error" and "exited 2" in r.message and "'no such plan': no such plan in" in r.message


def test_a_profile_is_what_the_plans_are_made_and_simulated_with(run_entry, tmp_path, monkeypatch):
    """--profile: the plans are made on the profiled graph and cluster (envs.real.profiler.with_profile, as the
    offload stages calibrate; a stand-in's profile would make its gpu:0 a CPU, so the call is watched here)."""
    pytest.importorskip("transformers")
    from envs.real import profiler

    seen = {}

    def with_profile(graph, cluster, profile, *, device_map=None):
        seen.update(profile=profile, device_map=device_map)
        return graph, cluster

    made = []
    monkeypatch.setattr(profiler, "with_profile", with_profile)
    monkeypatch.setattr(offload_homes, "cap_plans", lambda graph, cluster, model, **kw: made.append(graph) or [])
    prof = tmp_path / "profile.json"
    prof.write_text("{}")
    # --deadline 0: no row is measured (FSDP2's rows would start two processes); the plans are what is checked
    argv = [
        "--scenario",
        "tiny",
        "--cap",
        "0.01",
        "--device-map",
        "*=cpu",
        "--deadline",
        "0",
        "--out-dir",
        str(tmp_path),
    ]
    status, out, err = run_entry(offload_homes_measure, *argv, "--profile", str(prof))
    assert status == 0, err
    assert seen == {"profile": str(prof), "device_map": "*=cpu"} and len(made) == 1
    doc = json.loads((tmp_path / "measured-tiny-0.01.json").read_text())
    assert doc["simulator"] == f"profile {prof}"
    assert {r["status"] for r in doc["measured"]} == {"not measured: past the deadline"}
    status, out, err = run_entry(offload_homes_measure, *argv, "--profile", str(tmp_path / "none.json"))
    assert status == 2 and "--profile" in err and "no such file" in err


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_rows_rivals_measures_placer_s_plan_and_the_rivals_only(run_entry, tmp_path, monkeypatch):
    """--rows rivals: placer's plan with homes, then FSDP2's and DeepSpeed's rows, nothing else (the rows are
    watched, not run: each is a Result here)."""
    pytest.importorskip("transformers")
    seen = []

    def measure_row(args, scenario, cluster, plan, label=""):
        seen.append(label if plan is None else plan.label)
        return Result(0.5, "ok", peak_bytes={}, source="measured")

    monkeypatch.setattr(offload_homes_measure, "measure_row", measure_row)
    argv = ["--scenario", "tiny", "--cap", "0.01", "--device-map", "*=cpu", "--evals", "30", "--no-isolate"]
    status, out, err = run_entry(offload_homes_measure, *argv, "--rows", "rivals", "--out-dir", str(tmp_path))
    assert status == 0, err
    assert seen == [offload_homes.HOMED, *offload_homes_measure.RIVAL_ROWS]
    seen.clear()
    status, out, err = run_entry(offload_homes_measure, *argv, "--out-dir", str(tmp_path))  # all: more after them
    assert (
        status == 0
        and seen[: len(offload_homes_measure.RIVAL_ROWS) + 1]
        == [
            offload_homes.HOMED,
            *offload_homes_measure.RIVAL_ROWS,
        ]
        and len(seen) > len(offload_homes_measure.RIVAL_ROWS) + 1
    ), seen
