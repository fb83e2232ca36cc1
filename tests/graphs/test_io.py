"""placer-graph/1 JSON: round trips and one clear line for every kind of bad file."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from graphs import FORMAT, GraphFormatError, OpGraph, PlacerError, load, save
from graphs.io import from_dict
from graphs.synthetic import random_dag


@pytest.fixture
def graph() -> OpGraph:
    g = random_dag(120, seed=7, name="toy")
    g.profile = {"gpu": {"fwd_s": np.where(np.arange(120) % 4 == 0, np.nan, 1e-4), "bwd_s": np.full(120, 3e-4)}}
    g.meta["batch"] = 32
    g.invalidate()
    return g


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip_is_unchanged(tmp_path, graph, suffix):
    path = tmp_path / f"g{suffix}"
    save(graph, path)
    g2 = load(path)
    assert g2.content_hash == graph.content_hash
    assert g2.to_dict() == graph.to_dict() or _same_with_nan(g2.to_dict(), graph.to_dict())
    # A second save of what was loaded writes the same document.
    save(g2, tmp_path / f"h{suffix}")
    assert _read(tmp_path / f"h{suffix}") == _read(path)
    assert not os.path.exists(str(path) + ".tmp")


def _read(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _same_with_nan(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_numbers_spelled_differently_keep_the_canonical_hash(tmp_path):
    # flops 2 instead of 2.0: the same content, so the same hash; and a re-save loads again.
    g = OpGraph.from_edges(["a", "b"], [("a", "b", 8)], flops=[1.0, 2.0])
    doc = g.to_dict()
    doc["ops"]["flops"] = [1, 2]
    doc["hash"] = g.content_hash
    path = tmp_path / "ints.json"
    path.write_text(json.dumps(doc))
    g2 = load(path)
    assert g2.content_hash == g.content_hash
    save(g2, tmp_path / "again.json")
    assert load(tmp_path / "again.json").content_hash == g.content_hash


def test_profile_and_meta_survive(tmp_path, graph):
    save(graph, tmp_path / "g.json")
    g2 = load(tmp_path / "g.json")
    np.testing.assert_array_equal(g2.profile["gpu"]["fwd_s"], graph.profile["gpu"]["fwd_s"])
    assert g2.meta == graph.meta and g2.name == "toy"


def _doc(graph: OpGraph) -> dict:
    doc = graph.to_dict()
    doc["hash"] = graph.content_hash
    return doc


def _write(tmp_path, doc_or_text, name="bad.json") -> str:
    path = tmp_path / name
    path.write_text(doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text))
    return str(path)


def _edit(fn):
    def apply(doc):
        fn(doc)
        return doc

    return apply


BAD_DOCS = {
    "wrong format version": (
        _edit(lambda d: d.update(format="placer-graph/2")),
        "format is 'placer-graph/2', expected 'placer-graph/1'",
    ),
    "a cycle": (
        _edit(lambda d: (d["edges"]["src"].append(9), d["edges"]["dst"].append(2), d["edges"]["bytes"].append(4))),
        "contain a cycle",
    ),
    "dangling edge": (
        _edit(lambda d: (d["edges"]["src"].append(3), d["edges"]["dst"].append(500), d["edges"]["bytes"].append(4))),
        "dangling",
    ),
    "negative out_bytes": (
        _edit(lambda d: d["ops"]["out_bytes"].__setitem__(5, -8)),
        "negative or non-finite out_bytes",
    ),
    "negative edge bytes": (_edit(lambda d: d["edges"]["bytes"].__setitem__(5, -8)), "negative bytes"),
    "negative shape": (_edit(lambda d: d["ops"]["shapes"].__setitem__(5, [[-1, 4]])), r"output shape \[-1, 4\]"),
    "fractional bytes": (_edit(lambda d: d["ops"]["param_bytes"].__setitem__(5, 2.5)), r"ops.param_bytes\[5\] is 2.5"),
    "text in a number column": (
        _edit(lambda d: d["ops"]["flops"].__setitem__(5, "many")),
        r"ops.flops\[5\] must be a number, got 'many' \(a string\)",
    ),
    "short op column": (_edit(lambda d: d["ops"]["flops"].pop()), "ops.flops has 119 entries but there are 120 ops"),
    "short edge column": (_edit(lambda d: d["edges"]["bytes"].pop()), "edge arrays have different lengths"),
    "missing column": (_edit(lambda d: d["ops"].pop("module")), "ops.module is missing"),
    "missing table": (_edit(lambda d: d.pop("edges")), "missing 'ops' or 'edges' table"),
    "hash mismatch": (_edit(lambda d: d["ops"]["flops"].__setitem__(5, 1.0)), "content hash mismatch"),
    "unsorted ops": (
        _edit(lambda d: (d["edges"]["src"].append(9), d["edges"]["dst"].append(8), d["edges"]["bytes"].append(4))),
        "not in topological order|cycle",
    ),
    "bad profile": (_edit(lambda d: d["profile"]["gpu"]["fwd_s"].pop()), r"profile\['gpu'\]\['fwd_s'\] has shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_bad_documents_raise_one_line_naming_the_file(tmp_path, graph, case):
    edit, message = BAD_DOCS[case]
    path = _write(tmp_path, edit(_doc(graph)))
    with pytest.raises(GraphFormatError, match=message) as info:
        load(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"format": "placer-graph/1", "ops": {"name": ["a", "b"', "not valid JSON .*truncated"),
        ("[1, 2, 3]", "expected a JSON object"),
        ("", "not valid JSON"),
    ],
)
def test_unparseable_files(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(GraphFormatError, match=message) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_truncated_saved_graph(tmp_path, graph):
    save(graph, tmp_path / "g.json")
    text = (tmp_path / "g.json").read_text()
    path = _write(tmp_path, text[: len(text) // 2], "cut.json")
    with pytest.raises(GraphFormatError, match="truncated"):
        load(path)


def test_truncated_gzip(tmp_path, graph):
    save(graph, tmp_path / "g.json.gz")
    data = (tmp_path / "g.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphFormatError, match="cut.json.gz"):
        load(tmp_path / "cut.json.gz")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(PlacerError, match="no such file"):
        load(tmp_path / "nope.json")
    with pytest.raises(GraphFormatError, match="cannot read"):
        load(tmp_path)


def test_hash_check_can_be_skipped(tmp_path, graph):
    doc = _doc(graph)
    doc["hash"] = "0" * 16
    path = _write(tmp_path, doc)
    assert load(path, verify_hash=False).content_hash == graph.content_hash


def test_label_with_colon_does_not_garble_messages(graph):
    doc = _doc(graph)
    doc["name"] = "nmt:2"
    doc["ops"]["out_bytes"][3] = -1
    with pytest.raises(GraphFormatError) as info:
        from_dict(doc, source="file.json")
    assert str(info.value).startswith("file.json: op ")


def test_format_constant():
    assert FORMAT == "placer-graph/1"


def test_garbage_collector_is_back_on_after_loading(tmp_path, graph):
    import gc

    save(graph, tmp_path / "g.json")
    (tmp_path / "bad.json").write_text("{")
    assert gc.isenabled()
    load(tmp_path / "g.json")
    with pytest.raises(GraphFormatError):
        load(tmp_path / "bad.json")
    assert gc.isenabled()


def test_write_text_atomic_keeps_the_old_file_when_a_write_fails(tmp_path):
    from graphs.io import write_text_atomic

    path = tmp_path / "p.json"
    write_text_atomic(path, "old")
    with pytest.raises(TypeError):
        write_text_atomic(path, 12345)  # fails inside the write
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]
    write_text_atomic(tmp_path / "g.json.gz", "zipped")
    import gzip

    assert gzip.open(tmp_path / "g.json.gz", "rt").read() == "zipped"
