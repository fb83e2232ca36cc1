"""bench.checkpoint_fidelity: its plans, its table and its bad input (the measurement itself runs from the README)."""

from __future__ import annotations

import pytest

import envs
import graphs
from bench import checkpoint_fidelity


def test_the_three_plans_put_every_op_on_the_host_and_checkpoint_none_every_other_and_every_layer():
    pytest.importorskip("transformers")
    graph = graphs.capture(*checkpoint_fidelity.llama())
    made = checkpoint_fidelity.plans(graph, envs.Cluster.preset("h200x1"))
    layers = [f"model.model.layers.{k}" for k in range(4)]
    assert {name: p.checkpoint for name, p in made.items()} == {"plain": [], "half": layers[::2], "all": layers}
    assert all(set(p.assignment.values()) == {"cpu:0"} for p in made.values())
    env = envs.SimEnv(graph, envs.Cluster.preset("h200x1"))
    times = {name: env.simulate(p).step_time_s for name, p in made.items()}
    assert times["plain"] < times["half"] < times["all"]  # each layer checkpointed runs its forward twice


def test_the_table_reads_the_rows():
    row = {"blocks": 2, "real_s": 0.1, "spread": 1.05, "sim_s": 0.09, "real_over_plain": 1.2, "sim_over_plain": 1.1}
    doc = {"source": "m:b", "ops": 10, "repeats": 3, "steps": 5, "rows": {"half": {**row, "sim_error": -0.1}}}
    assert "| half | 2 | 100.00 | 1.05 | 90.00 | 1.200 | 1.100 | -10.0 % |" in checkpoint_fidelity.table(doc)


@pytest.mark.parametrize("args,message", [(["--repeats", "0"], "--repeats 0: must be >= 1"), (["--steps", "0"], "")])
def test_bad_input_is_one_line_and_status_2(run_entry, args, message):
    status, out, err = run_entry(checkpoint_fidelity, *args)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
