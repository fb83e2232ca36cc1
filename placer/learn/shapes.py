"""``placer train --ranks --choose-shape``: the pipeline's shape (M microbatches, W in flight) chosen before the run.

A plan across processes runs one shape: M and W decide how much of the pipeline's
bubble is filled, what each microbatch's ops cost (a dense layer reads its whole
weight for every microbatch) and how many activations a rank holds. The move search
keeps the run's shape and moves ops, so a run given one shape cannot find a plan of
another. Before the run, each shape of :data:`envs.sim.ranks.PIPELINE_SHAPES` is
scored by the pipeline splits (:data:`SPLITS`: fast, and made for pipelines) on the
simulator of ranks, and the run takes the shape of the fastest split. The choice
runs before the run's clock starts, as the heuristics' scoring does, and the
placements it simulated are counted with the heuristics' (so the equal-budget search
is given them too); they and its seconds are in ``shapes.json`` (``simulated``,
``wall_s``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envs.cluster import Cluster
from envs.sim.ranks import PIPELINE_SHAPES
from graphs import OpGraph, PlacerError
from placer.learn.config import TrainConfig
from placer.learn.progress import Progress, ms

#: The run directory's record of the choice (:meth:`ShapeChoice.to_dict`).
SHAPES_JSON = "shapes.json"

#: The splits that score each shape: torchtitan's default, the FLOPs- and parameter-balanced splits, and the search
#: over stage boundaries on the simulator of ranks.
SPLITS = ("equal_layers", "flops_balanced", "parameters_balanced", "stage_search")


@dataclass
class ShapeChoice:
    """The shape a run takes, and every shape's fastest split."""

    microbatches: int
    inflight: int | None
    """None: all M in flight (fill-drain)."""
    rows: list[dict[str, Any]]
    """per shape: ``microbatches``, ``inflight``, ``step_time_s`` (inf: no split runs) and its ``method``."""
    simulated: int
    """placements the splits simulated, over every shape."""
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def split_table(graph: OpGraph, cluster: Cluster, methods: Sequence[str] = SPLITS, seed: int = 0) -> list[dict]:
    """Every split of ``methods`` at every shape of :data:`PIPELINE_SHAPES`, scored on the simulator of ranks.

    One row per method and shape, shapes in their order: ``method``, ``microbatches``, ``inflight`` (None: all M
    in flight), ``step_time_s`` (inf: the split does not run at that shape), ``placement`` (None likewise),
    ``simulated`` (placements the method simulated there) and ``message`` (why not, where it does not run).
    What ``--choose-shape`` chooses from, and what ``bench.rank_splits`` takes each method's fastest plan from.
    """
    from placer.compare import compare  # the heuristics and the simulators: only when a table is made

    rows = []
    for M, W in PIPELINE_SHAPES:
        report = compare(graph, cluster, methods=list(methods), seed=seed, microbatches=M, inflight=W, ranks=True)
        for r in report.rows:
            if r.kind != "heuristic":
                continue
            ok = r.status == "ok" and r.step_time_s is not None
            rows.append(
                {
                    "method": r.method,
                    "microbatches": M,
                    "inflight": None if W == M else W,
                    "step_time_s": float(r.step_time_s) if ok else float("inf"),
                    "placement": r.placement if ok else None,
                    "simulated": r.simulated,
                    "message": "" if ok else (r.message or r.status),
                }
            )
    return rows


def fastest(rows: Sequence[dict], key: Callable[[dict], Any]) -> dict[Any, dict]:
    """The fastest row of :func:`split_table`'s ``rows`` per ``key`` (a shape, a method...), in first-seen order of
    the keys; a key none of whose rows runs keeps its first row (``step_time_s`` inf).

    >>> rows = [{"m": "a", "step_time_s": 2.0}, {"m": "b", "step_time_s": float("inf")}, {"m": "a", "step_time_s": 1.0}]
    >>> {k: r["step_time_s"] for k, r in fastest(rows, lambda r: r["m"]).items()}
    {'a': 1.0, 'b': inf}
    """
    best: dict[Any, dict] = {}
    for r in rows:
        k = key(r)
        if k not in best or r["step_time_s"] < best[k]["step_time_s"]:
            best[k] = r
    return best


def choose_shape(graph: OpGraph, cluster: Cluster, config: TrainConfig, progress: Progress) -> ShapeChoice:
    """Score :data:`SPLITS` at every shape of :data:`PIPELINE_SHAPES` that ``cluster`` can hold, on the simulator of
    ranks (:func:`split_table`); the shape of the fastest. Raises :class:`PlacerError` when no split runs at any
    shape."""
    t0 = time.perf_counter()
    progress.phase(f"choosing the pipeline's shape: {len(PIPELINE_SHAPES)} shapes (M, W), each scored by the splits")
    table = split_table(graph, cluster, SPLITS, seed=config.seed)
    per_shape = fastest(table, lambda r: (r["microbatches"], r["inflight"])).values()
    rows = [
        {k: r[k] for k in ("microbatches", "inflight", "step_time_s")}
        | {"method": r["method"] if r["placement"] is not None else None}
        for r in per_shape
    ]
    simulated = sum(r["simulated"] for r in table)
    chosen = min(rows, key=lambda r: r["step_time_s"])
    if chosen["method"] is None:
        raise PlacerError(f"--choose-shape: no pipeline split of {graph.name or 'the graph'} runs on {cluster.name}")
    shapes = ", ".join(
        f"M={r['microbatches']}" + (f" W={r['inflight']}" if r["inflight"] else "") + f" {ms(r['step_time_s'])}"
        for r in rows
    )
    progress.phase(
        f"pipeline shape: M={chosen['microbatches']}"
        + (f", W={chosen['inflight']}" if chosen["inflight"] else "")
        + f" ({chosen['method']} {ms(chosen['step_time_s'])}); every shape's fastest split: {shapes}"
    )
    return ShapeChoice(chosen["microbatches"], chosen["inflight"], rows, simulated, time.perf_counter() - t0)


def with_shape(config: TrainConfig, choice: ShapeChoice) -> TrainConfig:
    """``config`` at the chosen shape, the choice made (a resumed run keeps the shape of its checkpoint)."""
    return dataclasses.replace(config, microbatches=choice.microbatches, inflight=choice.inflight, choose_shape=False)


__all__ = ["SHAPES_JSON", "SPLITS", "ShapeChoice", "choose_shape", "fastest", "split_table", "with_shape"]
