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
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.methods.heuristics.costs import MEMORY_HEADROOM


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
) -> Placement:
    """The move search's best plan in ``evals`` simulated placements, with home moves (``homes`` False: the op
    placement only, the same search otherwise), within ``headroom`` of each device's memory; ``meta`` records the
    search's budget, seconds and headroom."""
    t0 = time.perf_counter()
    room = with_headroom(cluster, headroom)  # the same devices, names and links
    r = MoveSearch(graph, room, envs.SimEnv(graph, room), options=MoveSearchOptions(homes=homes), seed=seed).run(
        max_evals=evals
    )
    return Placement.from_indices(
        graph,
        cluster.device_names,
        r.op_devices,
        cluster=cluster.name,
        method="move_search_homes" if homes else "move_search",
        meta={
            "evals": r.evals,
            "search_s": time.perf_counter() - t0,
            "seed": seed,
            "step_time_s": r.step_time_s,
            "headroom": headroom,
        },
        homes=r.homes,
    )
