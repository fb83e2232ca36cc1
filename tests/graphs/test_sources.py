"""graphs.sources: one module:callable loader, one sys.path rule, for the driver and the Ray workers."""

from __future__ import annotations

import sys
import uuid

import pytest

from envs.real import measured
from graphs import PlacerError

pytest.importorskip("torch")


def _user_module(directory) -> str:
    name = f"user_models_{uuid.uuid4().hex[:8]}"
    (directory / f"{name}.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(2, 3), [torch.zeros(1, 2)]\n"
    )
    return name


def test_a_worker_resolves_source_in_the_drivers_directory(tmp_path, monkeypatch):
    driver_dir, worker_dir = tmp_path / "driver", tmp_path / "elsewhere"
    driver_dir.mkdir()
    worker_dir.mkdir()
    name = _user_module(driver_dir)
    monkeypatch.chdir(worker_dir)  # a Ray worker need not start where the driver runs
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(driver_dir))])
    model, inputs = measured.build_model(f"{name}:build", search_dir=str(driver_dir))
    assert model.out_features == 3 and isinstance(inputs, tuple) and len(inputs) == 1
    assert measured.Worker(f"{name}:build", "*=cpu", threads=1, source_dir=str(driver_dir)).source_dir == str(
        driver_dir
    )


def test_the_current_directory_is_searched_by_default(tmp_path, monkeypatch):
    name = _user_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert measured.build_model(f"{name}:build")[0].in_features == 2
    with pytest.raises(PlacerError, match="no_such_mod_xyz:build: cannot import module"):
        measured.build_model("no_such_mod_xyz:build")
