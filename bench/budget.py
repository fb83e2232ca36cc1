"""Every method at equal budgets: simulated placements or seconds, every placement counted, from the same start.

    python -m bench.budget                                   # nmt-2 on k80x4, 1k/10k/100k placements, 60/300 s
    python -m bench.budget --graphs nmt-2,inception-v3,moe-400 --clusters k80x4,v100x4 --seeds 0,1,2
    python -m bench.budget --evals 1000 --seconds "" --methods learned,uniform,module_search --json
    python -m bench.budget --plot docs/budget.png
    python -m bench.budget --table a.json b.json             # earlier runs' --json, side by side in one table

For each graph, cluster, budget and seed:

* **start**: the best of the rule heuristics (:data:`START_HEURISTICS`: list
  schedulers, the expert, one GPU; none searches with the simulator), each
  scored once. Whoever starts from it pays for it: its simulated placements
  and its seconds count against the learner's, the ablation's, annealing's and
  ilp's budgets;
* **learned**: the move search with the learned critic ranking the moves and
  each round's level drawn by the levels' hit rates
  (:class:`placer.learn.move_search.MoveSearch`), from the best of the start and
  what ``module_search`` finds on the search's ``module_share`` of the budget
  (run first, counted; the same seed as module_search below, so it is that run's
  first share);
* **uniform**: the same loop with uniform proposals and the levels in turn (the
  ablation: nothing learned); on request, the two halves of the ablation,
  **learned_cycle** (the critic, the levels in turn) and **uniform_levels**
  (uniform moves, the levels learned); and **learned_coarse_kicks** and
  **uniform_coarse_kicks**, both loops as they were before kicks of single ops
  and faster moves combined;
* **module_search**: ``module_search(n)`` from its own uniform draws;
* **annealing**: annealing started from the start's heuristic, the same n
  (its cooling schedule sized to the budget);
* **ilp**: the CP-SAT model given the same seconds (at a budget of placements,
  the seconds the learner took), hinted with the start.

The methods (:mod:`bench.budget_runs`; on request also learned_accept and uniform_accept, the same two loops
taking slower moves as annealing does) but ilp score through one :class:`bench.budget_env.BudgetEnv`, which counts
every placement simulated, stops the method when its budget is spent (a method's result is
the best placement it had simulated by then, as the method itself would
return it) and records its best-so-far curve. Every method's best placement
is then timed in the best issue order :meth:`envs.SimEnv.plan_order` finds
(four more simulations of it, counted, for every method alike; ilp keeps its
own order where that is faster; a method that began at the start keeps the
start's plan where that is faster): the plan a placement file carries, and
what the table compares. All figures are simulated step times and hold inside the simulator
only. Graphs: zoo names, graph files, module:callable, or synthetic families as family-ops[-seed] (moe-400,
unet-400-1). Medians over the seeds. Progress on stderr; a markdown table (or --json) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Sequence

import envs
from bench.budget_env import Budget
from bench.budget_runs import ACCEPT, HEURISTICS, METHODS, RUNNERS, best_start, run_moves
from bench.common import OneLineParser, Progress, machine_line, parse_list
from bench.graph_sources import graphs_and_clusters
from graphs import OpGraph, PlacerError
from graphs.io import read_json
from policies.policy_file import load_critic


def budget_cell(
    graph: OpGraph,
    cluster: Any,
    budgets: Sequence[Budget],
    *,
    methods: Sequence[str] = METHODS,
    seeds: Sequence[int] = (0,),
    order: str | None = None,
    ilp_workers: int = 1,
    progress: Progress | None = None,
    runners: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every method at every budget and seed on one graph and cluster (see the module docstring); ``runners``:
    method -> runner (default :data:`bench.budget_runs.RUNNERS`)."""
    runners = RUNNERS if runners is None else runners
    bad = [m for m in methods if m not in runners]
    if bad:
        raise PlacerError(f"--methods: unknown {', '.join(bad)} (known: {', '.join(runners)})")
    say = progress or (lambda line: None)
    env = envs.SimEnv(graph, cluster)
    bound = env.lower_bound()
    out: dict[str, Any] = {
        "graph": graph.name,
        "cluster": cluster.name,
        "num_ops": graph.num_ops,
        "score_order": order or "node",
        "lower_bound_s": float(bound),
        "lower_bound_name": getattr(bound, "name", ""),
        "runs": [],
    }
    for budget in budgets:
        for seed in seeds:
            start = best_start(graph, cluster, env, order, seed)
            out.setdefault("start", {"method": start.name, "step_time_s": start.step_time_s, "evals": start.evals})
            learner_s = None
            for method in methods:
                seconds = learner_s if (method == "ilp" and budget.kind == "evals") else None
                run = runners[method](
                    graph, cluster, env, budget, start, seed, order, seconds=seconds, ilp_workers=ilp_workers
                )
                if method == "learned":
                    learner_s = run.wall_s
                best = f"{run.step_time_s * 1e3:.2f} ms" if run.step_time_s is not None else run.note or "none"
                say(
                    f"  {graph.name}/{cluster.name} {budget.label} seed {seed} {method}: {best} "
                    f"({run.evals:,} placements, {run.wall_s:.1f} s)"
                )
                out["runs"].append(
                    {"budget": {"kind": budget.kind, "value": budget.value}, "seed": seed, **run.to_dict()}
                )
    return out


def medians(
    cell: dict[str, Any], time_key: str = "plan_step_time_s"
) -> dict[tuple[str, float], dict[str, float | None]]:
    """(budget kind, value) -> method -> median over the seeds of ``time_key`` (None if it never placed)."""
    found: dict[tuple[str, float], dict[str, list[float]]] = {}
    for r in cell["runs"]:
        key = (r["budget"]["kind"], r["budget"]["value"])
        found.setdefault(key, {}).setdefault(r["method"], [])
        if r.get(time_key) is not None:
            found[key][r["method"]].append(r[time_key])
    return {k: {m: (statistics.median(v) if v else None) for m, v in by.items()} for k, by in found.items()}


#: The ablations' halves and the pretrained critic's methods (not in METHODS; on request): each gets a ratio to
#: uniform when run.
VS_UNIFORM = ("learned_cycle", "uniform_levels", "untrained_frozen", "pretrained", "pretrained_frozen")
#: Each loop and itself as it was before kicks of single ops and faster moves combined (on request): each pair gets
#: a ratio when both ran.
VS_BEFORE = (("learned", "learned_coarse_kicks"), ("uniform", "uniform_coarse_kicks"))


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a is not None and b else "–"


def markdown_table(cells: Sequence[dict[str, Any]]) -> str:
    """One row per graph, cluster and budget: each method's median plan, learned over the best heuristic and over
    uniform."""
    extra = [m for m in RUNNERS if m not in METHODS and any(r["method"] == m for c in cells for r in c["runs"])]
    accept = "learned_accept" in extra  # the acceptance variant and its own ablation, when run
    head = [
        "graph",
        "cluster",
        "budget",
        *METHODS,
        *extra,
        "best rival",
        "learned / best rival",
        "learned / uniform",
        *(["learned_accept / best rival", "learned_accept / uniform_accept"] if accept else []),
        *[f"{m} / uniform" for m in VS_UNIFORM if m in extra],
        *(["expert / learned"] if "expert" in extra else []),
        *[f"{m} / {before}" for m, before in VS_BEFORE if before in extra],
        "best / bound (bound)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for cell in cells:
        for (kind, value), by in medians(cell).items():
            heuristics = {m: by[m] for m in HEURISTICS if by.get(m) is not None}
            heuristic = min(heuristics.items(), key=lambda kv: kv[1]) if heuristics else None
            best = min(v for v in by.values() if v is not None) if any(v is not None for v in by.values()) else None
            budget = Budget(kind, value).label
            cols = [f"{by[m] * 1e3:.2f}" if by.get(m) is not None else "–" for m in (*METHODS, *extra)]
            ratios = (
                [
                    _ratio(by.get("learned_accept"), heuristic[1] if heuristic else None),
                    _ratio(by.get("learned_accept"), by.get("uniform_accept")),
                ]
                if accept
                else []
            )
            lines.append(
                "| "
                + " | ".join(
                    [
                        cell["graph"],
                        cell["cluster"],
                        budget,
                        *cols,
                        f"{heuristic[0]} {heuristic[1] * 1e3:.2f}" if heuristic else "–",
                        _ratio(by.get("learned"), heuristic[1] if heuristic else None),
                        _ratio(by.get("learned"), by.get("uniform")),
                        *ratios,
                        *[_ratio(by.get(m), by.get("uniform")) for m in VS_UNIFORM if m in extra],
                        *([_ratio(by.get("expert"), by.get("learned"))] if "expert" in extra else []),
                        *[_ratio(by.get(m), by.get(before)) for m, before in VS_BEFORE if before in extra],
                        f"{_ratio(best, cell['lower_bound_s'])} ({cell['lower_bound_name']})",
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def merge_cells(files: Sequence[str]) -> list[dict[str, Any]]:
    """The cells of earlier runs' ``--json`` files, one per graph, cluster and issue order, each with the runs of
    every file that has it (methods run by separate commands, side by side in one table). Raises
    :class:`PlacerError` naming the file where one is not such a run, or where a graph's start (the best heuristic's
    placement, which every method starts from) differs from the one an earlier file gave it."""
    merged: dict[tuple, dict[str, Any]] = {}
    first: dict[tuple, str] = {}
    for path in files:
        doc = read_json(path)
        cells = doc.get("cells") if isinstance(doc, dict) else None
        if not isinstance(cells, list) or not all(
            isinstance(c, dict) and {"graph", "cluster", "runs", "start"} <= set(c) for c in cells
        ):
            raise PlacerError(f"{path}: not a `python -m bench.budget --json` run (no cells of graph, cluster, runs)")
        for cell in cells:
            key = (cell["graph"], cell["cluster"], cell.get("score_order", "node"))
            if key not in merged:
                merged[key] = {**cell, "runs": list(cell["runs"])}
                first[key] = path
            elif cell["start"] != merged[key]["start"]:
                raise PlacerError(
                    f"{path}: {cell['graph']} on {cell['cluster']} starts from another placement than in "
                    f"{first[key]} ({cell['start'].get('method')} against {merged[key]['start'].get('method')})"
                )
            else:
                merged[key]["runs"] += cell["runs"]
    return list(merged.values())


def _numbers(arg: str, option: str, cast) -> list:
    if not arg.strip():
        return []
    try:
        values = [cast(v) for v in arg.split(",")]
    except ValueError:
        raise PlacerError(f"{option} {arg!r}: give comma-separated numbers") from None
    if any(v <= 0 for v in values):
        raise PlacerError(f"{option} {arg!r}: every budget must be positive")
    return values


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.budget", description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="nmt-2", help="comma list (default nmt-2)")
    ap.add_argument("--clusters", default="k80x4", help="comma list of presets or files (default k80x4)")
    ap.add_argument("--evals", default="1000,10000,100000", help="budgets in simulated placements ('' for none)")
    ap.add_argument("--seconds", default="60,300", help="budgets in seconds ('' for none)")
    ap.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"default: {','.join(METHODS)}; also learned_accept and uniform_accept (the move search "
        f"taking slower moves at temperature {ACCEPT}, with and without its critic); learned_cycle (the critic, the "
        "levels in turn) and uniform_levels (uniform moves, the levels learned): the ablation's halves; "
        "untrained_frozen (a critic never trained); pretrained and "
        "pretrained_frozen (the critic shipped with placer, fine-tuned or not); expert (kicks drawn from a policy "
        "that imitates the search's local optima: expert iteration; learned is its ablation); learned_coarse_kicks "
        "and uniform_coarse_kicks (both loops kicking coarse items, no faster moves combined: as they were)",
    )
    ap.add_argument("--seeds", default="0", help="comma list of seeds (medians are reported)")
    ap.add_argument(
        "--critic",
        default="pretrained",
        metavar="FILE.pt",
        help="the critic the pretrained and pretrained_frozen methods start from (default: the one shipped with "
        "placer; a file python -m bench.critic_pretrain --output wrote)",
    )
    ap.add_argument(
        "--score-order",
        choices=("node", "planned"),
        default="node",
        help="issue order every placement is scored in (default node)",
    )
    ap.add_argument("--ilp-workers", type=int, default=1, help="CP-SAT workers (default 1: the others use one core)")
    ap.add_argument("--plot", default=None, metavar="FILE.png", help="draw quality against budget (the plot extra)")
    ap.add_argument("--json", action="store_true", help="print every run as JSON instead of the table")
    ap.add_argument(
        "--table",
        nargs="+",
        metavar="RUN.json",
        help="run nothing: print the table of earlier runs (their --json), the cells of one graph and cluster "
        "merged across the files (methods run by separate commands, side by side)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.table:
        try:
            print(markdown_table(merge_cells(args.table)))
        except PlacerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        budgets = [Budget("evals", v) for v in _numbers(args.evals, "--evals", int)]
        budgets += [Budget("seconds", v) for v in _numbers(args.seconds, "--seconds", float)]
        if not budgets:
            raise PlacerError("--evals and --seconds: give at least one budget")
        methods = parse_list(args.methods, what="methods", known=list(RUNNERS))
        runners = dict(RUNNERS)
        if args.critic != "pretrained":
            load_critic(args.critic)  # a missing or bad file: one line, before any run
            runners["pretrained"] = run_moves("critic", critic=args.critic, name="pretrained")
            runners["pretrained_frozen"] = run_moves(
                "critic", critic=args.critic, fine_tune=False, name="pretrained_frozen"
            )
        seeds = [int(s) for s in parse_list(args.seeds, what="seeds") if s.isdigit()] or [0]
        if args.ilp_workers < 1:
            raise PlacerError(f"--ilp-workers {args.ilp_workers}: must be at least 1")
        graphs, clusters = graphs_and_clusters(args.graphs, args.clusters)
        order = None if args.score_order == "node" else "planned"
        cells = []
        for graph in graphs:
            for cluster in clusters:
                say(f"{graph.name} ({graph.num_ops:,} ops) on {cluster.name}")
                cells.append(
                    budget_cell(
                        graph,
                        cluster,
                        budgets,
                        methods=methods,
                        seeds=seeds,
                        order=order,
                        ilp_workers=args.ilp_workers,
                        progress=say,
                        runners=runners,
                    )
                )
        if args.plot:
            from bench.plots import plot_budget_curves

            plot_budget_curves(cells, args.plot)
            say(f"{args.plot}: {os.path.getsize(args.plot) / 1024:.0f} KiB")
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"machine": machine_line(), "cells": cells}, indent=1))
    else:
        print(markdown_table(cells))
        print(
            f"\nMedians over seeds {','.join(map(str, seeds))}; simulated step times in ms of each method's best "
            f"placement in its best issue order (searched in {args.score_order} order). Machine: {machine_line()}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
