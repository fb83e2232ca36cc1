"""`placer place SOURCE --method homes`: a model to a plan with parameter homes in one command, then `placer run`."""

from __future__ import annotations

import json

import pytest

import envs
import graphs
from bench import offload, offload_homes
from graphs.plan import Placement, checkpoint_blocks
from placer.cli import main
from placer.learn.checkpoint_choice import candidate_blocks

SOURCE = "bench.offload:tiny"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def capped_cluster(tmp_path_factory):
    """The tiny scenario's host and a GPU of 10 MiB: its training state does not fit the GPU."""
    scenario = offload_homes.capped(offload.SCENARIOS["tiny"], int(0.01 * 2**30))
    path = tmp_path_factory.mktemp("cluster") / "capped.json"
    path.write_text(json.dumps(offload.scenario_cluster(scenario).to_dict()))
    return str(path)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_homes_plans_a_model_that_does_not_fit_the_gpu_and_placer_run_runs_it(capsys, tmp_path, capped_cluster):
    pytest.importorskip("transformers")
    out_path = tmp_path / "plan.json"
    rc, out, err = run(
        capsys, "place", SOURCE, "--cluster", capped_cluster, "--method", "homes", "--option", "evals=200",
        "-o", str(out_path),
    )  # fmt: skip
    assert rc == 0, err
    plan = Placement.load(str(out_path))
    assert plan.param_homes and set(plan.param_homes.values()) == {"cpu:0"} and plan.method == "move_search_homes"
    assert "parameters homed apart from their ops" in out and "of 10.2 MiB" in out
    rival = plan.meta["fsdp2_offload_s"]  # FSDP2's offload as a plan, as it is and with every layer checkpointed
    assert set(rival) == {"plain", "checkpointed"} and "  FSDP2's offload as a plan (every op on the GPU" in out
    compared = plan.meta["host_step_s"]  # host_step=auto: the plan found, simulated both ways, keeps the faster
    assert plan.host_step == min(("after", "backward"), key=lambda way: (compared[way], way != "after"))
    if plan.host_step == "backward":
        assert "during the backward, in batches" in out and "placer.apply.step_in_backward(placed, optimizer)" in out
    else:
        assert "homed parameters stepped by the optimizer's step after the backward (simulated" in out
    assert (
        "activations checkpointed: " in out
        and "searched: layers chosen by moves fits at" in out
        and "every layer then pruned" in out
    )
    cluster = envs.resolve_cluster(capped_cluster)
    graph = graphs.capture(*offload.tiny())
    assert envs.SimEnv(graph, cluster).simulate(plan).ok  # the plan fits the 10 MiB GPU
    everything_on_gpu = Placement.from_indices(graph, cluster.device_names, [1] * graph.num_ops)
    assert not envs.SimEnv(graph, cluster).simulate(everything_on_gpu).ok  # where the model alone does not
    rc, out, err = run(
        capsys, "run", SOURCE, "--placement", str(out_path), "--cluster", capped_cluster, "--device-map", "*=cpu",
        "--steps", "1", "--warmup", "0", "--json",
    )  # fmt: skip
    assert rc == 0, err
    assert json.loads(out)["status"] == "ok"
    # stepped during the backward: placer run registers the optimizer and reports what the host worker did
    plan.host_step = "backward"
    plan.save(str(out_path))
    argv = ["run", SOURCE, "--placement", str(out_path), "--cluster", capped_cluster, "--device-map", "*=cpu"]
    rc, out, err = run(capsys, *argv, "--steps", "2", "--warmup", "1", "--json")
    steps = json.loads(out)["extra"]["host_steps"]
    assert rc == 0 and 1 <= steps["calls"] <= steps["stepped"] and steps["stepped"] >= 1, err
    rc, out, err = run(capsys, *argv, "--steps", "2", "--warmup", "1")
    assert rc == 0 and "homed parameters stepped during each backward in " in out, err
    rc, out, err = run(capsys, "simulate", SOURCE, str(out_path), "--cluster", capped_cluster)  # what it predicts
    assert rc == 0 and "calls of the host worker; backward() waits " in out, err
    # the same plan with its layers checkpointed (each on one device) runs too
    p = plan.indices(graph, cluster.device_names)
    plan.checkpoint = [b for b in candidate_blocks(graph) if len(set(p[checkpoint_blocks(graph, [b]) >= 0])) == 1]
    assert plan.checkpoint
    plan.save(str(out_path))
    rc, out, err = run(
        capsys, "run", SOURCE, "--placement", str(out_path), "--cluster", capped_cluster, "--device-map", "*=cpu",
        "--steps", "1", "--warmup", "0", "--json",
    )  # fmt: skip
    assert rc == 0 and json.loads(out)["status"] == "ok", err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--option", "foo=1"], "--option foo: --method homes takes evals=N, headroom=F, checkpoint=on|off|moves and"),
        (["--option", "host_step=later"], "--option host_step=later: must be auto, backward or after"),
        (["--option", "headroom=2"], "--option headroom=2: must be a number in (0, 1]"),
        (["--option", "checkpoint=maybe"], "--option checkpoint=maybe: must be on, off or moves"),
        (["--ranks"], "--ranks: a plan with parameter homes runs in one process"),
    ],
)
def test_bad_options_are_one_line_and_status_2(capsys, tmp_path, capped_cluster, argv, message):
    pytest.importorskip("transformers")
    rc, out, err = run(
        capsys, "place", SOURCE, "--cluster", capped_cluster, "--method", "homes", *argv, "-o", str(tmp_path / "p.json")
    )
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_cluster_without_a_host_is_refused(capsys, tmp_path):
    pytest.importorskip("transformers")
    doc = {
        "format": "placer-cluster/1",
        "name": "one-gpu",
        "devices": [{"name": "gpu:0", "kind": "gpu", "memory_bytes": 1e7, "flops_per_s": 1e13,
                     "mem_bw_bytes_per_s": 1e12, "launch_overhead_s": 5e-6}],
        "links": [],
    }  # fmt: skip
    path = tmp_path / "one_gpu.json"
    path.write_text(json.dumps(doc))
    rc, out, err = run(
        capsys, "place", SOURCE, "--cluster", str(path), "--method", "homes", "-o", str(tmp_path / "p.json")
    )
    assert rc == 2 and "has no host (cpu:0) to home parameters on" in err, err
