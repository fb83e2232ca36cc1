"""Module search: local search over whole modules, scored by the simulator.

``random_modules`` draws a GPU per module and keeps the best draw. This heuristic
spends the same budget of simulated placements (``n``) on search instead: at
each module depth that groups the ops differently
(:func:`graphs.module_tree.module_levels`, taken in turn), the best of ``starts``
uniform draws is improved by steepest descent (:func:`descend`): every move of
one module to another GPU is simulated in one batch, the best one is taken if
it is faster, until none is or the budget is spent. Then the next depth gets a
fresh start, and so on round-robin until ``n`` placements have been simulated.

On the zoo's LSTMs a layer per GPU is the known good structure, and moving one
layer at a time from a random layer-per-device draw finds better ones than
uniform draws alone: BENCHMARKS.md, "Module search". :func:`descend` is also
how ``placer place --method learned`` refines the policy's decodes
(:func:`placer.methods.learned.place_learned`).

Placements that fit in memory beat those that do not; among those, the fastest
wins, and among placements out of memory the one closest to fitting, so a descent
started out of memory moves toward fitting (:func:`scored_keys`). Deterministic for a seed. A graph that records no
module paths has nothing to search (status "needs module paths").
"""

from __future__ import annotations

import time

import numpy as np

import envs
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph, PlacerError
from graphs.module_tree import module_levels
from placer.methods.heuristics.costs import candidate_devices
from placer.methods.heuristics.ranking import scored_keys
from placer.methods.registry import HeuristicUnavailable, register


def descend(
    env,
    op_group: np.ndarray,
    group_devices: np.ndarray,
    devices: np.ndarray,
    budget: int,
    *,
    key: tuple[bool, float] | None = None,
    rng: np.random.Generator | None = None,
    deadline: float | None = None,
) -> tuple[np.ndarray, tuple[bool, float], int]:
    """Steepest descent over single-group moves: ``(group devices, their key, placements simulated)``.

    ``op_group[i]`` is op i's group and ``group_devices[g]`` group g's device
    index; a move sends one group to another of ``devices``. Each round
    simulates every move (the ones of a round that the remaining ``budget``
    allows, in ``rng``'s order when given, else in order) and takes the best
    if it beats the current placement, keyed by :func:`scored_keys` (out of
    memory, then step time, or for placements out of memory how far over).
    ``key``: the start's, when already known (else it is simulated first).
    ``deadline``: a :func:`time.perf_counter` time after which no new round starts.

    >>> import envs
    >>> from graphs.ir import OpGraph
    >>> g = OpGraph.from_edges(["a", "b"], [], flops=[4e12, 4e12])
    >>> c = envs.Cluster.preset("k80x2")
    >>> gpus = np.asarray(c.gpu_indices())
    >>> group_devices, key, used = descend(envs.SimEnv(g, c), np.arange(2), np.array([gpus[0], gpus[0]]), gpus, 100)
    >>> len(set(group_devices.tolist())), used   # the two independent ops end up apart: 1 start + 2 rounds of 2 moves
    (2, 5)
    """
    current = np.asarray(group_devices, dtype=np.int64).copy()
    devices = np.asarray(devices, dtype=np.int64)
    used = 0
    if key is None:
        if budget < 1:
            raise PlacerError("descend: the budget must allow simulating the start")
        key = scored_keys(env, current[op_group][None])[0]
        used = 1
    while used < budget and (deadline is None or time.perf_counter() < deadline):
        moves = np.asarray(
            [(k, d) for k in range(len(current)) for d in devices if d != current[k]], dtype=np.int64
        ).reshape(-1, 2)
        if not len(moves):
            break
        if rng is not None:
            moves = moves[rng.permutation(len(moves))]
        moves = moves[: budget - used]
        cand = np.repeat(current[None], len(moves), axis=0)
        cand[np.arange(len(moves)), moves[:, 0]] = moves[:, 1]
        keys = scored_keys(env, cand[:, op_group])
        used += len(moves)
        j = min(range(len(keys)), key=keys.__getitem__)
        if not keys[j] < key:
            break
        current, key = cand[j], keys[j]
    return current, key, used


@register("module_search")
def module_search(
    graph: OpGraph,
    cluster,
    *,
    seed: int = 0,
    n: int = 1000,
    starts: int = 16,
    devices: str = "auto",
    env=None,
    deadline: float | None = None,
) -> np.ndarray:
    """Steepest descent over whole modules from uniform starts, ``n`` simulated placements in all.

    ``deadline``: a :func:`time.perf_counter` time after which no new round starts (the first always runs).
    ``devices``: where a module may go (:func:`placer.methods.heuristics.costs.candidate_devices`; by default
    the GPUs, and the host too when the model's training state does not fit them).
    """
    if n < 1 or starts < 1:
        raise PlacerError(f"module_search: n and starts must be >= 1, got n={n}, starts={starts}")
    levels = [lv.op_group.astype(np.int64) for lv in module_levels(schedule_graph(graph))]
    if not levels:
        raise HeuristicUnavailable(
            f"module_search: {graph.name or 'the graph'} records no module paths to search", status="needs module paths"
        )
    env = env if env is not None else envs.SimEnv(graph, cluster)
    cand = np.asarray(candidate_devices(cluster, devices, graph), dtype=np.int64)
    rng = np.random.default_rng(seed)
    best_key, best, used, r = (True, float("inf")), None, 0, 0
    while used < n and (r == 0 or deadline is None or time.perf_counter() < deadline):
        g = levels[r % len(levels)]
        r += 1
        draws = cand[rng.integers(0, len(cand), size=(min(starts, n - used), int(g.max()) + 1))]
        keys = scored_keys(env, draws[:, g])
        used += len(draws)
        j = min(range(len(keys)), key=keys.__getitem__)
        op_group_devices, key, spent = descend(
            env, g, draws[j], cand, n - used, key=keys[j], rng=rng, deadline=deadline
        )
        used += spent
        if key < best_key:
            best_key, best = key, op_group_devices[g]
        if len(cand) < 2:  # one device: every round would draw the one placement again, until n or the deadline
            break
    return np.asarray(best, dtype=np.int32)
