"""``placer compare``: every baseline and learned placements on one scorer, one table."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    from envs.cluster import CLUSTER_ARG_HELP
    from envs.simulator import EXECUTOR_ARG_HELP, EXECUTORS
    from envs.profiler import add_profile_argument

    p = sub.add_parser(
        "compare",
        help="compare heuristic baselines and learned placements on the simulator",
        description="Place GRAPH with every baseline (or --methods), score each with the same simulator, "
        "and print one table: step time, speed-up over the best single device, peak memory per device, "
        "status and the time each method took; the lower bound is the last row.",
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file, zoo name or module:callable")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--methods", default="all", help="comma-separated baseline names, or 'all' (default)")
    p.add_argument("--placement", action="append", default=[], metavar="FILE", help="a placement file to add as a row (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed for the randomised methods (default 0)")
    p.add_argument("--executor", metavar="{" + ",".join(EXECUTORS) + "}", default="eager", help=EXECUTOR_ARG_HELP)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart of the step times")
    add_profile_argument(p)
    p.set_defaults(func=run)


def _methods(text: str) -> list[str] | None:
    from graphs import PlacerError
    from placer import baselines

    if text.strip() == "all":
        return None
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise PlacerError("--methods: give baseline names separated by commas, or 'all'")
    for m in names:
        baselines.get(m)
    return names


def run(args: argparse.Namespace) -> int:
    import envs
    from placer.checks import check_output_file, check_seed
    from placer.cli import print_json
    from placer.compare import compare, plot
    from placer.placement import Placement
    from placer.sources import resolve_graph_and_model

    check_seed(args.seed)
    if args.plot:
        check_output_file(args.plot, "--plot")
    cluster = envs.resolve_cluster(args.cluster)
    methods = _methods(args.methods)
    graph, model = resolve_graph_and_model(args.graph)  # the model, for the methods that need one (accelerate)
    if args.profile:  # measured op times and link speeds; the graph hash (so placements) is unchanged
        from envs.profiler import with_profile

        graph, cluster = with_profile(graph, cluster, args.profile)
    placements = [(path, Placement.load(path)) for path in args.placement]
    report = compare(graph, cluster, methods=methods, placements=placements, seed=args.seed, model=model, executor=args.executor)
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print_json(report.to_dict())
        return 0
    best = report.best()
    print(f"{report.graph} ({graph.num_ops} ops) on {report.cluster}; scored by the simulator ({report.executor} executor), seed {report.seed}")
    print(report.table())
    if report.best_single_s is not None:
        print(f"best single device: {report.best_single_device} {report.best_single_s * 1e3:.3f} ms; ", end="")
    else:
        print("no single device fits the graph; ", end="")
    print(f"best heuristic: {best.method} {best.step_time_s * 1e3:.3f} ms" if best else "no heuristic fits")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
