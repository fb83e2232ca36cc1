"""Datasets by name, the train/held-out split, and bad names, graphs and clusters as one-line errors."""

from __future__ import annotations

import json

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import placer.gym  # noqa: F401  (registers the environments)
from graphs import PlacerError, io, zoo
from graphs.synthetic import FAMILIES
from placer.gym import datasets


def test_the_split_is_by_family_and_covers_every_item():
    assert set(datasets.TRAIN).isdisjoint(datasets.HELD_OUT)
    every = [name for d in datasets.DATASETS for name in datasets.items(d)]
    assert sorted(datasets.TRAIN + datasets.HELD_OUT) == sorted(every)
    assert {n for n in every if n.startswith("zoo/")} == {f"zoo/{m}" for m in zoo.names()} <= set(datasets.TRAIN)
    assert datasets.items("corpus", "held_out") == ["corpus/llama", "corpus/bert"]
    held_synthetic = {n.split("/")[1].split("-")[0] for n in datasets.items("synthetic", "held_out")}
    assert held_synthetic == {"attention", "branches"}
    assert len(datasets.items("synthetic")) == len(FAMILIES) * 2 * 3


def test_any_synthetic_size_and_seed_is_an_item_of_its_familys_split():
    assert datasets.split_of("synthetic/branches-77-s9") == "held_out"
    assert datasets.split_of("synthetic/unet-77-s9") == "train"
    g = datasets.graph("synthetic/unet-77-s9")
    assert (
        g.num_ops == FAMILIES["unet"](77, seed=9).num_ops
        and g.content_hash == FAMILIES["unet"](77, seed=9).content_hash
    )


def test_a_graph_file_and_a_zoo_name_are_sources_outside_the_split(tmp_path):
    path = tmp_path / "g.json"
    io.save(FAMILIES["chain"](20, seed=0), path)
    assert datasets.split_of(str(path)) is None and datasets.graph(str(path)).num_ops == FAMILIES["chain"](20).num_ops
    assert datasets.split_of("nmt-2") is None and datasets.split_of("mymodels:build") is None


def test_a_held_out_synthetic_item_is_an_environment():
    item = datasets.items("synthetic", "held_out")[0]
    assert item == "synthetic/branches-300-s0" and item in datasets.HELD_OUT
    env = gymnasium.make("placer/PlaceAll-v0", graph=item, cluster="k80x4")
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.slow  # captures a Hugging Face model (transformers)
def test_a_held_out_corpus_item_is_an_environment():
    env = gymnasium.make("placer/PlaceAll-v0", graph="corpus/llama", cluster="k80x2")
    obs, _ = env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.action_space.sample())
    assert terminated and info["status"] in ("ok", "oom") and reward < 0
    assert env.unwrapped.problem.graph.name == "corpus/llama"


@pytest.mark.parametrize(
    "graph, message",
    [
        ("nope/x", "unknown dataset 'nope'"),
        ("zoo/alexnet", "zoo/alexnet: not a zoo model"),
        ("synthetic/moe", "synthetic/moe: not a synthetic item"),
        ("synthetic/cube-30-s0", "not a synthetic item"),
        ("corpus/resnet", "corpus/resnet: not a corpus entry"),
        ("missing.json", "missing.json: no such file"),
        ("alexnet", "alexnet: not a graph file, zoo name"),
    ],
)
def test_an_unknown_dataset_or_graph_is_one_placer_error(graph, message):
    with pytest.raises(PlacerError) as e:
        gymnasium.make("placer/PlaceAll-v0", graph=graph, cluster="k80x2")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_cluster_file_that_does_not_load_is_one_placer_error(tmp_path):
    bad = tmp_path / "cluster.json"
    bad.write_text(json.dumps({"format": "placer-cluster/1", "devices": [{"name": "gpu:0"}]}))
    for cluster, message in (
        (str(bad), str(bad)),
        ("k99x3", "unknown cluster 'k99x3'"),
        (str(tmp_path / "no.json"), "no such file"),
    ):
        with pytest.raises(PlacerError) as e:
            gymnasium.make("placer/PlaceAll-v0", graph="synthetic/chain-20-s0", cluster=cluster)
        assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"groups": -1}, "groups=-1"),
        ({"order": "random"}, "order='random': unknown"),
        ({"fail_factor": 0}, "fail_factor=0"),
        ({"max_items": 3}, "max_items=3: the graph has"),
        ({"scorer": "gpu"}, "scorer='gpu': unknown"),
        ({"scorer": object()}, "is not a scorer"),
        ({"scorer": "measured"}, "is not runnable"),
    ],
)
def test_bad_options_are_one_placer_error(options, message):
    with pytest.raises(PlacerError) as e:
        gymnasium.make("placer/PlaceAll-v0", graph=FAMILIES["chain"](20, seed=0), cluster="k80x2", **options)
    assert message in str(e.value) and "\n" not in str(e.value)
