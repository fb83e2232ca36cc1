"""``placer graphs``, ``placer export`` and ``placer inspect``: the graph commands.

``inspect`` summarises a graph: sizes, parameters, FLOPs, activation bytes, an
op-type histogram, and for one cluster (``--cluster``, default the first preset)
the simulator's own figures: op times from :func:`envs.cost.op_times` (each op
at its fastest device), the forward-then-backward critical path of
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
import os
import sys
from collections import Counter
from typing import Any

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.dag import critical_path
from placer.checks import check_int, check_output_file
from placer.cli import print_json


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graphs", help="list the model zoo with op counts", description=_cmd_graphs.__doc__)
    p.add_argument("--decompose", action="store_true", help="count ops after decomposition to core ATen")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.set_defaults(func=_cmd_graphs)

    p = sub.add_parser("export", help="capture a model's graph to a JSON file", description=_cmd_export.__doc__)
    p.add_argument("source", metavar="SOURCE", help="zoo name, module:callable returning (model, inputs), or .pt2 file")
    p.add_argument("-o", "--output", required=True, metavar="FILE.json", help="where to write (.json or .json.gz)")
    p.add_argument("--decompose", action="store_true", help="decompose to core ATen (unrolls nn.LSTM over time)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("inspect", help="summarise a graph", description=_cmd_inspect.__doc__)
    p.add_argument("graph", metavar="GRAPH", help="graph file (.json/.pt2), zoo name or module:callable")
    p.add_argument("--top", type=int, default=12, help="op types to list (default 12)")
    p.add_argument("--cluster", default=None, help=f"times on this cluster: {_cluster_help()} (default: the first preset)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_inspect)


def _cluster_help() -> str:
    from envs.cluster import CLUSTER_ARG_HELP

    return CLUSTER_ARG_HELP


# ------------------------------------------------------------------ commands
def _cmd_graphs(args: argparse.Namespace) -> int:
    """List the zoo's models with op counts, parameters and forward FLOPs.

    The first run captures every model (about a minute each for the LSTM
    models); later runs read the cache.
    """
    from graphs import zoo

    rows = zoo.info(decompose=args.decompose, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print_json(rows, indent=2)
        return 0
    table = [["name", "ops", "edges", "params", "fwd FLOPs", "description"]]
    for r in rows:
        table.append([r["name"], f"{r['ops']:,}", f"{r['edges']:,}", _count(r["params"]), _flops(r["flops"]), r["description"]])
    print(_table(table, right={1, 2, 3, 4}))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """Capture SOURCE with torch.export and write its graph as placer-graph/1 JSON."""
    import graphs
    from placer.sources import resolve_graph

    out = check_output_file(args.output, "-o")
    if not out.endswith((".json", ".json.gz")):
        raise PlacerError(f"{out}: output must end in .json or .json.gz")
    source = args.source
    if source.endswith(".pt2") and os.path.exists(source):
        from graphs.torch_capture import capture_pt2

        graph = capture_pt2(source, decompose=args.decompose)
    elif os.path.exists(source) and args.decompose:
        raise PlacerError(f"{source}: --decompose needs a model (zoo name, module:callable or .pt2), not a graph file")
    else:
        graph = resolve_graph(source, decompose=args.decompose)
    try:
        graphs.save(graph, out)
    except OSError as e:
        raise PlacerError(f"{out}: cannot write ({e.strerror or e})") from None
    info = {
        "path": out,
        "name": graph.name,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "param_bytes": graph.total_param_bytes,
        "flops": graph.total_flops,
        "hash": graph.content_hash,
    }
    if args.json:
        print_json(info, indent=2)
    else:
        print(
            f"wrote {out}: {graph.name}, {graph.num_ops:,} ops, {graph.num_edges:,} edges, "
            f"{_bytes(graph.total_param_bytes)} params, {_flops(graph.total_flops)} forward, hash {graph.content_hash}"
        )
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Summarise a graph: sizes, parameters, FLOPs, activations, op types, and the simulator's op
    times, critical path and lower bound on one cluster."""
    import envs
    from envs.cluster import PRESETS
    from placer.sources import resolve_graph

    check_int(args.top, "--top", least=0)
    cluster = envs.resolve_cluster(args.cluster if args.cluster is not None else next(iter(PRESETS)))
    summary = summarize(resolve_graph(args.graph), cluster, top=args.top)
    if args.json:
        print_json(summary, indent=2)
    else:
        print(format_summary(summary))
    return 0


# ------------------------------------------------------------------ analysis
def summarize(graph: OpGraph, cluster: Any, *, top: int = 12) -> dict[str, Any]:
    """The numbers ``placer inspect`` prints, as a JSON-able dict; times are the simulator's on ``cluster``.

    Each op's time is its forward plus backward on its fastest device
    (:func:`envs.cost.op_times`), the critical path is :func:`graphs.dag.critical_path`
    over those times and ``lower_bound_s`` is :func:`envs.lower_bound`.
    """
    from envs import cost
    from envs.sim import bound
    from graphs.ops import view_mask

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
    for t, f, ts in zip(graph.op_types, graph.flops.tolist(), op_time_s.tolist()):
        type_flops[t] += f
        type_time[t] += ts
    total_flops = graph.total_flops
    return {
        "name": graph.name,
        "hash": graph.content_hash,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "param_bytes": graph.total_param_bytes,
        "buffer_bytes": int(graph.buffer_bytes.sum()),
        "flops": total_flops,
        "activation_bytes": int(graph.out_bytes[~views].sum()),
        "view_ops": int(views.sum()),
        "edge_bytes": int(graph.edge_bytes.sum()),
        "input_bytes": int(sum(x.get("bytes", 0) for x in graph.meta.get("inputs", []))),
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
            {"type": t, "count": c, "flops": type_flops[t], "flops_share": type_flops[t] / total_flops if total_flops else 0.0,
             "time_s": type_time[t]}
            for t, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        ],
        "op_type_count": len(counts),
    }


def _largest(graph: OpGraph) -> dict[str, Any] | None:
    if graph.num_ops == 0:
        return None
    i = int(np.argmax(graph.flops))
    return {"name": graph.names[i], "type": graph.op_types[i], "flops": float(graph.flops[i]), "module": graph.module_paths[i]}


def format_summary(s: dict[str, Any]) -> str:
    cp = s["critical_path"]
    lines = [
        f"graph        {s['name'] or '(unnamed)'}  hash {s['hash']}",
        f"ops          {s['ops']:,} ({s['view_ops']:,} views), {s['edges']:,} edges, {s['op_type_count']} op types",
        f"parameters   {_bytes(s['param_bytes'])} (+ {_bytes(s['buffer_bytes'])} buffers)",
        f"forward      {_flops(s['flops'])}",
        f"activations  {_bytes(s['activation_bytes'])} op outputs (views excluded), {_bytes(s['edge_bytes'])} on edges,"
        f" {_bytes(s['input_bytes'])} inputs",
    ]
    if s["largest_op"]:
        lo = s["largest_op"]
        lines.append(f"largest op   {lo['name']} ({lo['type']}, {_flops(lo['flops'])}, module {lo['module'] or '-'})")
    lines.append(
        f"critical path {cp['length']:,} ops, {_flops(cp['flops'])}, {cp['est_time_s'] * 1e3:.2f} ms forward + backward of"
        f" {s['est_total_time_s'] * 1e3:.2f} ms total op time on {s['cluster']['name']}, each op on its fastest device"
        f" (parallelism {s['parallelism']:.2f}; simulated step >= {s['lower_bound_s'] * 1e3:.2f} ms)"
    )
    if cp["ops"]:
        ends = cp["ops"] if len(cp["ops"]) <= 4 else [cp["ops"][0], cp["ops"][1], "...", cp["ops"][-1]]
        lines.append(f"              {' -> '.join(ends)}")
    if s["op_types"]:
        lines.append("")
        table = [["op type", "count", "FLOPs", "share", "time"]]
        for r in s["op_types"]:
            table.append([r["type"], f"{r['count']:,}", _flops(r["flops"]), f"{100 * r['flops_share']:.1f}%", f"{r['time_s'] * 1e3:.3f} ms"])
        lines.append(_table(table, right={1, 2, 3, 4}))
    return "\n".join(lines)


# ------------------------------------------------------------------ formatting
def _table(rows: list[list[str]], right: set[int] = frozenset()) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        cells = [v.rjust(w) if c in right else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _scaled(x: float, units: tuple[str, ...], base: float) -> str:
    for unit in units[:-1]:
        if abs(x) < base:
            return f"{x:.3g} {unit}" if unit else f"{x:.3g}"
        x /= base
    return f"{x:.3g} {units[-1]}"


def _flops(x: float) -> str:
    return _scaled(x, ("FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"), 1000.0)


def _bytes(x: float) -> str:
    return _scaled(x, ("B", "KiB", "MiB", "GiB", "TiB"), 1024.0)


def _count(x: float) -> str:
    return _scaled(x, ("", "K", "M", "G"), 1000.0)
