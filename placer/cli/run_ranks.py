"""``placer run --nproc-per-node N``: the plan across processes, one per device; its step time, memory and check.

``--nproc-per-node auto`` starts one process per device the plan's ops use: a plan that leaves a rank of the
cluster idle (``train --ranks`` may find the model faster on fewer ranks) runs as it is.

The placement is checked and compiled here (:func:`placer.distributed.compile_for_model`:
its graph, its devices against the processes, its schedule) before any process
starts; then torch's launcher starts this node's processes (:func:`placer.distributed.run`).
Node 0 prints the job's result: the median step time with the fastest and slowest
step, the peak memory of each rank, and with ``--check`` whether one step's loss and
gradients match the one-process step (or the worst tensor). Each rank's step is split
into phases (forward, backward, optimizer, and the rest: waiting on the other ranks,
the sends, the runtime between actions; :func:`envs.timeline.phases`). With
``--trace FILE`` the median step's timeline is written to FILE as a Chrome trace, the
same plan simulated on ``--cluster`` beside it (:meth:`envs.sim.ranks.RankSim.timeline`),
and the report gives each rank's simulated phases too (``--profile``: simulated with a profile's per-op
times, as ``train --ranks --profile`` simulates). The JSON has ``step_time_s``,
``ranks`` (each with its ``phases``), ``timeline`` and ``check.ok``; with ``--trace``,
``simulated``. Other nodes print that their ranks finished.
"""

from __future__ import annotations

import argparse
from typing import Any

import envs
from envs.real.distributed.rank_plan import RankPlan, stage_table
from envs.timeline import Event, rank_phases, write_chrome_trace
from graphs import sources
from graphs.errors import PlacerError
from graphs.plan import Placement
from graphs.schema import check_float, check_int
from placer.cli.args import check_step_counts, warn_if_mixing
from placer.cli.checked import check_line
from placer.cli.output import print_json
from placer.cli.run import check_devices
from placer.option_checks import check_input_file, check_output_file


def run_ranks(args: argparse.Namespace) -> int:
    from placer.distributed import compile_for_model, run

    check_step_counts(args)
    auto = args.nproc_per_node == "auto"  # the plan's device count, once the plan is read
    if auto and args.nnodes != 1:
        raise PlacerError("--nproc-per-node auto: one process per device of the plan on one machine; with --nnodes, N")
    if not auto:
        check_int(args.nproc_per_node, "--nproc-per-node", least=1)
    check_int(args.nnodes, "--nnodes", least=1)
    check_float(args.rdzv_timeout, "--rdzv-timeout", above=0)
    check_float(args.measure_timeout, "--measure-timeout", above=0)
    if args.trace:
        args.trace = check_output_file(args.trace, "--trace")
    if args.profile:
        if not args.trace:
            raise PlacerError("--profile: prices the simulated side of --trace; add --trace FILE")
        check_input_file(args.profile, "--profile")
    cluster = envs.resolve_cluster(args.cluster)
    placement = Placement.load(args.placement)
    check_devices(placement, cluster, args.placement)
    if auto:  # one process per device the plan's ops use (a plan may leave a rank idle)
        args.nproc_per_node = len(set(placement.assignment.values()))
    model, inputs = sources.resolve_model(args.source)
    plan, _ = compile_for_model(
        model,
        inputs,
        placement,
        rank_map=args.rank_map,
        backend=args.backend,
        nproc_per_node=args.nproc_per_node,
        device_map=args.device_map,
    )
    check_local_devices(plan, args.nproc_per_node, args.node_rank)
    if args.node_rank == 0:
        warn_if_mixing(args.source, args.placement, model, inputs, plan.microbatches)
    simulated = None
    if args.trace and args.node_rank == 0:
        simulated = simulate_plan(model, inputs, placement, cluster, args.profile)
    report = run(
        args.source,
        plan,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_timeout_s=args.rdzv_timeout,
        backend=args.backend,
        steps=args.steps,
        warmup=args.warmup,
        lr=args.lr,
        check=args.check,
        timeout_s=args.measure_timeout,
    )
    if report is None:  # another node: node 0 reports the job
        done = {"status": "ok", "node_rank": args.node_rank, "note": "this node's ranks finished; node 0 reports"}
        if args.json:
            print_json(done)
        else:
            print(f"node {args.node_rank}: its ranks finished; node 0 reports the job")
        return 0
    report["stage_table"] = stage_table(plan)
    if simulated is not None:
        result, events = simulated
        report["simulated"] = simulated_report(result, events, cluster.name)
        measured = [Event.from_list(row) for row in (report["timeline"] or {}).get("events", [])]
        meta = {"source": args.source, "placement": args.placement, "cluster": cluster.name}
        meta.update(step_time_s=report["step_time_s"], simulated_step_time_s=result.step_time_s)
        write_chrome_trace(args.trace, [("measured", measured), (f"simulated ({cluster.name})", events)], meta)
    ok = report["check"] is None or report["check"]["ok"]
    if args.json:
        print_json(report)
    else:
        print_report(args, report)
    return 0 if ok else 1


def simulate_plan(
    model: Any, inputs: Any, placement: Placement, cluster: Any, profile: str | None = None
) -> tuple[Any, list[Event]]:
    """The plan's step on the simulator of ranks (its own order, microbatches and schedule) and its timeline;
    ``profile``: a ``placer profile`` file whose per-op times go on the graph (the ranks cluster kept as it is)."""
    from envs.real.profiler.fit import with_profile
    from envs.sim.ranks import RankSim
    from graphs.torch_capture import capture

    graph, cluster = with_profile(capture(model, inputs), cluster, profile, ranks=True)
    return RankSim(graph, cluster).timeline(placement)


def simulated_report(result: Any, events: list[Event], cluster: str) -> dict[str, Any]:
    """The simulated step's time and each rank's phases (the report's ``simulated``)."""
    return {
        "cluster": cluster,
        "status": result.status,
        "step_time_s": result.step_time_s if result.ok else None,
        "ranks": [{"rank": r, "phases": p} for r, p in rank_phases(events).items()],
    }


def check_local_devices(plan: RankPlan, nproc_per_node: int, node_rank: int) -> None:
    """The torch devices of this node's ranks exist here (a CUDA device this machine lacks is one line)."""
    from envs.real.placing import check_available, resolve_devices

    first = node_rank * nproc_per_node
    here = {d: where.torch_device for d, where in plan.devices.items() if first <= where.rank < first + nproc_per_node}
    check_available(resolve_devices(here, here))


def print_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The text form of a run across processes."""
    times = report["step_times_s"]
    print(
        f"{args.source} across {len(report['ranks'])} process{'es' if len(report['ranks']) != 1 else ''} "
        f"({report['schedule']}, {report['stages']} stage{'s' if report['stages'] != 1 else ''}, "
        f"{report['microbatches']} microbatch{'es' if report['microbatches'] != 1 else ''}): "
        f"step time {report['step_time_s'] * 1e3:.2f} ms "
        f"(median of {len(times)}; min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f})"
    )
    for line in report["stage_table"]:
        print(f"  {line}")
    print(f"{'rank':<5} {'device':<8} {'torch':<8} {'stages':<10} {'peak memory':>14}")
    for r in report["ranks"]:
        stages = ",".join(map(str, r["stages"]))
        print(f"{r['rank']:<5} {r['device']:<8} {r['torch_device']:<8} {stages:<10} {r['peak_bytes'] / 1e9:>11.3f} GB")
    print_phases(report)
    if report["losses"]:
        print(f"loss {report['losses'][0]:.4f} -> {report['losses'][-1]:.4f}")
    if report["check"] is not None:
        print(check_line(report["check"], "one process"))


def print_phases(report: dict[str, Any]) -> None:
    """Where each rank's step goes, measured (and simulated, with ``--trace``): milliseconds, medians."""
    if not any(r.get("phases") for r in report["ranks"]):
        return
    sim = {r["rank"]: r["phases"] for r in (report.get("simulated") or {}).get("ranks", [])}
    cols = ("forward_s", "backward_s", "optimizer_s", "other_s", "step_s")
    heads = ("forward", "backward", "optimizer", "other", "step")
    print(
        "each rank's step, ms (medians; other: waiting on the other ranks, sends, the runtime between actions"
        + (f"; simulated on {report['simulated']['cluster']} after the /" if sim else "")
        + ")"
    )
    print(f"{'rank':<5} " + " ".join(f"{h:>{15 if sim else 9}}" for h in heads))
    for r in report["ranks"]:
        measured = r.get("phases")
        if not measured:
            continue
        cells = []
        for c in cols:
            cell = f"{measured[c] * 1e3:.1f}"
            if sim:
                cell += f" / {sim[r['rank']][c] * 1e3:.1f}" if r["rank"] in sim else " / -"
            cells.append(f"{cell:>{15 if sim else 9}}")
        print(f"{r['rank']:<5} " + " ".join(cells))
