"""Simulated annealing over single-group moves, scored by the simulator (FlexFlow's MCMC search).

FlexFlow searches its strategy space with Metropolis–Hastings: propose a random
change of one op's configuration, simulate, accept with probability
``min(1, exp(-beta * (new - current)))``; the best strategy seen is the answer.
Here a move sends one co-location group to another device; the cost is the
simulated step time, multiplied by ``1 + oom_penalty`` for placements that run
out of memory and by their worst peak / capacity (``graded_oom``), so that a
chain started out of memory has a slope toward fitting. The temperature,
relative to the starting cost, cools geometrically from ``t0`` to ``t0 / 100``
over the ``steps``. The answer is the best placement seen that fits, whatever
the chain's costs: the fastest that fits, or, when none did, the one closest to
fitting (:func:`~placer.methods.heuristics.ranking.placement_keys`).

The chain starts from the best of: every GPU alone, and the ``init`` heuristics
(FlexFlow starts from data parallelism or an expert strategy). Proposals are
simulated ``batch`` at a time from the current state; they are then tried in
order, and the first accepted one moves the chain (the rest are discarded, as
they were drawn from the old state). ``time_budget_s`` stops early; results are
deterministic for a seed unless that budget cuts the run short.

One block move joins the single-group moves when the plan is pipelined (the env
runs M > 1 microbatches; ``block_moves`` overrides): the last proposal of each
batch sends every group of input-free ops (:func:`graphs.ops.input_free_mask`:
masks, rotary tables, positions) to one device, the host included, and every
starting point and the final best are also tried with that block on each
device. Every stage reads those values; placed on a GPU, each microbatch's copy
of them to another GPU is a peer copy, a two-way barrier between the two
streams, which ties the source's stream to every stage's progress and
serialises the microbatches. From the host they are copies that wait for the
destination's queue only. Single moves rarely find this: one op moved alone
still leaves the others' barriers.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import envs
from graphs import OpGraph, PlacerError
from graphs.ops import input_free_mask
from placer.methods.heuristics.costs import candidate_devices
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.ranking import placement_keys
from placer.methods.registry import get, register


def cost(step_time_s: np.ndarray, oom: np.ndarray, penalty: float, over: np.ndarray | None = None) -> np.ndarray:
    """Step time, times ``1 + penalty`` when out of memory (and by the worst peak / capacity, when graded)."""
    factor = np.where(oom, 1.0 + penalty, 1.0)
    if over is not None:
        factor = factor * np.where(oom, np.maximum(over, 1.0), 1.0)
    return step_time_s * factor


def _starting_points(
    graph: OpGraph,
    cluster: Any,
    groups: np.ndarray,
    num_groups: int,
    cand: np.ndarray,
    init: tuple[str, ...],
    seed: int,
) -> np.ndarray:
    """Each candidate device alone, then the ``init`` heuristics' placements (a device per group: its first op's)."""
    starts = [np.full(num_groups, d, dtype=np.int64) for d in cand]
    first_op = np.unique(groups, return_index=True)[1]
    for name in init:
        starts.append(np.asarray(get(name)(graph, cluster, seed=seed), dtype=np.int64)[first_op])
    return np.stack(starts)


def _input_free_block(graph: OpGraph, groups: np.ndarray, num_groups: int) -> np.ndarray:
    """The groups whose every op is input-free (see the module doc): a block moved as one to any device."""
    free = input_free_mask(graph)
    if free is None or not free.any():
        return np.zeros(0, dtype=np.int64)
    whole = np.bincount(groups, weights=free, minlength=num_groups) == np.bincount(groups, minlength=num_groups)
    return np.flatnonzero(whole)


def _block_variants(rows: np.ndarray, block: np.ndarray, num_devices: int) -> np.ndarray:
    """``rows`` and each row with the block on each device in turn."""
    if not len(block):
        return rows
    out = np.repeat(rows, num_devices, axis=0)
    out[:, block] = np.tile(np.arange(num_devices), len(rows))[:, None]
    return np.concatenate([rows, out])


class _Best:
    """The best placement seen by :func:`~placer.methods.heuristics.ranking.placement_keys`: one that fits beats one
    that does not, whatever the chain's costs."""

    def __init__(self) -> None:
        self.key: tuple[bool, float] = (True, float("inf"))
        self.row: np.ndarray | None = None

    def offer(self, rows: np.ndarray, step_time_s: np.ndarray, oom: np.ndarray, over: np.ndarray) -> None:
        keys = placement_keys(step_time_s, oom, over)
        j = min(range(len(keys)), key=keys.__getitem__)
        if keys[j] < self.key:
            self.key, self.row = keys[j], rows[j].copy()


def _anneal(
    score: Callable[[np.ndarray], tuple],
    cur: np.ndarray,
    cur_cost: float,
    groups: np.ndarray,
    cand: np.ndarray,
    block: np.ndarray,
    num_devices: int,
    best: _Best,
    *,
    steps: int,
    batch: int,
    t0: float,
    oom_penalty: float,
    graded: bool,
    rng: np.random.Generator,
    deadline: float | None,
) -> None:
    """The Markov chain from ``cur``: batches of single-group moves (and a block move), Metropolis acceptance; offers
    ``best`` every placement."""
    num_groups = len(cur)
    scale = max(cur_cost, 1e-12)
    done = 0
    while done < steps and len(cand) > 1:
        if deadline is not None and time.perf_counter() > deadline:
            break
        b = min(batch, steps - done)
        temp = t0 * (0.01 ** (done / max(steps, 1))) * scale
        g = rng.integers(0, num_groups, size=b)
        shift = rng.integers(1, len(cand), size=b)  # a different device, uniformly
        pos = np.searchsorted(cand, cur[g])
        new_dev = cand[(pos + shift) % len(cand)]
        props = np.repeat(cur[None, :], b, axis=0)
        props[np.arange(b), g] = new_dev
        if len(block):
            props[-1] = cur  # last: tried after the single moves (the first accepted proposal moves the chain)
            props[-1, block] = rng.integers(0, num_devices)
        step_time_s, oom, over = score(props[:, groups].astype(np.int32))
        c = cost(step_time_s, oom, oom_penalty, over if graded else None)
        u = rng.random(b)
        done += b
        best.offer(props, step_time_s, oom, over)
        for j in range(b):
            if c[j] <= cur_cost or u[j] < np.exp(-(c[j] - cur_cost) / temp):
                cur, cur_cost = props[j].copy(), float(c[j])
                break


@register("annealing")
def annealing(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    steps: int = 2000,
    time_budget_s: float | None = None,
    t0: float = 0.05,
    batch: int = 16,
    devices: str = "auto",
    init: tuple[str, ...] = ("m_etf", "expert"),
    oom_penalty: float = 10.0,
    env=None,
    order: str | None = None,
    block_moves: bool | None = None,
    graded_oom: bool = True,
) -> np.ndarray:
    """MCMC placement search; ``steps`` simulated proposals at most.

    ``order="planned"`` scores every proposal in its planned issue order
    (``SimEnv.step_times(..., order="planned")``), as ``placer train`` does with
    ``score_order="planned"``; None: node order. ``graded_oom`` (default on): an
    out-of-memory placement's cost also grows with its worst peak over capacity,
    so moves that bring it closer to fitting are taken (off, a chain started out
    of memory on a d=2048 encoder never left it; on the zoo it changes nothing). ``devices``: where a
    group may move (:func:`placer.methods.heuristics.costs.candidate_devices`; by default the GPUs, and the
    host too when the model's training state does not fit them).
    """
    if steps < 0 or batch < 1:
        raise PlacerError(f"annealing: steps must be >= 0 and batch >= 1 (got {steps}, {batch})")
    start_clock = time.perf_counter()
    env = env if env is not None else envs.SimEnv(graph, cluster)
    graded = bool(graded_oom)
    kw = {} if order is None else {"order": order}

    def score(op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return env.overflow(op_devices, **kw)

    cand = candidate_devices(cluster, devices, graph)
    groups = colocation_groups(graph)
    num_groups = int(groups.max()) + 1 if len(groups) else 0
    if num_groups == 0:
        return np.zeros(0, dtype=np.int32)
    starts = _starting_points(graph, cluster, groups, num_groups, cand, init, seed)
    pipelined = block_moves if block_moves is not None else getattr(env, "microbatches", 1) > 1
    block = _input_free_block(graph, groups, num_groups) if pipelined else np.zeros(0, dtype=np.int64)
    group_devices = _block_variants(starts, block, cluster.num_devices)  # a device per group, per starting point
    step_time_s, oom, over = score(group_devices[:, groups].astype(np.int32))
    best = _Best()
    best.offer(group_devices, step_time_s, oom, over)
    costs = cost(step_time_s, oom, oom_penalty, over if graded else None)
    k = int(np.argmin(costs))
    deadline = start_clock + time_budget_s if time_budget_s is not None else None
    _anneal(
        score,
        group_devices[k].copy(),
        float(costs[k]),
        groups,
        cand,
        block,
        cluster.num_devices,
        best,
        steps=steps,
        batch=batch,
        t0=t0,
        oom_penalty=oom_penalty,
        graded=graded,
        rng=np.random.default_rng(seed),
        deadline=deadline,
    )
    if len(block):  # the best found, with the block on each device
        finals = _block_variants(best.row[None], block, cluster.num_devices)
        best.offer(finals, *score(finals[:, groups].astype(np.int32)))
    return best.row[groups].astype(np.int32)
