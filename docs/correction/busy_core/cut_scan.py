"""Every split of a model over the two busy-core ranks, measured: where the fastest split is, by measurement alone.

The same reality as ``python -m bench.correction ranks ... --pin --busy-core 1`` (two pinned gloo ranks, a busy
loop on the second core, M microbatches): each split of one cut (ops before the cut on the first rank, the rest on
the second) measured side by side, the splits interleaved, ``--rounds`` rounds; each one's reads and median, the
fastest first. A split is a plan of logical devices 1 and 2 (``gpu:0``, ``gpu:1`` of ``k80x2``), as the measured
loops' plans are. The cut equal to the op count is the plan with no cut: every op on the first rank, one process
(the second rank's core keeps its busy loop), with the same microbatches.

    python docs/correction/busy_core/cut_scan.py --source bench.rank_models:lm_b32 --cuts 8:147:8,143 --rounds 3
"""

import argparse
import json
import statistics
import sys

import numpy as np

import envs
from bench.correction import busy_core
from envs.real.distributed.worker import one_core_each
from envs.real.ray.jobs import RanksEnv
from placer.learn.measured_search import side_by_side


def cut_list(text: str, num_ops: int) -> list[int]:
    """``8:147:8,143``: ranges (start:stop:step) and single cuts, each in 1..num_ops, sorted, once each.

    A cut of ``num_ops`` is no cut: every op on the first rank.
    """
    cuts: set[int] = set()
    for part in text.split(","):
        bounds = [int(x) for x in part.split(":")]
        cuts |= set(range(*bounds)) if len(bounds) > 1 else set(bounds)
    return sorted(c for c in cuts if 0 < c <= num_ops)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--cluster", default="k80x2")
    ap.add_argument("--cuts", required=True, help="start:stop:step ranges and single cuts, comma separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--busy-core", type=int, default=1)
    args = ap.parse_args()
    cluster = envs.resolve_cluster(args.cluster)
    real = RanksEnv(
        args.source,
        cluster,
        microbatches=args.microbatches,
        warmup_steps=1,
        timed_steps=args.steps,
        rank_cpus=one_core_each(),
    )
    try:
        n = real.graph.num_ops
        cuts = cut_list(args.cuts, n)
        plans = [np.where(np.arange(n) < c, 1, 2).astype(np.int32) for c in cuts]
        print(f"{args.source}: {n} ops, {len(cuts)} cuts, {args.rounds} rounds", file=sys.stderr, flush=True)
        with busy_core(args.busy_core):
            reads = side_by_side(real, plans, args.rounds, on_round=lambda r: print(f"round {r}", file=sys.stderr))
    finally:
        real.close()
    rows = sorted(
        ({"cut": c, "reads_s": r, "median_s": statistics.median(r)} for c, r in zip(cuts, reads)),
        key=lambda row: row["median_s"],
    )
    json.dump({"argv": sys.argv[1:], "num_ops": n, "splits": rows}, sys.stdout, indent=1)
    print()
    for row in rows[:10]:
        print(f"cut {row['cut']:4d}: median {row['median_s'] * 1e3:.1f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
