"""``placer inspect``: a graph's sizes, parameters, FLOPs, activation bytes and op types, and the simulator's view of
it.

For one cluster (``--cluster``, default the first preset) it gives the simulator's
own figures: op times from :func:`envs.sim.cost.op_times` (each op at its fastest
device), the forward-then-backward critical path of
:func:`graphs.dag.critical_path` and :func:`envs.lower_bound`.

>>> from graphs.ir import OpGraph
>>> from envs import Cluster
>>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "c", 4), ("b", "c", 4)], flops=[1e9, 3e9, 1e9])
>>> s = summarize(g, Cluster.preset("k80x2"))
>>> s["cluster"]["name"], s["critical_path"]["ops"], s["critical_path"]["flops"]
('k80x2', ['b', 'c'], 4000000000.0)
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np

import envs
from envs.cluster import CLUSTER_ARG_HELP, PRESETS
from envs.sim import bound, cost
from graphs import OpGraph, sources
from graphs.dag import critical_path
from graphs.ops import frozen_names, view_mask
from placer.cli.output import flops, nbytes, print_json, table
from placer.option_checks import check_int


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarise a graph", description=run.__doc__)
    p.add_argument("graph", metavar="GRAPH", help="graph file (.json/.pt2), zoo name or module:callable")
    p.add_argument("--top", type=int, default=12, help="op types to list (default 12)")
    p.add_argument(
        "--cluster", default=None, help=f"times on this cluster: {CLUSTER_ARG_HELP} (default: the first preset)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Summarise a graph: sizes, parameters, FLOPs, activations, op types, and the simulator's op
    times, critical path and lower bound on one cluster."""
    check_int(args.top, "--top", least=0)
    cluster = envs.resolve_cluster(args.cluster if args.cluster is not None else next(iter(PRESETS)))
    summary = summarize(sources.resolve_graph(args.graph), cluster, top=args.top)
    if args.json:
        print_json(summary, indent=2)
    else:
        print(format_summary(summary))
    return 0


def summarize(graph: OpGraph, cluster: Any, *, top: int = 12) -> dict[str, Any]:
    """The numbers ``placer inspect`` prints, as a JSON-able dict; times are the simulator's on ``cluster``.

    Each op's time is its forward plus backward on its fastest device
    (:func:`envs.sim.cost.op_times`), the critical path is :func:`graphs.dag.critical_path`
    over those times and ``lower_bound_s`` is :func:`envs.lower_bound`.
    """
    views = view_mask(graph)
    fwd, bwd = cost.op_times(graph, cluster)
    fwd_min = fwd.min(axis=1) if graph.num_ops else np.zeros(0)
    bwd_min = bwd.min(axis=1) if graph.num_ops else np.zeros(0)
    op_time_s = fwd_min + bwd_min
    path_time_s, path = critical_path(graph, fwd_min, bwd_min)
    _, path_flops = critical_path(graph, graph.flops, np.zeros(graph.num_ops))
    total_time_s = float(op_time_s.sum())
    counts = Counter(graph.op_types)
    type_flops: Counter[str] = Counter()
    type_time: Counter[str] = Counter()
    for op_type, flops_of_op, time_s in zip(graph.op_types, graph.flops.tolist(), op_time_s.tolist()):
        type_flops[op_type] += flops_of_op
        type_time[op_type] += time_s
    total_flops = graph.total_flops
    return {
        "name": graph.name,
        "hash": graph.content_hash,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "param_bytes": graph.total_param_bytes,
        "buffer_bytes": int(graph.buffer_bytes.sum()),
        "frozen_params": len(frozen_names(graph)),
        "flops": total_flops,
        "activation_bytes": int(graph.out_bytes[~views].sum()),
        "view_ops": int(views.sum()),
        "edge_bytes": int(graph.edge_bytes.sum()),
        "input_bytes": int(sum(entry.get("bytes", 0) for entry in graph.meta.get("inputs", []))),
        "largest_op": _largest(graph),
        "cluster": {"name": cluster.name, "devices": cluster.device_names},
        "critical_path": {
            "ops": [graph.names[i] for i in path],
            "length": len(path),
            "flops": float(graph.flops[path].sum()) if path else 0.0,
            "est_time_s": float(path_time_s),
            "max_path_flops": float(graph.flops[path_flops].sum()) if path_flops else 0.0,
        },
        "est_total_time_s": total_time_s,
        "lower_bound_s": float(bound.lower_bound_from_times(graph, cluster, fwd, bwd)),
        "parallelism": total_time_s / path_time_s if path_time_s > 0 else 1.0,
        "op_types": [
            {
                "type": op_type,
                "count": count,
                "flops": type_flops[op_type],
                "flops_share": type_flops[op_type] / total_flops if total_flops else 0.0,
                "time_s": type_time[op_type],
            }
            for op_type, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        ],
        "op_type_count": len(counts),
    }


def _largest(graph: OpGraph) -> dict[str, Any] | None:
    if graph.num_ops == 0:
        return None
    i = int(np.argmax(graph.flops))
    return {
        "name": graph.names[i],
        "type": graph.op_types[i],
        "flops": float(graph.flops[i]),
        "module": graph.module_paths[i],
    }


def format_summary(s: dict[str, Any]) -> str:
    cp = s["critical_path"]
    lines = [
        f"graph        {s['name'] or '(unnamed)'}  hash {s['hash']}",
        f"ops          {s['ops']:,} ({s['view_ops']:,} views), {s['edges']:,} edges, {s['op_type_count']} op types",
        f"parameters   {nbytes(s['param_bytes'])} (+ {nbytes(s['buffer_bytes'])} buffers)"
        if not s.get("frozen_params")
        else f"parameters   {nbytes(s['param_bytes'])} trainable (+ {nbytes(s['buffer_bytes'])} buffers and "
        f"{s['frozen_params']:,} frozen parameters: no gradient, no optimizer state)",
        f"forward      {flops(s['flops'])}",
        f"activations  {nbytes(s['activation_bytes'])} op outputs (views excluded), {nbytes(s['edge_bytes'])} on edges,"
        f" {nbytes(s['input_bytes'])} inputs",
    ]
    if s["largest_op"]:
        lo = s["largest_op"]
        lines.append(f"largest op   {lo['name']} ({lo['type']}, {flops(lo['flops'])}, module {lo['module'] or '-'})")
    lines.append(
        f"critical path {cp['length']:,} ops, {flops(cp['flops'])}, {cp['est_time_s'] * 1e3:.2f} ms forward + "
        "backward of"
        f" {s['est_total_time_s'] * 1e3:.2f} ms total op time on {s['cluster']['name']}, each op on its fastest device"
        f" (parallelism {s['parallelism']:.2f}; simulated step >= {s['lower_bound_s'] * 1e3:.2f} ms)"
    )
    if cp["ops"]:
        ends = cp["ops"] if len(cp["ops"]) <= 4 else [cp["ops"][0], cp["ops"][1], "...", cp["ops"][-1]]
        lines.append(f"              {' -> '.join(ends)}")
    if s["op_types"]:
        lines.append("")
        cells = [["op type", "count", "FLOPs", "share", "time"]]
        for r in s["op_types"]:
            cells.append(
                [
                    r["type"],
                    f"{r['count']:,}",
                    flops(r["flops"]),
                    f"{100 * r['flops_share']:.1f}%",
                    f"{r['time_s'] * 1e3:.3f} ms",
                ]
            )
        lines.append(table(cells, right={1, 2, 3, 4}))
    return "\n".join(lines)
