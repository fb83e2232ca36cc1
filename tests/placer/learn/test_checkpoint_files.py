"""Checkpoints go through the one atomic writer: no fixed temp name, no followed symlink."""

from __future__ import annotations

import os

import torch

from placer.learn import checkpoint


def test_checkpoint_does_not_follow_a_planted_temp_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    logdir = tmp_path / "run"
    logdir.mkdir()
    # The old code wrote a fixed "checkpoint.pt.tmp", opened with truncation.
    os.symlink(victim, logdir / "checkpoint.pt.tmp")
    os.symlink(victim, logdir / f"checkpoint.json.{os.getpid()}.tmp")
    checkpoint.save(str(logdir), {"w": torch.arange(3.0)}, {"iteration": 4})
    assert victim.read_text() == "precious"
    tensors, state = checkpoint.load(str(logdir))
    assert state == {"iteration": 4} and torch.equal(tensors["w"], torch.arange(3.0))
    assert sorted(p.name for p in logdir.iterdir()) == sorted(
        ["checkpoint.pt", "checkpoint.json", "checkpoint.pt.tmp", f"checkpoint.json.{os.getpid()}.tmp"]
    )


def test_the_run_state_s_dict_is_asdict_s_with_its_lists_copied():
    import dataclasses

    from placer.learn.state import RunState

    state = RunState(iteration=7, best_indices=[1, 2, 3], warm_start_indices=[0, 1], best_found_by="move search")
    doc = state.to_dict()
    assert doc == dataclasses.asdict(state) and list(doc) == [f.name for f in dataclasses.fields(RunState)]
    doc["best_indices"].append(9)
    assert state.best_indices == [1, 2, 3]  # a copy: a checkpoint written later is not changed by the caller
