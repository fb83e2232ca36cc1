"""Run the conformance corpus on one GPU and its host: every model, every plan, errors against float64 and step times.

The same corpus (:mod:`graphs.models.corpus`, 23 architectures built from configs) and
plans (:mod:`bench.conformance`) as ``tests/placer/test_conformance.py``, on real
devices: the host ``cpu:0`` runs on ``cpu`` and every logical GPU of the
``h100x8`` cluster on ``cuda:0`` (so a pipeline over 8 logical GPUs runs its
stages, copies and microbatches on one card), with TF32 off. For each model and
plan it reports the loss's and the worst gradient's relative error against a
float64 copy on the CPU, whether that is within float32's own error
(``bench.conformance.FACTOR`` times the unplaced float32 step's, or
``FLOOR``), and the median step time (forward, backward, SGD step, CUDA
synchronised) beside all on ``gpu:0``.

Run from the repository root, on the lent GPU machine (files come back from ``$OUT``)::

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_conformance --out $OUT/conformance.jsonl --table $OUT/conformance.md

Not yet timed on a GPU; 95 s on a 2-core CPU with every device mapped to ``cpu``.
Rows are appended to ``--out`` as each model finishes, so a run cut short keeps
them, and a run given the same ``--out`` skips the models already in it.
``--deadline`` stops before a model that would start after that many seconds.
On a machine without CUDA, ``--device-map '*=cpu'`` runs the same on the CPU (a
smoke test). Progress goes to stderr, the table to stdout (``--json``: the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench import conformance
from bench.common import OneLineParser, machine_line
from graphs import PlacerError
from graphs.models import corpus as conformance_corpus

DEFAULT_MAP = "cpu:0=cpu,*=cuda:0"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m bench.gpu_conformance",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", default="all", help="comma-separated corpus entries, or 'all' (default)")
    p.add_argument(
        "--plans",
        default=",".join(conformance.PLANS),
        help=f"comma-separated plans (default all: {','.join(conformance.PLANS)})",
    )
    p.add_argument("--device-map", default=DEFAULT_MAP, help=f"logical -> torch devices (default {DEFAULT_MAP})")
    p.add_argument(
        "--steps", type=int, default=10, help="timed steps per plan, median reported (default 10; 0: no timing)"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's own)")
    p.add_argument("--deadline", type=float, default=450.0, help="start no model after this many seconds (default 450)")
    p.add_argument(
        "--out",
        default="runs/gpu_conformance.jsonl",
        help="rows, appended per model (default runs/gpu_conformance.jsonl)",
    )
    p.add_argument("--table", default="", help="also write the Markdown table here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    return p.parse_args(argv)


def _names(text: str, known: list[str], option: str) -> list[str]:
    names = known if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if unknown or not names:
        raise PlacerError(f"{option}: {', '.join(unknown) or 'none given'}: not one of {', '.join(known)}")
    return names


def check(args: argparse.Namespace) -> None:
    """PlacerError (one line, naming the option) for a bad option, before any work."""
    from envs.cluster import resolve_cluster
    from envs.real.placing import check_available, resolve_devices

    args.model_names = _names(args.models, conformance_corpus.available(), "--models")
    args.plan_names = _names(args.plans, list(conformance.PLANS), "--plans")
    for opt, least in (("steps", 0), ("warmup", 0), ("threads", 0)):
        if getattr(args, opt) < least:
            raise PlacerError(f"--{opt} {getattr(args, opt)}: must be >= {least}")
    check_available(resolve_devices(resolve_cluster(conformance.CLUSTER).device_names, args.device_map))


def done_models(path: str) -> dict[str, list[dict]]:
    """Rows already in ``path`` (a run cut short), by model."""
    rows: dict[str, list[dict]] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    rows.setdefault(row["model"], []).append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        check(args)
    except PlacerError as e:
        print(f"gpu_conformance: {e}", file=sys.stderr)
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available() and "cuda" in args.device_map

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize()

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    earlier = done_models(args.out)
    device = torch.cuda.get_device_name(0) if cuda else "cpu only"
    print(f"# {machine_line()}; torch {torch.__version__}; {device}; map {args.device_map}", file=sys.stderr)
    rows: list[dict] = [r for name in args.model_names for r in earlier.get(name, [])]
    t_start = time.time()
    for k, name in enumerate(args.model_names):
        if name in earlier:
            print(f"[{k + 1}/{len(args.model_names)}] {name}: already in {args.out}", file=sys.stderr)
            continue
        if time.time() - t_start > args.deadline:
            print(
                f"[{k + 1}/{len(args.model_names)}] {name}: not started (past --deadline {args.deadline:g}s)",
                file=sys.stderr,
            )
            continue
        t0 = time.time()
        results = conformance.check_model(
            name,
            args.plan_names,
            device_map=args.device_map,
            timed_steps=args.steps,
            warmup_steps=args.warmup,
            synchronize=synchronize,
        )
        new = [r.to_dict() | {"device": device, "torch": torch.__version__} for r in results]
        with open(args.out, "a", encoding="utf-8") as f:  # per model: a run cut short keeps what it measured
            f.writelines(json.dumps(r) + "\n" for r in new)
        rows.extend(new)
        passed = sum(r.ok for r in results)
        print(
            f"[{k + 1}/{len(args.model_names)}] {name}: {passed}/{len(results)} plans pass ({time.time() - t0:.0f}s)",
            file=sys.stderr,
        )
    table = conformance.format_rows(
        [
            conformance.PlanResult(
                **{k: (float("nan") if v is None else v) for k, v in r.items() if k not in ("device", "torch")}
            )
            for r in rows
        ]
    )
    if args.table:
        with open(args.table, "w", encoding="utf-8") as f:
            f.write("\n".join(table) + "\n")
    print(json.dumps(rows, indent=1) if args.json else "\n".join(table))
    failed = [f"{r['model']}/{r['plan']}" for r in rows if not r["ok"]]
    print(
        f"{len(rows) - len(failed)}/{len(rows)} rows pass" + (f"; failing: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
