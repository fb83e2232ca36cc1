"""Random search: the best of ``n`` uniformly random placements, scored by the simulator.

``random_search``: each co-location group gets a device drawn uniformly from the
GPUs (``devices="gpus"``), from every device (``"all"``), or by default (``"auto"``) from the GPUs
when the model's training state fits them and from every device when it does not
(:func:`placer.methods.heuristics.costs.candidate_devices`).

``random_modules``: each *module* gets one, at every module depth that groups
the ops differently (:func:`graphs.module_tree.module_levels`), the ``n`` draws
shared round-robin among the depths. A layer per GPU is one such draw: on the
zoo's LSTMs this beats the list schedulers (BENCHMARKS.md, "Placing modules").
A graph that records no module paths has nothing to draw (status "needs module
paths" in ``placer compare``; a one-line error from ``placer place``).

The ``n`` placements are scored in batches with :meth:`envs.SimEnv.step_times`.
Placements that fit in memory beat those that do not; among those, the fastest
wins (:func:`scored_keys`). Deterministic for a seed.
"""

from __future__ import annotations

import numpy as np

import envs
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph, PlacerError
from graphs.module_tree import module_levels
from placer.methods.heuristics.costs import candidate_devices
from placer.methods.heuristics.groups import colocation_groups
from placer.methods.heuristics.ranking import scored_keys
from placer.methods.registry import HeuristicUnavailable, register

BATCH = 64


@register("random_search")
def random_search(
    graph: OpGraph, cluster, *, seed: int = 0, n: int = 1000, devices: str = "auto", env=None
) -> np.ndarray:
    """Best of ``n`` random placements of the co-location groups (``env``: a SimEnv to reuse, else one is built)."""
    return _best_of(
        graph, cluster, [colocation_groups(graph)], "random_search", seed=seed, n=n, devices=devices, env=env
    )


@register("random_modules")
def random_modules(
    graph: OpGraph, cluster, *, seed: int = 0, n: int = 1000, devices: str = "auto", env=None
) -> np.ndarray:
    """Best of ``n`` random placements of whole modules, the draws shared among the module depths."""
    levels = [lv.op_group.astype(np.int64) for lv in module_levels(schedule_graph(graph))]
    if not levels:
        raise HeuristicUnavailable(
            f"random_modules: {graph.name or 'the graph'} records no module paths to place by",
            status="needs module paths",
        )
    return _best_of(graph, cluster, levels, "random_modules", seed=seed, n=n, devices=devices, env=env)


def _best_of(
    graph: OpGraph, cluster, groupings: list[np.ndarray], name: str, *, seed: int, n: int, devices: str, env
) -> np.ndarray:
    """The best of ``n`` placements, draw ``i`` giving each group of ``groupings[i % len]`` a uniform device."""
    if n < 1:
        raise PlacerError(f"{name}: n must be >= 1, got {n}")
    env = env if env is not None else envs.SimEnv(graph, cluster)
    cand = candidate_devices(cluster, devices, graph)
    sizes = [int(g.max()) + 1 if len(g) else 0 for g in groupings]
    rng = np.random.default_rng(seed)
    best_key, best = (True, np.inf), None
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        op_devices = np.empty((k, graph.num_ops), dtype=np.int32)
        for j in range(k):
            which = (start + j) % len(groupings)
            op_devices[j] = cand[rng.integers(0, len(cand), size=sizes[which])][groupings[which]]
        for key, row in zip(scored_keys(env, op_devices, BATCH), op_devices):
            if key < best_key:
                best_key, best = key, row
    return best.astype(np.int32)
