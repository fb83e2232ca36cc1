"""``placer export``: capture a model's training step as a graph file."""

from __future__ import annotations

import argparse
import os

import graphs
from graphs import PlacerError
from placer import sources
from placer.checks import check_output_file
from placer.cli.args import note_stand_in_loss
from placer.cli.output import flops, nbytes, print_json


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="capture a model's graph to a JSON file", description=run.__doc__)
    p.add_argument("source", metavar="SOURCE", help="zoo name, module:callable returning (model, inputs), or .pt2 file")
    p.add_argument("-o", "--output", required=True, metavar="FILE.json", help="where to write (.json or .json.gz)")
    p.add_argument("--decompose", action="store_true", help="decompose to core ATen (unrolls nn.LSTM over time)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Capture SOURCE with torch.export and write its graph as placer-graph/1 JSON."""
    out = check_output_file(args.output, "-o")
    if not out.endswith((".json", ".json.gz")):
        raise PlacerError(f"{out}: output must end in .json or .json.gz")
    source = args.source
    if source.endswith(".pt2") and os.path.exists(source):
        from graphs.torch_capture import capture_pt2  # torch: loaded only to capture

        graph = capture_pt2(source, decompose=args.decompose)
    elif os.path.exists(source) and args.decompose:
        raise PlacerError(f"{source}: --decompose needs a model (zoo name, module:callable or .pt2), not a graph file")
    else:
        graph = sources.resolve_graph(source, decompose=args.decompose)
    note_stand_in_loss(graph, source)
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
            f"{nbytes(graph.total_param_bytes)} params, {flops(graph.total_flops)} forward, hash {graph.content_hash}"
        )
    return 0
