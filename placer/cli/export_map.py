"""``placer export-map``: a placement projected onto module names, a ``device_map`` for ``from_pretrained``.

Typical use::

    placer export-map p.json --graph mypkg.models:build --module model -o device_map.json
"""

from __future__ import annotations

import argparse

import envs
from envs.cluster import CLUSTER_ARG_HELP
from graphs import sources
from graphs.errors import PlacerError
from graphs.io import write_text_atomic
from graphs.plan import Placement
from placer.cli.args import add_executor_argument
from placer.cli.output import print_json, to_json
from placer.device_map import project, projection_cost, wrapped_module
from placer.option_checks import check_output_file


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-map",
        help="project a placement onto module names: a device_map for from_pretrained/accelerate",
        description="Project PLACEMENT onto module names and write the device_map that from_pretrained(device_map=...) "
        'and accelerate.dispatch_model accept (module name -> GPU index or "cpu"); say how much simulated step time '
        "the projection gives up (placer.apply stays the full-speed path).",
    )
    p.add_argument("placement", metavar="PLACEMENT", help="placement file (from `placer place` or `placer train`)")
    p.add_argument(
        "--graph",
        required=True,
        metavar="SOURCE",
        help="the placement's graph: graph file, zoo name or module:callable",
    )
    p.add_argument(
        "--cluster", default=None, help="the placement's cluster (default: the one it records). " + CLUSTER_ARG_HELP
    )
    p.add_argument(
        "--module",
        default=None,
        metavar="NAME",
        help="the submodule to map, keys relative to it (e.g. model, for a callable wrapping a Hugging Face model "
        "as self.model); default: the one submodule holding every parameter, if there is one (said in a line), "
        "else the whole captured module ('' asks for the whole module)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE.json", help="device map to write (.json)")
    p.add_argument(
        "--torchtitan",
        action="store_true",
        help="write the plan's pipeline stages as torchtitan's module_fqns_per_model_part instead",
    )
    add_executor_argument(p)
    p.add_argument("--json", action="store_true", help="print the map and the simulated cost as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = check_output_file(args.output, "-o")
    if not out.endswith(".json"):
        raise PlacerError(f"-o {out}: a device map is written as .json")
    placement = Placement.load(args.placement)
    if args.torchtitan:  # the stages of a plan across processes (placer.distributed)
        from placer.cli.torchtitan_split import write_split

        module = "" if args.module is None else args.module  # torchtitan names FQNs from the model's root
        return write_split(sources.resolve_graph(args.graph), placement, module, out, args.json)
    if args.cluster is None:
        if not placement.cluster:
            raise PlacerError(f"{args.placement}: records no cluster; pass --cluster")
        try:
            cluster = envs.resolve_cluster(placement.cluster)
        except PlacerError:
            raise PlacerError(
                f"{args.placement}: its cluster {placement.cluster!r} is not a preset; pass --cluster"
            ) from None
    else:
        cluster = envs.resolve_cluster(args.cluster)
    graph = sources.resolve_graph(args.graph)
    op_devices = placement.indices(graph, cluster.device_names, source=args.placement)
    module = wrapped_module(graph) if args.module is None else args.module
    device_map = project(graph, op_devices, cluster, module=module)
    cost = projection_cost(graph, placement, cluster, device_map, module=module, executor=args.executor)
    write_text_atomic(out, to_json(device_map) + "\n")
    left_out = {"param_homes": len(placement.param_homes), "checkpoint": len(placement.checkpoint)}
    if args.json:
        print_json({"output": out, "module": module, "device_map": device_map, **cost, "left_out": left_out})
        return 0
    t0, t1 = cost["placement_step_time_s"], cost["projected_step_time_s"]
    print(
        f"wrote {out}: {len(device_map)} module keys for {module or 'the whole model'} "
        f"({cost['ops_moved']} of {cost['ops']} ops move when run by module)"
    )
    if args.module is None and module:
        print(
            f"keys relative to submodule {module!r}, which holds every parameter (as from_pretrained on it "
            "expects); --module '' keeps the whole captured module's names"
        )
    placed = f"{t0 * 1e3:.3f} ms" if t0 is not None else cost["placement_status"]
    if t1 is None:
        print(f"simulated step: placement {placed}; device map {cost['projected_status']}: {cost['projected_message']}")
    elif t0 is not None:
        print(
            f"simulated step: placement {placed}, device map {t1 * 1e3:.3f} ms "
            f"(gives up {(t1 - t0) * 1e3:+.3f} ms, {100 * (t1 - t0) / t0:+.1f}%); placer.apply runs the "
            "placement itself"
        )
    else:
        print(f"simulated step: placement {placed}, device map {t1 * 1e3:.3f} ms")
    if any(left_out.values()):  # a device map says where modules run, nothing more
        print(
            f"not in the device map: the plan's {left_out['param_homes']} parameter homes and "
            f"{left_out['checkpoint']} checkpointed blocks (placer.apply runs them)"
        )
    return 0
