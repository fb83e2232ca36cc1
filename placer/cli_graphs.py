"""``placer graphs``, ``placer export`` and ``placer inspect``: the graph commands.

``inspect`` summarises a graph: sizes, parameters, FLOPs, activation bytes, the
critical path under a simple roofline time estimate, and an op-type histogram.

>>> from graphs.ir import OpGraph
>>> g = OpGraph.from_edges(["a", "b", "c"], [("a", "c", 4), ("b", "c", 4)], flops=[1e9, 3e9, 1e9])
>>> s = summarize(g)
>>> s["critical_path"]["ops"], s["critical_path"]["flops"]
(['b', 'c'], 4000000000.0)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any

import numpy as np

from graphs import OpGraph, PlacerError
from placer.checks import check_int, check_output_file
from placer.cli import print_json

# The nominal device of the critical-path time estimate (roughly one V100).
NOMINAL_FLOPS_PER_S = 14e12
NOMINAL_MEM_BW_BYTES_PER_S = 900e9
NOMINAL_LAUNCH_OVERHEAD_S = 5e-6


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
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_inspect)


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
    """Summarise a graph: sizes, parameters, FLOPs, activations, critical path, op types."""
    from placer.sources import resolve_graph

    check_int(args.top, "--top", least=0)
    summary = summarize(resolve_graph(args.graph), top=args.top)
    if args.json:
        print_json(summary, indent=2)
    else:
        print(format_summary(summary))
    return 0


# ------------------------------------------------------------------ analysis
def estimate_op_time_s(graph: OpGraph) -> np.ndarray:
    """Roofline forward time of each op on the nominal device (views cost nothing)."""
    alias = _alias_mask(graph)
    t = np.maximum(graph.flops / NOMINAL_FLOPS_PER_S, graph.out_bytes / NOMINAL_MEM_BW_BYTES_PER_S)
    t = t + NOMINAL_LAUNCH_OVERHEAD_S
    t[alias] = 0.0
    return t


def critical_path(graph: OpGraph, weight: np.ndarray) -> list[int]:
    """Op indices of the heaviest path by ``weight`` (ops are in topological order)."""
    n = graph.num_ops
    if n == 0:
        return []
    indptr, preds, _ = graph.in_csr
    indptr, preds, w = indptr.tolist(), preds.tolist(), np.asarray(weight, dtype=np.float64).tolist()
    dist = [0.0] * n
    best_pred = [-1] * n
    for i in range(n):  # plain lists: ~10x faster than numpy slices per op
        best, best_d = -1, 0.0
        for j in preds[indptr[i] : indptr[i + 1]]:
            if best < 0 or dist[j] > best_d:
                best, best_d = j, dist[j]
        dist[i] = best_d + w[i]
        best_pred[i] = best
    path = [max(range(n), key=dist.__getitem__)]
    while best_pred[path[-1]] >= 0:
        path.append(best_pred[path[-1]])
    return path[::-1]


def _alias_mask(graph: OpGraph) -> np.ndarray:
    alias = set(graph.meta.get("alias_ops", []))
    return np.array([nm in alias for nm in graph.names], dtype=bool)


def summarize(graph: OpGraph, *, top: int = 12) -> dict[str, Any]:
    """The numbers ``placer inspect`` prints, as a JSON-able dict."""
    alias = _alias_mask(graph)
    op_time_s = estimate_op_time_s(graph)
    path = critical_path(graph, op_time_s)
    path_flops = critical_path(graph, graph.flops)
    total_time_s = float(op_time_s.sum())
    path_time_s = float(op_time_s[path].sum()) if path else 0.0
    counts = Counter(graph.op_types)
    type_flops: Counter[str] = Counter()
    for t, f in zip(graph.op_types, graph.flops.tolist()):
        type_flops[t] += f
    total_flops = graph.total_flops
    return {
        "name": graph.name,
        "hash": graph.content_hash,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "param_bytes": graph.total_param_bytes,
        "buffer_bytes": int(graph.buffer_bytes.sum()),
        "flops": total_flops,
        "activation_bytes": int(graph.out_bytes[~alias].sum()),
        "view_ops": int(alias.sum()),
        "edge_bytes": int(graph.edge_bytes.sum()),
        "input_bytes": int(sum(x.get("bytes", 0) for x in graph.meta.get("inputs", []))),
        "largest_op": _largest(graph),
        "critical_path": {
            "ops": [graph.names[i] for i in path],
            "length": len(path),
            "flops": float(graph.flops[path].sum()) if path else 0.0,
            "est_time_s": path_time_s,
            "max_path_flops": float(graph.flops[path_flops].sum()) if path_flops else 0.0,
        },
        "est_total_time_s": total_time_s,
        "parallelism": total_time_s / path_time_s if path_time_s > 0 else 1.0,
        "nominal_device": {
            "flops_per_s": NOMINAL_FLOPS_PER_S,
            "mem_bw_bytes_per_s": NOMINAL_MEM_BW_BYTES_PER_S,
            "launch_overhead_s": NOMINAL_LAUNCH_OVERHEAD_S,
        },
        "op_types": [
            {"type": t, "count": c, "flops": type_flops[t], "flops_share": type_flops[t] / total_flops if total_flops else 0.0}
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
        f"critical path {cp['length']:,} ops, {_flops(cp['flops'])}, est. {cp['est_time_s'] * 1e3:.2f} ms of"
        f" {s['est_total_time_s'] * 1e3:.2f} ms total on a nominal {_flops(s['nominal_device']['flops_per_s'])}/s device"
        f" (parallelism {s['parallelism']:.2f})"
    )
    if cp["ops"]:
        ends = cp["ops"] if len(cp["ops"]) <= 4 else [cp["ops"][0], cp["ops"][1], "...", cp["ops"][-1]]
        lines.append(f"              {' -> '.join(ends)}")
    if s["op_types"]:
        lines.append("")
        table = [["op type", "count", "FLOPs", "share"]]
        for r in s["op_types"]:
            table.append([r["type"], f"{r['count']:,}", _flops(r["flops"]), f"{100 * r['flops_share']:.1f}%"])
        lines.append(_table(table, right={1, 2, 3}))
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
