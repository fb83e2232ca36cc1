"""``placer clusters``, ``placer place`` and ``placer simulate``.

Typical use::

    placer clusters                                   # the presets
    placer clusters k80x4 --json > my.json            # a loadable file to edit
    placer place g.json --cluster k80x4 --method single -o p.json
    placer simulate g.json p.json --cluster k80x4 --trace step.json
    placer export-map p.json --graph mypkg.models:build --module model -o device_map.json
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from graphs.errors import PlacerError
from placer.checks import check_output_file, check_seed
from placer.cli import print_json, to_json


def add_commands(sub: argparse._SubParsersAction) -> None:
    from envs.cluster import CLUSTER_ARG_HELP
    from envs.sim.simulator import EXECUTOR_ARG_HELP, EXECUTORS
    from placer.cli import add_profile_argument

    p = sub.add_parser("clusters", help="list the preset clusters, or show one", description="List the preset clusters, or show one (with --json: a loadable placer-cluster/1 file).")
    p.add_argument("name", nargs="?", metavar="NAME", help="a preset name or cluster JSON file to show")
    p.add_argument("--json", action="store_true", help="print JSON (a loadable cluster file when NAME is given)")
    p.set_defaults(func=run_clusters)

    p = sub.add_parser("place", help="place a graph with a heuristic baseline", description="Place GRAPH on a cluster with a heuristic baseline and write the placement file.")
    p.add_argument("graph", metavar="GRAPH", help="graph file, zoo name or module:callable")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--method", default="single", help="baseline name (see `placer compare --help`), or learned "
                   "(a pretrained gnn policy, zero-shot); default single")
    p.add_argument("--policy-file", default=None, metavar="FILE", help="--method learned: policy .pt (default: the one shipped with placer)")
    p.add_argument("--samples", type=int, default=None, help="--method learned: placements sampled per group count "
                   "besides the greedy ones; the best simulated is kept (default 48)")
    p.add_argument("--groups", default=None, metavar="N[,N...]", help="--method learned: the policy decodes the ops "
                   "(greedy) and the graph coarsened to each of these group counts, or grouped by module at each "
                   "depth (the word modules); none: the ops only, sampled too (default 128,256,512,modules)")
    p.add_argument("--refine", type=int, default=None, metavar="N", help="--method learned: then simulate up to N "
                   "more placements improving the best decodes, one group moved to another GPU at a time (steepest "
                   "descent, as the module_search baseline does from random draws); stops after 2 s; 0: keep the "
                   "best decode (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed for randomised methods (default 0)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a method option, e.g. device=gpu:1 (repeatable)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="placement file to write (.json)")
    add_profile_argument(p)
    p.set_defaults(func=run_place)

    p = sub.add_parser("simulate", help="simulate one training step of a placed graph", description="Simulate one training step of GRAPH placed by PLACEMENT: step time, lower bound, per-device busy time and peak memory, status.")
    p.add_argument("graph", metavar="GRAPH", help="graph file, zoo name or module:callable")
    p.add_argument("placement", metavar="PLACEMENT", help="placement file (from `placer place` or `placer train`)")
    p.add_argument("--cluster", required=True, help=CLUSTER_ARG_HELP)
    p.add_argument("--trace", metavar="FILE", help="write the schedule as Chrome/Perfetto trace JSON")
    p.add_argument("--executor", metavar="{" + ",".join(EXECUTORS) + "}", default="eager", help=EXECUTOR_ARG_HELP)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_profile_argument(p)
    p.set_defaults(func=run_simulate)

    p = sub.add_parser(
        "export-map", help="project a placement onto module names: a device_map for from_pretrained/accelerate",
        description="Project PLACEMENT onto module names and write the device_map that from_pretrained(device_map=...) "
        "and accelerate.dispatch_model accept (module name -> GPU index or \"cpu\"); say how much simulated step time "
        "the projection gives up (placer.apply stays the full-speed path).",
    )
    p.add_argument("placement", metavar="PLACEMENT", help="placement file (from `placer place` or `placer train`)")
    p.add_argument("--graph", required=True, metavar="SOURCE", help="the placement's graph: graph file, zoo name or module:callable")
    p.add_argument("--cluster", default=None, help="the placement's cluster (default: the one it records). " + CLUSTER_ARG_HELP)
    p.add_argument("--module", default="", metavar="NAME", help="the submodule to map, keys relative to it (e.g. model, "
                   "for a callable wrapping a Hugging Face model as self.model); default the whole captured module")
    p.add_argument("-o", "--output", required=True, metavar="FILE.json", help="device map to write (.json)")
    p.add_argument("--executor", metavar="{" + ",".join(EXECUTORS) + "}", default="eager", help=EXECUTOR_ARG_HELP)
    p.add_argument("--json", action="store_true", help="print the map and the simulated cost as JSON")
    p.set_defaults(func=run_export_map)


# ------------------------------------------------------------------ helpers
def _gb(b: float) -> str:
    return f"{b / 1e9:.2f} GB"


def _rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if x >= scale:
            return f"{x / scale:g} {prefix}{unit}"
    return f"{x:g} {unit}"


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict, with ints, floats and true/false converted.

    >>> parse_options(["device=gpu:1", "k=3", "x=0.5", "flag=true"])
    {'device': 'gpu:1', 'k': 3, 'x': 0.5, 'flag': True}

    A number that is not finite (``nan``, ``inf``) is refused.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PlacerError(f"--option {item!r}: expected KEY=VALUE")
        if key == "seed":
            raise PlacerError("--option seed=...: use --seed")
        low = value.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
            continue
        for conv in (int, float):
            try:
                out[key] = conv(value)
                break
            except ValueError:
                continue
        else:
            out[key] = value
        if isinstance(out[key], float) and not math.isfinite(out[key]):
            raise PlacerError(f"--option {item!r}: {value} is not a finite number")
    return out


def _profiled(graph: Any, cluster: Any, profile: str | None) -> tuple[Any, Any]:
    """Graph with measured op times and cluster with measured links, when ``--profile`` is given."""
    if not profile:
        return graph, cluster
    from envs.real.profiler import with_profile

    return with_profile(graph, cluster, profile)


# ----------------------------------------------------------------- commands
def run_clusters(args: argparse.Namespace) -> int:
    from envs.cluster import Cluster
    from envs.cluster import resolve_cluster

    if args.name is None:
        clusters = [Cluster.preset(n) for n in Cluster.presets()]
        if args.json:
            print_json([c.to_dict() for c in clusters])
            return 0
        w = max(len(c.name) for c in clusters)
        print(f"{'name':<{w}} {'devices':<44} description")
        for c in clusters:
            print(f"{c.name:<{w}} {', '.join(c.device_names):<44} {c.description}")
        print("\nshow one: placer clusters NAME; save an editable file: placer clusters NAME --json > my.json")
        return 0
    c = resolve_cluster(args.name)
    if args.json:
        print_json(c.to_dict())
        return 0
    print(f"{c.name}: {c.description}")
    print(f"{'device':<8} {'kind':<5} {'memory':>10} {'compute':>14} {'mem bw':>12} {'launch':>8}")
    for d in c.devices:
        print(f"{d.name:<8} {d.kind:<5} {_gb(d.memory_bytes):>10} {_rate(d.flops_per_s, 'FLOP/s'):>14} "
              f"{_rate(d.mem_bw_bytes_per_s, 'B/s'):>12} {d.launch_overhead_s * 1e6:>6.1f}us")
    print("links (bandwidth, latency):")
    names = c.device_names
    for i, a in enumerate(names):
        row = []
        for j, b in enumerate(names):
            if i != j:
                lk = c.links[(a, b)]
                row.append(f"{b} {_rate(lk.bandwidth_bytes_per_s, 'B/s')} {lk.latency_s * 1e6:g}us")
        print(f"  {a} -> " + "; ".join(row))
    return 0


def run_place(args: argparse.Namespace) -> int:
    import envs
    from placer.methods import registry
    from placer.methods.registry import accepts
    from placer.sources import resolve_graph_and_model

    check_output_file(args.output, "-o")
    check_seed(args.seed)
    cluster = envs.resolve_cluster(args.cluster)
    options = parse_options(args.option)
    graph, model = resolve_graph_and_model(args.graph)
    graph, cluster = _profiled(graph, cluster, args.profile)
    if model is not None and accepts(registry.get(args.method), "model"):
        options["model"] = model  # accelerate's device maps need the module
    for flag, value in (("--policy-file", args.policy_file), ("--samples", args.samples), ("--groups", args.groups),
                        ("--refine", args.refine)):
        if args.method != "learned" and value is not None:
            raise PlacerError(f"{flag}: only with --method learned")
    try:
        if args.method == "learned":
            from placer.checks import check_int, parse_group_counts
            from placer.pretrain import ZERO_SHOT_GROUPS, ZERO_SHOT_REFINE, ZERO_SHOT_SAMPLES, place_learned

            samples = ZERO_SHOT_SAMPLES if args.samples is None else args.samples
            check_int(samples, "--samples", least=0, most=4096)
            refine = ZERO_SHOT_REFINE if args.refine is None else args.refine
            check_int(refine, "--refine", least=0, most=10**6)
            groups = ZERO_SHOT_GROUPS if args.groups is None else parse_group_counts(args.groups, modules=True)
            if options:
                raise PlacerError("--option: --method learned takes none (use --policy-file, --samples, --groups, --refine)")
            placement = place_learned(graph, cluster, policy_file=args.policy_file, samples=samples, groups=groups,
                                      seed=args.seed, refine=refine)
        else:
            placement = registry.place(args.method, graph, cluster, seed=args.seed, **options)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise PlacerError(f"--method {args.method}: {str(e).split(') ', 1)[-1]}") from None
        raise
    placement.save(args.output)
    counts = ", ".join(f"{d}: {k}" for d, k in sorted(placement.device_counts().items()))
    print(f"{args.output}: {args.method} placement of {graph.name or args.graph} ({graph.num_ops} ops) on {cluster.name} ({counts}); "
          f"issue order: {placement.meta['issue_order']} ({placement.meta['step_time_s'] * 1e3:.3f} ms simulated, eager)")
    if args.method == "learned":
        m = placement.meta
        refined = (f"; {m['refine_simulated']} placements simulated refining the decodes (stopped: {m['refine_stopped']})"
                   if m["refine"] else "")
        print(f"  best of {m['decodes']} decodes of the policy{refined}: {m['found_by']}, in {m['place_time_s']:.1f} s")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    import envs
    from graphs.io import write_text_atomic
    from graphs.plan import Placement
    from placer.sources import resolve_graph

    if args.trace:
        check_output_file(args.trace, "--trace")
    cluster = envs.resolve_cluster(args.cluster)
    graph, cluster = _profiled(resolve_graph(args.graph), cluster, args.profile)
    placement = Placement.load(args.placement)
    env = envs.SimEnv(graph, cluster, executor=args.executor, microbatches=placement.microbatches, inflight=placement.inflight)
    result = env.simulate(placement.indices(graph, cluster.device_names, source=args.placement), trace=bool(args.trace),
                          order=getattr(placement, "order", None))
    bound = env.lower_bound()
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
    sim_s = result.extra["sim_step_time_s"]
    plan = "" if env.microbatches == 1 else (
        f", {env.microbatches} microbatches ({'fill-drain' if env.inflight == env.microbatches else f'at most {env.inflight} in flight'})")
    print(f"{graph.name or args.graph} ({graph.num_ops} ops) on {cluster.name}, placement {args.placement}, {args.executor} executor{plan}")
    if result.ok:
        named = f": {bound.name}" if getattr(bound, "name", "") else ""
        print(f"step time   {result.step_time_s * 1e3:.3f} ms  (lower bound {bound * 1e3:.3f} ms{named}, {result.step_time_s / bound:.2f}x)" if bound > 0 else f"step time   {result.step_time_s * 1e3:.3f} ms")
    else:
        print(f"step time   -  ({sim_s * 1e3:.3f} ms ignoring memory; lower bound {bound * 1e3:.3f} ms)")
    print(f"status      {result.status}{': ' + result.message if result.message else ''}")
    print(f"{'device':<8} {'ops':>6} {'busy ms':>10} {'peak memory':>12} {'capacity':>10}")
    counts = placement.device_counts()
    for d, name in enumerate(cluster.device_names):
        print(f"{name:<8} {counts.get(name, 0):>6} {result.busy_s[name] * 1e3:>10.3f} {_gb(result.peak_bytes[name]):>12} {_gb(cluster.memory_bytes[d]):>10}")
    links = [(k, v) for k, v in result.busy_s.items() if "->" in k]
    if links:
        print("links busy: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(links)))
    if args.trace:
        print(f"trace: {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def run_export_map(args: argparse.Namespace) -> int:
    import envs
    from graphs.io import write_text_atomic
    from placer.device_map import project, projection_cost
    from graphs.plan import Placement
    from placer.sources import resolve_graph

    out = check_output_file(args.output, "-o")
    if not out.endswith(".json"):
        raise PlacerError(f"-o {out}: a device map is written as .json")
    placement = Placement.load(args.placement)
    if args.cluster is None:
        if not placement.cluster:
            raise PlacerError(f"{args.placement}: records no cluster; pass --cluster")
        try:
            cluster = envs.resolve_cluster(placement.cluster)
        except PlacerError:
            raise PlacerError(f"{args.placement}: its cluster {placement.cluster!r} is not a preset; pass --cluster") from None
    else:
        cluster = envs.resolve_cluster(args.cluster)
    graph = resolve_graph(args.graph)
    idx = placement.indices(graph, cluster.device_names, source=args.placement)
    device_map = project(graph, idx, cluster, module=args.module)
    cost = projection_cost(graph, placement, cluster, device_map, module=args.module, executor=args.executor)
    write_text_atomic(out, to_json(device_map) + "\n")
    if args.json:
        print_json({"output": out, "device_map": device_map, **cost})
        return 0
    t0, t1 = cost["placement_step_time_s"], cost["projected_step_time_s"]
    print(f"wrote {out}: {len(device_map)} module keys for {args.module or 'the whole model'} "
          f"({cost['ops_moved']} of {cost['ops']} ops move when run by module)")
    placed = f"{t0 * 1e3:.3f} ms" if t0 is not None else cost["placement_status"]
    if t1 is None:
        print(f"simulated step: placement {placed}; device map {cost['projected_status']}: {cost['projected_message']}")
    elif t0 is not None:
        print(f"simulated step: placement {placed}, device map {t1 * 1e3:.3f} ms "
              f"(gives up {(t1 - t0) * 1e3:+.3f} ms, {100 * (t1 - t0) / t0:+.1f}%); placer.apply runs the placement itself")
    else:
        print(f"simulated step: placement {placed}, device map {t1 * 1e3:.3f} ms")
    return 0
