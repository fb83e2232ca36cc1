"""A new user's own models: the module groupings and the search heuristics on them (issue 35, findings 3 and 4).

    python scripts/bench_first_hour.py [--models encoder_small,gpt2_wrapped,encoder_2048] [--clusters k80x4]
                                       [--seed 0] [--json]

Per model (bench/first_hour.py: a 2-layer nn.TransformerEncoder, a Hugging Face GPT-2 in the README's wrapper,
a d=2048 8-layer encoder on the meta device) and cluster: the module depths and their group counts, then each
search heuristic's status (ok, or out of memory), simulated step time (node order, eager) and largest peak.
Markdown rows, or with --json one JSON object per (model, cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/ beside scripts/
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    from bench.first_hour import MODELS, report
    from graphs import PlacerError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models", default=",".join(name for name, _ in MODELS), help="comma list of bench/first_hour.py models"
    )
    ap.add_argument("--clusters", default="k80x4", help="comma list of cluster presets or files (default k80x4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the randomised heuristics (default 0)")
    ap.add_argument("--json", action="store_true", help="one JSON object per (model, cluster)")
    args = ap.parse_args(argv)
    known = dict(MODELS)
    try:
        for name in args.models.split(","):
            if name not in known:
                raise PlacerError(f"--models: {name!r} is not one of {', '.join(known)}")
            for cluster in args.clusters.split(","):
                row = report(name, cluster, seed=args.seed)
                print(json.dumps(row) if args.json else _markdown(row), flush=True)
    except PlacerError as e:
        print(f"bench_first_hour: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"bench_first_hour: needs {e.name} (pip install {e.name})", file=sys.stderr)
        return 2
    return 0


def _markdown(row: dict) -> str:
    levels = ", ".join(f"depth {d}: {k}" for d, k in row["module_levels"]) or "none"
    lines = [
        f"**{row['model']}** ({row['ops']} ops) on {row['cluster']}; module levels: {levels}",
        "",
        "| method | status | step time (ms) | largest peak (GB) |",
        "|---|---|---:|---:|",
    ]
    for method, r in row["methods"].items():
        step = f"{r['step_time_s'] * 1e3:.3f}" if r["step_time_s"] is not None else "—"
        peak = f"{r['peak_bytes'] / 1e9:.2f}" if r["peak_bytes"] is not None else "—"
        lines.append(f"| {method} | {r['status']} | {step} | {peak} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
