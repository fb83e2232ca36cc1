"""The one schema layer (graphs.schema) as the graph reader uses it: strict types, one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs import GraphFormatError, OpGraph, load, schema
from graphs.errors import PlacerError
from graphs.io import read_json


def _doc() -> dict:
    g = OpGraph.from_edges(
        ["a", "b", "c"], [("a", "b", 8), ("b", "c", 4)], flops=[1.0, 2.0, 3.0], param_bytes=[16, 0, 0]
    )
    g.meta.update(alias_ops=["b"], decomposed=False)
    return g.to_dict()  # no hash: edits below must be judged on their types


def _set(path, value):
    def edit(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


BAD = {
    "meta is a list": (_set(["meta"], [1, 2]), "meta must be an object, got [1, 2] (a list)"),
    "meta is a string": (_set(["meta"], "abc"), "meta must be an object"),
    "alias_ops is a string": (_set(["meta", "alias_ops"], "b"), "meta.alias_ops must be a list, got 'b' (a string)"),
    "alias_ops holds a number": (_set(["meta", "alias_ops"], ["b", 3]), "meta.alias_ops[1] must be a string, got 3"),
    "decomposed is the string false": (
        _set(["meta", "decomposed"], "false"),
        "meta.decomposed must be true or false, got 'false'",
    ),
    "param_bytes 2**63": (
        _set(["ops", "param_bytes", 0], 2**63),
        "ops.param_bytes[0] is too large (9223372036854775808",
    ),
    "param_bytes 2**64": (_set(["ops", "param_bytes", 0], 2**64), "ops.param_bytes[0] is too large"),
    "int too large for a float": (_set(["ops", "flops", 1], 10**400), "ops.flops[1] is too large"),
    "bool among ints": (_set(["ops", "out_bytes", 2], True), "ops.out_bytes[2] must be a number, got True (a bool)"),
    "bool in edges": (_set(["edges", "bytes", 0], False), "edges.bytes[0] must be a number, got False (a bool)"),
    "edge index beyond int32": (_set(["edges", "dst", 0], 2**32 + 1), "edges.dst[0] is 4294967297: a dangling edge"),
    "op name is a number": (_set(["ops", "name", 1], 7), "ops.name[1] must be a string, got 7"),
    "op type is a list": (_set(["ops", "type", 1], ["x"]), "ops.type[1] must be a string"),
    "params entry is a string": (_set(["ops", "params", 0], "w"), "ops.params[0] must be a list"),
    "graph name is a list": (_set(["name"], ["g"]), "name must be a string"),
    "profile time is a string": (
        _set(["profile"], {"gpu": {"fwd_s": ["1", None, 0.1]}}),
        "profile.gpu.fwd_s[0] must be a number",
    ),
    "inputs bytes is a bool": (
        _set(["meta", "inputs"], [{"name": "x", "bytes": True}]),
        "meta.inputs[0].bytes must be an integer",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_graph_type_errors_name_file_and_field(tmp_path, case):
    edit, message = BAD[case]
    doc = _doc()
    edit(doc)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphFormatError) as info:
        load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and message in msg and "\n" not in msg


def test_the_good_document_loads(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_doc()))
    g = load(path)
    assert g.meta["decomposed"] is False and int(g.param_bytes[0]) == 16


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_deeply_nested_json_is_one_line(tmp_path, text):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(PlacerError, match="nested too deeply") as info:
        read_json(path)
    assert str(info.value).startswith(f"{path}: ")


def test_integer_beyond_the_digit_limit_is_one_line(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"x": ' + "9" * 5000 + "}")
    with pytest.raises(PlacerError, match="not valid JSON") as info:
        read_json(path)
    assert "\n" not in str(info.value)


def test_helpers():
    assert schema.number(3, "f", "x") == 3.0 and schema.integer(4.0, "f", "x") == 4
    assert schema.column([1, 2.0], "f", "c", whole=True).dtype == np.int64
    for bad in (True, "1", None, [1], float("nan")):
        with pytest.raises(PlacerError, match="f: x "):
            schema.number(bad, "f", "x")
    with pytest.raises(PlacerError, match="must be true or false"):
        schema.boolean(0, "f", "x")
    with pytest.raises(PlacerError, match="must be a string"):
        schema.string(["a"], "f", "x")
    with pytest.raises(PlacerError, match="too large"):
        schema.integer(2**63, "f", "x")
    with pytest.raises(PlacerError, match="must be >= 1"):
        schema.number(0.5, "f", "x", minimum=1)
