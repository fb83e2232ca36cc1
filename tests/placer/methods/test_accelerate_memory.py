"""accelerate's map with a user's ``max_memory``: what from_pretrained(max_memory=...) would place, onto ops."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import envs
from graphs import PlacerError

pytest.importorskip("accelerate")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import graphs  # noqa: E402
from placer.methods import place  # noqa: E402
from placer.methods.heuristics.hf_accelerate import max_memory_of  # noqa: E402

MIB = 1 << 20
H200 = envs.resolve_cluster("h200x1")  # cpu:0 + gpu:0 (141 GB)


class Net(nn.Module):
    """Eight 1 MiB layers (256 x 1024 floats, no bias)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Linear(1024, 256, bias=False) if i % 2 == 0 else nn.Linear(256, 1024, bias=False) for i in range(8)]
        )

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.sum()


@pytest.fixture(scope="module")
def net():
    model = Net()
    return model, graphs.capture(model, (torch.randn(2, 1024),))


def _gpu_weight_bytes(g, idx) -> int:
    return int(sum(b for b, d in zip(g.param_bytes, idx) if d == 1))


def test_max_memory_caps_the_gpus_weights_and_fills_in_module_order(net):
    model, g = net
    assert set(place("accelerate", g, H200, model=model).indices(g, H200.device_names).tolist()) == {1}  # all fit
    idx = place("accelerate", g, H200, model=model, max_memory="gpu:0=3MiB").indices(g, H200.device_names)
    assert 0 < _gpu_weight_bytes(g, idx) <= 3 * MIB and (idx == 0).any()
    weighted = idx[g.param_bytes > 0]
    assert (np.diff(weighted) <= 0).all()  # the first layers on gpu:0 (1), the rest on the host (0)


def test_a_fraction_is_of_every_gpus_capacity(net):
    model, g = net
    fraction = 3 * MIB / float(H200.memory_bytes[1])
    by_fraction = place("accelerate_sequential", g, H200, model=model, max_memory=fraction).indices(
        g, H200.device_names
    )
    by_size = place("accelerate_sequential", g, H200, model=model, max_memory={"gpu:0": 3 * MIB}).indices(
        g, H200.device_names
    )
    assert by_fraction.tolist() == by_size.tolist() and (by_size == 0).any()
    assert max_memory_of(H200, fraction)["cpu"] == int(H200.memory_bytes[0])  # the host keeps its own


@pytest.mark.parametrize(
    "value,match",
    [
        (1.5, "in \\(0, 1\\]"),
        (0, "in \\(0, 1\\]"),
        ("gpu:3=1GiB", "gpu:3"),
        ("gpu:0=lots", "lots"),
        ("gpu:0", "DEVICE=SIZE"),
        ({"gpu:0": -5}, "not a size"),
        ([1, 2], "expected a fraction"),
    ],
)
def test_a_bad_max_memory_is_one_line_naming_the_option(value, match):
    with pytest.raises(PlacerError, match=match) as e:
        max_memory_of(H200, value)
    assert "--option max_memory" in str(e.value) and "\n" not in str(e.value)


def test_accelerate_keys_and_logical_names_say_the_same():
    k80 = envs.resolve_cluster("k80x2")
    assert max_memory_of(k80, "1=2GiB,cpu=5GiB") == max_memory_of(k80, "gpu:1=2GiB,cpu:0=5GiB")
    assert max_memory_of(k80, None) == {
        0: int(k80.memory_bytes[1]),
        1: int(k80.memory_bytes[2]),
        "cpu": int(k80.memory_bytes[0]),
    }


def test_placer_place_takes_the_option(tmp_path, monkeypatch, capsys):
    from placer.cli import main

    (tmp_path / "mymodel_acc.py").write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        class MeanSquare(nn.Module):  # the training loss: a model's forward returns it
            def forward(self, x):
                return x.pow(2).mean()

        def build():
            model = nn.Sequential(*[nn.Linear(512, 512, bias=False) for _ in range(4)], MeanSquare())
            return model, (torch.randn(2, 512),)
    """)
    )
    monkeypatch.chdir(tmp_path)
    base = ["place", "mymodel_acc:build", "--cluster", "h200x1", "--method", "accelerate"]
    assert main(base + ["--option", "max_memory=gpu:0=2MiB", "-o", "p.json"]) == 0
    devices = graphs.plan.Placement.load(str(tmp_path / "p.json")).assignment.values()
    assert {"cpu:0", "gpu:0"} <= set(devices)
    capsys.readouterr()
    assert main(base + ["--option", "max_memory=gpu:9=1GiB", "-o", "q.json"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "gpu:9" in err
