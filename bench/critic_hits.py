"""How often the critic's ranked moves make the step faster, against the uniform draws of the same rounds.

    python -m bench.critic_hits --graphs branches-300-0,branches-1500-0 --clusters k80x4 --evals 1000 --seeds 0,1

The move search mixes, every round, moves the critic ranked first (3 of its 4) with moves drawn uniformly (1 of
4): both arms are tried on the same incumbents, so their hit rates (the share of tried moves that made the step
faster) compare the critic's ranking with chance where it is used. For each critic (``fresh``: untrained, it
ranks from its second round; ``pretrained``: the shipped one, from the first, fine-tuned; ``frozen``: the
shipped one, not fine-tuned), on each graph, cluster and seed: the hit rates over the first ``--early`` rounds
and over the whole run, and the best step time. A markdown table on stdout (``--json``: every run).
"""

from __future__ import annotations

import sys
from typing import Any

import envs
from bench.common import OneLineParser, parse_list, print_report
from bench.graph_sources import graphs_and_clusters
from graphs import PlacerError
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.search_budget import BudgetSpent

#: critic name -> the move search's options for it.
CRITICS: dict[str, dict[str, Any]] = {
    "fresh": dict(critic=None),
    "pretrained": dict(critic="pretrained"),
    "frozen": dict(critic="pretrained", fine_tune=False),
}


def hit_rates(graph: Any, cluster: Any, critic: str, *, evals: int, seed: int, early: int) -> dict[str, Any]:
    """One move search with ``critic``: ``[uniform, ranked]`` tries and hits, early and in all; its best."""
    options = MoveSearchOptions(module_share=0, **CRITICS[critic])
    search = MoveSearch(graph, cluster, envs.SimEnv(graph, cluster), options=options, seed=seed)
    early_counts = None
    try:
        search.begin(None, max_evals=evals)
        while True:
            if search.rounds == early:
                early_counts = (search.tries.copy(), search.hits.copy())
            search.step()
    except BudgetSpent:
        pass
    early_counts = early_counts or (search.tries.copy(), search.hits.copy())
    return {
        "early": {"tries": early_counts[0].tolist(), "hits": early_counts[1].tolist()},
        "all": {"tries": search.tries.tolist(), "hits": search.hits.tolist()},
        "rounds": search.rounds,
        "step_time_s": search.result().step_time_s,
    }


def _rate(counts: dict[str, list[int]], arm: int) -> float:
    tries = counts["tries"][arm]
    return counts["hits"][arm] / tries if tries else float("nan")


def markdown_table(runs: list[dict[str, Any]], early: int) -> str:
    head = ["graph", "cluster", "seed", "critic", f"ranked hits, first {early}", "uniform hits", "ranked, all"]
    head += ["uniform, all", "best ms"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|" + "---:|" * (len(head) - 4)]
    for r in runs:
        rates = [_rate(r["early"], 1), _rate(r["early"], 0), _rate(r["all"], 1), _rate(r["all"], 0)]
        row = [r["graph"], r["cluster"], str(r["seed"]), r["critic"], *[f"{x:.1%}" for x in rates]]
        lines.append("| " + " | ".join([*row, f"{r['step_time_s'] * 1e3:.2f}"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m bench.critic_hits", description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="branches-300-0", help="comma list (zoo, files, family-ops[-seed])")
    ap.add_argument("--clusters", default="k80x4", help="comma list of presets or files")
    ap.add_argument("--evals", type=int, default=1000, help="simulated placements per run (default 1000)")
    ap.add_argument("--early", type=int, default=20, help="the rounds counted as early (default 20)")
    ap.add_argument("--seeds", default="0", help="comma list of seeds")
    ap.add_argument("--critics", default=",".join(CRITICS), help=f"comma list of {', '.join(CRITICS)}")
    ap.add_argument("--json", action="store_true", help="print every run as JSON")
    args = ap.parse_args(argv)
    try:
        if args.evals < 10 or args.early < 1:
            raise PlacerError("--evals must be at least 10 and --early at least 1")
        critics = parse_list(args.critics, what="critics", known=list(CRITICS))
        seeds = [int(s) for s in parse_list(args.seeds, what="seeds") if s.isdigit()]
        graphs, clusters = graphs_and_clusters(args.graphs, args.clusters)
        runs = []
        for graph in graphs:
            for cluster in clusters:
                for seed in seeds:
                    for critic in critics:
                        r = hit_rates(graph, cluster, critic, evals=args.evals, seed=seed, early=args.early)
                        runs.append({"graph": graph.name, "cluster": cluster.name, "seed": seed, "critic": critic, **r})
                        print(f"  {graph.name} {cluster.name} s{seed} {critic}: {r['all']}", file=sys.stderr)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_report(args.json, {"runs": runs}, lambda: markdown_table(runs, args.early))
    return 0


if __name__ == "__main__":
    sys.exit(main())
