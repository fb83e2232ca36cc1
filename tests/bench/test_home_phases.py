"""bench.home_phases: a plan's phases (forward, backward, optimizer step) on the CPU stand-in, and bad input."""

from __future__ import annotations

import json

import pytest

from bench import home_phases


@pytest.mark.slow  # the tiny model captured, two plans applied and stepped (~8 s)
def test_every_plan_has_every_phase_of_every_step_beside_the_simulator(run_entry):
    pytest.importorskip("transformers")
    argv = ["--scenario", "tiny", "--cap", "0.02", "--device-map", "*=cpu", "--plans", "fsdp2,ops", "--evals", "30"]
    status, out, err = run_entry(home_phases, *argv, "--steps", "2", "--json")
    assert status == 0, err
    runs = json.loads(out)["runs"]
    assert [r["plan"] for r in runs] == ["fsdp2", "ops"]
    fsdp2, ops = runs
    assert fsdp2["homed_gib"] > 0 and ops["homed_gib"] == 0  # FSDP2's plan homes every parameter, ops none
    for r in runs:
        assert len(r["steps"]) == 2 and r["sim_step_s"] > 0 and r["sim_peak_gpu_gib"] >= 0
        assert all(s[f"{p}_s"] > 0 for s in r["steps"] for p in home_phases.PHASES)
        assert r["steps"][0]["loss"] != r["steps"][1]["loss"]  # the backward and the step ran: the loss moved
    table = home_phases.markdown_table(runs)
    assert table.splitlines()[2].startswith("| fsdp2 | ") and len(table.splitlines()) == 4
    assert all(len(r["builds"]) == 1 and "build_spread" not in r for r in runs)


@pytest.mark.slow  # the tiny model captured, one plan applied and stepped twice (~6 s)
def test_builds_give_each_phase_its_spread_across_builds(run_entry):
    pytest.importorskip("transformers")
    argv = ["--scenario", "tiny", "--cap", "0.02", "--device-map", "*=cpu", "--plans", "ops", "--evals", "30"]
    status, out, err = run_entry(home_phases, *argv, "--steps", "2", "--builds", "2", "--json")
    assert status == 0, err
    (r,) = json.loads(out)["runs"]
    assert len(r["builds"]) == 2 and r["steps"] == r["builds"][-1] and all(len(b) == 2 for b in r["builds"])
    assert r["build_spread"] == pytest.approx(home_phases.build_spread(r["builds"]))
    assert set(r["build_spread"]) == {f"{p}_s" for p in home_phases.PHASES}
    assert all(v >= 0 for v in r["build_spread"].values())
    table = home_phases.markdown_table([r]).splitlines()
    assert "fwd spread across builds" in table[4] and table[6].startswith("| ops | 2 | ")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--plans", "fsdp2,nope"], "--plans: unknown nope"),
        (["--scenario", "llama-9b"], "--scenario 'llama-9b': unknown"),
        (["--steps", "0"], "--steps and --builds >= 1"),
        (["--builds", "0"], "--steps and --builds >= 1"),
    ],
)
def test_bad_input_is_one_line_and_status_2(run_entry, args, message):
    status, _, err = run_entry(home_phases, *args)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
