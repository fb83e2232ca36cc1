"""bench.rank_splits: each method's best simulated plan, the report and its fidelity, one-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import envs
from bench import rank_splits
from envs.sim.ranks import PIPELINE_SHAPES, RankSim
from graphs import OpGraph, PlacerError
from graphs.plan import Placement


def lm_like() -> OpGraph:
    paths = ["embed"] + [f"layers.{i}.{p}" for i in range(4) for p in ("attn.q", "mlp.fc")] + ["head"]
    names = [f"op{i}" for i in range(len(paths))]
    flops = [1e8] + [1e9] * 8 + [6e9]
    return OpGraph.from_edges(
        names,
        [(a, b, 1 << 16) for a, b in zip(names, names[1:])],
        flops=flops,
        module_paths=paths,
        op_types=["aten.mm.default"] * len(paths),
    )


def test_each_method_keeps_its_fastest_shape_and_placers_search_is_never_slower():
    g, cluster = lm_like(), envs.Cluster.preset("k80x2")
    times = {}
    for method, (plan, sim_s, rows) in rank_splits.best_plans(g, cluster).items():
        assert len(rows) == len(PIPELINE_SHAPES) and sim_s == min(r["sim_s"] for r in rows)
        assert (plan.microbatches, plan.inflight or plan.microbatches) in PIPELINE_SHAPES
        times[method] = sim_s
    assert sorted(times) == sorted(rank_splits.METHODS)
    assert times["stage_search"] <= min(times.values()) * (1 + 1e-9)
    assert times["stage_search"] < times["equal_layers"]  # the head is the heaviest layer by far


def test_the_report_and_its_fidelity():
    rows = [
        {"method": m, "microbatches": 2, "inflight": 2, "sim_s": s, "measured_s": r, "spread_s": [r, r]}
        for m, s, r in zip(rank_splits.METHODS, [1.0, 2.0, 3.0, 0.5], [1.1, 2.2, 2.7, 0.5])
    ]
    models = [{"model": "toy", "source": "x:y", "ops": 3, "rows": rows}]
    f = rank_splits.fidelity(models)
    assert f["plans"] == 4 and f["spearman"] == pytest.approx(1.0)
    assert f["mape"] == pytest.approx((0.1 / 1.1 + 0.2 / 2.2 + 0.3 / 2.7 + 0) / 4)
    lines = rank_splits.table(models)
    assert "equal_layers" in lines[1] and "2.20x faster" in lines[1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cluster", "k80x2", "--models", "nope"], "unknown nope"),
        (["--cluster", "nope.json"], "nope.json"),
        (["--cluster", "k80x2", "--cluster-of", "nope=k80x2"], "--cluster-of 'nope=k80x2': give MODEL=FILE"),
        (["--cluster", "k80x2", "--cluster-of", "unet"], "--cluster-of 'unet'"),
        (["--cluster", "k80x2", "--cluster-of", "unet=missing.json"], "missing.json"),
        (["--cluster", "k80x2", "--placement", "unet=missing.json"], "missing.json"),
        (["--cluster", "k80x2", "--placement", "lm"], "--placement 'lm': give MODEL=FILE"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, message):
    assert rank_splits.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_placement_file_named_like_a_method_is_refused(tmp_path, capsys):
    g = lm_like()
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1] * g.num_ops).save(str(tmp_path / "stage_search.json"))
    assert rank_splits.main(["--cluster", "k80x2", "--placement", f"lm={tmp_path / 'stage_search.json'}"]) == 2
    assert "name the file other than a method (stage_search)" in capsys.readouterr().err


def test_each_model_is_planned_and_simulated_on_its_own_cluster_where_given(monkeypatch, capsys):
    seen = []
    row = {"method": "equal_layers", "microbatches": 1, "inflight": 1, "sim_s": 1.0, "measured_s": 1.0}
    phase = {"forward_s": 0.2, "backward_s": 0.4, "optimizer_s": 0.1, "other_s": 0.3, "step_s": 1.0}
    row.update(spread_s=[1.0, 1.0], phases={"measured": [phase], "simulated": [phase]})

    def run_model(name, cluster, repeats, steps, warmup, given=(), profile=None):
        seen.append((name, cluster.name, profile))
        return {"model": name, "source": rank_splits.MODELS[name], "ops": 1, "rows": [row]}

    monkeypatch.setattr(rank_splits, "run_model", run_model)
    argv = ["--cluster", "k80x2", "--cluster-of", "unet=k80x4", "--models", "lm,unet", "--json"]
    assert rank_splits.main([*argv, "--profile-of", "unet=ops.json"]) == 0
    assert seen == [("lm", "k80x2", None), ("unet", "k80x4", "ops.json")]
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster_files"] == {"lm": "k80x2", "unet": "k80x4"}


@pytest.mark.slow
def test_the_llm_scale_table_scores_every_split_under_each_schedule():
    from bench import rank_llm

    g = rank_llm.llama_graph(4, 32, vocab=2000, hidden=64, mlp=128, layers=8, heads=4, kv_heads=2)
    rows = rank_llm.score(g, envs.Cluster.preset("k80x2"), "1f1b", 4)
    rows += rank_llm.score(g, envs.Cluster.preset("k80x2"), "interleaved_1f1b", 4)
    rows += rank_llm.score(g, envs.Cluster.preset("k80x2"), "zbv", 4)
    assert [r["method"] for r in rows] == list(rank_llm.METHODS) * 3
    assert all(r["status"] == "ok" for r in rows), rows
    assert {r["stages"] for r in rows[:4]} == {2} and {r["stages"] for r in rows[4:]} == {4}
    assert {r["schedule"] for r in rows[8:]} == {"zbv"}
    for part in (rows[:4], rows[4:8], rows[8:]):
        ours = part[-1]["step_time_s"]
        assert ours <= min(r["step_time_s"] for r in part) * (1 + 1e-9)


@pytest.mark.slow
def test_a_method_without_a_plan_is_its_row_and_the_others_run(monkeypatch, tmp_path):
    """8 ranks (the H200 machine's cluster file), a U-Net of 7 layers: equal_layers cannot cut 8 stages."""
    measured = []
    ph = dict.fromkeys(("forward_s", "backward_s", "optimizer_s", "other_s", "step_s"), 0.02)
    monkeypatch.setattr(
        rank_splits, "measure", lambda source, plan, steps, warmup: (measured.append(plan) or 0.1, [ph] * 8)
    )
    cluster = envs.Cluster.load(Path(__file__).parents[2] / "docs/ranks/h200/ranks-8.json")
    # and a placement of the U-Net given (as a `placer train --ranks` run's best): a row of its own
    from graphs import sources
    from graphs.torch_capture import capture

    g = capture(*sources.resolve_model(rank_splits.MODELS["unet"]))
    table = rank_splits.split_table(g, cluster, ["flops_balanced"])
    mine = next(r["placement"] for r in table if r["microbatches"] == 2)  # not its fastest shape
    mine.save(str(tmp_path / "mine.json"))
    model = rank_splits.run_model(
        "unet", cluster, repeats=1, steps=1, warmup=0, given=[("mine", str(tmp_path / "mine.json"))]
    )
    rows = {r["method"]: r for r in model["rows"]}
    assert rows["mine"]["status"] == "ok" and rows["mine"]["microbatches"] == 2 and measured[-1] == mine
    assert rows["mine"]["sim_s"] == pytest.approx(rank_splits.RankSim(g, cluster).simulate(mine).step_time_s)
    assert " mine " in "\n".join(rank_splits.table([model]))
    assert (
        rows["equal_layers"]["status"] == "no plan"
        and "8 stages for a model of 7 layers" in rows["equal_layers"]["message"]
    )
    ok = [m for m in rank_splits.METHODS if rows[m]["status"] == "ok"]
    assert {"flops_balanced", "stage_search"} <= set(ok) and len(measured) == len(ok) + 1
    assert rank_splits.fidelity([model])["plans"] == len(ok) + 1  # the given plan's row too
    assert "equal_layers         no plan: " in "\n".join(rank_splits.table([model]))
    # every measured plan has its ranks' phases, measured and simulated, and so every phase its error
    assert all(len(rows[m]["phases"]["simulated"]) == len(rows[m]["phases"]["measured"]) for m in [*ok, "mine"])
    assert set(rank_splits.phase_error([model])) == {"compute", "optimizer", "other"}
    # the measured plans simulated again on a cluster (here the same): each row's own plan, the same step
    again = rank_splits.rescore([model], cluster)
    assert again["plans"] == len(ok) + 1 and all(rows[m]["rescored_s"] == pytest.approx(rows[m]["sim_s"]) for m in ok)


def test_resimulate_scores_an_earlier_runs_measured_plans_on_todays_simulator(monkeypatch, tmp_path, capsys):
    g, cluster = lm_like(), envs.Cluster.preset("k80x2")
    plans = [Placement.from_indices(g, cluster.device_names, [1] * k + [2] * (g.num_ops - k)) for k in (3, 6)]
    sims = [RankSim(g, cluster).simulate(p).step_time_s for p in plans]
    rows = [
        {"method": m, "status": "ok", "sim_s": 1.0, "measured_s": real, "placement": p.to_dict()}
        for m, p, real in zip(("equal_layers", "mine"), plans, (sims[0] * 1.1, sims[1] * 0.8))
    ]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"models": [{"model": "lm", "source": "x:y", "rows": rows}], "fidelity": {"mape": 0.5}}))
    graphs = []
    monkeypatch.setattr(rank_splits, "model_graph", lambda source, profile=None: graphs.append(profile) or g)
    argv = ["--resimulate", str(run), "--cluster", "k80x2", "--profile-of", "lm=ops.json"]
    assert rank_splits.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recorded"] == {"mape": 0.5} and doc["now"]["plans"] == 2 and set(graphs) == {"ops.json"}
    assert doc["now"]["mape"] == pytest.approx((0.1 / 1.1 + 0.2 / 0.8) / 2)  # |sim - real| / real, each plan's
    assert rank_splits.main(argv) == 0
    assert "now:      MAPE 17.0%" in capsys.readouterr().out
    run.write_text(json.dumps({"rows": []}))
    assert rank_splits.main(argv) == 2
    err = capsys.readouterr().err
    assert "run.json: not a `python -m bench.rank_splits --json` run" in err and len(err.strip().splitlines()) == 1


def test_the_phase_error_is_the_median_ratio_over_every_plans_ranks():
    def ph(f, b, o, other):
        return {"forward_s": f, "backward_s": b, "optimizer_s": o, "other_s": other, "step_s": f + b + o + other}

    rows = [
        {"method": "a", "phases": {"measured": [ph(2, 4, 1, 3), ph(1, 1, 1, 1)], "simulated": [ph(1, 2, 2, 1)] * 2}},
        {"method": "b", "phases": {"measured": [ph(3, 3, 1, 0)], "simulated": [ph(1, 2, 1, 0)]}},
        {"method": "c", "status": "no plan", "message": "-"},
    ]
    e = rank_splits.phase_error([{"rows": rows}])
    # compute: 6/3, 2/3, 6/3 -> median 2; optimizer: 1/2, 1/2, 1/1 -> 0.5; other: 3/1, 1/1 (0/0 skipped) -> 2
    assert e["compute"] == {"median": 2.0, "min": pytest.approx(2 / 3), "max": 2.0, "n": 3}
    assert e["optimizer"]["median"] == 0.5 and e["other"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 2}


def test_the_balanced_estimate_spreads_the_compute_and_adds_the_bubble():
    from bench import rank_llm
    from tests.envs.sim.test_ranks import cluster, two_stage_graph

    # per microbatch a: 1 s + 2 s, b: 2 s + 4 s; M = 2: rank 0 computes 6 s, rank 1 12 s; mean 9 s
    est = rank_llm.balanced_estimate(two_stage_graph(2), cluster(), "1f1b", 2, [0, 1])
    assert est["bubble"] == pytest.approx(1.5) and est["estimate_s"] == pytest.approx(13.5)  # (M + R - 1) / M
    assert est["imbalance"] == pytest.approx(12 / 9)
    chain = OpGraph.from_edges(list("abcd"), [(x, y, 8) for x, y in zip("abc", "bcd")], flops=[2e9] * 4)
    looped = rank_llm.balanced_estimate(chain, cluster(), "interleaved_1f1b", 2, [0, 1, 0, 1])
    assert looped["bubble"] == pytest.approx(1 + 1 / 4)  # 1 + (R - 1) / (v M), v = 2 stages per rank
    # each rank: 2 ops x 2 microbatches x (1 + 2) s
    assert looped["estimate_s"] == pytest.approx(12.0 * 1.25) and looped["imbalance"] == pytest.approx(1.0)
    with pytest.raises(PlacerError, match="does not run"):  # one stage per rank: not an interleaved plan
        rank_llm.balanced_estimate(two_stage_graph(2), cluster(), "interleaved_1f1b", 2, [0, 1])


def test_the_convnet_s_dense_layers_hold_its_parameters_and_few_of_its_flops():
    """Where a FLOPs-balanced split misleads: the dense layers' gradients and Adam step, not their FLOPs."""
    from bench.rank_models import convnet
    from graphs.torch_capture import capture

    model, inputs = convnet()
    params = dict(model.named_parameters())
    dense = sum(p.numel() for n, p in params.items() if n.startswith("fc"))
    assert dense > 0.9 * sum(p.numel() for p in params.values())
    g = capture(model, inputs)
    fc_flops = sum(f for f, path in zip(g.flops, g.module_paths) if path.startswith("fc"))
    assert fc_flops < 0.1 * g.flops.sum() and "convnet" in rank_splits.MODELS


@pytest.mark.slow  # builds VGG16's 135 M parameters and captures it (~4 s)
def test_vgg16_is_configuration_d_whose_dense_layers_hold_its_parameters_and_few_of_its_flops():
    """13 convolutions in five pooled blocks, torchvision's 7 x 7 pooling, dense 25088 -> 4096 -> 4096 -> 200: the
    dense layers hold 89 % of the parameters and under 10 % of the FLOPs."""
    from bench.rank_models import vgg16
    from graphs.torch_capture import capture

    model, (x, labels) = vgg16()
    convs = [m for m in model.features if isinstance(m, torch.nn.Conv2d)]
    pools = [m for m in model.features if isinstance(m, torch.nn.MaxPool2d)]
    assert len(convs) == 13 and len(pools) == 5 and [m.out_channels for m in convs][::3] == [64, 128, 256, 512, 512]
    dense = [m for m in model.classifier if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in dense] == [(25088, 4096), (4096, 4096), (4096, 200)]
    params = dict(model.named_parameters())
    held = sum(p.numel() for n, p in params.items() if n.startswith("classifier"))
    assert held > 0.85 * sum(p.numel() for p in params.values())
    assert tuple(x.shape) == (8, 3, 64, 64) and int(labels.max()) < 200
    g = capture(model, (x, labels))
    fc_flops = sum(f for f, path in zip(g.flops, g.module_paths) if path.startswith("classifier"))
    assert 0 < fc_flops < 0.1 * g.flops.sum() and {"vgg16", "vgg16_b32"} <= set(rank_splits.MODELS)


def test_the_text_classifier_s_embedding_holds_its_parameters_and_none_of_its_flops():
    """Its embedding's dense gradient and Adam step are work a FLOPs-balanced split does not see."""
    from bench.rank_models import text_classifier
    from bench.rank_models import text_classifier_256k as rank_models_text_classifier_256k
    from graphs.torch_capture import capture

    model, inputs = text_classifier()
    embed = model.embed.weight.numel()
    assert embed == 65536 * 128 and embed > 0.9 * sum(p.numel() for p in model.parameters())
    assert not model.embed.sparse  # a dense gradient, the size of the table, every microbatch
    g = capture(model, inputs)
    assert [f for f, path in zip(g.flops, g.module_paths) if path == "embed"] == [0.0]
    assert "text_classifier_b32" in rank_splits.MODELS
    big, (tokens, _) = rank_models_text_classifier_256k()
    assert big.embed.weight.shape == (262144, 128) and int(tokens.max()) >= 65536 and tokens.shape[0] == 8
    assert {"text_classifier_256k", "text_classifier_256k_b32"} <= set(rank_splits.MODELS)


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_mobilenet_v2_is_the_paper_s_block_table_with_depthwise_convolutions_of_few_flops():
    """17 inverted residual blocks (MobileNetV2's Table 2), each 3x3 convolution of a block depthwise; those
    convolutions hold a few percent of the FLOPs (what FLOPs miss: they are memory-bound)."""
    from bench.rank_models import InvertedResidual, mobilenet_v2
    from graphs.torch_capture import capture

    model, (x, labels) = mobilenet_v2()
    blocks = [b for b in model.features if isinstance(b, InvertedResidual)]
    assert len(blocks) == 17 and [b.conv[-2].out_channels for b in blocks][-1] == 320
    depthwise = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert len(depthwise) == 17 and all(m.groups == m.in_channels == m.out_channels for m in depthwise)
    assert sum(b.residual for b in blocks) == 10  # the input added back wherever the shape stays
    assert tuple(x.shape) == (8, 3, 64, 64) and int(labels.max()) < 200 and model.classifier.out_features == 200
    g = capture(model, (x, labels))
    dw_paths = {name for name, m in model.named_modules() if m in depthwise}
    dw_flops = sum(f for f, path in zip(g.flops, g.module_paths) if path in dw_paths)
    assert len(dw_paths) == 17 and 0 < dw_flops < 0.1 * g.flops.sum()


@pytest.mark.slow  # builds a transformers model and captures it (~3 s)
def test_the_deepseek_moe_s_expert_layers_hold_its_parameters_and_few_of_its_flops():
    """DeepSeek-V3's layout: dense layers first, then expert layers, each holding 3.6x a dense layer's parameters
    and under half its FLOPs (what a FLOPs-balanced split of the layers misjudges)."""
    pytest.importorskip("transformers")
    from bench.rank_models import deepseek_moe, deepseek_moe_b32
    from graphs.torch_capture import capture

    model, (tokens, labels) = deepseek_moe()
    layers = model.model.model.layers
    kinds = [type(layer.mlp).__name__ for layer in layers]
    assert kinds == ["DeepseekV3MLP"] * 3 + ["DeepseekV3MoE"] * 3
    size = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    assert size[3] > 3 * size[0]
    g = capture(model, (tokens, labels))
    flops = [
        sum(f for f, path in zip(g.flops, g.module_paths) if path.startswith(f"model.model.layers.{i}."))
        for i in (0, 3)
    ]
    assert 0 < flops[1] < 0.5 * flops[0]
    assert tuple(tokens.shape) == (8, 64) and torch.equal(tokens, labels) and int(tokens.max()) < 8192
    (_, (t32, _)) = deepseek_moe_b32()
    assert t32.shape[0] == 32 and {"deepseek_moe", "deepseek_moe_b32"} <= set(rank_splits.MODELS)


@pytest.mark.slow  # builds a transformers model (~2 s)
def test_the_held_out_t5_is_shaped_as_t5_small_at_half_its_width():
    """T5-small's layout: 6 encoder and 6 decoder blocks (a decoder block has cross-attention), one 32,128-token
    embedding that the head shares; width 256."""
    pytest.importorskip("transformers")
    from bench.rank_models import t5

    model, (source, target) = t5()
    inner = model.model
    assert len(inner.encoder.block) == 6 and len(inner.decoder.block) == 6 and inner.config.d_model == 256
    assert inner.lm_head.weight is inner.shared.weight and inner.shared.num_embeddings == 32128
    assert tuple(source.shape) == tuple(target.shape) == (8, 32) and int(source.max()) < 32128
    assert not torch.equal(source, target)
    enc = sum(p.numel() for p in inner.encoder.block[0].parameters())
    dec = sum(p.numel() for p in inner.decoder.block[0].parameters())
    assert dec > 1.2 * enc  # the cross-attention


@pytest.mark.slow  # builds a transformers model (~2 s)
def test_the_held_out_gpt2_is_shaped_as_gpt2_small_at_a_third_of_its_width():
    """GPT-2 small's layout: 12 blocks and a 50,257-token vocabulary that the embedding and the head share (the
    head's logits cost more than the 12 blocks together); width 256."""
    pytest.importorskip("transformers")
    from bench.rank_models import gpt2

    model, (tokens, labels) = gpt2()
    inner = model.model
    assert len(inner.transformer.h) == 12 and inner.config.n_embd == 256
    assert inner.lm_head.weight is inner.transformer.wte.weight and inner.transformer.wte.num_embeddings == 50257
    assert tuple(tokens.shape) == (8, 64) and torch.equal(tokens, labels) and int(tokens.max()) < 50257


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_the_batch_32_models_are_the_same_models_on_four_times_the_batch():
    """One of 4 microbatches of ``lm_b32`` is ``lm``'s whole batch; the default run measures the batch-8 models."""
    from bench import rank_models

    pairs = [(rank_models.lm, rank_models.lm_b32), (rank_models.unet, rank_models.unet_b32)]
    pairs.append((rank_models.encoder_decoder, rank_models.encoder_decoder_b32))
    pairs.append((rank_models.convnet, rank_models.convnet_b32))
    pairs.append((rank_models.text_classifier, rank_models.text_classifier_b32))
    pairs.append((rank_models.mobilenet_v2, rank_models.mobilenet_v2_b32))
    pairs.append((rank_models.text_classifier_256k, rank_models.text_classifier_256k_b32))
    for small, large in pairs:
        (m8, x8), (m32, x32) = small(), large()
        assert [t.shape[0] for t in x8] == [8, 8] and [t.shape[0] for t in x32] == [32, 32]
        assert all(torch.equal(a, b) for a, b in zip(m8.state_dict().values(), m32.state_dict().values()))
    assert set(rank_splits.DEFAULT_MODELS) < set(rank_splits.MODELS) and "lm_b32" not in rank_splits.DEFAULT_MODELS
    (m8, x8), (m128, x128) = rank_models.mobilenet_v2(), rank_models.mobilenet_v2_b128()
    assert [t.shape[0] for t in x128] == [128, 128]
    assert all(torch.equal(a, b) for a, b in zip(m8.state_dict().values(), m128.state_dict().values()))


def test_one_plan_made_by_several_methods_is_measured_once_per_round_and_pooled(monkeypatch, tmp_path, capsys):
    """flops_balanced and stage_search often cut alike: one plan, one measurement per round, rows that share it."""
    g, cluster = lm_like(), envs.Cluster.preset("k80x2")
    cuts = {"equal_layers": 3, "flops_balanced": 6, "parameters_balanced": 3, "stage_search": 6}
    plans = {
        m: Placement.from_indices(g, cluster.device_names, [1] * k + [2] * (g.num_ops - k)) for m, k in cuts.items()
    }
    monkeypatch.setattr(rank_splits, "model_graph", lambda source, profile=None: g)
    monkeypatch.setattr(rank_splits, "best_plans", lambda graph, c: {m: (plans[m], 1.0, []) for m in plans})
    measured = []
    ph = dict.fromkeys(("forward_s", "backward_s", "optimizer_s", "other_s", "step_s"), 0.01)
    times = iter([0.30, 0.20, 0.34, 0.22, 0.32, 0.21])  # rounds of (cut at 3, cut at 6)

    def measure(source, plan, steps, warmup):
        measured.append(plan)
        return next(times), [ph, ph, ph]

    monkeypatch.setattr(rank_splits, "measure", measure)
    model = rank_splits.run_model("lm", cluster, repeats=3, steps=1, warmup=0)
    assert len(measured) == 6  # 2 distinct plans x 3 rounds, not 4 x 3
    rows = {r["method"]: r for r in model["rows"]}
    assert rows["equal_layers"]["repeats_s"] == rows["parameters_balanced"]["repeats_s"] == [0.30, 0.34, 0.32]
    assert rows["stage_search"]["same_plan_as"] == ["flops_balanced"] and rows["equal_layers"]["measured_s"] == 0.32
    pool = rank_splits.pooled(model["rows"])  # shared measurements counted once
    assert pool["equal_layers"] == {"median_s": 0.32, "n": 3, "same_plan_as": ["parameters_balanced"]}
    assert rank_splits.fidelity([model])["plans"] == 2  # one point per plan, not per row
    # an earlier run's rows, one plan measured by two methods apart: every repeat pooled
    rows["parameters_balanced"]["repeats_s"] = [0.40, 0.42]
    assert rank_splits.pooled(model["rows"])["equal_layers"]["median_s"] == 0.34  # of .30 .32 .34 .40 .42
    # --report: an earlier run's report, measuring nothing, the speed-ups pooled against pooled
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"models": [model]}))
    assert rank_splits.main(["--report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "pooled 340.0 ms of 5 (= parameters_balanced)  stage_search 1.62x faster" in out  # 0.34 / 0.21
    run.write_text("{}")
    assert rank_splits.main(["--report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "run.json: not a `python -m bench.rank_splits --json` run" in err and len(err.strip().splitlines()) == 1
