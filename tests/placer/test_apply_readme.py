"""The README's training loop with a placed model runs as printed: a smaller last batch, eval(), a checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow  # a capture, a heuristic and four programs exported: seconds
def test_the_readme_training_loop_runs(tmp_path, monkeypatch, capsys):
    block = re.search(r"```python\n(# train_placed\.py.*?)```", README.read_text(), re.S)
    assert block, "README: the training loop block (# train_placed.py) is gone"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "train_placed"}
    exec(compile(block.group(1), "README.md:train_placed.py", "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 1"]
    placed, model = namespace["placed"], namespace["model"]
    assert len(namespace["data"]) % 8 == 2 and not placed.training  # the loop met its last batch of 2
    fresh = namespace["Classifier"]()
    fresh.load_state_dict(torch.load("classifier.pt", weights_only=True))
    x, y = namespace["data"][:5]
    fresh.eval()
    torch.testing.assert_close(fresh(x, y), model.eval()(x, y))  # unwrap()'s model: the placed parameters
