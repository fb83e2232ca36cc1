"""A plan across processes, before any process starts: its stages, ranks and schedule, checked by hand.

Toy graphs whose stage cuts, schedule choices and action lists can be worked out on
paper; every bad plan is one line (:class:`PlacerError`).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from envs.real.distributed.cut import cut_stages
from envs.real.distributed.rank_plan import RankPlan, compile_plan
from envs.real.distributed.ranks import assign_ranks, check_world, parse_rank_map, plan_devices
from envs.real.distributed.schedules import (
    BUILDERS,
    check_schedule,
    fitting_schedule,
    layout,
    planned_actions,
)
from graphs import OpGraph, PlacerError
from graphs.plan import SCHEDULES, Placement

DEVICES = ["gpu:0", "gpu:1"]


def chain(n: int) -> OpGraph:
    names = [f"op{i}" for i in range(n)]
    return OpGraph.from_edges(names, [(a, b, 4) for a, b in zip(names, names[1:])], name="chain")


# ------------------------------------------------------------------ the cut
def test_each_run_of_ops_on_one_device_in_issue_order_is_a_stage():
    g = chain(6)
    stages = cut_stages(g, [0, 0, 1, 1, 0, 1], DEVICES)
    assert [(s.index, s.device, s.ops) for s in stages] == [
        (0, "gpu:0", (0, 1)),
        (1, "gpu:1", (2, 3)),
        (2, "gpu:0", (4,)),
        (3, "gpu:1", (5,)),
    ]


def test_the_issue_order_decides_the_runs():
    # a -> c on gpu:0, b -> d on gpu:1: issued a c b d it is two stages, a b c d four
    g = OpGraph.from_edges(["a", "b", "c", "d"], [("a", "c", 4), ("b", "d", 4)])
    two = cut_stages(g, [0, 1, 0, 1], DEVICES, order=[0, 2, 1, 3])
    assert [s.ops for s in two] == [(0, 2), (1, 3)]
    four = cut_stages(g, [0, 1, 0, 1], DEVICES, order=[0, 1, 2, 3])
    assert [s.ops for s in four] == [(0,), (1,), (2,), (3,)]
    with pytest.raises(PlacerError, match="issued before its input"):
        cut_stages(g, [0, 1, 0, 1], DEVICES, order=[2, 0, 1, 3])


def test_a_stage_cut_starts_a_stage_on_the_same_device_and_a_cut_at_a_getitem_moves_past_its_tuple():
    g = chain(6)
    stages = cut_stages(g, [0, 1, 1, 1, 1, 0], DEVICES, starts=[3])
    assert [(s.device, s.ops) for s in stages] == [
        ("gpu:0", (0,)),
        ("gpu:1", (1, 2)),
        ("gpu:1", (3, 4)),
        ("gpu:0", (5,)),
    ]
    assert len(cut_stages(g, [0, 1, 1, 1, 1, 0], DEVICES, starts=[0, 1, 5])) == 3  # where a stage begins anyway
    # lstm's tuple and its getitem stay together: a cut at the getitem moves past it, to x
    g = OpGraph.from_edges(
        ["lstm", "item", "x", "out"],
        [("lstm", "item", 4), ("item", "x", 4), ("x", "out", 4)],
        op_types=["aten.lstm.input", "getitem", "aten.relu.default", "aten.add.Tensor"],
    )
    stages = cut_stages(g, [0, 0, 0, 0], DEVICES, starts=[1])
    assert [[g.names[i] for i in s.ops] for s in stages] == [["lstm", "item"], ["x", "out"]]


def test_a_getitem_runs_with_its_tuple_right_after_it():
    # lstm makes a tuple on gpu:0; its getitem placed on gpu:1 and issued later would make a tuple cross processes
    g = OpGraph.from_edges(
        ["lstm", "x", "item", "out"],
        [("lstm", "item", 4), ("item", "out", 4), ("x", "out", 4)],
        op_types=["aten.lstm.input", "aten.relu.default", "getitem", "aten.add.Tensor"],
    )
    stages = cut_stages(g, [0, 1, 1, 1], DEVICES, order=[0, 1, 2, 3])
    assert [(s.device, [g.names[i] for i in s.ops]) for s in stages] == [
        ("gpu:0", ["lstm", "item"]),
        ("gpu:1", ["x", "out"]),
    ]


def _two_iterations(reads_b_at: str | None = None) -> OpGraph:
    """Spectral norm's shape, by hand: ``w1`` writes the buffer ``u`` (a region under ``no_grad``), ``u1`` is what
    it wrote and returned, ``c1`` its clone, ``x1`` the real batch's layer; ``p`` a view of the weight, ``w2`` the
    second iteration writing ``u1`` in place, ``u2``/``c2`` likewise, ``x2`` the fake batch's layer. With
    ``reads_b_at``: ``x1`` also writes another buffer ``b``, which that op reads."""
    names = ["w1", "u1", "c1", "x1", "p", "w2", "u2", "c2", "x2"]
    edges = [("w1", "u1"), ("u1", "c1"), ("c1", "x1"), ("u1", "w2"), ("p", "w2"), ("w2", "u2"), ("u2", "c2")]
    edges += [("c2", "x2"), ("x1", "x2")]
    region, item, clone = "torch.ops.higher_order.wrap_with_set_grad_enabled", "getitem", "aten.clone.default"
    types = [region, item, clone, "aten.relu.default", "aten.flatten.using_ints", region, item, clone]
    types.append("aten.add.Tensor")
    g = OpGraph.from_edges(names, [(a, b, 4) for a, b in edges], op_types=types)
    g.meta["buffer_writes"] = [["w1", "u", ""], ["w2", "u", "u1"]]
    g.meta["buffer_readers"] = {"u": ["w1", "u1", "c1", "w2", "u2", "c2"]}
    if reads_b_at:
        g.meta["buffer_writes"].append(["x1", "b", ""])
        g.meta["buffer_readers"]["b"] = sorted(["x1", reads_b_at])
    return g


def test_the_ops_that_touch_a_buffer_written_in_place_run_in_one_stage_brought_together_in_the_issue_order():
    g = _two_iterations()
    split = [0, 0, 0, 0, 1, 1, 1, 1, 1]  # the two iterations on two devices, as a split in node order puts them
    stages = cut_stages(g, split, DEVICES)
    # the second iteration (with the weight's view it reads, and what reads its output) moves up to the first, so
    # the stage that wrote the buffer writes it again; the real batch's layer follows, the rest stays where it was
    assert [(s.device, [g.names[i] for i in s.ops]) for s in stages] == [
        ("gpu:0", ["w1", "u1", "c1", "p", "w2", "u2", "c2", "x1"]),
        ("gpu:1", ["x2"]),
    ]
    # a graph without capture's record of the writes keeps its cut
    g.meta.clear()
    assert [[g.names[i] for i in s.ops] for s in cut_stages(g, split, DEVICES)] == [
        ["w1", "u1", "c1", "x1"],
        ["p", "w2", "u2", "c2", "x2"],
    ]


def test_buffer_ops_are_not_brought_together_past_an_op_that_writes_what_they_read_but_stay_in_one_stage():
    # x1 writes the buffer b and p reads it: p (and w2 after it) may not run before x1, so the order stays; the
    # span from w1 to c2 stays on w1's device
    g = _two_iterations(reads_b_at="p")
    stages = cut_stages(g, [0, 0, 0, 0, 1, 1, 1, 1, 1], DEVICES)
    assert [(s.device, [g.names[i] for i in s.ops]) for s in stages] == [
        ("gpu:0", ["w1", "u1", "c1", "x1", "p", "w2", "u2", "c2"]),
        ("gpu:1", ["x2"]),
    ]
    # an op that merely passes (reads no buffer) does not hold them back
    g = _two_iterations(reads_b_at="x2")
    assert [g.names[i] for i in cut_stages(g, [0] * 9, DEVICES)[0].ops][:5] == ["w1", "u1", "c1", "p", "w2"]


def test_a_stage_start_within_a_written_buffers_span_moves_after_it():
    g = _two_iterations()
    # a V's turn placed at p, between the two iterations: the stage begins after c2, at x1
    stages = cut_stages(g, [0] * 9, DEVICES, starts=[g.index["p"]])
    assert [[g.names[i] for i in s.ops] for s in stages] == [
        ["w1", "u1", "c1", "p", "w2", "u2", "c2"],
        ["x1", "x2"],
    ]


def test_a_graph_file_keeps_its_buffer_writes_and_a_malformed_record_is_one_line(tmp_path):
    from graphs.errors import GraphFormatError
    from graphs.io import check_meta, load, save

    g = _two_iterations()
    save(g, tmp_path / "g.json")
    back = load(tmp_path / "g.json")
    assert back.meta["buffer_writes"] == g.meta["buffer_writes"]
    assert back.meta["buffer_readers"] == g.meta["buffer_readers"]
    with pytest.raises(GraphFormatError, match=r"^g.json: meta.buffer_writes\[0\] must be \[op, buffer, through\]"):
        check_meta({"buffer_writes": [["w1", "u"]]}, "g.json")
    with pytest.raises(GraphFormatError, match=r"^g.json: meta.buffer_readers.u\[1\] must be a string"):
        check_meta({"buffer_readers": {"u": ["w1", 3]}}, "g.json")


# ------------------------------------------------------------------ ranks
def test_the_plans_devices_in_list_order_are_ranks_unless_a_rank_map_says_otherwise():
    assert plan_devices({"a": "gpu:1", "b": "cpu:0"}, ["cpu:0", "gpu:0", "gpu:1"]) == ["cpu:0", "gpu:1"]
    default = assign_ranks(DEVICES, backend="nccl", nproc_per_node=1)
    assert [(d, r.rank, r.torch_device) for d, r in default.items()] == [("gpu:0", 0, "cuda:0"), ("gpu:1", 1, "cuda:0")]
    mapped = assign_ranks(DEVICES, "gpu:0=1,gpu:1=0", backend="gloo", device_map="gpu:1=cpu")
    assert mapped["gpu:0"].rank == 1 and mapped["gpu:1"].rank == 0 and mapped["gpu:0"].torch_device == "cpu"


@pytest.mark.parametrize(
    "text, message",
    [
        ("gpu:0=0", "no rank for 'gpu:1'"),
        ("gpu:0=0,gpu:1=0", "must be 0..1, each once"),
        ("gpu:0=0,gpu:7=1", "'gpu:7' is not a device of the plan"),
        ("gpu:0:0", "is not LOGICAL=RANK"),
    ],
)
def test_a_bad_rank_map_is_one_line(text, message):
    with pytest.raises(PlacerError, match=message):
        parse_rank_map(text, DEVICES)


def test_more_or_fewer_processes_than_devices_is_one_line():
    check_world(DEVICES, 2)
    for n, what in ((1, "process"), (3, "processes")):
        with pytest.raises(PlacerError, match=f"{n} {what} for a plan on 2 devices"):
            check_world(DEVICES, n)
    with pytest.raises(PlacerError, match=r"2 processes for a plan on 1 device \(gpu:0\)"):  # one device: singular
        check_world(["gpu:0"], 2)


# ------------------------------------------------------------------ schedules
def test_the_schedule_that_fits_a_plan():
    assert layout([0, 1], 2) == "one_per_rank" and layout([0, 1, 0, 1], 2) == "looped"
    assert layout([1, 0], 2) == "other" and layout([0, 1, 1], 2) == "other"
    assert layout([0, 1, 1, 0], 2) == "v" and layout([0, 1, 2, 2, 1, 0], 3) == "v" and layout([0, 0], 1) == "looped"
    assert fitting_schedule([0, 1, 1, 0], 2, microbatches=4, inflight=None) == "planned"  # zbv only when named
    assert fitting_schedule([0, 1], 2, microbatches=4, inflight=None) == "gpipe"
    assert fitting_schedule([0, 1], 2, microbatches=4, inflight=2) == "1f1b"
    assert fitting_schedule([0, 1], 2, microbatches=4, inflight=1) == "planned"  # torch's 1F1B keeps 2 in flight
    assert fitting_schedule([0, 1, 0, 1], 2, microbatches=4, inflight=None) == "looped_bfs"
    assert fitting_schedule([0, 1, 0, 1], 2, microbatches=4, inflight=2) == "planned"
    assert fitting_schedule([1, 0], 2, microbatches=1, inflight=None) == "planned"
    assert set(BUILDERS) == set(SCHEDULES)


@pytest.mark.parametrize(
    "name, stage_ranks, M, W, message",
    [
        ("gpipe", [0, 1, 0, 1], 2, None, "runs one stage per rank"),
        ("1f1b", [0, 1], 1, None, "at least as many microbatches as stages"),
        ("1f1b", [0, 1], 4, 1, "keeps 2 microbatches in flight"),
        ("gpipe", [0, 1], 4, 2, "the plan keeps at most 2"),
        ("interleaved_1f1b", [0, 1], 4, None, "several stages per rank"),
        ("interleaved_1f1b", [0, 1, 0, 1], 5, None, "a multiple of its rounds"),
        ("looped_bfs", [1, 0, 1, 0], 2, None, "stage s on rank s mod 2"),
        ("dualpipe", [0, 1], 2, None, "not one of"),
        ("dualpipev", [0, 1, 1, 0], 2, None, r"needs at least as many microbatches as stages \(4\)"),
        ("dualpipev", [0, 1, 0, 1], 4, None, "two stages per rank in a V"),
        ("zbv", [0, 1, 0, 1], 2, None, r"two stages per rank in a V \(0 1 1 0;"),
        ("interleaved_zb", [0, 1, 1, 0], 2, None, "several stages per rank"),
    ],
)
def test_a_schedule_that_does_not_fit_the_plan_is_one_line(name, stage_ranks, M, W, message):
    with pytest.raises(PlacerError, match=message):
        check_schedule(name, stage_ranks, 2, microbatches=M, inflight=W)


def test_the_planned_actions_are_placers_one_forward_one_backward():
    # two stages, three microbatches, one in flight: F0 B0 F1 B1 F2 B2 as in envs.microbatch.issue_segments
    actions = planned_actions([0, 1], 2, microbatches=3, inflight=1)
    assert actions[0] == [(0, "F", 0), (0, "B", 0), (0, "F", 1), (0, "B", 1), (0, "F", 2), (0, "B", 2)]
    assert actions[1] == [(1, "F", 0), (1, "B", 0), (1, "F", 1), (1, "B", 1), (1, "F", 2), (1, "B", 2)]
    # fill-drain: every forward, then the backwards, microbatch by microbatch
    drain = planned_actions([0, 1], 2, microbatches=2, inflight=None)
    assert drain[0] == [(0, "F", 0), (0, "F", 1), (0, "B", 0), (0, "B", 1)]


def _runs_to_the_end(actions: dict[int, list[tuple[int, str, int]]], S: int) -> bool:
    """Every rank runs its list in order, an action waiting for what it reads (blocking receives): no deadlock."""
    done: set[tuple[int, str, int]] = set()
    position = dict.fromkeys(actions, 0)
    progress = True
    while progress:
        progress = False
        for rank, acts in actions.items():
            while position[rank] < len(acts):
                s, kind, m = acts[position[rank]]
                needs = [(s - 1, "F", m)] if kind == "F" and s > 0 else []
                if kind == "B":
                    needs = [(s, "F", m)] + ([(s + 1, "B", m)] if s + 1 < S else [])
                if not all(n in done for n in needs):
                    break
                done.add((s, kind, m))
                position[rank] += 1
                progress = True
    return all(position[r] == len(a) for r, a in actions.items())


@pytest.mark.parametrize(
    "stage_ranks, M, W",
    [
        (r, M, W)
        for r, M in itertools.product(([0, 1], [0, 1, 0, 1], [1, 0, 1], [0, 1, 2, 0, 1, 2]), (1, 2, 4))
        for W in sorted({1, 2, M})
        if W <= M
    ],
)
def test_the_planned_actions_never_deadlock_and_run_every_step_once(stage_ranks, M, W):
    R, S = max(stage_ranks) + 1, len(stage_ranks)
    actions = planned_actions(stage_ranks, R, microbatches=M, inflight=W)
    every = sorted(a for acts in actions.values() for a in acts)
    assert every == sorted((s, k, m) for s in range(S) for k in "FB" for m in range(M))
    assert all(stage_ranks[s] == r for r, acts in actions.items() for s, _, _ in acts)
    assert _runs_to_the_end(actions, S)


def test_the_deadlock_check_can_fail():
    assert not _runs_to_the_end({0: [(0, "B", 0), (0, "F", 0)], 1: [(1, "F", 0), (1, "B", 0)]}, 2)


# ------------------------------------------------------------------ compiling
def test_a_plan_compiles_with_its_stages_ranks_and_schedule_and_round_trips():
    g = chain(4)
    p = Placement.from_indices(g, ["cpu:0", *DEVICES], [2, 2, 1, 1], microbatches=2)
    plan = compile_plan(g, p, program=g)
    assert [(s.device, s.rank, s.ops) for s in plan.stages] == [
        ("gpu:1", 1, ("op0", "op1")),
        ("gpu:0", 0, ("op2", "op3")),
    ]
    assert plan.schedule == "planned"  # stage 0 on rank 1: not torch's layout
    assert RankPlan.from_dict(plan.to_dict()) == plan
    swapped = compile_plan(g, p, program=g, rank_map="gpu:1=0,gpu:0=1")
    assert swapped.stage_ranks == [0, 1] and swapped.schedule == "gpipe"


def test_a_v_plan_compiles_with_two_stages_on_its_last_rank_and_its_cuts_are_checked(tmp_path):
    g = chain(8)
    p = Placement.from_indices(g, DEVICES, [0, 0, 1, 1, 1, 1, 0, 0], microbatches=2, schedule="zbv", stage_starts=[4])
    plan = compile_plan(g, p, program=g)
    assert plan.stage_ranks == [0, 1, 1, 0] and plan.schedule == "zbv"
    assert [s.ops for s in plan.stages][1:3] == [("op2", "op3"), ("op4", "op5")]
    assert plan.rank_stages(0) == [0, 3] and plan.rank_stages(1) == [1, 2]
    p.save(tmp_path / "v.json")
    back = Placement.load(tmp_path / "v.json")
    assert back == p and back.stage_cuts == ["op4"]
    assert "stage_cuts" not in Placement.from_indices(g, DEVICES, [0] * 8).to_dict()  # absent when none
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**p.to_dict(), "stage_cuts": ["op9"]}))
    with pytest.raises(PlacerError, match="bad.json: stage_cuts names op 'op9', which graph chain does not have"):
        compile_plan(g, Placement.load(bad), program=g)
    bad.write_text(json.dumps({**p.to_dict(), "stage_cuts": "op4"}))
    with pytest.raises(PlacerError, match="bad.json.*stage_cuts"):
        Placement.load(bad)
    # without its cut the middle is one stage, which the V schedule cannot run
    bad.write_text(json.dumps({k: v for k, v in p.to_dict().items() if k != "stage_cuts"}))
    with pytest.raises(PlacerError, match="bad.json: schedule 'zbv' runs two stages per rank in a V"):
        compile_plan(g, Placement.load(bad), program=g)


def test_a_placement_made_for_another_model_is_one_line():
    p = Placement.from_indices(chain(4), DEVICES, [0, 0, 1, 1])
    with pytest.raises(PlacerError, match="made for graph"):
        compile_plan(chain(5), p)


def test_a_schedule_the_placement_names_must_fit_it():
    g = chain(4)
    p = Placement.from_indices(g, DEVICES, [0, 1, 0, 1], microbatches=2, schedule="1f1b")
    with pytest.raises(PlacerError, match="placement: schedule '1f1b' runs one stage per rank"):
        compile_plan(g, p, program=g)


def test_microbatches_need_the_same_program_at_the_microbatch_size():
    g = chain(4)
    p = Placement.from_indices(g, DEVICES, [0, 0, 1, 1], microbatches=2)
    with pytest.raises(PlacerError, match="needs the program of one microbatch"):
        compile_plan(g, p)
    with pytest.raises(PlacerError, match="other ops than at the whole batch"):
        compile_plan(g, p, program=chain(3))


# ------------------------------------------------------------------ the placement file
def test_a_placement_carries_its_schedule_and_old_files_still_load(tmp_path):
    g = chain(3)
    p = Placement.from_indices(g, DEVICES, [0, 1, 1], microbatches=2, schedule="gpipe")
    p.save(tmp_path / "p.json")
    back = Placement.load(tmp_path / "p.json")
    assert back == p and back.schedule == "gpipe"
    doc = Placement.from_indices(g, DEVICES, [0, 1, 1]).to_dict()
    assert "schedule" not in doc and Placement.from_dict(doc).schedule is None
    with pytest.raises(PlacerError, match="'schedule': 'dualpipe' is not a schedule"):
        Placement.from_dict({**doc, "schedule": "dualpipe"}, source="p.json")
    with pytest.raises(PlacerError, match="schedule"):
        Placement.from_dict({**doc, "schedule": 3}, source="p.json")


def test_rows_of_a_plan_vector_keep_their_devices():
    g = chain(4)
    op_devices = np.array([1, 1, 0, 0])
    assert [s.device for s in cut_stages(g, op_devices, DEVICES)] == ["gpu:1", "gpu:0"]
