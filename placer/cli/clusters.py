"""``placer clusters``: the preset clusters, or one of them (with ``--json``: a loadable cluster file).

Typical use::

    placer clusters                                   # the presets
    placer clusters k80x4 --json > my.json            # a loadable file to edit
"""

from __future__ import annotations

import argparse

from envs.cluster import Cluster, resolve_cluster
from placer.cli.output import gb, print_json, rate


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "clusters",
        help="list the preset clusters, or show one",
        description="List the preset clusters, or show one (with --json: a loadable placer-cluster/1 file).",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="a preset name or cluster JSON file to show")
    p.add_argument("--json", action="store_true", help="print JSON (a loadable cluster file when NAME is given)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        clusters = [Cluster.preset(name) for name in Cluster.presets()]
        if args.json:
            print_json([cluster.to_dict() for cluster in clusters])
            return 0
        width = max(len(cluster.name) for cluster in clusters)
        print(f"{'name':<{width}} {'devices':<44} description")
        for cluster in clusters:
            print(f"{cluster.name:<{width}} {', '.join(cluster.device_names):<44} {cluster.description}")
        print("\nshow one: placer clusters NAME; save an editable file: placer clusters NAME --json > my.json")
        return 0
    cluster = resolve_cluster(args.name)
    if args.json:
        print_json(cluster.to_dict())
        return 0
    print(f"{cluster.name}: {cluster.description}")
    print(f"{'device':<8} {'kind':<5} {'memory':>10} {'compute':>14} {'mem bw':>12} {'launch':>8}")
    for spec in cluster.devices:
        print(
            f"{spec.name:<8} {spec.kind:<5} {gb(spec.memory_bytes):>10} {rate(spec.flops_per_s, 'FLOP/s'):>14} "
            f"{rate(spec.mem_bw_bytes_per_s, 'B/s'):>12} {spec.launch_overhead_s * 1e6:>6.1f}us"
        )
    print("links (bandwidth, latency):")
    for src in cluster.device_names:
        links = [
            f"{dst} {rate(link.bandwidth_bytes_per_s, 'B/s')} {link.latency_s * 1e6:g}us"
            for dst, link in ((dst, cluster.links[(src, dst)]) for dst in cluster.device_names if dst != src)
        ]
        print(f"  {src} -> " + "; ".join(links))
    return 0
