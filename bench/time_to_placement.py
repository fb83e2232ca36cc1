"""Time-to-placement: best step time reached vs wall time and vs evaluated placements, RL vs annealing vs random
search.

    python -m bench.time_to_placement                        # nmt-2, inception-v3 on k80x4, 60 s each
    python -m bench.time_to_placement --graphs nmt-2 --budget 20 --plot docs/search_curves.png
    python -m bench.time_to_placement --json > search.json

:class:`RecordingEnv` wraps a scorer (``envs.SimEnv``) and records, every time a
batch is scored, how many distinct placements have been evaluated so far, the
wall time since :meth:`RecordingEnv.restart`, and the best step time of the
placements that fit in memory. RL (:func:`placer.learn.loop.train`, which accepts an
``env``) and the search heuristics (``annealing`` and ``random_search``, which
accept ``env=``) are run through it unchanged, so the curves of
:func:`search_curves` compare the methods on the same clock and the same count.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> g = random_dag(30, seed=0)
>>> rec = RecordingEnv(envs.SimEnv(g, envs.Cluster.preset("k80x2")))
>>> _ = rec.step_times(np.ones((4, 30), dtype=np.int32))
>>> rec.evals, len(rec.best_s)
(4, 1)

Every method starts from scratch (no warm start, no heuristic seed) and is scored by the same simulator. Progress
goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

import envs
from bench.common import OneLineParser, Progress, machine_line, parse_list
from graphs import OpGraph, PlacerError
from graphs.sources import resolve_graph
from placer.learn.config import TrainConfig
from placer.learn.loop import train
from placer.methods import get, registry

METHODS = ("rl-seq2seq", "rl-hierarchical", "annealing", "random_search")


class SearchBudgetExhausted(Exception):
    """Raised by :class:`RecordingEnv` when asked to score after its deadline."""


class RecordingEnv:
    """A scorer that forwards to ``env`` and records the best-so-far curve.

    Args:
        env: an object with ``step_times`` (and optionally ``evaluate``), e.g. ``envs.SimEnv``.
        deadline_s: if given, scoring after this many seconds since :meth:`restart`
            raises :class:`SearchBudgetExhausted` (to stop methods without a time budget).
    """

    def __init__(self, env: Any, *, deadline_s: float | None = None) -> None:
        self.env = env
        self.deadline_s = deadline_s
        self.restart()

    def restart(self) -> None:
        """Zero the clock, the count and the curve."""
        self.t0 = time.perf_counter()
        self.evals = 0
        self.best = math.inf
        self.wall_s: list[float] = []
        self.evals_at: list[int] = []
        self.best_s: list[float] = []

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def __getattr__(self, name: str) -> Any:  # graph, cluster, lower_bound... of the wrapped env
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def _check_deadline(self) -> None:
        if self.deadline_s is not None and self.elapsed_s() >= self.deadline_s:
            raise SearchBudgetExhausted(f"deadline of {self.deadline_s:g} s reached after {self.evals} evaluations")

    def _record(self, times: np.ndarray, failed: np.ndarray) -> None:
        now = self.elapsed_s()
        for t, bad in zip(np.asarray(times, dtype=float), np.asarray(failed, dtype=bool)):
            self.evals += 1
            if not bad and math.isfinite(t) and t < self.best:
                self.best = float(t)
                self.wall_s.append(now)
                self.evals_at.append(self.evals)
                self.best_s.append(self.best)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``env.step_times``, recorded."""
        self._check_deadline()
        out = self.env.step_times(op_devices, order)
        self._record(out[0], out[1])
        return out

    def overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``env.overflow``, recorded."""
        self._check_deadline()
        out = self.env.overflow(op_devices, order)
        self._record(out[0], out[1])
        return out

    def evaluate(self, placements: Sequence[Any]) -> list[Any]:
        """``env.evaluate``, recorded."""
        self._check_deadline()
        results = self.env.evaluate(placements)
        self._record(np.array([r.step_time_s for r in results], dtype=float), np.array([not r.ok for r in results]))
        return results

    def curve(self, graph: str, method: str) -> dict[str, Any]:
        """The recorded curve as a JSON-ready dict (see :func:`bench.plots.plot_search_curves`)."""
        return {
            "graph": graph,
            "method": method,
            "wall_s": list(self.wall_s),
            "evals": list(self.evals_at),
            "best_s": list(self.best_s),
            "end_wall_s": self.elapsed_s(),
            "end_evals": self.evals,
        }


def evals_per_s(env: Any, num_ops: int, num_devices: int, *, batch: int = 16, seed: int = 0) -> float:
    """Simulated placements per second of ``env.step_times`` (after one warm-up batch)."""
    rng = np.random.default_rng(seed)
    op_devices = rng.integers(0, num_devices, size=(batch, num_ops)).astype(np.int32)
    env.step_times(op_devices[:1])
    t0 = time.perf_counter()
    env.step_times(op_devices)
    return batch / max(time.perf_counter() - t0, 1e-9)


def _run_rl(policy: str) -> Callable[..., None]:
    def run(graph: OpGraph, cluster: Any, rec: RecordingEnv, budget_s: float, rate: float, seed: int) -> None:
        with tempfile.TemporaryDirectory(prefix="placer-search-") as tmp:
            config = TrainConfig(
                cluster=cluster.name,
                policy=policy,
                time_budget_s=budget_s,
                seed=seed,
                warm_start="none",
                heuristics=(),
                progress=False,
                logdir=tmp,
                executor=getattr(rec, "executor", "eager"),
            )
            train(config, graph=graph, cluster=cluster, env=rec)

    return run


def _run_annealing(graph: OpGraph, cluster: Any, rec: RecordingEnv, budget_s: float, rate: float, seed: int) -> None:
    # The cooling schedule runs over `steps`: size it to what the budget can score.
    # Proposals near a single-GPU placement (the chain's start) are the cheapest to
    # simulate, random placements (``rate``) the dearest; the chain wanders between,
    # so take the geometric mean of the two rates. The time budget still ends it.
    anneal = get("annealing")
    gpus = cluster.gpu_indices() or [0]
    rng = np.random.default_rng(seed)
    proposals = np.full((64, graph.num_ops), gpus[0], dtype=np.int32)
    proposals[np.arange(64), rng.integers(0, graph.num_ops, size=64)] = rng.choice(gpus, size=64)
    rec.env.step_times(proposals[:1])
    t0 = time.perf_counter()
    rec.env.step_times(proposals)
    move_rate = len(proposals) / max(time.perf_counter() - t0, 1e-9)
    rec.restart()
    steps = max(int(0.9 * math.sqrt(move_rate * rate) * budget_s), 16)
    anneal(graph, cluster, seed=seed, steps=steps, time_budget_s=budget_s, init=(), env=rec)


def _run_random(graph: OpGraph, cluster: Any, rec: RecordingEnv, budget_s: float, rate: float, seed: int) -> None:
    rec.deadline_s = budget_s
    try:
        get("random_search")(graph, cluster, seed=seed, n=10**12, env=rec)  # stopped by the deadline
    except SearchBudgetExhausted:
        pass


def _warm_up_torch() -> None:
    """Pay torch's one-time lazy imports (Adam pulls in torch._dynamo: seconds) before any clock starts."""
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


RUNNERS: dict[str, Callable[..., None]] = {
    "rl-seq2seq": _run_rl("seq2seq"),
    "rl-hierarchical": _run_rl("hierarchical"),
    "annealing": _run_annealing,
    "random_search": _run_random,
}


def search_curves(
    graph: OpGraph,
    cluster: Any,
    *,
    budget_s: float,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    progress: Progress | None = None,
    executor: str = "eager",
) -> dict[str, Any]:
    """Run each method for ``budget_s`` seconds from scratch through a :class:`RecordingEnv`.

    Every method starts without heuristic help: RL without warm start, annealing
    from the best single GPU (``init=()``), random search. Returns
    ``{"graph", "cluster", "num_ops", "lower_bound_s", "reference": {name: s}, "evals_per_s", "curves": [...]}``
    where ``reference`` holds the expert's and m_etf's step times for context.
    """
    bad = [m for m in methods if m not in RUNNERS]
    if bad:
        raise PlacerError(f"--methods: unknown {', '.join(bad)} (known: {', '.join(RUNNERS)})")
    if budget_s <= 0:
        raise PlacerError(f"--budget {budget_s:g}: must be positive")
    say = progress or (lambda line: None)
    if any(m.startswith("rl-") for m in methods):
        _warm_up_torch()
    env = envs.SimEnv(graph, cluster, executor=executor)
    rate = evals_per_s(env, graph.num_ops, cluster.num_devices, seed=seed)
    reference = {}
    for name in ("expert", "m_etf"):
        r = env.simulate(registry.get(name)(graph, cluster, seed=seed))
        reference[name] = float(r.step_time_s) if r.ok else None
    out: dict[str, Any] = {
        "graph": graph.name,
        "cluster": cluster.name,
        "num_ops": graph.num_ops,
        "lower_bound_s": float(env.lower_bound()),
        "reference": reference,
        "evals_per_s": rate,
        "executor": executor,
        "budget_s": budget_s,
        "curves": [],
    }
    for method in methods:
        say(f"  {method}: {budget_s:g} s")
        rec = RecordingEnv(env)
        RUNNERS[method](graph, cluster, rec, budget_s, rate, seed)
        curve = rec.curve(graph.name, method)
        curve["lower_bound_s"] = out["lower_bound_s"]
        curve["reference_s"] = reference
        out["curves"].append(curve)
        best = f"{curve['best_s'][-1] * 1e3:.2f} ms" if curve["best_s"] else "no valid placement"
        say(f"    best {best} after {curve['end_evals']} evaluations in {curve['end_wall_s']:.0f} s")
    return out


def _first_at_or_below(curve: dict[str, Any], target: float | None) -> tuple[float, int] | None:
    if target is None:
        return None
    for w, e, b in zip(curve["wall_s"], curve["evals"], curve["best_s"]):
        if b <= target:
            return w, e
    return None


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """One line per (graph, method): evaluations, best step time, when it was reached, when it beat the expert."""
    lines = [
        "| graph | method | evaluated placements | evals/s | best step (ms) | reached at (s / evals) | beat "
        "expert at (s / evals) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        expert = res["reference"].get("expert")
        for c in res["curves"]:
            best = f"{c['best_s'][-1] * 1e3:.2f}" if c["best_s"] else "—"
            reached = f"{c['wall_s'][-1]:.1f} / {c['evals'][-1]:,}" if c["best_s"] else "—"
            beat = _first_at_or_below(c, expert)
            beat_s = f"{beat[0]:.1f} / {beat[1]:,}" if beat else "not reached"
            rate = c["end_evals"] / c["end_wall_s"] if c["end_wall_s"] > 0 else 0.0
            lines.append(
                f"| {res['graph']} | {c['method']} | {c['end_evals']:,} | {rate:.0f} | {best} | {reached} | {beat_s} |"
            )
    return "\n".join(lines)


def reference_lines(results: Sequence[dict[str, Any]]) -> str:
    """One line per graph: the bound and the reference heuristics."""
    out = []
    for res in results:
        refs = ", ".join(f"{k} {v * 1e3:.2f} ms" if v is not None else f"{k} OOM" for k, v in res["reference"].items())
        out.append(
            f"- {res['graph']} ({res['num_ops']:,} ops) on {res['cluster']}: lower bound "
            f"{res['lower_bound_s'] * 1e3:.2f} ms; {refs}; simulator {res['evals_per_s']:.0f} placements/s"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.time_to_placement", description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="nmt-2,inception-v3", help="comma-separated zoo names or graph files")
    parser.add_argument("--cluster", default="k80x4", help="cluster preset or JSON file (default k80x4)")
    parser.add_argument(
        "--budget", type=float, default=60.0, metavar="S", help="seconds per method and graph (default 60)"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help=f"default: {','.join(METHODS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the curves into this PNG")
    parser.add_argument("--json", action="store_true", help="print the curves as JSON instead of markdown")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        sources = parse_list(args.graphs, what="graphs")
        methods = parse_list(args.methods, what="methods", known=list(RUNNERS))
        cluster = envs.resolve_cluster(args.cluster)
        results = []
        for source in sources:
            graph = resolve_graph(source)
            graph.name = graph.name or os.path.splitext(os.path.basename(source))[0]
            say(f"{graph.name} ({graph.num_ops:,} ops) on {cluster.name}")
            results.append(
                search_curves(graph, cluster, budget_s=args.budget, methods=methods, seed=args.seed, progress=say)
            )
        if args.plot:
            from bench.plots import plot_search_curves

            plot_search_curves([c for r in results for c in r["curves"]], args.plot)
            say(f"{args.plot}: {os.path.getsize(args.plot) / 1024:.0f} KiB")
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"machine": machine_line(), "results": results}, indent=2))
    else:
        print(markdown_table(results))
        print()
        print(reference_lines(results))
        print(
            f"\nBudget {args.budget:g} s per method; every method from scratch; seed {args.seed}. "
            f"Machine: {machine_line()}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
