"""The offload scenario's two GPU stages and its report, behind ``python -m bench.gpu_offload`` (issue 34).

Everything a stage measures goes to ``OUT/measurements.jsonl`` as it is taken
(:class:`envs.real.local.LocalEnv`), so a stage killed at its deadline or by a
crash loses nothing it measured, and running it again (or the next stage) on
the same folder measures only what is missing. Files under ``OUT``:

* ``cluster.json``: the scenario's cluster (``gpu:0``'s memory is the cap);
* ``profile.json`` (the ``profile`` stage): every op timed on this machine's devices; when it is there, the
  plans, placer's training and every simulated column use the calibrated simulator (:func:`simulator_view`);
* ``graph.json``: the graph exported where the stage ran (its torch's), so that the measured plans can be
  simulated again on any machine (``graphs.load``);
* ``plans.json``: every rival's plan and the simulator's view of it (made once);
* ``measurements.jsonl``: every real measurement, keyed by placement and order;
* ``fsdp2.json``: FSDP2's offload, measured; ``host_adam.json``: the host's Adam rate;
* ``sim/``: placer's run on the simulator (checkpoint, ``best_placement.json``);
* ``finetune/``: the run continued on measured rewards, its ``curves.jsonl``;
* ``rows.json`` and ``table.md``: the table, rewritten by every stage.

``plan`` (no device): the model captured on the meta device, the plans, the simulator's table.
``profile``: every op of the exported model timed on each torch device of the device map, in context
(:func:`envs.real.profiler.profile_model`, the GPU not capped: each device runs every op), for the stages after it.
``rivals``: build and export the model (the GPU capped), make the plans (placer
trained on the simulator for ``train_budget_s``), measure them in
:func:`bench.offload.measure_order` and FSDP2's offload, until ``deadline_s``.
``finetune``: REINFORCE from the simulator's policy with measured rewards for
``budget_s`` (:mod:`bench.measured_rl`). Neither needs Ray.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import graphs
from bench import offload, offload_report
from bench.offload import Plan, Scenario
from envs.result import Result
from graphs import PlacerError
from graphs.io import read_json, write_text_atomic

SIM_PLAN = "placer, trained on the simulator"
TUNED_PLAN = "placer, fine-tuned on measured rewards"


@dataclass
class StageOptions:
    """What both stages take (``python -m bench.gpu_offload``'s options)."""

    scenario: Scenario
    out_dir: str
    device_map: str
    warmup_steps: int = 2
    timed_steps: int = 4
    measure_timeout_s: float = 120.0
    deadline_s: float = 300.0
    train_budget_s: float = 60.0
    budget_s: float = 240.0
    samples: int = 8
    seed: int = 0
    exploration: float = 2.0
    profile_repeats: int = 3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _write_json(path: str, doc: Any) -> None:
    write_text_atomic(path, json.dumps(doc, indent=1, default=float))


def open_env(opts: StageOptions) -> tuple[Any, Any, str]:
    """(LocalEnv over OUT's log, the cluster, the cluster file's path): the model built, exported, the GPU capped."""
    from envs.real.local import LocalEnv

    cluster = offload.scenario_cluster(opts.scenario)
    os.makedirs(opts.out_dir, exist_ok=True)
    path = os.path.join(opts.out_dir, "cluster.json")
    _write_json(path, cluster.to_dict())
    t0 = time.perf_counter()
    env = LocalEnv(
        offload.builder(opts.scenario),
        cluster,
        device_map=opts.device_map,
        warmup_steps=opts.warmup_steps,
        timed_steps=opts.timed_steps,
        measure_timeout_s=opts.measure_timeout_s,
        run_dir=opts.out_dir,
    )
    graphs.save(
        env.graph, os.path.join(opts.out_dir, "graph.json")
    )  # the export measured: its plans re-simulate anywhere
    log(
        f"built and exported {opts.scenario.name} ({env.graph.num_ops} ops, {env.graph.total_param_bytes / 4e9:.2f} B "
        f"parameters) in {time.perf_counter() - t0:.0f}s; GPU memory fraction {env.memory_fractions or 'not capped'}"
    )
    return env, cluster, path


PROFILE_NAME = "profile.json"


def simulator_view(opts: StageOptions, graph: Any, cluster: Any) -> tuple[Any, Any, str]:
    """``(graph, cluster, name)`` the stages simulate with: calibrated by ``OUT/profile.json`` when the ``profile``
    stage wrote one for this graph (``"profile"``), else the scenario's estimates (``"estimates"``)."""
    from envs.real.profiler import with_profile

    path = os.path.join(opts.out_dir, PROFILE_NAME)
    if not os.path.exists(path):
        return graph, cluster, "estimates"
    return (*with_profile(graph, cluster, path, device_map=opts.device_map), "profile")  # refuses another graph's


def load_or_make_plans(
    opts: StageOptions, graph: Any, cluster: Any, cluster_path: str, simulator: str = "estimates"
) -> list[Plan]:
    """The rivals' plans of ``OUT/plans.json``, or made now (placer trained on the simulator) and saved.

    ``graph`` and ``cluster`` are what the plans are made and simulated with (:func:`simulator_view`, named
    ``simulator``); plans made with another simulator keep their placements and are simulated again with this one.
    """
    path = os.path.join(opts.out_dir, "plans.json")
    if os.path.exists(path):
        doc = read_json(path)
        if doc.get("graph_hash") != graph.content_hash:
            raise PlacerError(
                f"{path}: made for graph {doc.get('graph_hash')}, not {graph.content_hash} (another torch or model?)"
            )
        plans = [offload.plan_from_doc(d) for d in doc["plans"]]
        made = doc.get("simulator", "estimates")
        if made != simulator:
            log(f"plans made with the simulator's {made}: simulated again with its {simulator}")
            plans = [
                Plan(
                    p.label,
                    p.kind,
                    p.placement,
                    offload.simulated(graph, cluster, p.placement, p.sim.get("message", "")),
                )
                for p in plans
            ]
        return plans
    t0 = time.perf_counter()
    model, _ = offload.build(opts.scenario, meta=True)  # accelerate needs the modules and shapes only
    plans = offload.single_plans(graph, cluster) + offload.accelerate_plans(graph, cluster, model)
    plans += offload.heuristic_plans(graph, cluster, seed=opts.seed)
    log(
        f"heuristic and accelerate plans in {time.perf_counter() - t0:.0f}s; training placer on the simulator "
        f"for {opts.train_budget_s:g}s"
    )
    plans.append(
        offload.train_on_simulator(
            graph,
            cluster,
            cluster_path,
            os.path.join(opts.out_dir, "sim"),
            time_budget_s=opts.train_budget_s,
            samples=opts.samples,
            seed=opts.seed,
        )
    )
    _write_json(
        path, {"graph_hash": graph.content_hash, "simulator": simulator, "plans": [offload.plan_doc(p) for p in plans]}
    )
    return plans


def measure_plans(env: Any, plans: list[Plan], deadline: float, then: Any = None, after_each: Any = None) -> None:
    """Measure the plans in :func:`bench.offload.measure_order` until ``deadline`` (``time.monotonic``);
    ``then()`` (FSDP2's offload) runs after the :func:`bench.offload.leading` ones, ``after_each()`` after every
    measurement (the report is rewritten, so a run stopped at any point has its table)."""
    for plan in offload.measure_order(plans):
        if then is not None and not offload.leading(plan):
            then()
            then = None
        if plan.placement is None or not (offload.leading(plan) or offload.sim_fits(plan)):
            continue  # a heuristic's plan the simulator says does not fit: its row says so, unmeasured
        if env.logged([plan.placement])[0] is not None:
            continue
        if time.monotonic() > deadline:
            log(f"  {plan.label}: not measured (past the deadline)")
            continue
        t0 = time.perf_counter()
        r = env.evaluate([plan.placement])[0]
        log(f"  {plan.label}: {r.status} {r.step_time_s:.3f}s ({time.perf_counter() - t0:.0f}s)")
        if after_each is not None:
            after_each()
    if then is not None:
        then()


def fsdp2_stage(opts: StageOptions, deadline: float) -> None:
    """Measure FSDP2's offload once (``OUT/fsdp2.json``), unless past the deadline."""
    from bench.fsdp2 import measure_offload
    from envs.real.placing import resolve_devices

    path = os.path.join(opts.out_dir, "fsdp2.json")
    if os.path.exists(path) or time.monotonic() > deadline:
        return
    device = resolve_devices(["gpu:0"], opts.device_map)["gpu:0"]
    t0 = time.perf_counter()
    r = measure_offload(
        offload.builder(opts.scenario),
        device,
        warmup_steps=opts.warmup_steps,
        timed_steps=opts.timed_steps,
        timeout_s=opts.measure_timeout_s,
    )
    _write_json(path, r.to_dict())
    log(f"  FSDP2 with CPUOffloadPolicy: {r.status} {r.step_time_s:.3f}s ({time.perf_counter() - t0:.0f}s)")


def host_adam_stage(opts: StageOptions, parameters: int = 200_000_000) -> dict[str, Any]:
    """The host's Adam rate with torch's threads (``OUT/host_adam.json``, measured once): what any plan with
    parameters on the host pays per parameter in its optimizer step (:mod:`bench.host_adam`)."""
    import torch

    from bench.host_adam import adam_rate

    path = os.path.join(opts.out_dir, "host_adam.json")
    if os.path.exists(path):
        return read_json(path)
    doc = {
        "parameters": parameters,
        "threads": torch.get_num_threads(),
        "params_per_s": adam_rate(parameters, threads=torch.get_num_threads()),
    }
    _write_json(path, doc)
    log(f"host Adam: {doc['params_per_s']['foreach'] / 1e6:.0f} M parameters/s (foreach, {doc['threads']} threads)")
    return doc


def run_rivals(opts: StageOptions) -> dict[str, Any]:
    """The ``rivals`` stage (see the module doc); returns the report."""
    start = time.monotonic()
    os.makedirs(opts.out_dir, exist_ok=True)
    host_adam_stage(opts, parameters=opts.scenario.vocab_size * opts.scenario.hidden_size // 4)
    env, cluster, cluster_path = open_env(opts)
    view = simulator_view(opts, env.graph, cluster)
    plans = load_or_make_plans(opts, *view[:2], cluster_path, view[2])
    deadline = start + opts.deadline_s
    write_report(opts, env.graph, plans, env, view)
    measure_plans(
        env,
        plans,
        deadline,
        then=lambda: fsdp2_stage(opts, deadline),
        after_each=lambda: write_report(opts, env.graph, plans, env, view),
    )
    return write_report(opts, env.graph, plans, env, view)


def run_profile(opts: StageOptions) -> dict[str, Any]:
    """The ``profile`` stage: ``OUT/profile.json``, every op of the exported model timed on each torch device of the
    device map (in context: real training steps with every op on the device, the GPU not capped), and the
    host's probes (staging copies, contention). Returns what it wrote."""
    import torch

    from envs.real.placing import resolve_devices
    from envs.real.profiler import profile_model, save_profile

    os.makedirs(opts.out_dir, exist_ok=True)
    cluster = offload.scenario_cluster(opts.scenario)
    torch_devices = list(dict.fromkeys(str(d) for d in resolve_devices(cluster.device_names, opts.device_map).values()))
    t0 = time.perf_counter()
    model, inputs = offload.builder(opts.scenario)()
    log(
        f"profiling {opts.scenario.name} on {', '.join(torch_devices)} ({opts.profile_repeats} timed steps each, "
        f"{torch.get_num_threads()} host threads)"
    )
    prof = profile_model(model, inputs, torch_devices, warmup=1, repeats=opts.profile_repeats)
    path = os.path.join(opts.out_dir, PROFILE_NAME)
    save_profile(prof, path)
    took = time.perf_counter() - t0
    steps = {d: e.get("step_s") for d, e in prof["devices"].items()}
    log(
        f"wrote {path} in {took:.0f}s; measured steps with every op on one device: "
        + ", ".join(f"{d} {s:.3f}s" if s else f"{d} -" for d, s in steps.items())
        + (f"; errors: {prof['errors']}" if prof.get("errors") else "")
    )
    return {
        "profile": path,
        "graph_hash": prof["graph_hash"],
        "devices": torch_devices,
        "seconds": took,
        "step_s": steps,
        "errors": prof.get("errors", {}),
    }


def run_finetune(opts: StageOptions) -> dict[str, Any]:
    """The ``finetune`` stage: REINFORCE from the simulator's policy on measured rewards for ``budget_s``."""
    from bench.measured_rl import CURVES_NAME, curves, fine_tune, read_curves
    from placer.learn.run_scorers import CachedScorer, reference_time

    if not os.path.exists(os.path.join(opts.out_dir, "plans.json")):
        raise PlacerError(
            f"{opts.out_dir}: no plans.json: run the rivals stage first (it trains placer on the simulator)"
        )
    env, cluster, cluster_path = open_env(opts)
    view = simulator_view(opts, env.graph, cluster)
    sim_graph, sim_cluster = view[:2]
    plans = load_or_make_plans(opts, sim_graph, sim_cluster, cluster_path, view[2])
    sim_plan = next(p for p in plans if p.label == SIM_PLAN)
    measured = env.evaluate([sim_plan.placement])[0] if sim_plan.placement is not None else None
    if measured is not None and measured.ok:  # a sample 5x slower than the simulator's plan is a failure, not a wait
        steps = opts.warmup_steps + opts.timed_steps
        env.measure_timeout_s = min(opts.measure_timeout_s, max(10.0, 5 * measured.step_time_s * steps))
    t_ref = reference_time(CachedScorer(env), sim_graph, sim_cluster, "eager")
    # a placement that does not run costs 10x the simulator plan's real step (the paper's failing runtime was
    # ~10x its step times): in the simulator's units (t_ref) that is more than the simulator run's factor
    fail = max(10.0, 10 * measured.step_time_s / t_ref) if measured is not None and measured.ok else None
    log(
        f"fine-tuning for {opts.budget_s:g}s: reward scale {t_ref:.3f}s, fail factor {fail}, "
        f"{env.measure_timeout_s:g}s at most per measurement"
    )
    result = fine_tune(
        sim_graph,
        sim_cluster,
        cluster_path,
        env,
        os.path.join(opts.out_dir, "sim"),
        os.path.join(opts.out_dir, "finetune"),
        time_budget_s=opts.budget_s,
        fail_factor=fail,
        exploration=opts.exploration,
    )
    log(f"  {result.iterations} iterations, best {result.best_step_time_s:.3f}s, {env.measured} placements measured")
    records = read_curves(os.path.join(opts.out_dir, "finetune", CURVES_NAME))
    _write_json(os.path.join(opts.out_dir, "curves.json"), curves(records))
    return write_report(opts, env.graph, plans, env, view)


def table_rows(
    opts: StageOptions, graph: Any, plans: list[Plan], env: Any = None, view: Any = None
) -> list[dict[str, Any]]:
    """The table's rows: every plan with what ``env`` measured (None: simulated only), FSDP2's offload, and the
    fine-tuned plan (simulated in ``view``, :func:`simulator_view`'s; default the env's cluster)."""
    cap, on_gpu = opts.scenario.gpu_cap_bytes, bool(env is not None and env.memory_fractions)
    placed = [p for p in plans if p.placement is not None]
    results = env.logged([p.placement for p in placed]) if env is not None else [None] * len(placed)
    by_label = dict(zip([p.label for p in placed], results))
    rows = [
        offload_report.row(
            p.label,
            p.kind,
            by_label.get(p.label),
            p.sim,
            cap_bytes=cap,
            on_gpu=on_gpu,
            host_ops=offload.host_ops(p, graph),
            note=_unmeasured(p, env),
        )
        for p in offload.measure_order(plans)
    ]
    fsdp = os.path.join(opts.out_dir, "fsdp2.json")
    if os.path.exists(fsdp):
        after = max((i for i, r in enumerate(rows) if r["kind"] in ("placer", "accelerate")), default=-1)
        rows.insert(
            after + 1,
            offload_report.row(
                "FSDP2, CPUOffloadPolicy (every parameter on the host)",
                "fsdp2",
                Result.from_dict(read_json(fsdp)),
                None,
                cap_bytes=cap,
                on_gpu=on_gpu,
            ),
        )
    best = os.path.join(opts.out_dir, "finetune", "best_placement.json")
    if env is not None and os.path.exists(best):
        from graphs.plan import Placement

        p = Placement.load(best)
        sim_graph, sim_cluster = view[:2] if view is not None else (graph, env.cluster)
        plan = Plan(TUNED_PLAN, "placer", p, offload.simulated(sim_graph, sim_cluster, p))
        rows.insert(
            1,
            offload_report.row(
                TUNED_PLAN,
                "placer",
                env.logged([p])[0],
                plan.sim,
                cap_bytes=cap,
                on_gpu=on_gpu,
                host_ops=offload.host_ops(plan, graph),
            ),
        )
    return rows


def _unmeasured(plan: Plan, env: Any) -> str:
    if plan.placement is None:
        return plan.sim.get("message", "no plan")
    if env is None:
        return "simulated only"
    if not (offload.leading(plan) or offload.sim_fits(plan)):
        return f"not measured: the simulator says it does not fit ({plan.sim.get('message', '')})"
    return "not measured: past the deadline"


def write_report(
    opts: StageOptions, graph: Any, plans: list[Plan], env: Any = None, view: Any = None
) -> dict[str, Any]:
    rows = table_rows(opts, graph, plans, env, view)
    s = opts.scenario
    adam = os.path.join(opts.out_dir, "host_adam.json")
    doc = {
        "scenario": s.name,
        "description": s.description,
        "cap_gib": s.gpu_cap_bytes / (1 << 30),
        "host_adam": read_json(adam) if os.path.exists(adam) else None,
        "graph_hash": graph.content_hash,
        "ops": graph.num_ops,
        "measured": env is not None,
        "simulator": view[2] if view is not None else "estimates",
        "parameters": graph.total_param_bytes / 4,
        "forward_flops": float(graph.flops.sum()),
        "memory_fractions": env.memory_fractions if env is not None else {},
        "rows": rows,
        "summary": offload_report.summary(rows),
    }
    _write_json(os.path.join(opts.out_dir, "rows.json"), doc)
    write_text_atomic(os.path.join(opts.out_dir, "table.md"), offload_report.markdown(rows) + "\n")
    return doc


def run_plan(opts: StageOptions) -> dict[str, Any]:
    """The ``plan`` stage, no device: the model captured on the meta device, every rival's plan, the simulator's table.

    Its graph comes from this machine's torch, so its plans are not the GPU stages' (their graph is exported there).
    """
    import graphs

    model, inputs = offload.build(opts.scenario, meta=True)
    graph = graphs.capture(model, inputs, name=opts.scenario.name)
    cluster = offload.scenario_cluster(opts.scenario)
    os.makedirs(opts.out_dir, exist_ok=True)
    cluster_path = os.path.join(opts.out_dir, "cluster.json")
    _write_json(cluster_path, cluster.to_dict())
    return write_report(opts, graph, load_or_make_plans(opts, graph, cluster, cluster_path))


__all__ = [
    "PROFILE_NAME",
    "StageOptions",
    "run_finetune",
    "run_plan",
    "run_profile",
    "run_rivals",
    "simulator_view",
    "table_rows",
    "write_report",
]
