"""``placer export-map --torchtitan``: a plan's stages as the module lists torchtitan's pipeline reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs.models.corpus import build_nn_encoder
from graphs.plan import Placement
from graphs.torch_capture import capture
from placer.cli import main
from placer.distributed import module_fqns_per_model_part


@pytest.fixture(scope="module")
def encoder():
    return capture(*build_nn_encoder())


def test_a_split_at_a_layer_names_whole_layers_per_stage(encoder):
    g = encoder
    first = next(i for i, p in enumerate(g.module_paths) if p.startswith("body.layers.1"))
    p = Placement.from_indices(g, ["gpu:0", "gpu:1"], np.arange(g.num_ops) >= first)
    assert module_fqns_per_model_part(g, p) == [["body.layers.0", "embed"], ["body.layers.1", "head"]]
    assert module_fqns_per_model_part(g, p, module="body") == [["layers.0"], ["layers.1"]]


def test_a_layer_split_between_stages_is_named_by_its_parts_and_a_plan_that_returns_is_three_parts(encoder):
    g = encoder
    layer0 = [i for i, p in enumerate(g.module_paths) if p.startswith("body.layers.0")]
    middle = layer0[len(layer0) // 2]
    back = next(i for i, p in enumerate(g.module_paths) if p.startswith("body.layers.1"))
    op_devices = np.where((np.arange(g.num_ops) >= middle) & (np.arange(g.num_ops) < back), 1, 0)
    parts = module_fqns_per_model_part(g, Placement.from_indices(g, ["gpu:0", "gpu:1"], op_devices))
    assert len(parts) == 3  # gpu:0, gpu:1, gpu:0 again: three stages, three model parts
    assert "body.layers.0" not in sum(parts, []) and any(k.startswith("body.layers.0.") for k in parts[1])
    assert parts[2] == ["body.layers.1", "head"]


def test_export_map_writes_it(encoder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    g = encoder
    first = next(i for i, p in enumerate(g.module_paths) if p.startswith("body.layers.1"))
    Placement.from_indices(g, ["gpu:0", "gpu:1"], np.arange(g.num_ops) >= first).save("p.json")
    argv = [
        "export-map",
        "p.json",
        "--graph",
        "graphs.models.corpus:build_nn_encoder",
        "--torchtitan",
        "-o",
        "split.json",
    ]
    assert main(argv) == 0
    assert "2 model parts, one per stage" in capsys.readouterr().out
    doc = json.loads((tmp_path / "split.json").read_text())
    assert doc == {"module_fqns_per_model_part": [["body.layers.0", "embed"], ["body.layers.1", "head"]]}
