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
        print(
            f"{d.name:<8} {d.kind:<5} {gb(d.memory_bytes):>10} {rate(d.flops_per_s, 'FLOP/s'):>14} "
            f"{rate(d.mem_bw_bytes_per_s, 'B/s'):>12} {d.launch_overhead_s * 1e6:>6.1f}us"
        )
    print("links (bandwidth, latency):")
    names = c.device_names
    for i, a in enumerate(names):
        row = []
        for j, b in enumerate(names):
            if i != j:
                lk = c.links[(a, b)]
                row.append(f"{b} {rate(lk.bandwidth_bytes_per_s, 'B/s')} {lk.latency_s * 1e6:g}us")
        print(f"  {a} -> " + "; ".join(row))
    return 0
