"""Where the move search spends its placements, level by level, and where its moves were faster.

    PYTHONPATH=. python docs/levels/where_the_budget_goes.py branches-1500-0 uniform cycle 0

Arguments: a graph (bench.budget's names), the proposals (critic or uniform), the levels (learned or cycle) and a
seed; 1k placements from bench.budget's start, as ``bench.budget --evals 1000`` runs them. Per level: the
placements simulated while the search was on it (with the incumbents' schedules), the rounds that made the
incumbent faster, and the milliseconds they gained (kicks not counted).
"""

from __future__ import annotations

import collections
import sys

import envs
from bench.budget import graphs_and_clusters
from bench.budget_env import BudgetEnv
from bench.budget_runs import PLAN_EVALS, best_start
from placer.learn.move_search import MoveSearch, MoveSearchOptions


def main(graph_name: str, proposals: str, levels: str, seed: int) -> None:
    (graph,), (cluster,) = graphs_and_clusters(graph_name, "k80x4")
    env = envs.SimEnv(graph, cluster)
    start = best_start(graph, cluster, env, None, seed)
    max_evals = 1000 - start.evals - PLAN_EVALS  # what bench.budget leaves a method at 1k placements
    options = MoveSearchOptions(proposals=proposals, levels=levels)
    search = MoveSearch(graph, cluster, BudgetEnv(env, max_evals=max_evals), options=options, seed=seed)
    spent, hits, gain = collections.Counter(), collections.Counter(), collections.Counter()
    step = search.step

    def counted() -> None:
        cost, evals, kicks = search.cost, search.budget.evals, search.kicks
        try:
            step()
        finally:
            spent[search.level] += search.budget.evals - evals
            if search.cost < cost and search.kicks == kicks:
                hits[search.level] += 1
                gain[search.level] += (cost - search.cost) * 1e3

    search.step = counted
    result = search.run(start.op_devices, max_evals=max_evals)
    print(
        f"{graph.name} {proposals} proposals, levels {levels}, seed {seed}: start {start.step_time_s * 1e3:.2f} ms "
        f"({start.name}), best {result.step_time_s * 1e3:.2f} ms, {result.rounds} rounds, {result.kicks} kicks"
    )
    for k, lv in enumerate(search.levels):
        print(
            f"  {lv.name:24s} {lv.num_items:5d} items: {spent[k]:4d} placements, {hits[k]:3d} faster, "
            f"{gain[k]:.2f} ms gained"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
