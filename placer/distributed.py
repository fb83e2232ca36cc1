"""Plans across processes, from Python: this rank's stages and schedule, a whole job, torchtitan's split.

In a training script that ``torchrun`` starts once per device of the plan::

    import torch, torch.distributed as dist, placer
    from placer import distributed

    dist.init_process_group("gloo")                  # or "nccl"; torchrun set RANK, WORLD_SIZE...
    model, inputs = build()                          # the same seeded model in every process
    stages, schedule = distributed.stages(model, placer.Placement.load("best_placement.json"), inputs)
    optimizer = torch.optim.Adam(schedule.parameters())
    for batch in batches:
        optimizer.zero_grad()
        loss = schedule.step(*batch)                 # the loss on the last stage's rank, None elsewhere
        optimizer.step()

``stages`` are this rank's ``torch.distributed.pipelining.PipelineStage`` objects and
``schedule`` (:class:`envs.real.distributed.runtime.RankSchedule`) runs them with the
plan's schedule (``schedule.schedule``: torch's object). After ``step`` every parameter
holds the one-process step's gradient. :func:`run` launches such a job from here
(what ``placer run --nproc-per-node`` does), and :func:`module_fqns_per_model_part`
writes a plan's stages as torchtitan's ``module_fqns_per_model_part``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.real.distributed.rank_plan import RankPlan, check_batched, compile_plan
from graphs import OpGraph, PlacerError
from graphs.hash_seed import hash_seed_hint
from graphs.plan import Placement, as_indices
from graphs.sources import stand_in_loss


def compile_for_model(
    model: Any,
    example_inputs: tuple,
    placement: Placement | Mapping[str, str],
    *,
    graph: OpGraph | None = None,
    **options: Any,
) -> tuple[RankPlan, Any]:
    """Capture ``model`` (once more at the microbatch's size when M > 1) and compile ``placement`` for processes.

    Returns the plan and the program its stages are cut from. ``options`` go to
    :func:`envs.real.distributed.rank_plan.compile_plan` (``rank_map``, ``backend``,
    ``nproc_per_node``, ``device_map``, ``loss_reduction``).
    """
    from envs.real.distributed.stage_modules import carried_values
    from envs.real.pipeline import export_microbatch
    from graphs.torch_capture import export_program, graph_from_program

    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    program = export_program(model, inputs)
    captured = graph_from_program(program, name=graph.name if graph is not None else "")
    if graph is not None and graph.content_hash != captured.content_hash:
        raise PlacerError(
            f"graph {graph.name or ''} ({graph.content_hash}) is not the graph of this model and inputs "
            f"({captured.content_hash}){hash_seed_hint()}"
        )
    for field, what in (("param_homes", "parameter homes apart from their ops"), ("checkpoint", "checkpointed blocks")):
        if getattr(placement, field, None):
            raise PlacerError(
                f"{getattr(placement, 'source', '') or 'placement'}: {what} run in one process (placer "
                "run without --nproc-per-node, placer.apply), not across processes"
            )
    why = stand_in_loss(captured)
    if why:
        raise PlacerError(f"{why}; across processes the last stage computes the loss: forward must return it")
    M = int(getattr(placement, "microbatches", 1))
    check_batched(inputs, M, "example_inputs")
    part = None
    if M > 1:
        program = export_microbatch(model, inputs, M, source="example_inputs")
        part = graph_from_program(program)
    plan = compile_plan(captured, placement, program=part, **options)
    carried_values(program.module(), [s.ops for s in plan.stages])  # a cut every rank would refuse: here, once
    return plan, program


def stages(
    model: Any,
    placement: Placement | Mapping[str, str],
    example_inputs: tuple,
    *,
    rank_map: str | Mapping[str, int] | None = None,
    device_map: str | Mapping[str, str] | None = None,
    loss_reduction: str = "mean",
    graph: OpGraph | None = None,
    early_receives: bool | None = None,
) -> tuple[list, Any]:
    """This process's stages of ``placement`` and the schedule that runs them (see the module doc).

    Call it in every process of the job (the process group initialised, one process
    per device of the plan), with the same seeded model and inputs. Which rank runs
    which logical device, and on which torch device, follows
    :func:`envs.real.distributed.ranks.assign_ranks` (``rank_map``, ``device_map``;
    ``LOCAL_WORLD_SIZE`` gives the local rank of each). A bad plan, or more or fewer
    processes than it has devices, is a :class:`PlacerError`. ``early_receives``: post every receive of a step
    as it begins (None: on CPU ranks under the schedules of
    :data:`~envs.real.distributed.runtime.EARLY_RECEIVES`; :class:`~envs.real.distributed.runtime.RankSchedule`).
    """
    import torch.distributed as dist

    from envs.real.distributed.ranks import check_world
    from envs.real.distributed.runtime import RankSchedule

    if not dist.is_initialized():
        raise PlacerError("placer.distributed.stages: initialise the process group first (dist.init_process_group)")
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    plan, program = compile_for_model(
        model,
        example_inputs,
        placement,
        graph=graph,
        rank_map=rank_map,
        backend="nccl" if dist.get_backend() == "nccl" else "gloo",
        nproc_per_node=per_node,
        device_map=device_map,
        loss_reduction=loss_reduction,
    )
    check_world(list(plan.devices), dist.get_world_size())
    schedule = RankSchedule(plan, program, tuple(example_inputs), dist.get_rank(), early_receives=early_receives)
    return schedule.stages, schedule


def run(
    source: str,
    plan: RankPlan,
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_timeout_s: float = 300.0,
    backend: str = "gloo",
    steps: int = 10,
    warmup: int = 2,
    lr: float = 1e-3,
    check: bool = False,
    timeout_s: float = 600.0,
) -> dict[str, Any] | None:
    """Run ``plan`` on ``source``'s model in processes started here by torch's launcher (one per device).

    Returns the job's report (:func:`envs.real.distributed.worker.job_report`) on node
    0, None on the other nodes. A failed or dead rank, or a rendezvous that does not
    come, is a one-line :class:`PlacerError`.
    """
    from envs.real.distributed.launch import launch
    from envs.real.distributed.ranks import check_world
    from envs.real.distributed.worker import RankJob, run_rank

    check_world(list(plan.devices), nproc_per_node * nnodes, f"processes ({nnodes} x {nproc_per_node})")
    job = RankJob(
        source=source,
        plan=plan.to_dict(),
        source_dir=os.getcwd(),
        backend=backend,
        warmup=warmup,
        steps=steps,
        lr=lr,
        check=check,
        timeout_s=timeout_s,
    )
    out = launch(
        run_rank,
        (job,),
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_timeout_s=rdzv_timeout_s,
    )
    return out.get(0)


def module_fqns_per_model_part(graph: OpGraph, placement: Placement | Any, module: str = "") -> list[list[str]]:
    """The plan's stages as torchtitan's ``module_fqns_per_model_part``: per stage, the modules it runs.

    Each stage (a run of ops on one device, in the plan's issue order:
    :func:`envs.real.distributed.cut.cut_stages`) is a model part. A module whose ops
    all run in one stage is named once, for that stage; a module split between stages
    is named by its submodules (as :func:`placer.device_map.project` describes a module
    split between devices), and a module without submodules goes to the stage that
    runs most of its op time. ``module``: the submodule torchtitan builds (e.g.
    ``"model"`` inside a wrapper that computes the loss); names are relative to it.
    The root's own ops (the loss) are in no module and are left out: torchtitan
    computes the loss itself.
    """
    from envs.real.distributed.cut import cut_stages
    from placer.device_map import project

    devices = list(getattr(placement, "devices", None) or sorted(set(dict(placement).values())))
    source = getattr(placement, "source", "") or "placement"
    op_devices = as_indices(placement, graph, devices, source=source)
    order = placement.issue_order(graph) if isinstance(placement, Placement) else None
    starts = placement.stage_starts(graph) if isinstance(placement, Placement) else ()
    stages = cut_stages(graph, op_devices, devices, order, starts)
    op_stages = np.empty(graph.num_ops, dtype=np.int64)
    for s, stage in enumerate(stages):
        op_stages[list(stage.ops)] = s
    # one logical GPU per stage (device s + 1 of a host and S GPUs): the projection's GPU index is the stage
    keys = project(graph, op_stages + 1, _stage_cluster(len(stages)), module=module)
    parts: list[list[str]] = [[] for _ in stages]
    for key, stage in keys.items():
        if isinstance(stage, int):
            parts[stage].append(key)
    return [sorted(p) for p in parts]


def _stage_cluster(num_stages: int) -> Any:
    """A cluster of a host and one identical GPU per stage: stage ``s`` is GPU ``s`` (device ``s + 1``)."""
    from envs.cluster import Cluster, Device, Link

    gpus = [Device(f"gpu:{s}", "gpu", 80e9, 100e12, 2e12, 5e-6) for s in range(num_stages)]
    devices = [Device("cpu:0", "cpu", 512e9, 1e12, 1e11, 0.0), *gpus]
    links = {(a.name, b.name): Link(25e9, 1e-5) for a in devices for b in devices if a.name != b.name}
    return Cluster(name="stages", devices=devices, links=links)


__all__ = ["compile_for_model", "module_fqns_per_model_part", "run", "stages"]
