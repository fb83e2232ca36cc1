"""A plan for a model whose training state does not fit the GPU: the move search with home moves, as a Placement.

:func:`plan_with_homes` runs :class:`placer.learn.move_search.MoveSearch` with
``homes=True`` on the simulator and returns the best plan as a
:class:`graphs.plan.Placement` carrying its parameter homes (``param_homes``), ready
for ``Placement.save`` and :func:`placer.apply`. The plan it returns fits the cluster's
memory if any plan it simulated did (the search keeps the least cost, and a plan
out of memory costs ``OOM_FACTOR`` times its step time).

>>> import envs
>>> from graphs import OpGraph
>>> g = OpGraph.from_edges(["a", "b"], [("a", "b", 4)], flops=[1e9, 1e9], param_bytes=[8, 8])
>>> g.params = [["w"], ["v"]]
>>> p = plan_with_homes(g, envs.Cluster.preset("k80x2"), evals=20)
>>> p.method, p.meta["evals"]
('move_search_homes', 20)
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import envs
from graphs import OpGraph
from graphs.plan import Placement
from placer.learn.checkpoint_choice import candidate_blocks, kept_blocks, prune_blocks
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.search_budget import OOM_FACTOR
from placer.methods.heuristics.costs import MEMORY_HEADROOM

#: The fewest placements each of the two searches gets before ``plan_with_homes`` splits its budget.
MIN_ARM_EVALS = 100


def with_headroom(cluster: Any, headroom: float) -> Any:
    """A copy of ``cluster`` whose devices hold ``headroom`` (0 < headroom <= 1) of their memory."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom {headroom}: must be in (0, 1]")
    devices = [dataclasses.replace(d, memory_bytes=d.memory_bytes * headroom) for d in cluster.devices]
    return dataclasses.replace(cluster, devices=devices)  # its arrays are built anew from the devices


def plan_with_homes(
    graph: OpGraph,
    cluster: Any,
    *,
    evals: int = 2000,
    seed: int = 0,
    homes: bool = True,
    headroom: float = MEMORY_HEADROOM,
    checkpoint: bool = True,
) -> Placement:
    """The move search's best plan in ``evals`` simulated placements, with home moves (``homes`` False: the op
    placement only, the same search otherwise), within ``headroom`` of each device's memory; ``meta`` records the
    search's budget, seconds and headroom.

    ``checkpoint`` (and a model with a repeated list of layers,
    :func:`placer.learn.checkpoint_choice.candidate_blocks`): the budget is split in two searches from the same
    start, one without activation checkpointing and one with every layer checkpointed where a placement keeps it
    whole, whose best then turns off the layers that do not pay (:func:`placer.learn.checkpoint_choice.prune_blocks`,
    within its half); the faster plan is returned, with its ``checkpoint`` blocks. ``meta["checkpoint_search"]``:
    each search's simulated step time and whether it fits.
    """
    t0 = time.perf_counter()
    room = with_headroom(cluster, headroom)  # the same devices, names and links
    env = envs.SimEnv(graph, room)
    blocks = candidate_blocks(graph) if checkpoint and evals >= 2 * MIN_ARM_EVALS else []
    r = MoveSearch(graph, room, env, options=MoveSearchOptions(homes=homes), seed=seed).run(
        max_evals=evals // 2 if blocks else evals
    )
    found = (r.op_devices, r.homes, [])
    spent, meta = r.evals, {}
    if blocks:
        left = evals - r.evals
        prune = min(left // 4, (len(blocks) + 1) * len(blocks))
        options = MoveSearchOptions(homes=homes, checkpoint=blocks)
        c = MoveSearch(graph, room, env, options=options, seed=seed).run(max_evals=left - prune)
        kept = kept_blocks(env, graph, blocks, c.op_devices, c.homes)
        kept, step_s, oom, used = prune_blocks(env, graph, c.op_devices, c.homes, kept, prune)
        spent += c.evals + used
        meta["checkpoint_search"] = {
            "without": {"step_time_s": r.step_time_s, "fits": not r.oom},
            "with": {"step_time_s": step_s, "fits": not oom, "blocks": len(kept), "of": len(blocks)},
        }
        if step_s * (OOM_FACTOR if oom else 1.0) < r.step_time_s * (OOM_FACTOR if r.oom else 1.0):
            found = (c.op_devices, c.homes, kept)
    op_devices, found_homes, kept = found
    placement = Placement.from_indices(
        graph,
        cluster.device_names,
        op_devices,
        cluster=cluster.name,
        method="move_search_homes" if homes else "move_search",
        meta={"evals": spent, "seed": seed, "headroom": headroom, **meta},
        homes=found_homes,
    )
    placement.checkpoint = kept
    placement.meta["step_time_s"] = env.simulate(placement).extra["sim_step_time_s"]  # with its homes and blocks
    placement.meta["search_s"] = time.perf_counter() - t0
    return placement
