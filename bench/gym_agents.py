"""Agents run through placer's Gymnasium environment: a random agent, and placer's own REINFORCE.

``random`` draws ``--placements`` uniformly random actions of ``placer/PlaceAll-v0``
(a device per item) and keeps the best placement that fits. ``reinforce`` runs
``placer train --algo reinforce`` with every placement scored through the same
environment (items = ops, scored in the run's issue order:
:class:`placer.gym.EnvScorer`); with the same options it prints what
``placer train ... --algo reinforce --json`` prints.

    python -m bench.gym_agents random --graph nmt-2 --cluster k80x4 --placements 4096 --json
    python -m bench.gym_agents reinforce --graph nmt-2 --cluster k80x4 --iterations 512 --samples 8 --json
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from bench.common import parse_list
from bench.gym_cli import add_problem, doc_parser, print_report
from graphs import PlacerError


def build_parser() -> argparse.ArgumentParser:
    p = doc_parser("bench.gym_agents", __doc__)
    sub = p.add_subparsers(dest="agent", required=True)
    for name, helptext in (("random", "uniformly random placements"), ("reinforce", "placer's REINFORCE")):
        a = sub.add_parser(name, help=helptext)
        add_problem(a)
        a.add_argument("--seed", type=int, default=0, help="seed (default 0)")
        a.add_argument("--json", action="store_true", help="print one JSON document")
    rand = sub.choices["random"]
    rand.add_argument("--placements", type=int, default=1000, help="random placements to score (default 1000)")
    rand.add_argument("--groups", type=int, default=None, help="items (default: the environment's; 0: ops)")
    rand.add_argument("--placement-out", metavar="FILE", help="save the best placement there (placer-placement/1)")
    rl = sub.choices["reinforce"]
    rl.add_argument("--iterations", type=int, default=100, help="REINFORCE iterations (default 100)")
    rl.add_argument("--samples", type=int, default=8, help="placements sampled per iteration (default 8)")
    rl.add_argument("--heuristics", default=None, help="comma list of heuristics to start from (default all)")
    rl.add_argument("--warm-start", choices=("best", "none"), default="best", help="as placer train's")
    rl.add_argument("--lr", type=float, default=None, help="Adam learning rate (default placer train's)")
    rl.add_argument("--score-order", choices=("planned", "node"), default="planned", help="as placer train's")
    rl.add_argument("--logdir", default=None, help="the run's directory (default runs/...)")
    return p


def random_agent(args: argparse.Namespace) -> dict[str, Any]:
    """The random agent's best placement that fits, over ``--placements`` episodes."""
    from placer.gym import PlaceAllEnv

    if args.placements < 1:
        raise PlacerError(f"--placements {args.placements}: give at least 1")
    env = PlaceAllEnv(args.graph, args.cluster, groups=args.groups, peak_memory=False)
    env.action_space.seed(args.seed)
    best, best_op_devices, rewards, t0 = float("inf"), None, [], time.perf_counter()
    for k in range(args.placements):
        env.reset(seed=args.seed if k == 0 else None)
        _, reward, _, _, info = env.step(env.action_space.sample())
        rewards.append(reward)
        if not info["failed"] and info["step_time_s"] < best:
            best, best_op_devices = info["step_time_s"], info["op_devices"]
    bound = env.problem.scorer.lower_bound()
    if args.placement_out and best_op_devices is not None:
        env.to_placement(best_op_devices).save(args.placement_out)
    return {
        "agent": "random",
        "graph": args.graph,
        "cluster": args.cluster,
        "placements": args.placements,
        "best_step_time_s": best if best_op_devices is not None else None,
        "mean_reward": float(np.mean(rewards)),
        "reference_step_time_s": env.problem.t_ref,
        "lower_bound_s": float(bound),
        "lower_bound_name": getattr(bound, "name", ""),
        "wall_s": time.perf_counter() - t0,
    }


def reinforce(args: argparse.Namespace) -> dict[str, Any]:
    """``placer train --algo reinforce`` scored through the environment; its summary (``placer train --json``)."""
    from placer.gym import EnvScorer, PlaceAllEnv
    from placer.learn.runners import train
    from placer.train import TrainConfig

    env = PlaceAllEnv(args.graph, args.cluster, groups=0, order=args.score_order, peak_memory=False)
    heuristics = tuple(parse_list(args.heuristics, what="heuristics")) if args.heuristics else None
    config = TrainConfig.from_preset(
        "tuned",
        source=args.graph,
        cluster=args.cluster,
        algo="reinforce",
        iterations=args.iterations,
        samples=args.samples,
        seed=args.seed,
        heuristics=heuristics,
        warm_start=args.warm_start,
        **({"lr": args.lr} if args.lr is not None else {}),
        score_order=args.score_order,
        logdir=args.logdir,
        progress=False,
        equal_budget_search=False,
    )
    result = train(config, graph=env.problem.graph, cluster=env.problem.cluster, env=EnvScorer(env))
    return {"agent": "reinforce", "graph": args.graph, "cluster": args.cluster, **result.to_dict()}


AGENTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"random": random_agent, "reinforce": reinforce}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        report = AGENTS[args.agent](args)
    except PlacerError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print_report(report, "bench.gym_agents", sys.argv[1:] if argv is None else list(argv))
        return 0
    best = report["best_step_time_s"]
    print(
        f"{args.agent} on {args.graph} / {args.cluster}: best step time "
        + (f"{best * 1e3:.3f} ms" if best is not None else "none fits")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
