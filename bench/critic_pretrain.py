"""Pretrain the move critic on the TRAIN split and write it (by default, the critic shipped with placer).

    python -m bench.critic_pretrain                       # writes policies/pretrained/critic-default.{pt,json}
    python -m bench.critic_pretrain --clusters k80x4 --evals 500 --output /tmp/critic.pt --json

The moves are those the default move search simulates (``--collect-with learned``: its own critic's picks from its
own incumbents, where a pretrained critic is then used; ``uniform``: a uniform-proposal search's, as the first
shipped critic was trained). The problems are the TRAIN items of the published split (``placer/gym/datasets.py``:
every zoo model, the conformance corpus's entries that ``transformers`` can build here, the synthetic families at
300 and 1,500 ops, seeds 0-2), on each cluster. The HELD_OUT families (synthetic ``attention`` and ``branches``,
corpus ``llama`` and ``bert``) are never trained on: their moves are collected too, with ``--held-out``, only to
report how well the critic ranks them (the ROC AUC of the moves that made the step faster). See
:mod:`placer.learn.pretrain_critic`.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

import numpy as np

import envs
from bench.common import OneLineParser, parse_list
from graphs import OpGraph, PlacerError
from placer.gym import datasets
from placer.learn.pretrain_critic import COLLECTORS, FitOptions, Problem, collect, pretrain_critic, ranking_auc
from policies import policy_file


def items(split: str) -> list[tuple[str, Callable[[], OpGraph]]]:
    """``(name, graph loader)`` of every item of ``split`` ("train" or "held_out") of the published split; corpus
    entries only where ``transformers`` can build them here."""
    from graphs.models import corpus

    found = []
    for dataset in datasets.DATASETS:
        for name in datasets.items(dataset, split):
            if dataset == "corpus" and name.partition("/")[2] not in corpus.available():
                continue
            found.append((name, lambda name=name: datasets.graph(name)))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.critic_pretrain", description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="k80x4,v100x4", help="comma list of presets (default k80x4,v100x4)")
    ap.add_argument("--evals", type=int, default=2000, help="simulated placements per problem (default 2000)")
    ap.add_argument("--steps", type=int, default=FitOptions.steps, help=f"Adam steps (default {FitOptions.steps})")
    ap.add_argument("--seed", type=int, default=0, help="the searches' and the fit's seed")
    ap.add_argument(
        "--collect-with",
        default="learned",
        choices=COLLECTORS,
        help="the search whose simulated moves the critic learns from: the default learned search (its own critic's "
        "picks, from its own incumbents: what a pretrained critic then meets) or uniform proposals (default learned)",
    )
    ap.add_argument("--only", default="", help="comma list of TRAIN items to use (default: all)")
    ap.add_argument("--held-out", action="store_true", help="also report the critic's AUC on the held-out items")
    ap.add_argument("--output", default=policy_file.DEFAULT_CRITIC, help="critic file (.pt; a .json sidecar beside)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if args.evals < 100 or args.steps < 1:
            raise PlacerError("--evals must be at least 100 and --steps at least 1")
        clusters = parse_list(args.clusters, what="clusters")
        for c in clusters:
            envs.resolve_cluster(c)
        train = items("train")
        if args.only:
            wanted = parse_list(args.only, what="only", known=[n for n, _ in train])
            train = [(n, load) for n, load in train if n in wanted]
        problems = [Problem(n, load, c) for n, load in train for c in clusters]
        say(f"collecting moves on {len(problems)} problems ({len(train)} TRAIN items x {len(clusters)} clusters)")
        critic, sidecar, report = pretrain_critic(
            problems,
            evals=args.evals,
            seeds=(args.seed,),
            options=FitOptions(steps=args.steps, seed=args.seed),
            search=args.collect_with,
            say=say,
        )
        sidecar["excluded"] = [f"{d}/{f}" for d, fams in datasets.HELD_OUT_FAMILIES.items() for f in fams]
        held_auc: dict[str, float | None] = {}
        if args.held_out:
            for name, load in items("held_out"):
                graph = load()
                for c in clusters:
                    moves = collect(
                        graph, envs.resolve_cluster(c), evals=args.evals, seed=args.seed, search=args.collect_with
                    )
                    held_auc[f"{name}@{c}"] = ranking_auc(critic, moves)
                    say(f"  held out {name}@{c}: AUC {held_auc[f'{name}@{c}']}")
            sidecar["training"]["held_out_auc_median"] = _median(held_auc.values())
        sidecar["training"]["train_auc_median"] = _median(report.auc.values())
        policy_file.save_critic(args.output, critic, sidecar)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc = {"output": args.output, "train_auc": report.auc, "held_out_auc": held_auc, "training": sidecar["training"]}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(
            f"{args.output}: {sidecar['training']['moves']:,} moves of {len(problems)} problems; median AUC "
            f"{sidecar['training']['train_auc_median']} on TRAIN"
            + (f", {sidecar['training']['held_out_auc_median']} on HELD_OUT" if held_auc else "")
        )
    return 0


def _median(values) -> float | None:
    found = [v for v in values if v is not None]
    return round(float(np.median(found)), 3) if found else None


if __name__ == "__main__":
    sys.exit(main())
