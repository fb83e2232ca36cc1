"""``placer compare``: every heuristic and learned placements on one scorer, one table."""

from __future__ import annotations

import argparse
import inspect
import time

import envs
from envs.cluster import CLUSTER_ARG_HELP
from envs.microbatch import parse_windows
from graphs import PlacerError
from graphs.plan import Placement, check_microbatches
from graphs.schema import check_float
from placer.cli.args import (
    MethodsHelp,
    add_executor_argument,
    add_profile_argument,
    check_method,
    parse_options,
    profiled_source,
    warn_if_mixing,
)
from placer.cli.output import print_json
from placer.compare import SCORE_ORDERS, compare, plot
from placer.compare.comparison import default_methods
from placer.compare.table import summary_lines
from placer.learn.progress import Progress
from placer.methods import registry
from placer.option_checks import check_input_file, check_output_file, check_seed


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        formatter_class=MethodsHelp,
        help="compare the heuristics and learned placements on the simulator",
        description="Place GRAPH with every heuristic (or --methods), score each with the same simulator, "
        "and print one table: step time, speed-up over the best single device, peak memory per device, "
        "status and the time each method took; the lower bound is the last row.",
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file, zoo name or module:callable")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--methods", default="all", help="comma-separated heuristic names, or 'all' (default): {methods}")
    p.add_argument(
        "--placement", action="append", default=[], metavar="FILE", help="a placement file to add as a row (repeatable)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for the randomised methods (default 0)")
    add_executor_argument(p)
    p.add_argument(
        "--microbatches",
        default="1",
        metavar="M[,M...]",
        help="microbatches per step (a pipelined plan, the batch split M ways with gradient accumulation); "
        "several, e.g. 1,2,4,8, to search: each method's row is its fastest M (default 1)",
    )
    p.add_argument(
        "--inflight",
        default="all",
        metavar="W[,W...]",
        help="the most microbatches in flight: 'all' (default, fill-drain: every forward, then the backward) "
        "or W < M (one-forward-one-backward: activations of at most W microbatches held, for plans that "
        "would not fit otherwise); several, e.g. 2,4,all, to search alongside --microbatches",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="[METHOD.]KEY=VALUE",
        help="an option for every method that takes KEY (or for METHOD only), e.g. time_limit_s=30 or "
        "ilp.num_workers=2 (repeatable)",
    )
    p.add_argument(
        "--score-order",
        choices=SCORE_ORDERS,
        default="node",
        help="issue order the methods search and are scored in: node (default, the graph's own order) or "
        "planned (each placement in its planned order, the order `placer train` scores in by default and "
        "each heuristic's placement file then carries)",
    )
    p.add_argument(
        "--bound-seconds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also prove the block bound, giving its exact programs this many seconds: each stretch of the "
        "step between two points every op passes through is placed exactly, copies charged (tighter on "
        "branchy models such as Inception; 0, the default: the fast bounds only)",
    )
    p.add_argument(
        "--ranks",
        action="store_true",
        help="score every plan as it runs across processes, one rank per device it uses (the runtime of the run "
        "command's --nproc-per-node: each maximal run of ops on one device a pipeline stage, torch's schedule, "
        "activations and gradients sent between ranks); for a cluster file from the profile command's --ranks. "
        "The searches still search the one-process simulator (stage_search searches this one); the lower bound is "
        "then that of ranks: all the work spread evenly over them, or one microbatch's critical path",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart of the step times")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="print no progress on stderr (by default a line as each method starts, and the total time: ilp alone "
        "may search for its time_limit_s, 60 s by default)",
    )
    add_profile_argument(p)
    p.set_defaults(func=run)


def _methods(text: str) -> list[str] | None:
    if text.strip() == "all":
        return None
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise PlacerError("--methods: give heuristic names separated by commas, or 'all'")
    for m in names:
        check_method(m, "--methods")
    return names


def _microbatches(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(item.isdigit() for item in items):
        raise PlacerError(f"--microbatches {text!r}: give whole numbers separated by commas, e.g. 1,2,4,8")
    return [check_microbatches(int(item), "--microbatches") for item in items]


def _options(items: list[str], methods: list[str] | None) -> dict[str, dict]:
    """``--option`` values per method: ``KEY=VALUE`` for every method whose function takes KEY, ``METHOD.KEY=VALUE`` for
    one."""
    names = methods if methods is not None else registry.names()
    out: dict[str, dict] = {}
    for item in items:
        ((key, value),) = parse_options([item]).items()
        method, dot, key = key.rpartition(".")
        if dot and method not in names:
            raise PlacerError(f"--option {item!r}: method {method!r} is not compared")
        takers = [m for m in ([method] if dot else names) if key in inspect.signature(registry.get(m)).parameters]
        if not takers:
            raise PlacerError(f"--option {item!r}: no compared method takes {key!r}")
        for m in takers:
            out.setdefault(m, {})[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    check_float(args.bound_seconds, "--bound-seconds", least=0)
    microbatches = _microbatches(args.microbatches)
    inflight = parse_windows(args.inflight)
    if args.plot:
        check_output_file(args.plot, "--plot")
    if args.profile:
        check_input_file(args.profile, "--profile")
    placements = [(path, Placement.load(check_input_file(path, "--placement"))) for path in args.placement]
    cluster = envs.resolve_cluster(args.cluster)
    methods = _methods(args.methods)
    options = _options(args.option, methods)
    # the model, for the methods that need one (accelerate); measured op times and link speeds with --profile
    graph, model, inputs, cluster = profiled_source(args.graph, cluster, args.profile, ranks=args.ranks)
    split = [m for m in microbatches if m > 1]
    if model is not None and split:  # the plans of microbatches compare gradient accumulation's step, if it differs
        warn_if_mixing(args.graph, f"--microbatches {args.microbatches}", model, inputs, min(split))
    progress = Progress(enabled=not args.no_progress)  # lines on stderr: stdout keeps the table or the JSON
    names = methods if methods is not None else default_methods()
    started = time.perf_counter()
    report = compare(
        graph,
        cluster,
        methods=names,
        placements=placements,
        seed=args.seed,
        model=model,
        executor=args.executor,
        microbatches=microbatches,
        inflight=inflight,
        options=options,
        score_order=args.score_order,
        bound_s=args.bound_seconds,
        ranks=args.ranks,
        starting=lambda done, name: progress.phase(f"compare: {done + 1}/{len(names)} {name}"),
    )
    progress.phase(f"compare: {len(names)} methods in {time.perf_counter() - started:.1f} s")
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print_json(report.to_dict())
        return 0
    order = "; each placement in its planned issue order" if report.score_order == "planned" else ""
    if args.ranks:
        scorer = f"the simulator of ranks (one process per device{order})"
    else:
        scorer = f"the simulator ({report.executor} executor{order})"
    print(f"{report.graph} ({graph.num_ops} ops) on {report.cluster}; scored by {scorer}, seed {report.seed}")
    print(report.table())
    print("\n".join(summary_lines(report)))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
