"""bench.plots: trace -> Gantt bars (hand-computed schedule), colours, and the PNGs."""

from __future__ import annotations

import os

import numpy as np
import pytest

import envs
from bench import plots
from envs.cluster import Cluster, Device, Link
from graphs import OpGraph, PlacerError
from graphs.synthetic import random_dag


def toy_cluster() -> Cluster:
    """cpu:0, gpu:0, gpu:1 at 1 FLOP/s, links of 1 byte/s: forward = FLOPs s, backward = 2x, copy = bytes s."""
    devices = [Device(n, k, 1e15, 1.0, 1e30, 0.0) for n, k in (("cpu:0", "cpu"), ("gpu:0", "gpu"), ("gpu:1", "gpu"))]
    links = {(a.name, b.name): Link(1.0, 0.0) for a in devices for b in devices if a.name != b.name}
    return Cluster(name="toy", devices=devices, links=links)


@pytest.fixture(scope="module")
def two_ops():
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 2)], flops=[1.0, 1.0], op_types=["aten.mm.default"] * 2, name="toy")
    g.module_paths = ["enc.layers.0.cell", "dec.proj"]
    return g


def test_bars_of_a_hand_computed_schedule(two_ops):
    # a on gpu:0, b on gpu:1: fwd a [0,1], act a->gpu:1 [1,3], fwd b [3,4], bwd b [4,6], grad -> gpu:0 [6,8], bwd a
    # [8,10]
    trace = envs.simulate(two_ops, [1, 2], toy_cluster(), trace=True).extra["trace"]
    bars = plots.schedule_bars(trace, two_ops)
    assert bars.tracks[:3] == ["cpu:0", "gpu:0", "gpu:1"]
    assert set(bars.tracks[3:]) == {"gpu:0->gpu:1", "gpu:1->gpu:0"}
    got = sorted(
        (bars.tracks[b.track], b.kind, round(b.start_s, 9), round(b.dur_s, 9), b.op_index)
        for b in bars.bars
        if b.kind != "update"
    )
    assert got == sorted(
        [
            ("gpu:0", "forward", 0.0, 1.0, 0),
            ("gpu:0->gpu:1", "transfer", 1.0, 2.0, 0),
            ("gpu:1", "forward", 3.0, 1.0, 1),
            ("gpu:1", "backward", 4.0, 2.0, 1),
            ("gpu:1->gpu:0", "transfer", 6.0, 2.0, 0),
            ("gpu:0", "backward", 8.0, 2.0, 0),
        ]
    )
    assert bars.title == "toy on toy"


def test_transfers_without_a_graph_have_no_op(two_ops):
    trace = envs.simulate(two_ops, [1, 2], toy_cluster(), trace=True).extra["trace"]
    bars = plots.schedule_bars(trace)
    assert {b.op_index for b in bars.bars if b.kind == "transfer"} == {None}


@pytest.mark.parametrize(
    "path, layer",
    [
        ("encoder.layers.1.cell", "encoder.layers.1"),
        ("attention.combine", "attention"),
        ("Mixed_5b", "Mixed_5b"),
        ("", "(no module)"),
        ("h.0", "h.0"),
    ],
)
def test_layer_of(path, layer):
    assert plots.layer_of(path) == layer


def test_colours_by_kind_and_by_layer(two_ops):
    trace = envs.simulate(two_ops, [1, 2], toy_cluster(), trace=True).extra["trace"]
    bars = plots.schedule_bars(trace, two_ops)
    cols, legend = plots.bar_colours(bars, two_ops, "kind")
    assert [c for b, c in zip(bars.bars, cols) if b.kind == "forward"] == [plots.KIND_COLOURS["forward"]] * 2
    assert {"forward", "backward", "transfer"} <= set(legend)
    cols, legend = plots.bar_colours(bars, two_ops, "layer")
    assert {"enc.layers.0", "dec", "transfer"} <= set(legend)
    by_op = {b.op_index: c for b, c in zip(bars.bars, cols) if b.kind == "forward"}
    assert by_op[0] == legend["enc.layers.0"] and by_op[1] == legend["dec"] and by_op[0] != by_op[1]


def test_home_copies_and_recomputes_have_colours_of_their_own_by_kind_and_by_layer(two_ops):
    # b's 2 bytes homed on cpu:0, both ops on gpu:0 in a checkpointed module: the copies and b's second forward
    from graphs.plan import Placement

    g = OpGraph.from_edges(
        ["a", "b"], [("a", "b", 2)], flops=[1.0, 1.0], param_bytes=[0, 2], op_types=["aten.mm.default"] * 2, name="t"
    )
    g.module_paths, g.params = ["enc.layers.0.cell", "enc.layers.0.proj"], [[], ["w"]]
    p = Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1, 1], homes=[-1, 0])
    p.checkpoint = ["enc.layers.0"]
    trace = envs.SimEnv(g, toy_cluster(), executor="eager").simulate(p, trace=True).extra["trace"]
    bars = plots.schedule_bars(trace, g)
    assert {"home copy", "recompute"} <= {b.kind for b in bars.bars} and "cpu:0->gpu:0 homes" in bars.tracks
    for mode, colours in (("kind", plots.KIND_COLOURS), ("layer", plots.LAYER_MODE_KIND_COLOURS)):
        cols, legend = plots.bar_colours(bars, g, mode)
        assert "#000000" not in cols and {"home copy", "recompute"} <= set(legend)
        assert all(c == colours[b.kind] for b, c in zip(bars.bars, cols) if b.kind in ("home copy", "recompute"))


def test_many_layers_share_an_other_colour():
    g = random_dag(700, seed=0)  # module paths block0..block13: 14 layers
    c = envs.Cluster.preset("k80x2")
    bars = plots.schedule_bars(envs.simulate(g, np.ones(700, dtype=np.int32), c, trace=True).extra["trace"], g)
    cols, legend = plots.bar_colours(bars, g, "layer")
    layers = [k for k in legend if k.startswith("block")]
    assert len(layers) == plots.MAX_LAYER_COLOURS - 1 and "other layers" in legend
    assert legend["other layers"] in cols


def test_bad_input_is_one_placer_error(two_ops, tmp_path):
    with pytest.raises(PlacerError, match="traceEvents"):
        plots.schedule_bars({"events": []})
    trace = envs.simulate(two_ops, [1, 2], toy_cluster(), trace=True).extra["trace"]
    bars = plots.schedule_bars(trace, two_ops)
    with pytest.raises(PlacerError, match="color-by"):
        plots.bar_colours(bars, two_ops, "rainbow")
    with pytest.raises(PlacerError, match="needs the graph"):
        plots.bar_colours(bars, None, "layer")
    with pytest.raises(PlacerError, match="cannot write"):
        plots.plot_schedule(trace, str(tmp_path / "no" / "such" / "dir.png"), graph=two_ops)


def test_plot_schedule_writes_a_small_png(tmp_path):
    g = random_dag(300, seed=2)
    c = envs.Cluster.preset("k80x4")
    trace = envs.simulate(g, np.arange(300, dtype=np.int32) % 4 + 1, c, trace=True).extra["trace"]
    out = tmp_path / "s.png"
    plots.plot_schedule(trace, str(out), graph=g, color_by="layer")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out) < 300_000


def test_plot_search_curves(tmp_path):
    curve = {
        "graph": "g",
        "method": "random_search",
        "wall_s": [0.0, 1.0],
        "evals": [1, 50],
        "best_s": [0.2, 0.1],
        "end_wall_s": 2.0,
        "end_evals": 80,
        "lower_bound_s": 0.05,
    }
    out = tmp_path / "c.png"
    plots.plot_search_curves([curve, {**curve, "method": "annealing"}], str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(PlacerError, match="no search curves"):
        plots.plot_search_curves([], str(out))


def test_plot_measured_curves_draws_each_loop_s_real_steps_and_both_predictions(tmp_path):
    def m(real, sim, pred, best):
        return {"round": 0, "real_s": real, "simulated_s": sim, "predicted_s": pred, "best_s": best}

    corrected = [m(0.5, 0.01, 0.01, 0.5), m(0.4, 0.012, 0.45, 0.4), m(float("inf"), 0.011, 0.42, 0.4)]
    cell = {
        "graph": "lm",
        "seed": 3,
        "methods": {
            "corrected": {"curve": corrected},
            "simulator": {"curve": corrected[:1]},  # one measurement: no curve to draw
            "measured moves": {"curve": [{"best_s": 0.5}, {"best_s": 0.4}]},  # no predictions
        },
        "side_by_side": {"corrected": [0.41, 0.43, 0.42], "simulator": [0.5, float("inf"), 0.52]},
    }
    out = tmp_path / "m.png"
    drawn = plots.plot_measured_curves([cell], str(out))
    assert out.read_bytes()[:4] == b"\x89PNG" and list(drawn) == [("lm", 3, "corrected")]
    series = drawn[("lm", 3, "corrected")]
    assert series["real"][:2] == [500.0, 400.0] and np.isnan(series["real"][2])
    assert series["simulated"] == pytest.approx([10.0, 12.0, 11.0])
    assert series["predicted"] == pytest.approx([10.0, 450.0, 420.0])
    assert series["best"] == pytest.approx([500.0, 400.0, 400.0])
    with pytest.raises(PlacerError, match="no measured curves"):
        plots.plot_measured_curves([{**cell, "methods": {"simulator": {"curve": corrected[:1]}}}], str(out))
