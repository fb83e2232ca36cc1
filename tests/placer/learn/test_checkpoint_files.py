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
