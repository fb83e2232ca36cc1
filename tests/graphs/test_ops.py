"""graphs.ops: the one definition of base op names and view ops, checked against torch's schemas."""

from __future__ import annotations

import numpy as np
import pytest

from envs.cluster import Cluster
from envs.sim import cost
from graphs import grouping
from graphs.ir import OpGraph
from graphs.ops import SHAPE_OPS, VIEW_OPS, base_op_name, free_mask, is_view_op, saved_mask, view_mask


@pytest.mark.parametrize("spelling", ["aten.t.default", "torch.ops.aten.t.default", "ops.aten.t.default", "aten.t"])
def test_one_base_name_for_every_spelling_of_an_op(spelling):
    # envs.cost once read "torch.ops.aten.t.default" as "ops" and graphs.grouping as "t".
    assert base_op_name(spelling) == grouping.op_base_name(spelling) == "t"
    assert is_view_op(spelling)


def test_base_names_of_python_callables():
    assert [
        base_op_name(t) for t in ("getitem", "_operator.getitem", "torch.nn.functional.relu", "mylib.fused.default")
    ] == ["getitem", "getitem", "relu", "fused"]


def _schema_aliases() -> dict[str, bool]:
    torch = pytest.importorskip("torch")
    out: dict[str, bool] = {}
    for s in torch._C._jit_get_all_schemas():
        ns, _, name = s.name.partition("::")
        if ns != "aten":
            continue
        alias = bool(s.returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns)
        out[name] = out.get(name, False) or alias
    return out


def test_every_listed_view_aliases_its_input_by_torch_schema():
    aliases = _schema_aliases()
    not_by_schema = sorted(n for n in VIEW_OPS if not aliases.get(n, False))
    assert not_by_schema == ["_unsafe_view", "getitem"]  # the two documented exceptions
    assert not any(aliases.get(n, False) for n in SHAPE_OPS)  # numbers, not views
    for copies_when_needed in ("to", "contiguous", "cpu", "cuda", "pin_memory"):
        assert aliases[copies_when_needed] and copies_when_needed not in VIEW_OPS


def test_cost_grouping_and_capture_agree_on_views():
    import torch

    from graphs.flops import is_alias

    for name in ("t", "transpose", "adjoint", "numpy_T", "lift_fresh", "diagonal", "unfold", "_unsafe_view"):
        op = getattr(torch.ops.aten, name).default if hasattr(getattr(torch.ops.aten, name), "default") else None
        if op is not None:
            assert is_alias(op) and is_view_op(f"aten.{name}.default"), name
    types = [
        "aten.mm.default",
        "aten.t.default",
        "aten.numpy_T.default",
        "aten.diagonal.default",
        "aten.sym_size.int",
        "aten.relu.default",
    ]
    g = OpGraph.from_edges(
        list("abcdef"), [("a", x, 64) for x in "bcdef"], flops=[8.0, 0, 0, 0, 0, 1.0], op_types=types
    )
    g.meta["alias_ops"] = ["f"]  # what capture recorded counts as well
    views = view_mask(g)
    assert views.tolist() == [False, True, True, True, False, True]
    assert free_mask(g).tolist() == [False, True, True, True, True, True]
    fwd, _ = cost.op_times(g, Cluster.preset("k80x2"))
    assert np.array_equal(fwd[:, 0] == 0, free_mask(g))
    # every view joins its producer; the shape query does not
    assert grouping.colocate(g).tolist() == [0, 0, 0, 0, 1, 0]


def test_input_free_ops_are_those_no_model_input_reaches():
    """A causal mask from arange, shared by two blocks: input-free; everything the input reaches: not."""
    import torch

    from graphs import capture
    from graphs.ops import input_free_mask

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            n = x.shape[1]
            mask = torch.arange(n).unsqueeze(0) <= torch.arange(n).unsqueeze(1)
            h = self.a(x).masked_fill(~mask[:, :8], 0.0)
            return self.b(h).masked_fill(~mask[:, :8], 0.0).sum()

    g = capture(Blocks(), (torch.randn(8, 8),))
    free = input_free_mask(g)
    names = {g.names[i] for i in np.flatnonzero(free)}
    assert any(n.startswith("arange") for n in names) and any(n.startswith("le") for n in names), names
    assert not any(n.startswith(("linear", "masked_fill", "sum")) for n in names), names
    consumers = {c for item in g.meta["inputs"] for c in item["consumers"]}
    assert consumers and not free[[g.index[c] for c in consumers]].any()
    # a hand-built graph says nothing about its inputs
    assert input_free_mask(OpGraph.from_edges(["a", "b"], [("a", "b", 4)])) is None


def _typed(types: dict[str, str], edges: list[tuple[str, str]]) -> OpGraph:
    return OpGraph.from_edges(
        list(types), [(a, b, 4) for a, b in edges], op_types=[f"aten.{t}" for t in types.values()]
    )


def test_saved_mask_keeps_what_a_backward_reads():
    # x (mm) is read through a view by a linear (which saves its input): kept. y (mm) is read through a view by a relu
    # (which saves its own output): freed. z's type is unknown: kept, as every op was before. s (sdpa) saves its output.
    g = _typed(
        {
            "x": "mm.default",
            "xv": "view.default",
            "lin": "linear.default",
            "y": "mm.default",
            "yv": "t.default",
            "r": "relu.default",
            "z": "my_op.default",
            "s": "scaled_dot_product_attention.default",
            "add": "add.Tensor",
            "out": "sum.default",
        },
        [
            ("x", "xv"),
            ("xv", "lin"),
            ("y", "yv"),
            ("yv", "r"),
            ("lin", "add"),
            ("r", "add"),
            ("z", "add"),
            ("s", "add"),
            ("add", "out"),
        ],
    )
    kept = dict(zip(g.names, saved_mask(g).tolist()))
    assert kept == {
        "x": True,
        "xv": True,
        "lin": False,
        "y": False,
        "yv": True,
        "r": True,
        "z": True,
        "s": True,
        "add": False,
        "out": True,
    }  # add: sum's backward reads no input; out: nothing consumes it
