"""Zero-shot placement with a pretrained graph-network policy: ``placer place --method learned``.

The policy (:mod:`policies.gnn`, shipped in ``policies/pretrained/``) decodes the
ops, the graph coarsened to a few group counts and the graph grouped by module at
each depth (:func:`policies.views.group_views`); the best decodes are refined by
steepest descent over their groups (:func:`placer.methods.heuristics.module_search.descend`),
and the best on the simulator is kept, with its planned issue order.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Sequence

import numpy as np
import torch

import envs
from envs.sim.sim_graph import schedule_graph
from graphs import OpGraph
from graphs.plan import Placement
from placer.methods.heuristics.costs import candidate_devices
from placer.methods.heuristics.module_search import descend
from placer.methods.heuristics.ranking import scored_keys
from placer.methods.registry import placement_of
from policies import policy_file as pf
from policies.gnn import GNNPolicy
from policies.views import group_views

#: ``placer place --method learned`` defaults: group counts decoded besides the ops, and samples per group count.
ZERO_SHOT_GROUPS: tuple[int | str, ...] = (128, 256, 512, "modules")


ZERO_SHOT_SAMPLES = 48


#: Temperatures of the samples of each module view (``samples`` at each): the policy's own distribution, and one
#: spread over more devices, which found the held-out LSTMs' layer-per-GPU placements (BENCHMARKS.md, "Placing
#: modules").
ZERO_SHOT_MODULE_TEMPERATURES = (1.0, 4.0)


#: Placements simulated to refine the best decodes by steepest descent over their groups
#: (:func:`placer.methods.heuristics.module_search.descend`), and the largest view (in groups) refined.
ZERO_SHOT_REFINE = 1000


ZERO_SHOT_REFINE_MAX_ITEMS = 128


#: Seconds after which the refinement starts no new round (a 20,000-op graph simulates ~300 placements a second).
ZERO_SHOT_REFINE_TIME_S = 2.0


def place_learned(
    graph: OpGraph,
    cluster: Any,
    *,
    policy_file: str | None = None,
    samples: int = ZERO_SHOT_SAMPLES,
    groups: Sequence[int | str] = ZERO_SHOT_GROUPS,
    seed: int = 0,
    module_temperatures: Sequence[float] = ZERO_SHOT_MODULE_TEMPERATURES,
    refine: int = ZERO_SHOT_REFINE,
    refine_time_s: float = ZERO_SHOT_REFINE_TIME_S,
) -> Placement:
    """Zero-shot placement with a pretrained policy: the best on the simulator of several decodes.

    The policy decodes the ops (greedy), the co-location groups of
    ``graphs.grouping.coarsen`` at each count in ``groups``, and, for the entry
    ``"modules"``, the graph grouped by module at each depth that gives a distinct
    partition (:func:`graphs.module_tree.module_levels`): greedy plus ``samples``
    samples each (a count that gives as many groups as one already decoded is
    skipped); a module view gets ``samples`` at each of ``module_temperatures``
    (:meth:`policies.gnn.GNNPolicy.decode`). With no ``groups``, the ops get the ``samples`` samples.
    A group decode is 5-20x cheaper than an op decode on graphs of thousands of
    ops, and its samples were the better ones on every held-out graph measured
    (BENCHMARKS.md, "Pretrained gnn policy"); the module views place a layer
    per item, which held-out LSTMs need (BENCHMARKS.md, "Placing modules");
    the op-level greedy placement is the policy exactly as pretrained.

    Then ``refine`` more placements are simulated to improve the decodes by
    steepest descent over their view's groups (one group moved to another GPU
    at a time; :func:`placer.methods.heuristics.module_search.descend`): the best decode
    of each view of at most :data:`ZERO_SHOT_REFINE_MAX_ITEMS` groups in turn,
    best view first, then each view's second best, and so on until the budget
    is spent, or ``refine_time_s`` has passed (then the result depends on the
    machine's speed; ``meta["refine_stopped"]`` says which ended it). The
    ``module_search`` heuristic is the same descent from uniform draws; given as
    many simulated placements it is what this refinement is measured against
    (``bench/zero_shot.py``). ``refine=0`` keeps the best decode.

    Returns a :class:`placer.Placement` (method ``learned``) whose meta records the policy file and timings.
    """
    t0 = time.perf_counter()
    loaded = pf.load(policy_file)
    levels = [g for g in groups if g == "modules" or int(g) > 0]
    op_devices, found_by, view_of, groupings = _decodes(
        graph, cluster, loaded.net, levels, samples, seed, module_temperatures
    )
    env = envs.SimEnv(graph, cluster)
    keys = scored_keys(env, op_devices)
    step_time_s = np.asarray([np.inf if failed else x for failed, x in keys])
    j = int(np.argmin(step_time_s))
    greedy_t, decode_t = step_time_s[0], step_time_s[j]
    best, best_key, best_how = op_devices[j], keys[j], found_by[j]
    refined, stopped = 0, "off"
    if refine > 0:
        deadline = time.perf_counter() + float(refine_time_s)
        best, best_key, best_how, refined = _refine(
            env,
            cluster,
            op_devices,
            keys,
            found_by,
            view_of,
            groupings,
            refine,
            np.random.default_rng(seed),
            (best, best_key, best_how),
            deadline,
        )
        stopped = "budget" if refined >= refine else "time" if time.perf_counter() >= deadline else "no start left"
    step = best_key[1] if not best_key[0] else float("inf")
    meta = {
        "policy_file": loaded.path,
        "samples": samples,
        "groups": levels,
        "seed": seed,
        "found_by": best_how,
        "module_temperatures": [float(t) for t in module_temperatures],
        "decodes": len(op_devices),
        "refine": int(refine),
        "refine_simulated": int(refined),
        "refine_time_s": float(refine_time_s),
        "refine_stopped": stopped,
        "node_order_step_time_s": float(step) if np.isfinite(step) else None,
        "decode_step_time_s": float(decode_t) if np.isfinite(decode_t) else None,
        "greedy_step_time_s": float(greedy_t) if np.isfinite(greedy_t) else None,
        "place_time_s": None,
    }
    placement = placement_of(best, graph, cluster, "learned", meta=meta, plan=env)
    placement.meta["place_time_s"] = time.perf_counter() - t0  # the issue order's planning included
    return placement


def _decodes(
    graph: OpGraph,
    cluster: Any,
    net: Any,
    levels: list[int | str],
    samples: int,
    seed: int,
    module_temperatures: Sequence[float],
) -> tuple[np.ndarray, list[str], list[int], list[np.ndarray | None]]:
    """Every decode of every view: ``(op devices [K, num_ops], how each was found, its view, each view's op ->
    group)``."""
    cand, found_by, items_seen = [], [], set()
    view_of, groupings = [], []  # per decode: its view's index; per view: its op -> group map (None: the ops)
    torch.manual_seed(seed)
    with torch.no_grad():
        sg = schedule_graph(graph)  # what every view's policy reads: built and hashed once
        for view, kwargs in group_views(sg, [0, *levels]):
            policy = GNNPolicy(sg, cluster.num_devices, cluster=cluster, net=net, **kwargs)
            if view != "ops" and "max_groups" in kwargs and policy.num_items in items_seen:
                continue
            items_seen.add(policy.num_items)
            groupings.append(None if policy.grouping is None else np.asarray(policy.grouping.op_group, dtype=np.int64))
            first = len(found_by)
            what = (
                "ops"
                if view == "ops"
                else f"{policy.num_items} groups"
                if "max_groups" in kwargs
                else f"{view}: {policy.num_items} groups"
            )
            cand.append(policy.greedy()[None])
            found_by.append(f"greedy ({what})")
            k = samples if (view != "ops" or not levels) else 0
            gen = torch.Generator().manual_seed(seed)
            temperatures = (module_temperatures if "grouping" in kwargs else (1.0,)) if k > 0 else ()
            for temperature in temperatures:
                cand.append(policy.decode(k, temperature=temperature, generator=gen))
                found_by += [f"sample ({what})" if temperature == 1.0 else f"sample at T={temperature:g} ({what})"] * k
            view_of += [len(groupings) - 1] * (len(found_by) - first)
    return np.concatenate(cand, axis=0), found_by, view_of, groupings


def _refine(
    env: Any,
    cluster: Any,
    op_devices: np.ndarray,
    keys: list,
    found_by: list[str],
    view_of: list[int],
    groupings: list,
    budget: int,
    rng: np.random.Generator,
    incumbent: tuple,
    deadline: float,
) -> tuple:
    """:func:`place_learned`'s descent from its decodes: ``(op devices, key, found by, placements simulated)``."""
    devices = np.asarray(candidate_devices(cluster, "auto", env.graph), dtype=np.int64)
    ranked: dict[int, list[int]] = {}  # view -> its decodes, best first, one per distinct placement
    seen: set[tuple[int, bytes]] = set()
    for i in sorted(range(len(op_devices)), key=keys.__getitem__):
        g, placed = groupings[view_of[i]], (view_of[i], op_devices[i].tobytes())
        if g is not None and int(g.max()) + 1 <= ZERO_SHOT_REFINE_MAX_ITEMS and placed not in seen:
            seen.add(placed)
            ranked.setdefault(view_of[i], []).append(i)
    # each view's best, best view first (dicts keep the order of each view's best), then each view's second...
    starts = [i for rank in itertools.zip_longest(*ranked.values()) for i in rank if i is not None]
    best, best_key, best_how = incumbent
    used = 0
    for i in starts:
        if used >= budget or time.perf_counter() >= deadline:
            break
        g = groupings[view_of[i]]
        start = np.zeros(int(g.max()) + 1, dtype=np.int64)
        start[g] = op_devices[i]  # a decode of a view gives every op of a group the group's device
        group_devices, key, spent = descend(
            env, g, start, devices, budget - used, key=keys[i], rng=rng, deadline=deadline
        )
        used += spent
        if key < best_key:
            best, best_key, best_how = group_devices[g].astype(np.int32), key, f"descent from {found_by[i]}"
    return best, best_key, best_how, used
