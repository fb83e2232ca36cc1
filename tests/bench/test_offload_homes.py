"""The offload scenario at several caps with parameter homes, simulated (bench.offload_homes, issue 50)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import envs
from bench import offload_homes
from bench.offload import SCENARIOS, scenario_cluster
from envs.cluster import Cluster, Device
from envs.machines import PCIE5
from graphs import OpGraph


def test_fsdp2_s_offload_is_every_op_on_the_gpu_and_every_own_parameter_on_the_host():
    g = OpGraph.from_edges(
        ["a", "b", "c", "d"], [("a", "b", 4), ("b", "c", 4), ("c", "d", 4)], param_bytes=[8, 8, 0, 8]
    )
    g.params = [["wa"], ["shared"], [], ["shared"]]  # b and d read one parameter: homed too, copied for each
    devices = [Device("cpu:0", "cpu", 1e9, 1e9, 1e9, 0.0), Device("gpu:0", "gpu", 1e9, 1e12, 1e11, 0.0)]
    c = Cluster("c", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})
    p = offload_homes.fsdp2_offload_plan(g, c)
    assert p.indices(g).tolist() == [1, 1, 1, 1] and p.param_homes == {"wa": "cpu:0", "shared": "cpu:0"}
    assert envs.SimEnv(g, c).simulate(p).ok
    g.module_paths = ["layers.0", "layers.0", "layers.1", "layers.1"]
    ac = offload_homes.fsdp2_offload_plan(g, c, checkpoint=True)  # with every layer checkpointed, its homes kept
    assert ac.checkpoint == ["layers.0", "layers.1"] and ac.param_homes == p.param_homes
    assert envs.SimEnv(g, c).simulate(ac).ok


def test_ratios_compare_placer_s_homed_plan_with_the_fastest_fitting_rivals():
    rows = [
        {"label": offload_homes.HOMED, "kind": "placer", "sim_status": "ok", "sim_step_time_s": 1.0},
        {"label": offload_homes.OPS_ONLY, "kind": "placer-ops", "sim_status": "ok", "sim_step_time_s": 3.0},
        {"label": offload_homes.FSDP2, "kind": "fsdp2", "sim_status": "ok", "sim_step_time_s": 2.5},
        {"label": offload_homes.FSDP2_AC, "kind": "fsdp2-ac", "sim_status": "ok", "sim_step_time_s": 2.0},
        {
            "label": offload_homes.NO_CHECKPOINT,
            "kind": "placer-no-checkpoint",
            "sim_status": "ok",
            "sim_step_time_s": 1.5,
        },
        {"label": offload_homes.STEP_AFTER, "kind": "placer-step-after", "sim_status": "ok", "sim_step_time_s": 1.25},
        {"label": "accelerate, a", "kind": "accelerate", "sim_status": "oom", "sim_step_time_s": 0.5},
        {"label": "accelerate, b", "kind": "accelerate", "sim_status": "ok", "sim_step_time_s": 4.0},
    ]
    assert offload_homes.ratios(rows) == {
        "fsdp2_over_placer": 2.0,  # the faster of FSDP2 with and without checkpointing
        "accelerate_over_placer": 4.0,  # the map out of memory does not count
        "ops_only_over_placer": 3.0,
        "no_checkpoint_over_placer": 1.5,  # the ablation: the same search without checkpointing
        "step_after_over_placer": 1.25,  # and with the homed parameters stepped after the backward
    }
    rows[0]["sim_status"] = "oom"
    assert set(offload_homes.ratios(rows).values()) == {None}


@pytest.mark.parametrize(
    "args,message",
    [
        (["--scenarios", "llama-9b"], "--scenario 'llama-9b': unknown"),
        (["--caps", "24,x"], "--caps '24,x': not comma-separated numbers"),
        (["--caps", "0"], "caps > 0"),
        (["--evals", "0"], "--evals 0: must be >= 1"),
    ],
)
def test_bad_input_is_one_line_and_status_2(run_entry, tmp_path, args, message):
    status, out, err = run_entry(offload_homes, "--out-dir", str(tmp_path), *args)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_tiny_scenario_at_two_caps_writes_every_simulated_row_and_the_plans(run_entry, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    status, out, err = run_entry(
        offload_homes, "--scenarios", "tiny", "--caps", "0.02,0.01", "--evals", "60", "--out-dir", str(tmp_path)
    )
    assert status == 0, err
    doc = json.loads((tmp_path / "tiny.json").read_text())
    assert doc["simulated"] and [c["cap_gib"] for c in doc["caps"]] == [0.02, 0.01]
    cap = doc["caps"][1]
    labels = [r["label"] for r in cap["rows"]]
    assert labels[:6] == [
        offload_homes.HOMED,
        offload_homes.STEP_AFTER,
        offload_homes.NO_CHECKPOINT,
        offload_homes.OPS_ONLY,
        offload_homes.FSDP2,
        offload_homes.FSDP2_AC,
    ]
    assert {r["label"]: r["checkpointed"] for r in cap["rows"]}[offload_homes.NO_CHECKPOINT] == 0
    assert sum(r["kind"] == "accelerate" for r in cap["rows"]) == 5
    fsdp = next(p for p in cap["plans"] if p["label"] == offload_homes.FSDP2)
    assert fsdp["placement"]["param_homes"]  # saved with the plan, reloaded as a placement
    homed = next(r for r in cap["rows"] if r["label"] == offload_homes.HOMED)
    placer_plan = next(p for p in cap["plans"] if p["label"] == offload_homes.HOMED)["placement"]
    assert placer_plan["param_homes"] and "host_step" not in fsdp["placement"]
    compared = placer_plan["meta"]["host_step_s"]  # host_step auto: the plan found, simulated both ways
    faster = min(("after", "backward"), key=lambda way: (compared[way], way != "after"))
    assert placer_plan.get("host_step", "after") == faster
    assert homed["sim_status"] == "ok" and homed["sim_peak_gpu_gib"] * (1 << 30) <= 0.01 * (1 << 30)
    assert 0 < cap["bound_s"] <= homed["sim_step_time_s"] and cap["bound"]  # no plan under the lower bound
    assert "| placer / the lower bound |" in out
    assert (tmp_path / "table.md").read_text() == out
    assert "| tiny | 0.01 |" in out


def test_the_caps_change_the_cluster_s_gpu_only():
    s = offload_homes.capped(SCENARIOS["llama-256k"], 8 << 30)
    a, b = scenario_cluster(s), scenario_cluster(SCENARIOS["llama-256k"])
    assert a.memory_bytes[1] == 8 << 30 and b.memory_bytes[1] == 24 << 30
    assert np.array_equal(a.memory_bytes[:1], b.memory_bytes[:1])


def test_the_plan_with_homes_leaves_the_memory_headroom_free():
    """A chain whose fastest plan (all on the GPU) fills 95 % of it: the plan keeps its peak within the headroom's
    share of the GPU, by moving ops or homes to the host; without the headroom it takes the full GPU."""
    from placer.learn.offload_plan import plan_with_homes
    from placer.methods.heuristics.costs import MEMORY_HEADROOM

    n = 8
    g = OpGraph.from_edges(
        [f"o{i}" for i in range(n)], [(f"o{i}", f"o{i + 1}", 1 << 10) for i in range(n - 1)], flops=[1e10] * n
    )
    g.param_bytes = np.full(n, 1 << 20, dtype=np.int64)
    g.params = [[f"w{i}"] for i in range(n)]

    def cluster(gpu_bytes: float) -> Cluster:
        devices = [Device("cpu:0", "cpu", 1e12, 1e10, 1e10, 0.0), Device("gpu:0", "gpu", gpu_bytes, 1e13, 1e12, 0.0)]
        return Cluster("c", devices, {("cpu:0", "gpu:0"): PCIE5, ("gpu:0", "cpu:0"): PCIE5})

    all_gpu = envs.SimEnv(g, cluster(1e12)).simulate(np.ones(n, dtype=np.int32))
    cap = all_gpu.peak_bytes["gpu:0"] / 0.95
    c = cluster(cap)
    # stepped after the backward, homes cost the host's Adam after it: the fastest plan keeps everything on the GPU
    full = plan_with_homes(g, c, evals=300, headroom=1.0, host_step="after")
    assert envs.SimEnv(g, c).simulate(full).peak_bytes["gpu:0"] > MEMORY_HEADROOM * cap  # all on the GPU, at 95 %
    p = plan_with_homes(g, c, evals=300, host_step="after")
    assert p.meta["headroom"] == MEMORY_HEADROOM
    sim = envs.SimEnv(g, c).simulate(p)
    assert sim.ok and sim.peak_bytes["gpu:0"] <= MEMORY_HEADROOM * cap
