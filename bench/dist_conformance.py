"""Conformance across processes: every corpus model, under plans that run on two processes, float64's gradients.

One launch checks the whole corpus: :func:`check_corpus` runs in each process
(torch's launcher starts them) and loops over the models; for each it builds the
model, cuts and compiles each plan of :data:`PLANS`, runs one step on the gloo
ranks and sends the loss and every gradient to rank 0, which compares them with the
float64 one-process step at the conformance tolerance (:mod:`envs.real.conformance`).

==========  ====================================================================
``split``   the first half of the ops (node order) on one rank, the rest on the
            other; 2 microbatches, fill-drain: torch's GPipe
``looped``  the ops in 4 contiguous blocks, alternating between the 2 ranks (2
            stages per rank); 2 microbatches, 1 in flight: placer's own issue
            order, run by torch's runtime as a list of actions
``zero_``   the looped plan's stages, 2 microbatches, under torch's interleaved
``bubble``  zero-bubble schedule (``interleaved_zb``: each backward split into its
            input part and its weight part)
``zbv``     the same 4 blocks in a V, ranks 0 1 1 0 (the plan's ``stage_cuts``
            cut the two middle blocks apart), 2 microbatches, under torch's ZB-V
            schedule (the backward split likewise; the middle blocks hand over
            within rank 1)
==========  ====================================================================

Run it on one machine, or as two nodes of one process each meeting at a rendezvous
(two launchers)::

    python -m bench.dist_conformance --models rnn llama
    python -m bench.dist_conformance --nnodes 2 --node-rank 1 --rdzv-endpoint localhost:29511 &
    python -m bench.dist_conformance --nnodes 2 --node-rank 0 --rdzv-endpoint localhost:29511
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from bench.common import OneLineParser
from envs.real.conformance import reference
from envs.real.distributed.launch import launch
from envs.real.distributed.rank_plan import compile_plan
from envs.real.distributed.runtime import RankSchedule
from envs.real.distributed.worker import check_report, gather_to_first, step_gradients
from envs.real.pipeline import split_batch
from graphs import OpGraph
from graphs.models.corpus import available, build
from graphs.plan import Placement
from graphs.torch_capture import export_program, graph_from_program

PLANS = ("split", "looped", "zero_bubble", "zbv")
DEVICES = ["gpu:0", "gpu:1"]
MICROBATCHES = 2


def plan_of(kind: str, graph: OpGraph) -> Placement:
    """Plan ``kind`` of :data:`PLANS` for ``graph``."""
    n = graph.num_ops
    if kind == "split":
        return Placement.from_indices(graph, DEVICES, np.arange(n) >= n // 2, microbatches=MICROBATCHES)
    if kind == "looped":
        blocks = (np.arange(n) * 4 // max(n, 1)) % 2
        return Placement.from_indices(graph, DEVICES, blocks, microbatches=MICROBATCHES, inflight=1)
    if kind == "zero_bubble":
        blocks = (np.arange(n) * 4 // max(n, 1)) % 2
        return Placement.from_indices(graph, DEVICES, blocks, microbatches=MICROBATCHES, schedule="interleaved_zb")
    if kind == "zbv":
        blocks = np.arange(n) * 4 // max(n, 1)
        turn = np.flatnonzero(blocks == 2)[:1]  # where the second block on rank 1 begins
        devices = np.array([0, 1, 1, 0])[blocks]
        return Placement.from_indices(
            graph, DEVICES, devices, microbatches=MICROBATCHES, schedule="zbv", stage_starts=turn
        )
    raise KeyError(f"unknown plan {kind!r} (known: {', '.join(PLANS)})")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def check_model(name: str, kinds: Sequence[str], rank: int) -> list[dict[str, Any]]:
    """Every plan of ``kinds`` on corpus model ``name``, on this process's rank: rank 0's rows, [] elsewhere."""
    t0 = time.perf_counter()
    model, inputs = build(name)
    ref = reference(model, inputs) if rank == 0 else None
    # the plans are made on one microbatch's program (the whole batch's has the same ops, one for one: the
    # conformance corpus' batch of 4 splits into 2 microbatches of 2), so each process exports once; without the
    # nodes' stack traces, which only name a line in an error of the capture (the export takes 0.75-0.87x the time)
    program = export_program(model, split_batch(inputs, MICROBATCHES)[0], stack_traces=False)
    part = graph_from_program(program)
    module = program.module()  # unlifted once for every plan (the plans' stages share its parameters, as they would)
    rows = []
    for kind in kinds:
        try:
            plan = compile_plan(part, plan_of(kind, part), program=part)
            schedule = RankSchedule(plan, module, inputs, rank, validate=True)  # the stages' shapes checked too
            failed = ""
        except Exception as e:  # every rank builds the same: all fail alike, before any step
            failed = _first_line(e)
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, failed)
        if any(flags):
            rows.append({"model": name, "plan": kind, "ok": False, "message": next(f for f in flags if f)})
            continue
        parts = gather_to_first(step_gradients(schedule, inputs))
        if rank == 0:
            row = check_report(parts, ref, part.meta.get("tied_params", []))
            rows.append({"model": name, "plan": kind, "schedule": plan.schedule, "stages": len(plan.stages), **row})
    for row in rows:
        row["seconds"] = time.perf_counter() - t0
    return rows if rank == 0 else []


@record
def check_corpus(names: Sequence[str], kinds: Sequence[str], timeout_s: float = 300.0) -> list[dict] | None:
    """The entry point of each process: every model of ``names`` under every plan of ``kinds`` (rank 0's rows)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    try:
        rank = dist.get_rank()
        asked = [(list(names), list(kinds))]
        dist.broadcast_object_list(asked, src=0)  # node 0's models and plans: every rank must run the same
        names, kinds = asked[0]
        rows: list[dict] = []
        for name in names:
            rows += check_model(name, kinds, rank)
        return rows if rank == 0 else None
    finally:
        dist.destroy_process_group()


def run(
    names: Sequence[str],
    kinds: Sequence[str] = PLANS,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    timeout_s: float = 300.0,
) -> list[dict] | None:
    """Launch the check on this node: 2 processes here, or 1 per node of 2 (rank 0's node returns the rows)."""
    out = launch(
        check_corpus,
        (list(names), list(kinds), timeout_s),
        nproc_per_node=2 // nnodes,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_timeout_s=timeout_s,
    )
    return out.get(0)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.dist_conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=None, help="corpus entries (default: all available)")
    parser.add_argument("--plans", nargs="*", default=list(PLANS), choices=PLANS)
    parser.add_argument("--nnodes", type=int, default=1, choices=(1, 2))
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT")
    args = parser.parse_args(argv)
    rows = run(
        args.models or available(),
        args.plans,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
    )
    if rows is not None:
        print(json.dumps(rows, indent=1))
    return 0 if rows is None or all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
