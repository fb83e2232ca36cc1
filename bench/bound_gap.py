"""How far the best placements we know are from the lower bound: every bound, which wins, and best / bound.

    python -m bench.bound_gap                                   # the zoo's five graphs on k80x4 and v100x4
    python -m bench.bound_gap --graphs nmt-4 --clusters k80x4 --best docs/budget/planned200k_nmt4.json
    python -m bench.bound_gap --best docs/budget/*.json --json
    python -m bench.bound_gap --blocks-s 0                      # without the block bound (fast)

For each graph and cluster it computes :func:`envs.SimEnv.lower_bound` (eager executor, one microbatch)
with the block bound (:mod:`envs.sim.blocks`, its programs given ``--blocks-s`` seconds per cell) and prints
each of its parts (critical path, work, communicating path, the host-issue bounds, energetic reasoning,
blocks), the winner, the bound before this release (the best part but blocks) and the seconds it took. With ``--best``,
files written by ``python -m bench.budget --json`` (read as JSON data), it takes the fastest plan any run in them found
for that graph and cluster (``plan_step_time_s``, in its best issue order) and prints best / bound against both bounds.
Simulated step times: they hold inside our simulator only.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread unless told otherwise: read as numpy and torch load

import json
import sys
import time
from pathlib import Path

import envs
from bench.common import OneLineParser
from bench.graph_sources import graphs_and_clusters
from graphs import PlacerError
from graphs.schema import check_float

#: The parts this release adds; "before" is the best of the others.
NEW_PARTS = ("blocks",)


class BadFile(Exception):
    """A ``--best`` file that is not a ``python -m bench.budget --json`` output."""


def read_best(paths: list[str]) -> dict[tuple[str, str], dict]:
    """``(graph, cluster) -> {"step_time_s", "method", "file"}``: the fastest plan in the files' runs."""
    best: dict[tuple[str, str], dict] = {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
            cells = doc["cells"]
            for c in cells:
                key = (str(c["graph"]), str(c["cluster"]))
                for r in c["runs"]:
                    step_time_s = r.get("plan_step_time_s")
                    if step_time_s is not None and (key not in best or float(step_time_s) < best[key]["step_time_s"]):
                        best[key] = {"step_time_s": float(step_time_s), "method": str(r["method"]), "file": path}
        except OSError as e:
            raise BadFile(f"{path}: cannot read it ({e.strerror or e})") from None
        except (ValueError, KeyError, TypeError) as e:
            raise BadFile(f"{path}: not a bench.budget --json output ({type(e).__name__}: {e})") from None
    return best


def cell(graph, cluster, best: dict | None, blocks_s: float = 60.0) -> dict:
    """Every bound of one graph and cluster, and best / bound where a best plan is known."""
    env = envs.SimEnv(graph, cluster)
    t0 = time.perf_counter()
    lb = env.lower_bound(blocks_s=blocks_s)
    seconds = time.perf_counter() - t0
    others = {k: v for k, v in lb.parts.items() if k not in NEW_PARTS}
    before = max(others.values())
    out = {
        "graph": graph.name,
        "cluster": cluster.name,
        "num_ops": graph.num_ops,
        "bound_s": float(lb),
        "bound_name": lb.name,
        "parts_s": dict(lb.parts),
        "before_s": before,
        "before_name": max(others, key=lambda k: others[k]),
        "seconds": seconds,
        "best": best,
    }
    if best is not None:
        out["best_over_bound"] = best["step_time_s"] / float(lb)
        out["best_over_bound_before"] = best["step_time_s"] / before
    return out


def table(cells: list[dict]) -> str:
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    out = [
        "| graph | cluster | ops | critical path | communicating path | work | host issue + backward path | "
        "host issue + path | energetic | blocks | bound (winner) | before | seconds | best known | best / "
        "bound (before) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for c in cells:
        p = c["parts_s"]
        part = lambda k: ms(p[k]) if k in p else "—"  # noqa: E731
        b = c["best"]
        known = f"{ms(b['step_time_s'])} ({b['method']})" if b else "—"
        ratio = f"{c['best_over_bound']:.3f} ({c['best_over_bound_before']:.3f})" if b else "—"
        out.append(
            f"| {c['graph']} | {c['cluster']} | {c['num_ops']:,} | {part('critical path')} | "
            f"{part('communicating path')} | {part('work')} | {part('host issue + backward path')} | "
            f"{part('host issue + path')} | {part('energetic')} | {part('blocks')} | {ms(c['bound_s'])} "
            f"({c['bound_name']}) | "
            f"{ms(c['before_s'])} | "
            f"{c['seconds']:.2f} | {known} | {ratio} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.bound_gap", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--graphs",
        default="nmt-2,nmt-4,inception-v3,gpt2,resnet50",
        help="comma list of zoo names, graph files, module:callable or synthetic families (moe-400)",
    )
    ap.add_argument("--clusters", default="k80x4,v100x4", help="comma list of presets or files (default k80x4,v100x4)")
    ap.add_argument(
        "--best",
        nargs="*",
        default=[],
        metavar="FILE",
        help="python -m bench.budget --json outputs: the fastest plan in them is each cell's best known",
    )
    ap.add_argument(
        "--blocks-s",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="seconds per cell for the block bound's programs (default 60; 0: no block bound)",
    )
    ap.add_argument("--json", action="store_true", help="print every cell as JSON instead of the table")
    args = ap.parse_args(argv)
    try:
        check_float(args.blocks_s, "--blocks-s", least=0)
        best = read_best(args.best)
        graphs, clusters = graphs_and_clusters(args.graphs, args.clusters)
    except (PlacerError, BadFile) as e:
        print(f"bound_gap: {e}", file=sys.stderr)
        return 2
    cells = []
    for cluster in clusters:
        for graph in graphs:
            print(f"{graph.name} on {cluster.name}...", file=sys.stderr, flush=True)
            cells.append(cell(graph, cluster, best.get((graph.name, cluster.name)), args.blocks_s))
    print(json.dumps(cells, indent=1) if args.json else table(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
