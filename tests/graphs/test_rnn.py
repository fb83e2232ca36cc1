"""nn.LSTM and nn.GRU written out per layer and step: the fused module's values and gradients, and a graph to split."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from graphs.rnn import written_out
from graphs.torch_capture import capture

CASES = [
    ("lstm", dict(num_layers=2)),
    ("lstm", dict(num_layers=2, bidirectional=True, batch_first=True)),
    ("lstm", dict(num_layers=1, proj_size=3, bias=False)),
    ("gru", dict(num_layers=3, batch_first=True)),
    ("gru", dict(num_layers=2, bidirectional=True)),
]


def _rnn(kind: str, **options) -> nn.RNNBase:
    torch.manual_seed(0)
    return (nn.LSTM if kind == "lstm" else nn.GRU)(5, 4, **options)


def _sequence(rnn: nn.RNNBase, batch: int = 3, steps: int = 6) -> torch.Tensor:
    shape = (batch, steps, 5) if rnn.batch_first else (steps, batch, 5)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _loss(out) -> torch.Tensor:
    y, state = out
    states = state if isinstance(state, tuple) else (state,)
    return y.square().mean() + sum(s.sin().sum() for s in states)


@pytest.mark.parametrize("kind,options", CASES)
@pytest.mark.parametrize("initial_state", [False, True])
def test_written_out_layers_have_the_fused_outputs_and_gradients(kind, options, initial_state):
    fused = _rnn(kind, **options)
    unrolled = copy.deepcopy(fused)
    x = _sequence(fused)
    hx = None
    if initial_state:
        layers = fused.num_layers * (2 if fused.bidirectional else 1)
        h0 = torch.randn(layers, 3, fused.proj_size or 4)
        hx = (h0, torch.randn(layers, 3, 4)) if kind == "lstm" else h0
    want = fused(x, hx)
    with written_out(unrolled) as count:
        got = unrolled(x, hx)
    assert count == 1 and type(unrolled) is type(fused)  # the class is restored
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    _loss(got).backward()
    _loss(want).backward()
    for (name, p), q in zip(unrolled.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_an_unbatched_sequence_and_a_packed_one():
    lstm = _rnn("lstm", num_layers=2)
    x = torch.randn(6, 5)
    with written_out(lstm):
        y, (h, c) = lstm(x)
        packed = nn.utils.rnn.pack_sequence([torch.randn(4, 5), torch.randn(2, 5)])
        lstm(packed)  # the fused module runs it
    want, (wh, wc) = lstm(x)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert h.shape == wh.shape == (2, 4) and c.shape == wc.shape


class Seq2Seq(nn.Module):
    """A GRU encoder and decoder with tied input/output embeddings: the model a new user tried."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.encoder = nn.GRU(8, 8, num_layers=2, batch_first=True)
        self.decoder = nn.GRU(8, 8, num_layers=2, batch_first=True)
        self.out = nn.Linear(8, 16, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        _, h = self.encoder(self.emb(src))
        y, _ = self.decoder(self.emb(tgt), h)
        return nn.functional.cross_entropy(self.out(y).flatten(0, 1), tgt.flatten())


def _tokens(*shape: int) -> torch.Tensor:
    return torch.randint(0, 16, shape, generator=torch.Generator().manual_seed(2))


@pytest.mark.slow
def test_capture_writes_out_recurrent_layers_on_request_and_says_so():
    model, inputs = Seq2Seq(), (_tokens(2, 3), _tokens(2, 2))
    fused = capture(model, inputs)
    assert sum("gru" in t for t in fused.op_types) == 2 and "unroll_rnn" not in fused.meta
    g = capture(model, inputs, unroll_rnn=True)
    assert g.meta["unroll_rnn"] is True and not any("gru" in t for t in g.op_types)
    assert g.total_param_bytes == fused.total_param_bytes and g.meta["tied_params"] == fused.meta["tied_params"]
    # every layer's every step is its own op: 2 layers x (3 + 2) steps of a recurrent matmul
    recurrent = [i for i, ps in enumerate(g.params) if any("weight_hh" in p for p in ps)]
    assert len(recurrent) == 2 * (3 + 2)
    assert {p.split(".")[0] for i in recurrent for p in g.params[i]} == {"encoder", "decoder"}


@pytest.mark.slow
def test_apply_splits_a_recurrent_layer_across_devices_with_the_fused_gradients():
    from graphs.plan import Placement
    from placer.apply import apply

    torch.manual_seed(3)
    model, inputs = Seq2Seq(), (_tokens(2, 3), _tokens(2, 2))
    ref = copy.deepcopy(model)
    g = capture(model, inputs, unroll_rnn=True)
    layer1 = np.array([any("_l1" in p for p in ps) for ps in g.params])  # every op of layer 1 on gpu:1
    p = Placement.from_indices(g, ["gpu:0", "gpu:1"], layer1.astype(int))
    placed = apply(model, p, inputs, device_map="*=cpu", graph=g)  # re-exported as the graph says
    loss, want = placed(*inputs), ref(*inputs)
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for name, q in ref.named_parameters():
        torch.testing.assert_close(placed.get_parameter(name).grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    shorter = (_tokens(3, 2), _tokens(3, 4))  # another batch and lengths: the written-out program follows
    torch.testing.assert_close(placed(*shorter), ref(*shorter), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_placer_export_unroll_rnn_and_dynamic(tmp_path, monkeypatch, capsys):
    import json
    import sys

    import graphs
    from placer.cli import main

    (tmp_path / "s2s_model.py").write_text(
        "import torch\n"
        "from test_rnn import Seq2Seq\n\n"
        "def build():\n"
        "    return Seq2Seq(), (torch.randint(0, 16, (2, 3)), torch.randint(0, 16, (2, 2)))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    sys.modules.pop("s2s_model", None)
    rc = main(["export", "s2s_model:build", "-o", "g.json", "--unroll-rnn", "--dynamic", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["dynamic_dims"] == {"src": [0], "tgt": [0]}  # a written-out layer fixes the lengths
    g = graphs.load("g.json")
    assert g.meta["unroll_rnn"] is True and g.meta["inputs"][0]["dynamic"] == {"0": [0, None]}
    rc = main(["export", "g.json", "-o", "again.json", "--unroll-rnn"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "--unroll-rnn needs a model" in err
