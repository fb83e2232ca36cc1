"""``placer simulate``: one simulated training step of a placed graph; the schedule as a Chrome/Perfetto trace.

Typical use::

    placer simulate g.json p.json --cluster k80x4 --trace step.json
"""

from __future__ import annotations

import argparse
from typing import Any

import envs
from envs.cluster import CLUSTER_ARG_HELP
from graphs import sources
from graphs.io import write_text_atomic
from graphs.plan import Placement
from placer.cli.args import add_executor_argument, add_profile_argument, note_stand_in_loss, profiled
from placer.cli.output import gb, print_json, to_json
from placer.option_checks import check_input_file, check_output_file


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate one training step of a placed graph",
        description="Simulate one training step of GRAPH placed by PLACEMENT: step time, lower bound, per-device "
        "busy time and peak memory, status.",
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file, zoo name or module:callable")
    p.add_argument("placement", metavar="PLACEMENT", help="placement file (from `placer place` or `placer train`)")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--trace", metavar="FILE", help="write the schedule as Chrome/Perfetto trace JSON")
    add_executor_argument(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_profile_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trace:
        check_output_file(args.trace, "--trace")
    if args.profile:
        check_input_file(args.profile, "--profile")
    placement = Placement.load(check_input_file(args.placement))  # before a capture: a bad file is said at once
    cluster = envs.resolve_cluster(args.cluster)
    graph = sources.resolve_graph(args.graph)
    note_stand_in_loss(graph, args.graph)
    graph, cluster = profiled(graph, cluster, args.profile)
    env = envs.SimEnv(
        graph, cluster, executor=args.executor, microbatches=placement.microbatches, inflight=placement.inflight
    )
    placement.indices(graph, cluster.device_names, source=args.placement)  # another graph's plan: said, naming it
    result = env.simulate(placement, trace=bool(args.trace))  # its order, homes and checkpointed blocks with it
    bound = env.lower_bound(host_step=placement.host_step)  # homed parameters stepped during the backward: looser
    if args.trace:
        write_text_atomic(args.trace, to_json(result.extra.pop("trace"), indent=None))
    if args.json:
        doc = result.to_dict()
        doc["lower_bound_s"] = float(bound)
        doc["lower_bound_name"] = getattr(bound, "name", "")
        doc["graph"] = graph.name
        doc["cluster"] = cluster.name
        doc["executor"] = args.executor
        print_json(doc)
        return 0
    print(
        f"{graph.name or args.graph} ({graph.num_ops} ops) on {cluster.name}, placement {args.placement}, "
        f"{args.executor} executor{_pipelining(env)}"
    )
    _print_result(result, bound, placement, cluster)
    if args.trace:
        print(f"trace: {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def _pipelining(env: envs.SimEnv) -> str:
    """How the plan pipelines its step, for the title line (nothing for one microbatch)."""
    if env.microbatches == 1:
        return ""
    window = "fill-drain" if env.inflight == env.microbatches else f"at most {env.inflight} in flight"
    return f", {env.microbatches} microbatches ({window})"


def _print_result(result: Any, bound: float, placement: Placement, cluster: Any) -> None:
    """The step time against the bound, the status, and each device's ops, busy time and peak memory."""
    if result.ok:
        named = f": {bound.name}" if getattr(bound, "name", "") else ""
        print(
            f"step time   {result.step_time_s * 1e3:.3f} ms  (lower bound {bound * 1e3:.3f} ms{named}, "
            f"{result.step_time_s / bound:.2f}x)"
            if bound > 0
            else f"step time   {result.step_time_s * 1e3:.3f} ms"
        )
    else:
        sim_step_time_s = result.extra["sim_step_time_s"]
        print(f"step time   -  ({sim_step_time_s * 1e3:.3f} ms ignoring memory; lower bound {bound * 1e3:.3f} ms)")
    print(f"status      {result.status}{': ' + result.message if result.message else ''}")
    print(f"{'device':<8} {'ops':>6} {'busy ms':>10} {'peak memory':>12} {'capacity':>10}")
    counts = placement.device_counts()
    for device_index, device in enumerate(cluster.device_names):
        print(
            f"{device:<8} {counts.get(device, 0):>6} {result.busy_s[device] * 1e3:>10.3f} "
            f"{gb(result.peak_bytes[device]):>12} {gb(cluster.memory_bytes[device_index]):>10}"
        )
    links = [(k, v) for k, v in result.busy_s.items() if "->" in k]
    if links:
        print("links busy: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(links)))
    if placement.param_homes:
        print(f"homes       {len(placement.param_homes)} parameters live apart from their ops (param_homes)")
    steps = result.extra.get("host_steps")
    if steps:  # stepped during the backward: what `placer run`'s homes line measures
        print(
            f"host steps  {steps['stepped']} offloaded ops' parameters stepped during the backward in {steps['calls']} "
            f"calls of the host worker; backward() waits {steps['waited_s'] * 1e3:.3f} ms for it after autograd"
        )
    if placement.checkpoint:
        print(f"checkpoint  {len(placement.checkpoint)} blocks run their forward again in the backward")
