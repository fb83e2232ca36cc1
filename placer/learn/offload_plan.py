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

import numpy as np

import envs
from graphs import OpGraph, PlacerError
from graphs.plan import HOST_STEPS, Placement, faster_host_step
from placer.learn.checkpoint_choice import candidate_blocks, kept_blocks, prune_blocks
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.search_budget import OOM_FACTOR
from placer.methods.heuristics.costs import MEMORY_HEADROOM

#: The fewest placements each of the two searches gets before ``plan_with_homes`` splits its budget.
MIN_ARM_EVALS = 100
#: How ``plan_with_homes`` chooses the checkpointed layers: "both", two searches (one whose moves turn each layer on
#: or off, :mod:`placer.learn.checkpoint_moves`; one with every layer, then pruned); "moves", the first alone.
CHECKPOINT_BY = ("both", "moves")
#: What ``plan_with_homes``'s ``host_step`` takes: a plan's :data:`graphs.plan.HOST_STEPS`, or "auto" (the search
#: steps during the backward; the plan found is simulated both ways and keeps the faster).
HOST_STEP_CHOICES = ("auto", *HOST_STEPS)


def fsdp2_offload_plan(graph: OpGraph, cluster: Any, *, checkpoint: bool = False) -> Placement:
    """FSDP2's ``CPUOffloadPolicy`` as a placement: every op on the first GPU, every parameter that can live apart
    from its op (:func:`envs.sim.homes.homeable`) homed on the host (``cpu:0``), stepped after the backward as FSDP2
    steps them; ``checkpoint``: every layer of the model's repeated module list
    (:func:`placer.learn.checkpoint_choice.candidate_blocks`) checkpointed too. The rival ``placer place --method
    homes`` reports and ``bench.offload_homes`` tabulates."""
    from envs.sim.homes import homeable

    gpu, host = cluster.gpu_indices()[0], cluster.device_names.index("cpu:0")
    homes = np.where(homeable(graph) == 1, host, -1)
    p = Placement.from_indices(
        graph, cluster.device_names, np.full(graph.num_ops, gpu), cluster=cluster.name, method="fsdp2", homes=homes
    )
    if checkpoint:
        p.checkpoint = candidate_blocks(graph)
    return p


def fsdp2_offload_times(graph: OpGraph, cluster: Any) -> dict[str, float | None]:
    """The simulated step time of :func:`fsdp2_offload_plan` on ``cluster`` (its whole memory, as FSDP2 runs): as
    it is (``"plain"``) and, for a model with a repeated list of layers, with every layer checkpointed
    (``"checkpointed"``); None where it does not fit."""
    env = envs.SimEnv(graph, cluster)
    times: dict[str, float | None] = {}
    for name, checkpoint in (("plain", False), ("checkpointed", True)):
        if checkpoint and not candidate_blocks(graph):
            continue
        r = env.simulate(fsdp2_offload_plan(graph, cluster, checkpoint=checkpoint))
        times[name] = float(r.step_time_s) if r.ok else None
    return times


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
    checkpoint_by: str = "both",
    host_step: str = "auto",
) -> Placement:
    """The move search's best plan in ``evals`` simulated placements, with home moves (``homes`` False: the op
    placement only, the same search otherwise), within ``headroom`` of each device's memory; ``meta`` records the
    search's budget, seconds and headroom.

    ``checkpoint`` (and a model with a repeated list of layers,
    :func:`placer.learn.checkpoint_choice.candidate_blocks`): the plan checkpoints layers too, chosen by
    ``checkpoint_by`` (:data:`CHECKPOINT_BY`):

    * "both" (the default): the budget is split in two searches from the same start, and the faster plan returned.
      One chooses the layers by moves (:mod:`placer.learn.checkpoint_moves`: each move turns one layer on or off).
      The other checkpoints every layer wherever a placement keeps it whole, and its best then turns off the layers
      that do not pay (:func:`placer.learn.checkpoint_choice.prune_blocks`, within its half): it finds what one layer
      at a time cannot, layers checkpointed so that weights can stay on the GPU (BENCHMARKS.md, "Checkpoint moves").
      ``meta["checkpoint_search"]``: each search's simulated step time, whether it fits, and its layers;
    * "moves": the first of those alone, on the whole budget.

    ``host_step`` (:data:`HOST_STEP_CHOICES`): when the homed parameters are stepped, in every plan simulated and
    in the plan returned: "backward", each as soon as its gradient is home, during the backward (a host worker
    steps them in batches, :func:`placer.apply.step_in_backward` runs it); "after", by the optimizer's step after
    the backward; "auto" (the default), "backward" in the search, and the plan found keeps whichever of the two
    simulates faster (``meta["host_step_s"]``: both step times). "after" wins where the worker's steps do not
    overlap the backward: parameters whose last gradient comes home at its end (a first layer's, an embedding's)
    stepped during it run before the GPU's own update, and after it beside it.
    """
    if checkpoint_by not in CHECKPOINT_BY:
        raise PlacerError(f"plan_with_homes: checkpoint_by {checkpoint_by!r}: one of {', '.join(CHECKPOINT_BY)}")
    if host_step not in HOST_STEP_CHOICES:
        raise PlacerError(f"plan_with_homes: host_step {host_step!r}: one of {', '.join(HOST_STEP_CHOICES)}")
    t0 = time.perf_counter()
    room = with_headroom(cluster, headroom)  # the same devices, names and links
    env = envs.SimEnv(graph, room)
    env.host_step = "backward" if host_step == "auto" else host_step
    blocks = candidate_blocks(graph) if checkpoint else []
    if not blocks:
        r = MoveSearch(graph, room, env, options=MoveSearchOptions(homes=homes), seed=seed).run(max_evals=evals)
        meta = {"evals": r.evals}
        return _plan(graph, cluster, env, r.op_devices, r.homes, [], homes, meta, seed, headroom, t0, host_step)
    both = checkpoint_by == "both" and evals >= 2 * MIN_ARM_EVALS
    moved = _by_moves(graph, room, env, blocks, evals // 2 if both else evals, seed, homes)
    found, spent = moved, moved["evals"]
    meta: dict[str, Any] = {"checkpoint_search": {"moves": _arm(moved, blocks)}}
    if both:
        left = evals - spent
        prune = min(left // 4, (len(blocks) + 1) * len(blocks))
        options = MoveSearchOptions(homes=homes, checkpoint=blocks)
        c = MoveSearch(graph, room, env, options=options, seed=seed).run(max_evals=left - prune)
        kept = kept_blocks(env, graph, blocks, c.op_devices)
        kept, step_s, oom, used = prune_blocks(env, graph, c.op_devices, c.homes, kept, prune)
        every = {"op_devices": c.op_devices, "homes": c.homes, "blocks": kept, "step_s": step_s, "oom": oom}
        spent += c.evals + used
        meta["checkpoint_search"]["every"] = _arm(every, blocks)
        if _cost(every) < _cost(moved):
            found = every
    meta["evals"] = spent
    found_at = (found["op_devices"], found["homes"], found["blocks"])
    return _plan(graph, cluster, env, *found_at, homes, meta, seed, headroom, t0, host_step)


def _by_moves(graph: OpGraph, room: Any, env: Any, blocks: list[str], evals: int, seed: int, homes: bool) -> dict:
    """The search whose moves choose the layers, in ``evals`` placements: its best, then any layer whose removal is
    faster turned off (one round over the layers, at most a quarter of the placements, kept for it)."""
    prune = min(evals // 4, len(blocks) + 1)
    options = MoveSearchOptions(homes=homes, checkpoint=blocks, checkpoint_moves=True)
    r = MoveSearch(graph, room, env, options=options, seed=seed).run(max_evals=evals - prune)
    kept = kept_blocks(env, graph, r.checkpoint or [], r.op_devices)
    step_s, oom, used = r.step_time_s, r.oom, 0
    if kept:
        kept, step_s, oom, used = prune_blocks(env, graph, r.op_devices, r.homes, kept, evals - r.evals)
    return {
        "op_devices": r.op_devices,
        "homes": r.homes,
        "blocks": kept,
        "step_s": step_s,
        "oom": oom,
        "evals": r.evals + used,
    }


def _arm(arm: dict, blocks: list[str]) -> dict[str, Any]:
    return {"step_time_s": arm["step_s"], "fits": not arm["oom"], "blocks": len(arm["blocks"]), "of": len(blocks)}


def _cost(arm: dict) -> float:
    return arm["step_s"] * (OOM_FACTOR if arm["oom"] else 1.0)


def _plan(
    graph: OpGraph,
    cluster: Any,
    env: Any,
    op_devices: Any,
    found_homes: Any,
    kept: list[str],
    homes: bool,
    meta: dict[str, Any],
    seed: int,
    headroom: float,
    t0: float,
    host_step: str,
) -> Placement:
    """The search's plan as a file, its simulated step time (with its homes and blocks) and seconds in ``meta``;
    with ``host_step`` "auto", stepping its homed parameters whichever way simulates faster (ties: "after")."""
    placement = Placement.from_indices(
        graph,
        cluster.device_names,
        op_devices,
        cluster=cluster.name,
        method="move_search_homes" if homes else "move_search",
        meta={**meta, "seed": seed, "headroom": headroom},
        homes=found_homes,
    )
    placement.checkpoint = kept
    placement.host_step = env.host_step if placement.param_homes else "after"

    def step_s(way: str) -> float:  # with its homes and blocks
        return env.simulate(dataclasses.replace(placement, host_step=way)).extra["sim_step_time_s"]

    if host_step == "auto" and placement.param_homes:
        placement.host_step, placement.meta["host_step_s"] = faster_host_step(step_s)
        placement.meta["step_time_s"] = placement.meta["host_step_s"][placement.host_step]
    else:
        placement.meta["step_time_s"] = step_s(placement.host_step)
    placement.meta["search_s"] = time.perf_counter() - t0
    return placement
