"""Hugging Face models as sources: capture, compare, train, run, apply, export-map, meta-device models.

The models are tiny configs built in :mod:`hf_tiny` (no weights, no network);
transformers is a test extra, so every test here skips without it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402

import graphs  # noqa: E402
from graphs.plan import Placement  # noqa: E402
from placer.cli import main  # noqa: E402

HERE = Path(__file__).resolve().parent
FAMILIES = ["llama", "bert", "t5", "vit"]
ACCELERATE = ("accelerate", "accelerate_low_0", "accelerate_sequential")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("hf_tiny", None)
    return tmp_path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _build(family: str, meta: bool = False):
    import hf_tiny

    return getattr(hf_tiny, f"build_{family}{'_meta' if meta else ''}")()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_family_captures_compares_trains_runs_and_applies(family, workdir, capsys):
    pytest.importorskip("accelerate")
    source = f"hf_tiny:build_{family}"
    rc, out, err = cli(capsys, "export", source, "-o", "g.json", "--json")
    assert rc == 0, err
    info = json.loads(out)
    model, inputs = _build(family)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied weights once
    assert info["param_bytes"] == n_bytes and info["ops"] > 50

    methods = "single,expert,m_etf," + ",".join(ACCELERATE)
    rc, out, err = cli(capsys, "compare", source, "--cluster", "k80x2", "--methods", methods, "--json")
    assert rc == 0, err
    rows = {r["method"]: r for r in json.loads(out)["rows"]}
    assert all(rows[m]["status"] == "ok" for m in methods.split(",")), {m: rows[m]["message"] for m in rows}
    rc, out, _ = cli(capsys, "compare", "g.json", "--cluster", "k80x2", "--methods", "accelerate")
    line = next(ln for ln in out.splitlines() if ln.startswith("| accelerate "))
    assert "needs a model" in line and source in line  # how to get the row, in the row

    rc, out, err = cli(
        capsys,
        "train",
        "g.json",
        "--cluster",
        "k80x2",
        "--iterations",
        "1",
        "--hidden",
        "8",
        "--max-groups",
        "4",
        "--no-progress",
        "--logdir",
        "run",
        "--json",
    )
    assert rc == 0 and json.loads(out)["status"] == "ok", err
    rc, out, err = cli(
        capsys,
        "run",
        source,
        "--placement",
        "run/best_placement.json",
        "--cluster",
        "k80x2",
        "--device-map",
        "*=cpu",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--json",
    )
    assert rc == 0 and json.loads(out)["status"] == "ok", err

    import graphs
    from placer.apply import apply

    g = graphs.load("g.json")
    op_devices = np.random.default_rng(1).integers(0, 3, size=g.num_ops)  # every op anywhere: the hardest case
    placed = apply(
        model, Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], op_devices), inputs, device_map="*=cpu"
    )
    want = model(*inputs)
    want.backward()
    want_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    got = placed(*inputs)
    got.backward()
    got_grads = _grads(placed)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert set(got_grads) == set(want_grads)
    for name, grad in want_grads.items():
        assert torch.allclose(got_grads[name], grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.slow
def test_a_placed_llama_trains_like_the_model_at_two_batch_sizes_and_two_lengths(workdir, tmp_path):
    """A training loop: batches of 4 and 2 sequences of 12 and 7 tokens; every step's gradients are the model's.

    Then the way back: a checkpoint of the placed model loads into a fresh model, and
    unwrap() gives the model (tied embeddings and all) to save_pretrained."""
    import copy

    import hf_tiny
    from transformers import LlamaForCausalLM

    from graphs.torch_capture import capture
    from placer.apply import apply, unwrap

    torch.manual_seed(0)
    model = hf_tiny.LossOf(hf_tiny.llama_model())
    ref = copy.deepcopy(model)
    fresh = copy.deepcopy(model)
    ids = torch.randint(0, hf_tiny.VOCAB, (4, 12), generator=torch.Generator().manual_seed(1))
    g = capture(model, (ids, ids))
    op_devices = np.random.default_rng(4).integers(0, 3, size=g.num_ops)
    placed = apply(model, Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], op_devices), (ids, ids), "*=cpu")
    opt = torch.optim.SGD(placed.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step, (batch, length) in enumerate([(4, 12), (2, 12), (4, 7), (2, 7), (4, 12)]):
        x = torch.randint(0, hf_tiny.VOCAB, (batch, length), generator=torch.Generator().manual_seed(step))
        for module, optimizer in ((placed, opt), (ref, ref_opt)):
            optimizer.zero_grad()
            module(x, x).backward()
        for name, p in ref.named_parameters():
            torch.testing.assert_close(placed.get_parameter(name).grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
        opt.step()
        ref_opt.step()
    assert {d["name"]: sorted(d["dynamic"]) for d in placed.meta["placer_dynamic_dims"]} == {
        "inputs_0": ["0", "1"],
        "inputs_1": ["0", "1"],
    }
    torch.save(placed.state_dict(), tmp_path / "placed.pt")
    fresh.load_state_dict(torch.load(tmp_path / "placed.pt", weights_only=True))
    torch.testing.assert_close(fresh(ids, ids), ref(ids, ids))
    unwrap(placed).model.save_pretrained(tmp_path / "hf")
    loaded = hf_tiny.LossOf(LlamaForCausalLM.from_pretrained(tmp_path / "hf"))
    torch.testing.assert_close(loaded(ids, ids), ref(ids, ids))


@pytest.mark.slow
def test_meta_device_model_is_captured_compared_and_refused_at_run(workdir, capsys):
    """A model built under torch.device("meta") has shapes but no weights: enough to capture, simulate and place."""
    pytest.importorskip("accelerate")
    rc, out, err = cli(capsys, "export", "hf_tiny:build_llama_meta", "-o", "meta.json", "--json")
    assert rc == 0, err
    meta_info = json.loads(out)
    rc, out, _ = cli(capsys, "export", "hf_tiny:build_llama", "-o", "real.json", "--json")
    real_info = json.loads(out)
    assert meta_info["param_bytes"] == real_info["param_bytes"] and meta_info["flops"] == real_info["flops"]

    rc, out, err = cli(
        capsys, "compare", "hf_tiny:build_llama_meta", "--cluster", "k80x2", "--methods", "single,accelerate", "--json"
    )
    assert rc == 0 and {r["method"]: r["status"] for r in json.loads(out)["rows"]} == {
        "single": "ok",
        "accelerate": "ok",
        "previous bound": "bound",
        "lower bound": "bound",
    }, err
    rc, _, err = cli(
        capsys, "place", "hf_tiny:build_llama_meta", "--cluster", "k80x2", "--method", "accelerate", "-o", "p.json"
    )
    assert rc == 0, err
    rc, _, err = cli(
        capsys,
        "run",
        "hf_tiny:build_llama_meta",
        "--placement",
        "p.json",
        "--cluster",
        "k80x2",
        "--device-map",
        "*=cpu",
    )
    assert rc == 2 and "meta device" in one_line(err)


@pytest.mark.slow  # importing transformers alone takes seconds
def test_bare_causal_lm_is_captured_without_its_kv_cache_and_applied(workdir):
    """`return GPT2LMHeadModel(cfg), (ids,)`: the cache object used to fail the export; a training step has none."""
    import graphs
    from placer.apply import apply

    model, inputs = _build("gpt2_raw")
    g = graphs.capture(model, inputs)
    assert model.config.use_cache is True  # restored after the export
    assert g.meta["tied_params"] == [["lm_head.weight", "transformer.wte.weight"]]
    op_devices = np.random.default_rng(2).integers(0, 3, size=g.num_ops)
    placed = apply(
        model, Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], op_devices), inputs, device_map="*=cpu"
    )
    want = model(*inputs, use_cache=False).logits
    got = placed(*inputs)
    assert torch.allclose(got["logits"], want, atol=1e-6)
    got["logits"].sum().backward()
    assert model.transformer.wte.weight.grad is not None  # tied: one parameter, gradients from both uses


def test_meta_device_capture_moves_inputs_to_meta():
    from graphs.torch_capture import capture

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    g = capture(model, (torch.randn(4, 8),))  # CPU inputs: a device mismatch before
    assert g.total_param_bytes == (8 * 16 + 16 + 16 + 16) * 4 and g.flops[0] == 2 * 4 * 8 * 16


@pytest.mark.slow
def test_export_map_loads_in_accelerate_and_says_what_it_gives_up(workdir, capsys):
    accelerate = pytest.importorskip("accelerate")
    from accelerate.utils import check_device_map

    rc, _, err = cli(capsys, "export", "hf_tiny:build_llama", "-o", "g.json")
    rc, _, err = cli(capsys, "place", "g.json", "--cluster", "k80x4", "--method", "expert", "-o", "p.json")
    assert rc == 0, err
    rc, out, err = cli(
        capsys, "export-map", "p.json", "--graph", "g.json", "--module", "model", "-o", "map.json", "--json"
    )
    assert rc == 0, err
    doc = json.loads(out)
    device_map = json.loads(Path("map.json").read_text())
    assert doc["device_map"] == device_map and len(set(device_map.values())) > 1  # expert splits the layers over GPUs
    assert set(device_map.values()) <= {0, 1, 2, 3, "cpu"}
    assert doc["placement_step_time_s"] > 0 and doc["projected_step_time_s"] > 0

    wrapper, inputs = _build("llama")
    model = wrapper.model
    check_device_map(model, device_map)  # covers every parameter and buffer
    assert not any("lifted_tensor" in k for k in device_map)  # the program's constants are not the model's
    want = wrapper(*inputs)
    accelerate.dispatch_model(model, device_map={k: "cpu" for k in device_map})  # this machine's devices
    assert torch.allclose(wrapper(*inputs), want)

    rc, out, _ = cli(capsys, "export-map", "p.json", "--graph", "g.json", "--module", "model", "-o", "map2.json")
    assert rc == 0 and "gives up" in out and "placer.apply" in out and "not in the device map" not in out
    assert doc["left_out"] == {"param_homes": 0, "checkpoint": 0}
    p, g = Placement.load("p.json"), graphs.load("g.json")
    whole = [
        m
        for m in set(g.module_paths)
        if m and len({p.assignment[n] for n, q in zip(g.names, g.module_paths) if q == m or q.startswith(m + ".")}) == 1
    ]
    p.checkpoint = [sorted(whole)[0]]  # a block on one device; a device map cannot say it: said instead
    p.save("p.json")
    rc, out, _ = cli(capsys, "export-map", "p.json", "--graph", "g.json", "--module", "model", "-o", "map3.json")
    assert rc == 0 and "not in the device map: the plan's 0 parameter homes and 1 checkpointed blocks" in out


def test_export_map_projects_whole_modules():
    from envs import Cluster
    from graphs import OpGraph
    from placer.device_map import project, projected_op_devices

    g = OpGraph.from_edges(
        ["emb", "q", "k", "add", "head"],
        [("emb", "q", 4), ("emb", "k", 4), ("q", "add", 4), ("k", "add", 4), ("add", "head", 4)],
        flops=[1e6, 1e9, 1e9, 1e3, 1e9],
        module_paths=["embed", "layers.0.q", "layers.0.k", "layers.0", "head"],
    )
    g.params = [["embed.weight"], ["layers.0.q.weight"], ["layers.0.k.weight"], [], ["head.weight"]]
    k80 = Cluster.preset("k80x4")
    dm = project(g, [1, 2, 3, 2, 0], k80)
    assert dm == {"embed": 0, "head": "cpu", "layers.0.k": 2, "layers.0.q": 1}
    assert projected_op_devices(g, dm, k80).tolist() == [1, 2, 3, 2, 0]  # add follows its (first) input
    assert project(g, [1, 2, 2, 2, 1], k80) == {"embed": 0, "head": 0, "layers": 1}


def test_export_map_bad_inputs_are_one_line(workdir, capsys):
    import graphs
    from graphs import OpGraph
    from graphs.synthetic import random_dag

    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 1e9], module_paths=["enc", "head"])
    graphs.save(g, "g.json")
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1, 2], cluster="k80x2").save("p.json")
    graphs.save(random_dag(5), "other.json")
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1, 2], cluster="mine").save("nocluster.json")
    cases = [
        (["p.json", "--graph", "g.json", "--module", "nope", "-o", "m.json"], "--module 'nope'"),
        (["missing.json", "--graph", "g.json", "-o", "m.json"], "missing.json"),
        (["p.json", "--graph", "other.json", "-o", "m.json"], "p.json"),
        (["p.json", "--graph", "g.json", "-o", "m.txt"], "m.txt"),
        (["p.json", "--graph", "g.json", "-o", "nodir/m.json"], "nodir"),
        (["nocluster.json", "--graph", "g.json", "-o", "m.json"], "pass --cluster"),
        (["p.json", "--graph", "g.json", "--cluster", "h200x1", "-o", "m.json"], "p.json"),  # no gpu:1 there
    ]
    for argv, needle in cases:
        rc, _, err = cli(capsys, "export-map", *argv)
        assert rc == 2 and needle in one_line(err), (argv, err)
    assert not Path("m.json").exists()
    rc, out, err = cli(capsys, "export-map", "p.json", "--graph", "g.json", "-o", "m.json")
    assert rc == 0 and json.loads(Path("m.json").read_text()) == {"enc": 0, "head": 1}


def test_export_map_of_a_wrapper_keys_the_wrapped_model_and_says_so(workdir, capsys):
    """A callable's wrapper (forward returns the loss, the model is self.m): from_pretrained needs the model's keys."""
    import graphs
    from graphs import OpGraph

    g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 1e9], module_paths=["m.enc", "m.head"])
    g.params = [["m.enc.weight"], ["m.head.weight"]]
    graphs.save(g, "g.json")
    Placement.from_indices(g, ["cpu:0", "gpu:0", "gpu:1"], [1, 2], cluster="k80x2").save("p.json")
    rc, out, err = cli(capsys, "export-map", "p.json", "--graph", "g.json", "-o", "m.json")
    assert rc == 0, err
    assert json.loads(Path("m.json").read_text()) == {"enc": 0, "head": 1}
    assert "keys relative to submodule 'm'" in out and "--module ''" in out
    rc, out, err = cli(capsys, "export-map", "p.json", "--graph", "g.json", "-o", "m.json", "--module", "")
    assert rc == 0 and json.loads(Path("m.json").read_text()) == {"m.enc": 0, "m.head": 1}
    rc, out, err = cli(capsys, "export-map", "p.json", "--graph", "g.json", "-o", "m.json", "--json")
    assert json.loads(out)["module"] == "m"


@pytest.mark.slow
def test_module_heuristics_place_the_readme_wrapper_of_gpt2_block_by_block(workdir, capsys):
    # the README's pattern: a wrapper whose forward returns model(...).loss; its paths all start with "model."
    rc, out, err = cli(
        capsys,
        "compare",
        "hf_tiny:build_gpt2",
        "--cluster",
        "k80x4",
        "--methods",
        "random_modules,module_search",
        "--json",
    )
    assert rc == 0, err
    assert {r["method"]: r["status"] for r in json.loads(out)["rows"]}.items() >= {
        "random_modules": "ok",
        "module_search": "ok",
    }.items()
    from envs.sim.sim_graph import schedule_graph
    from graphs import capture
    from graphs.module_tree import module_levels

    g = schedule_graph(capture(*_build("gpt2")))

    def block_groups(lv, i):
        return {int(lv.op_group[j]) for j, p in enumerate(g.module_paths) if p.startswith(f"model.transformer.h.{i}.")}

    assert any(
        len(block_groups(lv, 0)) == 1 and len(block_groups(lv, 1)) == 1 and block_groups(lv, 0) != block_groups(lv, 1)
        for lv in module_levels(g)
    )
