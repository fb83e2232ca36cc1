"""The most a critic pretrained elsewhere could give: a critic pretrained on the very graph it then searches.

Issue 49 asks for a critic pretrained across graphs that ranks moves on a new graph from its first placement. The
shipped one, frozen, ends no better than uniform proposals on the held-out graphs ("The four ablations"). Before
looking for better transfer: how much would perfect transfer give? Here the critic is fitted (as
``bench.critic_pretrain`` fits the shipped one: ``placer.learn.pretrain_critic``) on the moves a uniform search
simulated on the same graph and cluster with another seed (100), then searched with from the same starts as the
rest, frozen and fine-tuned, beside the default (an untrained critic fine-tuned online) and uniform proposals.

    PYTHONPATH=. python docs/critic/self/self_transfer.py branches-300-0 --evals 1000 --seeds 0,1,2,3,4,5,6,7 \
        --json > docs/critic/self/branches-300-0.json
    PYTHONPATH=. python docs/critic/self/self_transfer.py branches-300-0 --collect-with learned ... (the learned
        search's own moves: its critic's picks and its uniform draws, from its own incumbents)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import envs
from bench import budget
from bench.budget_runs import RUNNERS, run_moves
from bench.graph_sources import graphs_and_clusters
from placer.learn.move_search import MoveSearch
from placer.learn.pretrain_critic import FitOptions, Moves, collect, fit
from policies import policy_file


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--collect", type=int, default=1500, help="placements of the uniform search the critic learns from")
    ap.add_argument(
        "--collect-with",
        default="uniform",
        choices=["uniform", "learned"],
        help="the search whose simulated moves the critic learns from: uniform proposals (as bench.critic_pretrain "
        "collects) or the default learned search",
    )
    ap.add_argument("--evals", default="1000")
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    (graph,), (cluster,) = graphs_and_clusters(args.graph, args.cluster)
    if args.collect_with == "uniform":
        moves = collect(graph, cluster, evals=args.collect, seed=100)
    else:
        search = MoveSearch(graph, cluster, envs.SimEnv(graph, cluster), seed=100)
        search.run(None, max_evals=args.collect)
        n = search.replay.size
        moves = Moves(graph.name, search.replay.features[:n].copy(), search.replay.faster[:n].copy())
    print(f"collected {len(moves.faster):,} moves, {int(moves.faster.sum())} faster", file=sys.stderr)
    critic = fit([moves], FitOptions())
    path = os.path.join(tempfile.mkdtemp(), "self.pt")
    policy_file.save_critic(
        path, critic, {"corpus": [args.graph], "clusters": [args.cluster], "seed": 100, "date": "-"}
    )
    RUNNERS["self_frozen"] = run_moves("critic", critic=path, fine_tune=False, name="self_frozen")
    RUNNERS["self_tuned"] = run_moves("critic", critic=path, name="self_tuned")
    budget.VS_UNIFORM = (*budget.VS_UNIFORM, "self_frozen", "self_tuned")
    argv = [
        "--graphs", args.graph, "--clusters", args.cluster, "--evals", args.evals, "--seconds", "",
        "--methods", "learned,uniform,self_frozen,self_tuned,pretrained_frozen", "--seeds", args.seeds,
    ]  # fmt: skip
    return budget.main(argv + (["--json"] if args.json else []))


if __name__ == "__main__":
    sys.exit(main())
