"""``placer export``: capture a model's training step as a graph file."""

from __future__ import annotations

import argparse
import os
from typing import Any

import graphs
from graphs import OpGraph, PlacerError, sources, zoo
from placer.cli.args import note_stand_in_loss
from placer.cli.output import flops, nbytes, print_json
from placer.option_checks import check_output_file


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="capture a model's graph to a JSON file", description=run.__doc__)
    p.add_argument("source", metavar="SOURCE", help="zoo name, module:callable returning (model, inputs), or .pt2 file")
    p.add_argument("-o", "--output", required=True, metavar="FILE.json", help="where to write (.json or .json.gz)")
    p.add_argument("--decompose", action="store_true", help="decompose to core ATen (unrolls nn.LSTM over time)")
    p.add_argument(
        "--unroll-rnn",
        action="store_true",
        help="write every nn.LSTM and nn.GRU as one op per layer and time step, so a placement can split it "
        "(recorded in the graph: placer.apply exports the same way)",
    )
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="also export with dynamic dimensions and record which input dimensions the placed model takes at "
        "other sizes (meta inputs[].dynamic)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Capture SOURCE with torch.export and write its graph as placer-graph/1 JSON."""
    out = check_output_file(args.output, "-o")
    if not out.endswith((".json", ".json.gz")):
        raise PlacerError(f"{out}: output must end in .json or .json.gz")
    graph = _captured(args.source, args)
    note_stand_in_loss(graph, args.source)
    try:
        graphs.save(graph, out)
    except OSError as e:
        raise PlacerError(f"{out}: cannot write ({e.strerror or e})") from None
    dynamic = {x["name"]: sorted(int(d) for d in x["dynamic"]) for x in graph.meta.get("inputs", []) if "dynamic" in x}
    info: dict[str, Any] = {
        "path": out,
        "name": graph.name,
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "param_bytes": graph.total_param_bytes,
        "flops": graph.total_flops,
        "hash": graph.content_hash,
    }
    if args.dynamic:
        info["dynamic_dims"] = dynamic
    if args.json:
        print_json(info, indent=2)
        return 0
    print(
        f"wrote {out}: {graph.name}, {graph.num_ops:,} ops, {graph.num_edges:,} edges, "
        f"{nbytes(graph.total_param_bytes)} params, {flops(graph.total_flops)} forward, hash {graph.content_hash}"
    )
    if args.dynamic:
        dims = "; ".join(f"{name} {', '.join(map(str, d)) or 'none'}" for name, d in dynamic.items())
        print(f"dynamic dimensions: {dims or graph.meta.get('dynamic_error', 'none')}")
    return 0


def _captured(source: str, args: argparse.Namespace) -> OpGraph:
    """The graph of SOURCE, captured with the options asked for."""
    if source.endswith(".pt2") and os.path.exists(source):
        if args.unroll_rnn:
            raise PlacerError(f"{source}: --unroll-rnn needs a model (zoo name or module:callable), not a program")
        from graphs.torch_capture import capture_pt2  # torch: loaded only to capture

        return capture_pt2(source, decompose=args.decompose)  # a program with dynamic dimensions records them
    if os.path.exists(source) and (args.decompose or args.unroll_rnn or args.dynamic):
        option = "--decompose" if args.decompose else "--unroll-rnn" if args.unroll_rnn else "--dynamic"
        raise PlacerError(f"{source}: {option} needs a model (zoo name, module:callable or .pt2), not a graph file")
    if not (args.unroll_rnn or args.dynamic):
        return sources.resolve_graph(source, decompose=args.decompose)
    options = dict(decompose=args.decompose, unroll_rnn=args.unroll_rnn, dynamic=args.dynamic)
    if source in zoo.names():
        return graphs.capture(*zoo.build(source, device="meta"), name=source, **options)
    model, inputs = sources.resolve_model(source)
    graph = graphs.capture(model, inputs, **options)
    graph.meta["source"] = source
    return graph
