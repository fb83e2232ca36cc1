"""``placer place``: a heuristic's placement (or the pretrained policy's, ``--method learned``; or the move search
with parameter homes, ``--method homes``, for a model whose training state does not fit the GPUs) as a placement
file.

Typical use::

    placer place g.json --cluster k80x4 --method m_etf -o p.json
    placer place g.json --cluster k80x4 --method learned -o p.json
    placer place mymodel:build --cluster cluster.json --method homes -o plan.json   # then placer run, placer.apply
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

import envs
from envs.cluster import CLUSTER_ARG_HELP
from graphs import OpGraph
from graphs.errors import PlacerError
from graphs.plan import Placement
from placer.cli.args import (
    MethodsHelp,
    add_profile_argument,
    check_method,
    parse_options,
    profiled_source,
    roofline_ranks_note,
    warn_if_mixing,
)
from placer.cli.output import counted
from placer.compare.comparison import best_single
from placer.learn.progress import Progress
from placer.methods import registry
from placer.option_checks import check_input_file, check_int, check_output_file, check_seed, parse_group_counts

#: A method still running after this many seconds gets one line on stderr saying so (and, for a search with a time
#: limit, how long it may take and how to shorten it); a quick method prints nothing, and an option it refuses at
#: once stays a one-line error.
SLOW_AFTER_S = 2.0


@contextlib.contextmanager
def said_when_slow(progress: Progress, text: str) -> Iterator[None]:
    """``progress``'s phase line ``text`` once the body has run :data:`SLOW_AFTER_S` seconds, if it has."""
    timer = threading.Timer(SLOW_AFTER_S, progress.phase, (text,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def slow_text(method: str, graph: OpGraph, options: dict[str, Any]) -> str:
    """What :func:`said_when_slow` says of ``method``: that it runs, and its time limit where it has one."""
    text = f"place: {method} on {graph.name or 'the graph'} ({graph.num_ops:,} ops) is still running"
    fn = registry.get(method)
    if registry.accepts(fn, "time_limit_s"):
        default = inspect.signature(fn).parameters.get("time_limit_s")
        limit = options.get("time_limit_s", default.default if default is not None else None)
        if isinstance(limit, (int, float)) and not isinstance(limit, bool):
            text += f"; it searches for up to {limit:g} s (--option time_limit_s=S)"
    return text


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "place",
        help="place a graph with a heuristic",
        formatter_class=MethodsHelp,
        description="Place GRAPH on a cluster with a heuristic and write the placement file.",
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file, zoo name or module:callable")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument(
        "--method",
        default="single",
        help="a heuristic: {methods}; or learned (a pretrained gnn policy, zero-shot); or homes (the move search "
        "choosing, with the op placement, which parameters live on the host with their gradients and Adam state "
        "while their ops run on the GPU: for a model whose training state does not fit the GPUs; --option "
        "evals=N simulated placements, default 2000; --option headroom=F of each device's memory planned, default "
        "0.9; --option checkpoint=on|off|moves: the layers whose activations are computed again in the backward: "
        "the faster of two searches, one choosing them by moves and one with every layer then pruned (on, default), "
        "none (off), or the first search alone (moves); --option host_step=auto|backward|after: the homed "
        "parameters stepped during the backward, in batches as their gradients come home, while the GPU goes on "
        "(backward; train with placer.apply.step_in_backward), or by the optimizer's step after it (after), or "
        "whichever simulates faster for the plan found (auto, default); default single",
    )
    p.add_argument(
        "--policy-file",
        default=None,
        metavar="FILE",
        help="--method learned: policy .pt (default: the one shipped with placer)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="--method learned: placements sampled per group count "
        "besides the greedy ones; the best simulated is kept (default 48)",
    )
    p.add_argument(
        "--groups",
        default=None,
        metavar="N[,N...]",
        help="--method learned: the policy decodes the ops "
        "(greedy) and the graph coarsened to each of these group counts, or grouped by module at each "
        "depth (the word modules); none: the ops only, sampled too (default 128,256,512,modules)",
    )
    p.add_argument(
        "--refine",
        type=int,
        default=None,
        metavar="N",
        help="--method learned: then simulate up to N "
        "more placements improving the best decodes, one group moved to another GPU (or to the host, when the "
        "model's training state does not fit the GPUs) at a time (steepest "
        "descent, as the module_search heuristic does from random draws); stops after 2 s; 0: keep the "
        "best decode (default 1000)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for randomised methods (default 0)")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a method option, e.g. device=gpu:1; devices=gpus|all|auto for the searches (random_search, "
        "random_modules, module_search, annealing; auto, the default: the GPUs, and the host too when the "
        "model's training state does not fit them); every method takes microbatches=M, inflight=W and "
        "schedule=S (across processes, the torch schedule the plan runs under: gpipe, 1f1b, looped_bfs, "
        "interleaved_1f1b, interleaved_zb, zbv, dualpipev, planned; the pipeline splits take stages_per_rank=K for "
        "the looped ones; under zbv and dualpipev they and stage_search split into 2 stages per rank in a V; "
        "stage_search also takes schedule=auto: it searches under one stage per rank, the looped and the V "
        "schedules that fit M and W, and keeps the fastest simulated, a plan of more stages than ranks only where "
        "it is faster by margin=F, default 0.1) (repeatable)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="placement file to write (.json)")
    p.add_argument(
        "--ranks",
        action="store_true",
        help="for a plan run across processes (the run command's --nproc-per-node): also simulate it there, one rank "
        "per device it uses, and keep the issue order that runs faster there, the planned one or node order (the "
        "order cuts the pipeline stages; node order keeps a split's stages contiguous)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help=f"print no progress on stderr (by default one line when a method still runs after {SLOW_AFTER_S:g} s)",
    )
    add_profile_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, "-o")
    check_seed(args.seed)
    for option, path in (("--profile", args.profile), ("--policy-file", args.policy_file)):
        if path:
            check_input_file(path, option)
    heuristic = args.method not in ("learned", "homes")
    if heuristic:
        check_method(args.method, "--method")
    cluster = envs.resolve_cluster(args.cluster)
    options = parse_options(args.option)
    graph, model, inputs, cluster = profiled_source(args.graph, cluster, args.profile, ranks=args.ranks)
    if model is not None and heuristic and registry.accepts(registry.get(args.method), "model"):
        options["model"] = model  # accelerate's device maps need the module
    for flag, value in (
        ("--policy-file", args.policy_file),
        ("--samples", args.samples),
        ("--groups", args.groups),
        ("--refine", args.refine),
    ):
        if args.method != "learned" and value is not None:
            raise PlacerError(f"{flag}: only with --method learned")
    if args.method == "homes" and args.ranks:
        raise PlacerError(
            "--ranks: a plan with parameter homes runs in one process (placer run without --nproc-per-node)"
        )
    try:
        if args.method == "learned":
            placement = _learned(args, graph, cluster, options)
        elif args.method == "homes":
            placement = _homes(args, graph, cluster, options)
        else:
            with said_when_slow(Progress(enabled=not args.no_progress), slow_text(args.method, graph, options)):
                placement = registry.place(args.method, graph, cluster, seed=args.seed, **options)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise PlacerError(f"--method {args.method}: {str(e).split(') ', 1)[-1]}") from None
        raise
    ranks = for_ranks(placement, graph, cluster) if args.ranks else None
    if ranks is not None and ranks.status == "error" and placement.schedule is not None:
        raise PlacerError(f"--option schedule={placement.schedule}: {ranks.message}")  # the plan would not run
    placement.save(args.output)
    if model is not None:  # a plan of microbatches of a step that mixes its batch computes gradient accumulation's
        warn_if_mixing(args.graph, args.output, model, inputs, placement.microbatches)
    if model is not None and ranks is not None and ranks.ok:
        warn_if_cut_refused(args.graph, args.output, model, inputs, placement)
    counts = ", ".join(f"{device}: {ops}" for device, ops in sorted(placement.device_counts().items()))
    step_ms = placement.meta["step_time_s"] * 1e3
    fit = envs.SimEnv(graph, cluster).simulate(
        placement
    )  # the planned order's time ignores memory: say when it does not fit
    timing = f"{step_ms:.3f} ms simulated, eager" if fit.ok else f"{fit.message}; {step_ms:.3f} ms ignoring memory"
    print(
        f"{args.output}: {args.method} placement of {graph.name or args.graph} ({graph.num_ops} ops) on "
        f"{cluster.name} ({counts}); "
        f"issue order: {placement.meta['issue_order']} ({timing})"
    )
    if ranks is not None:
        print(
            f"  across processes: {ranks.step_time_s * 1e3:.3f} ms simulated "
            f"({counted(ranks.extra['stages'], 'stage')} on {counted(ranks.extra['ranks'], 'rank')}, "
            f"{ranks.extra['schedule']} schedule); no plan of {placement.microbatches} microbatch"
            f"{'es' if placement.microbatches > 1 else ''} on these ranks under "
            f"{placement.meta['ranks_lower_bound_s'] * 1e3:.3f} ms ({placement.meta['ranks_lower_bound']})"
            if ranks.ok
            else f"  across processes: {ranks.status}: {ranks.message}"
        )
        if ranks.ok:  # where the step goes: each rank's actions and sends, the rest its idle time
            busy = ", ".join(f"{d} {s * 1e3:.1f} ms" for d, s in ranks.busy_s.items() if "->" not in d)
            print(
                f"  ranks busy: {busy} of the {ranks.step_time_s * 1e3:.1f} ms step (compute, sends, the runtime "
                "between actions; the rest waits, the pipeline's fill and the optimizer step)"
            )
            alone_s = placement.meta["ranks_one_rank_s"]
            if alone_s is not None:
                gain = alone_s / ranks.step_time_s
                print(
                    f"  one rank alone: {alone_s * 1e3:.3f} ms ({placement.meta['ranks_one_rank']}, the whole model, "
                    f"one microbatch): this plan is {gain:.2f}x as fast"
                    + ("" if gain >= 1 else " (a pipeline does not pay here)")
                )
        tried = placement.meta.get("schedules")
        if tried:  # schedule=auto: what each schedule's search reached
            each = ", ".join(f"{k} {'does not fit' if v is None else f'{v * 1e3:.1f} ms'}" for k, v in tried.items())
            margin = placement.meta["margin"]
            why = (
                f"more stages than ranks only where {margin * 100:g} % faster than one per rank: the simulator is "
                "optimistic about them"
                if margin > 0
                else "the fastest simulated, no margin"
            )
            print(f"  schedule=auto: {each}; {placement.schedule} kept ({why})")
        note = roofline_note(ranks, args.profile)
        if note:
            print(f"  {note}")
    if args.method == "homes":
        _say_homes(placement, graph, cluster, fit)
    if args.method == "learned":
        m = placement.meta
        refined = (
            f"; {m['refine_simulated']} placements simulated refining the decodes (stopped: {m['refine_stopped']})"
            if m["refine"]
            else ""
        )
        print(f"  best of {m['decodes']} decodes of the policy{refined}: {m['found_by']}, in {m['place_time_s']:.1f} s")
    return 0


def warn_if_cut_refused(source: str, path: str, model: Any, inputs: tuple, placement: Placement) -> bool:
    """A ``warning:`` line on stderr where ``placer run --nproc-per-node`` would refuse the plan's cut of the model's
    program (:func:`placer.distributed.compile_for_model`: a value that is not a tensor sent between stages, a
    buffer written in a stage that received it where the cut could not keep its ops together, say); the model is
    exported once more. True where it warned."""
    from placer.distributed import compile_for_model

    try:
        compile_for_model(model, inputs, placement)
    except PlacerError as e:
        if not str(e).startswith("stage cut:"):
            return False
        print(f"{source} with {path}: warning: this plan cannot run across processes: {e}", file=sys.stderr)
        return True
    return False


def roofline_note(ranks: Any, profile: str | None) -> str | None:
    """:func:`~placer.cli.args.roofline_ranks_note` for a plan of more stages than ranks simulated without
    ``--profile``; None otherwise."""
    if profile is not None or not ranks.ok or ranks.extra["stages"] <= ranks.extra["ranks"]:
        return None
    return roofline_ranks_note(f"{ranks.extra['stages']} stages on {ranks.extra['ranks']} ranks,")


def for_ranks(placement: Placement, graph: OpGraph, cluster: Any) -> Any:
    """``--ranks``: the plan as it runs across processes (:class:`envs.sim.ranks.RankSim`). Its issue order cuts the
    stages, so the file keeps the planned order or node order (each device's ops in program order: a pipeline
    split's contiguous stages), whichever runs faster there, the bound of ranks at its M
    (:func:`envs.sim.ranks.ranks_lower_bound`) and the whole model's step on its fastest rank alone; returns that
    order's Result."""
    from envs.sim.ranks import RankSim

    sim = RankSim(graph, cluster)
    result = sim.simulate(placement)
    if placement.order is not None:
        node = sim.simulate(placement, order=np.arange(graph.num_ops))
        if node.ok and (not result.ok or node.step_time_s < result.step_time_s):
            placement.order, result = None, node
            placement.meta["issue_order"] = "node"
            placement.meta["step_time_s"] = envs.SimEnv(graph, cluster).simulate(placement).step_time_s  # one process
    placement.meta["ranks_step_time_s"] = result.step_time_s if result.ok else None
    placement.meta["ranks_schedule"] = result.extra.get("schedule")
    bound = sim.lower_bound(placement.microbatches)  # what no plan of its M on these ranks beats
    placement.meta["ranks_lower_bound_s"], placement.meta["ranks_lower_bound"] = float(bound), bound.name
    # the whole model on its fastest rank alone, one microbatch (compare's best single device): where a pipeline
    # is no faster than that, one process does as well
    placement.meta["ranks_one_rank_s"], placement.meta["ranks_one_rank"] = best_single(sim, graph, cluster)
    return result


def _homes(args: argparse.Namespace, graph: OpGraph, cluster: Any, options: dict[str, Any]) -> Placement:
    """``--method homes``: the move search with home moves (:func:`placer.learn.offload_plan.plan_with_homes`)."""
    from placer.learn.offload_plan import HOST_STEP_CHOICES, fsdp2_offload_times, plan_with_homes
    from placer.methods.heuristics.costs import MEMORY_HEADROOM

    unknown = sorted(set(options) - {"evals", "headroom", "checkpoint", "host_step"})
    if unknown:
        raise PlacerError(
            f"--option {unknown[0]}: --method homes takes evals=N, headroom=F, checkpoint=on|off|moves and "
            "host_step=auto|backward|after"
        )
    host_step = options.get("host_step", "auto")
    if host_step not in HOST_STEP_CHOICES:
        raise PlacerError(f"--option host_step={host_step}: must be auto, backward or after")
    checkpoint = options.get("checkpoint", "on")
    if checkpoint not in ("on", "off", "moves"):
        raise PlacerError(f"--option checkpoint={checkpoint}: must be on, off or moves")
    evals = options.get("evals", 2000)
    check_int(evals, "--option evals", least=1, most=10**7)
    headroom = options.get("headroom", MEMORY_HEADROOM)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 < headroom <= 1:
        raise PlacerError(f"--option headroom={headroom}: must be a number in (0, 1]")
    if "cpu:0" not in cluster.device_names:
        raise PlacerError(f"--method homes: cluster {cluster.name} has no host (cpu:0) to home parameters on")
    placement = plan_with_homes(
        graph,
        cluster,
        evals=evals,
        seed=args.seed,
        headroom=float(headroom),
        checkpoint=checkpoint != "off",
        checkpoint_by="moves" if checkpoint == "moves" else "both",
        host_step=host_step,
    )
    placement.meta["issue_order"] = "node"  # the search scores node order; the file carries no other
    placement.meta["fsdp2_offload_s"] = fsdp2_offload_times(graph, cluster)  # the rival, as FSDP2 runs it
    return placement


def _say_homes(placement: Placement, graph: OpGraph, cluster: Any, fit: Any) -> None:
    """What the plan homes apart from its ops, and each GPU's simulated peak against its memory."""
    from placer.cli.output import first_few, nbytes

    peaks = ", ".join(
        f"{d.name} {nbytes(fit.peak_bytes.get(d.name, 0))} of {nbytes(d.memory_bytes)}"
        for d in cluster.devices
        if d.name != "cpu:0"
    )
    print(
        f"  parameters homed apart from their ops: {len(placement.param_homes)} "
        f"({nbytes(placement.homed_bytes(graph))}); simulated peak: {peaks}; "
        f"{placement.meta['evals']} placements simulated in {placement.meta['search_s']:.1f} s"
    )
    compared = placement.meta.get("host_step_s")  # host_step=auto: the plan simulated both ways
    versus = (
        f" (simulated {compared['backward'] * 1e3:.3f} ms stepped during it, {compared['after'] * 1e3:.3f} ms after)"
        if compared
        else ""
    )
    if placement.param_homes and placement.host_step == "backward":
        print(
            f"  homed parameters stepped during the backward, in batches as their gradients come home{versus}: build "
            "the optimizer on the placed module and call placer.apply.step_in_backward(placed, optimizer) (placer "
            "run does)"
        )
    elif placement.param_homes and compared:
        print(f"  homed parameters stepped by the optimizer's step after the backward{versus}")
    rival = {k: v for k, v in (placement.meta.get("fsdp2_offload_s") or {}).items() if v is not None}
    if rival:  # FSDP2's offload as a plan, the faster of as it is and with every layer checkpointed
        how = min(rival, key=rival.get)
        each = "every layer checkpointed" if how == "checkpointed" else "no layer checkpointed"
        mine = f"; this plan is {rival[how] / fit.step_time_s:.2f}x as fast" if fit.ok else ""
        print(
            f"  FSDP2's offload as a plan (every op on the GPU, every parameter homed on the host, stepped after the "
            f"backward, {each}): {rival[how] * 1e3:.3f} ms simulated{mine}"
        )
    elif "fsdp2_offload_s" in placement.meta:
        print("  FSDP2's offload as a plan (every op on the GPU, every parameter homed on the host) does not fit")
    search = placement.meta.get("checkpoint_search")
    blocks = placement.checkpoint
    if search:  # the searches (placer.learn.offload_plan): layers chosen by moves; every layer, then pruned
        of = next(iter(search.values()))["of"]
        said = f"{len(blocks)} of {of} layers ({first_few(blocks)})" if blocks else f"none of {of} layers"
        names = {"moves": "layers chosen by moves", "every": "every layer then pruned"}
        tried = ", ".join(
            f"{names[arm]} {'fits' if s['fits'] else 'out of memory'} at {s['step_time_s'] * 1e3:.1f} ms "
            f"({s['blocks']} layers)"
            for arm, s in search.items()
        )
        print(f"  activations checkpointed: {said}; searched: {tried}")


def _learned(args: argparse.Namespace, graph: OpGraph, cluster: Any, options: dict[str, Any]) -> Placement:
    """``--method learned``: the pretrained policy's placement (:func:`placer.methods.learned.place_learned`)."""
    # the policy is torch: loaded only for this method
    from placer.methods.learned import ZERO_SHOT_GROUPS, ZERO_SHOT_REFINE, ZERO_SHOT_SAMPLES, place_learned

    samples = ZERO_SHOT_SAMPLES if args.samples is None else args.samples
    check_int(samples, "--samples", least=0, most=4096)
    refine = ZERO_SHOT_REFINE if args.refine is None else args.refine
    check_int(refine, "--refine", least=0, most=10**6)
    groups = ZERO_SHOT_GROUPS if args.groups is None else parse_group_counts(args.groups, modules=True)
    if options:
        raise PlacerError("--option: --method learned takes none (use --policy-file, --samples, --groups, --refine)")
    return place_learned(
        graph, cluster, policy_file=args.policy_file, samples=samples, groups=groups, seed=args.seed, refine=refine
    )
