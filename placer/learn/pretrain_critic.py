"""Pretraining the move critic across graphs: the moves searches simulated on many graphs, and one critic fitted to
rank them.

Today's critic starts from nothing in every run; one that has seen many graphs ranks moves on a new graph from its
first placement (GDP, DreamShard, GiPH: what is learned on some graphs carries to others). The data:
:func:`collect` runs a move search on a graph and keeps the features of every move it simulated and whether it made
the step faster: the default learned search (``search="learned"``, what ``bench.critic_pretrain`` collects: the
moves and the incumbents a critic meets where it is used) or one with uniform proposals (an unbiased draw of the
moves of worse incumbents; a critic fitted to them and frozen ranks no better than uniform draws even on the graph
it was fitted on, BENCHMARKS.md, "A critic pretrained on the search's own moves"). :func:`fit` trains a
:class:`policies.moves.MoveCritic` on the pooled moves as the search trains it online (logistic regression on "was
it faster"), for many more steps; :func:`ranking_auc` says how well a critic ranks a graph's moves (the area under
the ROC curve of the faster moves, within each round's candidates pooled).

:func:`pretrain_critic` does it all over a list of problems and returns the critic and its sidecar; ``python -m
bench.critic_pretrain`` writes the critic shipped with placer (``policies/pretrained/critic-default.pt``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

import envs
from envs.cluster import Cluster
from graphs import OpGraph
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from policies.moves import CriticFit, MoveCritic


@dataclass
class Moves:
    """Simulated moves of one problem: features ``[m, NUM_FEATURES]`` and whether each made the step faster."""

    name: str
    features: np.ndarray
    faster: np.ndarray


#: The searches :func:`collect` can gather moves from.
COLLECTORS = ("uniform", "learned")


def collect(
    graph: OpGraph,
    cluster: Cluster,
    *,
    evals: int,
    seed: int = 0,
    start: np.ndarray | None = None,
    search: str = "uniform",
) -> Moves:
    """The moves a move search simulates in ``evals`` placements from ``start`` (None: its draws), with their outcome.

    ``search``: "uniform" (uniform proposals: an unbiased draw of the moves of its incumbents) or "learned" (the
    default move search, its untrained critic fine-tuned online: the moves and the incumbents a critic meets where it
    is used, which a critic frozen after pretraining needs; BENCHMARKS.md, "A critic pretrained on the search's own
    moves")."""
    if search not in COLLECTORS:
        raise ValueError(f"collect: search {search!r}: unknown (known: {', '.join(COLLECTORS)})")
    env = envs.SimEnv(graph, cluster)
    options = MoveSearchOptions(proposals="uniform", module_share=0) if search == "uniform" else MoveSearchOptions()
    runner = MoveSearch(graph, cluster, env, options=options, seed=seed)
    runner.run(start, max_evals=evals)
    n = runner.replay.size
    name = f"{graph.name or 'graph'}@{cluster.name}"
    return Moves(name, runner.replay.features[:n].copy(), runner.replay.faster[:n].copy())


@dataclass
class FitOptions:
    """How :func:`fit` trains the critic."""

    hidden: int = 64
    """units of the critic's two hidden layers (the search's default)."""
    steps: int = 4000
    """Adam steps."""
    batch: int = 512
    """moves per step, drawn with each problem weighted alike (a large graph's many moves do not drown the rest)."""
    lr: float = 2e-3
    """Adam's learning rate."""
    seed: int = 0


def fit(data: Sequence[Moves], options: FitOptions | None = None) -> MoveCritic:
    """A critic trained on ``data`` (logistic regression on "was it faster", problems weighted alike)."""
    o = options or FitOptions()
    torch.manual_seed(o.seed)
    rng = np.random.default_rng(o.seed)
    data = [d for d in data if len(d.faster)]
    critic = MoveCritic(o.hidden)
    fit = CriticFit(critic, o.lr)
    per = max(o.batch // max(len(data), 1), 1)
    for _ in range(o.steps):
        picks = [rng.integers(0, len(d.faster), size=per) for d in data]
        x = torch.from_numpy(np.concatenate([d.features[p] for d, p in zip(data, picks)]))
        y = torch.from_numpy(np.concatenate([d.faster[p] for d, p in zip(data, picks)]))
        fit.step(x, y)
    return critic


def ranking_auc(critic: MoveCritic, moves: Moves) -> float | None:
    """The probability that the critic scores a faster move above a slower one (ROC AUC; None: one class only).

    >>> crit = MoveCritic(4)
    >>> m = Moves("toy", np.zeros((4, crit.net[0].in_features), dtype=np.float32), np.array([0, 1, 0, 1.0]))
    >>> ranking_auc(crit, m)  # every score ties
    0.5
    """
    pos, neg = moves.faster > 0.5, moves.faster <= 0.5
    if not pos.any() or not neg.any():
        return None
    with torch.no_grad():
        score = critic(torch.from_numpy(moves.features)).numpy().astype(np.float64)
    ranks = _average_ranks(score)
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, ties given their average rank (Mann-Whitney's U needs them)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    start = 0
    for end in np.append(np.flatnonzero(np.diff(sorted_x)) + 1, len(x)):
        ranks[order[start:end]] = (start + end + 1) / 2.0
        start = end
    return ranks


@dataclass
class Problem:
    """A graph and a cluster to collect moves on, and the name the sidecar lists."""

    name: str
    graph: Callable[[], OpGraph]
    cluster: str


@dataclass
class PretrainReport:
    """What :func:`pretrain_critic` did: the moves per problem, the seconds, the critic's AUC on each problem."""

    moves: dict[str, int] = field(default_factory=dict)
    faster: dict[str, int] = field(default_factory=dict)
    auc: dict[str, float | None] = field(default_factory=dict)
    collect_s: float = 0.0
    fit_s: float = 0.0


def pretrain_critic(
    problems: Sequence[Problem],
    *,
    evals: int = 3000,
    seeds: Sequence[int] = (0,),
    options: FitOptions | None = None,
    search: str = "uniform",
    say: Callable[[str], Any] = lambda line: None,
) -> tuple[MoveCritic, dict[str, Any], PretrainReport]:
    """Collect moves on every problem (``evals`` placements per seed, from ``search``: :func:`collect`), fit one
    critic; ``(critic, sidecar, report)``.

    The sidecar is what :func:`policies.policy_file.save_critic` writes beside the weights (its ``corpus``: the
    problems' names).
    """
    o = options or FitOptions()
    report, data = PretrainReport(), []
    t0 = time.perf_counter()
    for p in problems:
        graph, cluster = p.graph(), envs.resolve_cluster(p.cluster)
        for seed in seeds:
            moves = collect(graph, cluster, evals=evals, seed=seed, search=search)
            moves.name = f"{p.name}@{p.cluster}/s{seed}"
            data.append(moves)
            report.moves[moves.name], report.faster[moves.name] = len(moves.faster), int(moves.faster.sum())
            say(f"  {moves.name}: {len(moves.faster):,} moves, {int(moves.faster.sum())} faster")
    report.collect_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    critic = fit(data, o)
    report.fit_s = time.perf_counter() - t0
    report.auc = {d.name: ranking_auc(critic, d) for d in data}
    sidecar = {
        "corpus": sorted({p.name for p in problems}),
        "clusters": sorted({p.cluster for p in problems}),
        "seed": o.seed,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "training": {
            "evals_per_problem": evals,
            "collected_with": search,
            "seeds": list(seeds),
            "steps": o.steps,
            "batch": o.batch,
            "lr": o.lr,
            "moves": sum(report.moves.values()),
            "faster": sum(report.faster.values()),
            "collect_s": round(report.collect_s, 1),
            "fit_s": round(report.fit_s, 1),
        },
    }
    return critic, sidecar, report
