"""The paper's Table 1 in our simulator: heuristics, RL and the bound per (model, cluster).

One :class:`Table1Row` per graph and cluster holds what ``python -m bench.reproduce_paper``
prints: the single-CPU and single-GPU step times, Scotch, METIS, the expert, the
best of the other heuristics (named), the two RL policies (seq2seq and
hierarchical, each trained for a time budget by :func:`placer.learn.loop.train`), the
lower bound, and the RL speed-ups. A speed-up is the paper's: the step-time
reduction of the better RL placement relative to a reference, in percent
(``100 * (t_ref - t_rl) / t_ref``; negative when RL is slower).

>>> row = Table1Row(graph="g", num_ops=3, cluster="k80x2", lower_bound_s=0.5,
...                 baselines={"expert": 1.0, "heft": 0.8}, rl={"seq2seq": 0.6})
>>> row.best_heuristic(), round(row.rl_speedup_pct("expert"), 1), round(row.rl_speedup_pct(), 1)
(('heft', 0.8), 40.0, 25.0)
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

import envs
from bench.common import Progress, machine_line
from graphs import OpGraph
from graphs.sources import resolve_graph
from placer.compare import compare
from placer.learn.config import TrainConfig
from placer.learn.loop import train
from placer.methods import best_heuristic

PAPER_GRAPHS = ("rnnlm", "nmt-2", "nmt-4", "inception-v3")
PAPER_CLUSTERS = ("k80x2", "k80x4")
MODERN_CLUSTERS = ("v100x4", "h100x8")
RL_POLICIES = ("seq2seq", "hierarchical")
#: Heuristics with a column of their own (the paper's Scotch, min-cut and expert).
NAMED_COLUMNS = ("scotch", "metis", "expert", "ilp")
#: Rows of ``compare`` that are not a heuristic to compare with (the single-device columns cover "single").
NOT_A_HEURISTIC = ("single",)


@dataclass
class Table1Row:
    """One model on one cluster. Times are simulated seconds; None: no valid placement.

    Attributes:
        baselines: heuristic name -> step time (None if it failed or ran out of memory).
        statuses: heuristic or column name -> status when not ``ok`` (``oom``, ``error``...).
        rl: policy name -> best step time found in the budget.
        rl_runs: policy name -> :meth:`placer.learn.state.TrainResult.to_dict` (minus paths).
    """

    graph: str
    num_ops: int
    cluster: str
    lower_bound_s: float
    single_cpu_s: float | None = None
    single_gpu_s: float | None = None
    baselines: dict[str, float | None] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    rl: dict[str, float | None] = field(default_factory=dict)
    rl_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    compare_s: float = 0.0

    def best_heuristic(self, exclude: Sequence[str] = ()) -> tuple[str, float] | None:
        """(name, step time) of the fastest heuristic not in ``exclude``."""
        return best_heuristic(self.baselines, exclude=(*exclude, *NOT_A_HEURISTIC))

    def best_other(self) -> tuple[str, float] | None:
        """The best heuristic that has no column of its own."""
        return self.best_heuristic(exclude=NAMED_COLUMNS)

    def best_rl(self) -> tuple[str, float] | None:
        ok = {p: t for p, t in self.rl.items() if t is not None}
        return min(ok.items(), key=lambda kv: kv[1]) if ok else None

    def rl_speedup_pct(self, reference: str | None = None) -> float | None:
        """Step-time reduction of the best RL placement over ``reference`` (None: the best heuristic), in %."""
        rl = self.best_rl()
        if reference is None:
            best = self.best_heuristic()
            ref = best[1] if best else None
        else:
            ref = self.baselines.get(reference)
        if rl is None or ref is None or ref <= 0:
            return None
        return 100.0 * (ref - rl[1]) / ref

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        best, other, rl = self.best_heuristic(), self.best_other(), self.best_rl()
        out.update(
            best_heuristic=best[0] if best else None,
            best_heuristic_s=best[1] if best else None,
            best_other=other[0] if other else None,
            best_other_s=other[1] if other else None,
            best_rl=rl[0] if rl else None,
            best_rl_s=rl[1] if rl else None,
            rl_speedup_over_expert_pct=self.rl_speedup_pct("expert"),
            rl_speedup_over_best_heuristic_pct=self.rl_speedup_pct(),
        )
        return out


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _singles(
    graph: OpGraph, cluster: Any, executor: str = "eager"
) -> tuple[tuple[float | None, str], tuple[float | None, str]]:
    """((step, status) of everything on cpu:0, the same on the first GPU)."""
    env = envs.SimEnv(graph, cluster, executor=executor)
    gpus = cluster.gpu_indices()
    cpu = cluster.host_indices()
    out = []
    for devs in (cpu, gpus):
        if not devs:
            out.append((None, "no such device"))
            continue
        r = env.simulate(np.full(graph.num_ops, devs[0], dtype=np.int32))
        out.append((_finite(r.step_time_s) if r.ok else None, r.status))
    return out[0], out[1]


def table1_row(
    graph: OpGraph,
    cluster: Any,
    *,
    rl_budget_s: float | None = 60.0,
    rl_iterations: int | None = None,
    policies: Sequence[str] = RL_POLICIES,
    seed: int = 0,
    warm_start: str = "best",
    logdir: str | None = None,
    compare_options: dict[str, dict[str, Any]] | None = None,
    progress: Progress | None = None,
    executor: str = "dataflow",
) -> Table1Row:
    """Score every heuristic with :func:`placer.compare.compare`, then train each RL policy.

    Args:
        graph: the op graph; cluster: an :class:`envs.Cluster`.
        rl_budget_s: seconds per RL run (warm start included); rl_iterations: or a
            fixed number of iterations (either may be None, not both).
        policies: RL policies to train (names in ``policies.POLICIES``).
        warm_start: ``"best"`` (imitate the best heuristic first, the ``placer
            train`` default) or ``"none"`` (from scratch, as in the paper).
        logdir: where the runs' TensorBoard logs go (None: a temporary directory).
        compare_options: per-heuristic options for ``compare``.
        executor: the simulator's executor model; ``"dataflow"`` by default, the
            paper's TensorFlow setting that Table 1 was measured in.
    """
    say = progress or (lambda line: None)
    t0 = time.perf_counter()
    report = compare(graph, cluster, seed=seed, options=compare_options, executor=executor)
    row = Table1Row(
        graph=graph.name, num_ops=graph.num_ops, cluster=cluster.name, lower_bound_s=float(report.lower_bound_s)
    )
    for r in report.rows:
        if r.kind != "heuristic":
            continue
        row.baselines[r.method] = _finite(r.step_time_s) if r.status == "ok" else None
        if r.status != "ok":
            row.statuses[r.method] = r.status
    (row.single_cpu_s, cpu_status), (row.single_gpu_s, gpu_status) = _singles(graph, cluster, executor)
    for col, status in (("single_cpu", cpu_status), ("single_gpu", gpu_status)):
        if status != "ok":
            row.statuses[col] = status
    row.compare_s = time.perf_counter() - t0
    best = row.best_heuristic()
    say(
        f"  heuristics scored in {row.compare_s:.1f} s; best {best[0]} {best[1] * 1e3:.2f} ms"
        if best
        else f"  heuristics scored in {row.compare_s:.1f} s; none found a valid placement"
    )
    with tempfile.TemporaryDirectory(prefix="placer-table1-") as tmp:
        root = logdir or tmp
        for policy in policies:
            config = TrainConfig(
                cluster=cluster.name,
                policy=policy,
                seed=seed,
                time_budget_s=rl_budget_s,
                iterations=rl_iterations,
                warm_start=warm_start,
                executor=executor,
                heuristics=(best[0],) if best and warm_start == "best" else (),
                progress=False,
                logdir=os.path.join(root, f"{graph.name or 'graph'}-{cluster.name}-{policy}"),
            )
            result = train(config, graph=graph, cluster=cluster)
            row.rl[policy] = _finite(result.best_step_time_s)
            run = result.to_dict()
            for key in ("logdir", "best_placement", "heuristics"):
                run.pop(key, None)
            if logdir:
                run["logdir"] = config.logdir
            row.rl_runs[policy] = run
            shown = f"{row.rl[policy] * 1e3:.2f} ms" if row.rl[policy] is not None else "no valid placement"
            say(f"  RL {policy}: {shown} after {result.iterations} iterations in {result.elapsed_s:.0f} s")
    return row


def run_table1(
    graphs: Sequence[str],
    clusters: Sequence[str],
    *,
    progress: Progress | None = None,
    **options: Any,
) -> list[Table1Row]:
    """:func:`table1_row` for every (graph SOURCE, cluster) pair, graphs outer."""
    say = progress or (lambda line: None)
    resolved_clusters = [envs.resolve_cluster(c) for c in clusters]
    rows = []
    total = len(graphs) * len(clusters)
    for gname in graphs:
        graph = resolve_graph(gname)
        if not graph.name:
            graph.name = os.path.splitext(os.path.basename(gname))[0]
        for cluster in resolved_clusters:
            say(f"[{len(rows) + 1}/{total}] {graph.name} ({graph.num_ops:,} ops) on {cluster.name}")
            rows.append(table1_row(graph, cluster, progress=progress, **options))
    return rows


# ------------------------------------------------------------------ formatting
def _ms(t: float | None, status: str | None = None) -> str:
    if t is None:
        return {"oom": "OOM", None: "—"}.get(status, status or "—")
    return f"{t * 1e3:.4g}"


def _pct(p: float | None) -> str:
    return "—" if p is None else f"{p:+.1f}%"


def _rl_cell(r: Table1Row, policy: str) -> str:
    if policy not in r.rl:
        return "not run"
    if r.rl[policy] is None and r.rl_runs.get(policy, {}).get("iterations") == 0:
        return "none (0 iterations)"  # the warm start used up the budget
    return _ms(r.rl[policy])


def markdown_table(rows: Sequence[Table1Row]) -> str:
    """Table 1 as markdown: one line per (model, cluster), step times in ms."""
    head = (
        "| model | ops | cluster | single CPU | single GPU | Scotch | METIS | expert | ILP (CP-SAT) | best "
        "other heuristic "
        "| RL seq2seq | RL hierarchical | lower bound | RL vs expert | RL vs best heuristic |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        other = r.best_other()
        best = r.best_heuristic()
        other_s = f"{other[0]} {_ms(other[1])}" if other else "—"
        if other and best and best[0] == other[0]:
            other_s = f"**{other_s}**"
        cells = [
            r.graph,
            f"{r.num_ops:,}",
            r.cluster,
            _ms(r.single_cpu_s, r.statuses.get("single_cpu")),
            _ms(r.single_gpu_s, r.statuses.get("single_gpu")),
            *[
                _ms(r.baselines.get(m), r.statuses.get(m, "n/a" if m not in r.baselines else None))
                for m in NAMED_COLUMNS
            ],
            other_s,
            *[_rl_cell(r, p) for p in RL_POLICIES],
            _ms(r.lower_bound_s),
            _pct(r.rl_speedup_pct("expert")),
            _pct(r.rl_speedup_pct()),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def markdown_report(
    rows: Sequence[Table1Row], *, budget_s: float | None, warm_start: str, seed: int, command: str = ""
) -> str:
    """The tables split into the paper's clusters and the others, with how they were made."""
    paper = [r for r in rows if r.cluster in PAPER_CLUSTERS]
    other = [r for r in rows if r.cluster not in PAPER_CLUSTERS]
    parts = []
    if paper:
        parts += ["#### The paper's machines (1 CPU + 2 or 4 K80)", "", markdown_table(paper), ""]
    if other:
        parts += ["#### Modern machines", "", markdown_table(other), ""]
    how = (
        f"Simulated step times in ms (lower is better); OOM: does not fit in memory. "
        f"RL: best placement found in {budget_s:g} s of training per policy"
        if budget_s is not None
        else "Simulated step times in ms (lower is better); OOM: does not fit in memory. RL: best placement found"
    )
    how += (
        f" ({'warm-started by imitating the best heuristic' if warm_start == 'best' else 'trained from scratch'}, "
        f"seed {seed}). Best other heuristic: the fastest heuristic without a column of its own (bold when it is "
        "the best heuristic overall). Speed-ups: step-time reduction of the better RL policy, in %."
    )
    parts += [how, "", f"Machine: {machine_line()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."]
    if command:
        parts += ["", f"Command: `{command}`"]
    return "\n".join(parts)
