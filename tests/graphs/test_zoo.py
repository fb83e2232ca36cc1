"""The model zoo: builds, the disk cache, and (slow) a capture of every model."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import graphs
from graphs import PlacerError, zoo
from graphs.models.lstm import LSTMLayer
from graphs.synthetic import random_dag


def test_names_and_unknown_name():
    assert zoo.names() == ["rnnlm", "nmt-2", "nmt-4", "inception-v3", "gpt2", "resnet50"]
    with pytest.raises(PlacerError, match="nope: not a zoo model"):
        zoo.build("nope")
    with pytest.raises(PlacerError, match="nope: not a zoo model"):
        zoo.graph("nope")


@pytest.mark.parametrize("name", ["rnnlm", "nmt-2", "inception-v3", "gpt2", "resnet50"])
def test_build_on_meta_is_training_mode(name):
    model, inputs = zoo.build(name, device="meta")
    assert model.training and all(t.device.type == "meta" for t in inputs)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_unrolled_lstm_layer_matches_nn_lstm():
    torch.manual_seed(0)
    ref = torch.nn.LSTM(5, 7)
    layer = LSTMLayer(5, 7)
    with torch.no_grad():
        layer.ih.weight.copy_(ref.weight_ih_l0)
        layer.ih.bias.copy_(ref.bias_ih_l0 + ref.bias_hh_l0)
        layer.hh.weight.copy_(ref.weight_hh_l0)
    x = torch.randn(6, 3, 5)
    expected, (h_ref, c_ref) = ref(x)
    steps, (h, c) = layer(list(x.unbind(0)))
    torch.testing.assert_close(torch.stack(steps), expected)
    torch.testing.assert_close(c, c_ref[0])


def test_small_model_forward_returns_a_loss():
    from graphs.models.nmt import NMT

    model = NMT(num_layers=2, src_vocab=50, tgt_vocab=60, hidden_size=16)
    src, tgt = torch.randint(0, 50, (3, 4)), torch.randint(0, 60, (3, 5))
    loss = model(src, tgt, tgt)
    loss.backward()
    assert loss.shape == () and model.src_embedding.weight.grad is not None


def test_graph_cache_is_used_and_damaged_entries_recaptured(tmp_path, monkeypatch):
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_capture(name, *, decompose=False):
        calls.append((name, decompose))
        return random_dag(30, seed=1, name=name)

    monkeypatch.setattr(zoo, "capture", fake_capture)
    first = zoo.graph("resnet50")
    path = zoo.cache_path("resnet50")
    assert path.exists() and str(path).startswith(str(tmp_path)) and torch.__version__.split("+")[0] in path.name
    again = zoo.graph("resnet50")
    assert calls == [("resnet50", False)] and again.content_hash == first.content_hash
    assert zoo.cache_path("resnet50", decompose=True) != path
    path.write_text('{"format": "placer-graph/1", "ops"')  # truncated
    zoo.graph("resnet50")
    assert len(calls) == 2 and graphs.load(path).content_hash == first.content_hash


def test_a_capture_under_way_elsewhere_is_waited_for_and_read_not_captured_again(tmp_path, monkeypatch):
    """Two processes asking for one uncached model: the second waits on the entry's lock and reads the first's."""
    import threading

    from filelock import FileLock

    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(zoo, "capture", lambda name, decompose=False: calls.append(name) or random_dag(9, name=name))
    path = zoo.cache_path("gpt2")
    path.parent.mkdir(parents=True)
    got = []
    with FileLock(f"{path}.lock"):  # another process is capturing gpt2
        reader = threading.Thread(target=lambda: got.append(zoo.graph("gpt2")))
        reader.start()
        reader.join(timeout=0.3)
        assert reader.is_alive() and not got  # waiting, not capturing
        graphs.io.save(random_dag(20, seed=4, name="gpt2"), path)  # the other process's capture lands
    reader.join(timeout=30)
    assert calls == [] and got[0].num_ops == 20
    assert not [p for p in os.listdir(path.parent) if ".tmp" in p]


# ---------------------------------------------------------------- slow: real captures
@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_graph_captures_and_round_trips(name, zoo_cache, tmp_path):
    g = zoo.graph(name)
    assert g.name == name and g.meta["zoo"]["model"] == name
    assert g.total_param_bytes == 4 * zoo.num_params(name)  # float32, tied weights once
    assert g.total_flops > 1e11 and np.all(g.flops >= 0)
    assert not g.meta["unused_params"]
    if name in ("rnnlm", "nmt-2", "nmt-4"):
        assert 1000 < g.num_ops < 10_000  # unrolled over time, but not huge
    graphs.save(g, tmp_path / "g.json")
    back = graphs.load(tmp_path / "g.json")
    assert back.content_hash == g.content_hash
    assert zoo.graph(name).content_hash == g.content_hash  # from the cache


@pytest.mark.slow
def test_capture_is_deterministic(zoo_cache):
    cached = zoo.graph("nmt-2")
    fresh = zoo.capture("nmt-2")
    assert fresh.content_hash == cached.content_hash and fresh.names == cached.names


@pytest.mark.slow
def test_lstm_models_scale_with_layers(zoo_cache):
    two, four = zoo.graph("nmt-2"), zoo.graph("nmt-4")
    steps = zoo._ZOO["nmt-2"].sizes["seq_len"]
    # two extra encoder and decoder layers add one cell per step each
    cells = lambda g: sum(t == "aten.chunk.default" for t in g.op_types)  # noqa: E731
    assert cells(two) == 2 * 2 * steps and cells(four) == 2 * 4 * steps
    attn = [p for p in four.module_paths if p.startswith("attention")]
    assert len(attn) > steps
