"""The offload scenario at several GPU caps with parameter homes, as the simulator scores it (issue 50).

For each scenario (:data:`bench.offload.SCENARIOS`, the model captured on the meta
device) and each cap, the cluster's ``gpu:0`` is capped and these plans are simulated:

* placer's move search with home moves (:func:`placer.learn.offload_plan.plan_with_homes`):
  layers on the GPU with their weights, gradients and Adam state homed on the host where
  that frees the GPU, the op placement chosen with them, and the layers it checkpoints
  (activation checkpointing, :mod:`placer.learn.checkpoint_choice`);
  its homed parameters stepped during the backward (``host_step`` "backward",
  :func:`placer.apply.step_in_backward`) or after it, whichever simulates faster for the plan found;
* the same searching with them stepped after the backward, as FSDP2 and ZeRO-Offload step them (the
  ablation of stepping during it), and the same without checkpointing (the ablation of checkpointing),
  at the same budget;
* the same search without home moves (the op-only plan: what placer planned before homes),
  at the same budget of simulated placements;
* FSDP2's ``CPUOffloadPolicy`` as a plan: every op on ``gpu:0``, every parameter homed on
  ``cpu:0``, Adam on the host (:func:`fsdp2_offload_plan`), and the same with every layer
  checkpointed (FSDP2 with torch's activation checkpointing on each block, how it is
  used on models whose activations do not fit);
* accelerate's ``device_map="auto"`` at ``max_memory`` = each fraction of the cap
  (:func:`bench.offload.accelerate_plans`), and all on the host.

Every row is simulated (none measured): ``step_time_s``, status and peak ``gpu:0``
bytes from :meth:`envs.sim.simulator.SimEnv.simulate`. The ratios compare placer's
plan with homes to FSDP2's offload and to accelerate's fastest map that fits.

    python -m bench.offload_homes --scenarios llama-256k,llama-3b --caps 24,16,8 --evals 2000 \\
        --out-dir docs/offload_homes

writes ``<scenario>.json`` (rows and plans per cap) and ``table.md`` there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import envs
from bench import offload
from bench.common import OneLineParser
from bench.offload import Plan, Scenario
from graphs import OpGraph, PlacerError
from graphs.io import write_text_atomic
from placer.learn.offload_plan import fsdp2_offload_plan, plan_with_homes

GIB = 1 << 30
HOMED = "placer, move search with homes"
NO_CHECKPOINT = "placer, move search with homes, no checkpointing"
STEP_AFTER = "placer, move search with homes, stepped after the backward"
OPS_ONLY = "placer, move search, op placement only"
FSDP2 = "FSDP2 CPUOffloadPolicy as planned (all on gpu:0, every parameter homed on cpu:0)"
FSDP2_AC = "FSDP2 CPUOffloadPolicy with every layer checkpointed, as planned"


def capped(scenario: Scenario, cap_bytes: int) -> Scenario:
    """``scenario`` with its GPU capped at ``cap_bytes``."""
    return dataclasses.replace(scenario, gpu_cap_bytes=int(cap_bytes))


def searched_plan(
    graph: OpGraph,
    cluster: Any,
    *,
    homes: bool,
    evals: int,
    seed: int = 0,
    checkpoint: bool = True,
    host_step: str = "auto",
) -> Plan:
    """placer's move search (with or without home moves, choosing checkpointed layers or not, stepping the homed
    parameters whichever way simulates faster, or after the backward: ``host_step``) on ``evals`` simulated
    placements, as a plan."""
    p = plan_with_homes(graph, cluster, evals=evals, seed=seed, homes=homes, checkpoint=checkpoint, host_step=host_step)
    label = (HOMED if checkpoint else NO_CHECKPOINT) if homes else OPS_ONLY
    kind = ("placer" if checkpoint else "placer-no-checkpoint") if homes else "placer-ops"
    if homes and host_step == "after":
        label, kind = STEP_AFTER, "placer-step-after"
    return Plan(label, kind, p, offload.simulated(graph, cluster, p))


def cap_plans(graph: OpGraph, cluster: Any, model: Any, *, evals: int, seed: int = 0) -> list[Plan]:
    """Every plan of one cap (see the module docstring), simulated."""
    fsdp, fsdp_ac = fsdp2_offload_plan(graph, cluster), fsdp2_offload_plan(graph, cluster, checkpoint=True)
    plans = [
        searched_plan(graph, cluster, homes=True, evals=evals, seed=seed),
        searched_plan(graph, cluster, homes=True, evals=evals, seed=seed, host_step="after"),
        searched_plan(graph, cluster, homes=True, evals=evals, seed=seed, checkpoint=False),
        searched_plan(graph, cluster, homes=False, evals=evals, seed=seed),
        Plan(FSDP2, "fsdp2", fsdp, offload.simulated(graph, cluster, fsdp)),
        Plan(FSDP2_AC, "fsdp2-ac", fsdp_ac, offload.simulated(graph, cluster, fsdp_ac)),
    ]
    plans += offload.accelerate_plans(graph, cluster, model)
    return plans + [p for p in offload.single_plans(graph, cluster) if p.label == "all on cpu:0"]


def row(plan: Plan, graph: OpGraph) -> dict[str, Any]:
    """One simulated row: label, kind, status, step time, peak gpu:0 GiB, host ops, homed parameters' GiB, blocks
    checkpointed."""
    p, sim = plan.placement, plan.sim
    homed = p.homed_bytes(graph) / GIB if p is not None else 0.0
    peak = sim.get("peak_bytes", {}).get("gpu:0")
    return {
        "label": plan.label,
        "kind": plan.kind,
        "sim_status": sim.get("status"),
        "sim_step_time_s": sim.get("step_time_s"),
        "sim_peak_gpu_gib": None if peak is None else peak / GIB,
        "host_ops": offload.host_ops(plan, graph),
        "homed_param_gib": homed,
        "checkpointed": len(p.checkpoint) if p is not None else 0,
        "message": sim.get("message", ""),
    }


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """placer's plan with homes against FSDP2's offload (the faster of with and without checkpointing), and against
    accelerate's fastest map that fits (x slower)."""
    ok = {r["label"]: r["sim_step_time_s"] for r in rows if r["sim_status"] == "ok"}
    placer = ok.get(HOMED)
    accel = [r["sim_step_time_s"] for r in rows if r["kind"] == "accelerate" and r["sim_status"] == "ok"]
    over = lambda t: None if placer is None or t is None else t / placer  # noqa: E731
    return {
        "fsdp2_over_placer": over(min((t for t in (ok.get(FSDP2), ok.get(FSDP2_AC)) if t is not None), default=None)),
        "accelerate_over_placer": over(min(accel, default=None)),
        "ops_only_over_placer": over(ok.get(OPS_ONLY)),
        "no_checkpoint_over_placer": over(ok.get(NO_CHECKPOINT)),
        "step_after_over_placer": over(ok.get(STEP_AFTER)),
    }


def run_scenario(scenario: Scenario, caps_gib: list[float], *, evals: int, seed: int = 0) -> dict[str, Any]:
    """The scenario captured on the meta device once, then every cap's plans and rows."""
    import graphs

    t0 = time.perf_counter()
    model, inputs = offload.build(scenario, meta=True)
    graph = graphs.capture(model, inputs, name=scenario.name)
    doc: dict[str, Any] = {
        "scenario": scenario.name,
        "description": scenario.description,
        "parameters": graph.total_param_bytes / 4,
        "ops": graph.num_ops,
        "graph_hash": graph.content_hash,
        "evals": evals,
        "seed": seed,
        "simulated": True,
        "caps": [],
    }
    for cap in caps_gib:
        cluster = offload.scenario_cluster(capped(scenario, int(cap * GIB)))
        t1 = time.perf_counter()
        plans = cap_plans(graph, cluster, model, evals=evals, seed=seed)
        rows = [row(p, graph) for p in plans]
        # no plan simulates faster, stepped during the backward or after it (envs.sim.bound)
        bound_s = envs.SimEnv(graph, cluster).lower_bound(host_step="backward")
        doc["caps"].append(
            {
                "cap_gib": cap,
                "rows": rows,
                "ratios": ratios(rows),
                "bound_s": float(bound_s),
                "bound": bound_s.name,
                "seconds": time.perf_counter() - t1,
                "plans": [offload.plan_doc(p) for p in plans],
            }
        )
        print(f"{scenario.name} at {cap:g} GiB: {time.perf_counter() - t1:.0f}s", file=sys.stderr, flush=True)
    doc["seconds"] = time.perf_counter() - t0
    return doc


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(docs: list[dict[str, Any]]) -> str:
    """One table over every scenario and cap (every row simulated)."""
    lines = [
        "| model | cap (GiB) | plan (simulated) | status | step (s) | peak gpu:0 (GiB) | ops on host | homed (GiB) "
        "| checkpointed |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for doc in docs:
        model = f"{doc['scenario']} ({doc['parameters'] / 1e9:.2f} B)"
        for cap in doc["caps"]:
            for r in cap["rows"]:
                lines.append(
                    f"| {model} | {cap['cap_gib']:g} | {r['label']} | {r['sim_status'] or 'no plan'} | "
                    f"{_fmt(r['sim_step_time_s'], '.3f')} | {_fmt(r['sim_peak_gpu_gib'], '.2f')} | "
                    f"{_fmt(r['host_ops'], 'd')} | {r['homed_param_gib']:.2f} | {r.get('checkpointed', 0)} |"
                )
    lines += [
        "",
        "| model | cap (GiB) | FSDP2's fastest / placer | accelerate's fastest / placer | op-only / placer "
        "| no checkpointing / placer | stepped after the backward / placer | placer / the lower bound |",
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for doc in docs:
        for cap in doc["caps"]:
            q = cap["ratios"]
            placer = next(
                (r["sim_step_time_s"] for r in cap["rows"] if r["label"] == HOMED and r["sim_status"] == "ok"), None
            )
            vs_bound = None if placer is None or not cap.get("bound_s") else placer / cap["bound_s"]
            lines.append(
                f"| {doc['scenario']} | {cap['cap_gib']:g} | {_fmt(q['fsdp2_over_placer'], '.2f')} | "
                f"{_fmt(q['accelerate_over_placer'], '.2f')} | {_fmt(q['ops_only_over_placer'], '.2f')} | "
                f"{_fmt(q.get('no_checkpoint_over_placer'), '.2f')} | {_fmt(q.get('step_after_over_placer'), '.2f')} | "
                f"{_fmt(vs_bound, '.2f')} |"
            )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m bench.offload_homes", description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", default="llama-256k", help="comma-separated (known: " + ", ".join(offload.SCENARIOS))
    p.add_argument("--caps", default="24,16,8", help="GPU caps in GiB, comma-separated (default 24,16,8)")
    p.add_argument("--evals", type=int, default=2000, help="placements each search simulates (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", required=True)
    return p.parse_args(argv)


def checked(args: argparse.Namespace) -> tuple[list[Scenario], list[float]]:
    """The scenarios and caps, checked (:class:`PlacerError` naming the option)."""
    scenarios = [offload.check_scenario(s.strip()) for s in args.scenarios.split(",") if s.strip()]
    try:
        caps = [float(c) for c in args.caps.split(",") if c.strip()]
    except ValueError:
        raise PlacerError(f"--caps {args.caps!r}: not comma-separated numbers of GiB") from None
    if not scenarios or not caps or min(caps) <= 0:
        raise PlacerError(f"--scenarios {args.scenarios!r} --caps {args.caps!r}: need at least one of each, caps > 0")
    if args.evals < 1:
        raise PlacerError(f"--evals {args.evals}: must be >= 1")
    return scenarios, caps


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        scenarios, caps = checked(args)
        docs = [run_scenario(s, caps, evals=args.evals, seed=args.seed) for s in scenarios]
        os.makedirs(args.out_dir, exist_ok=True)
        for doc in docs:
            write_text_atomic(os.path.join(args.out_dir, f"{doc['scenario']}.json"), json.dumps(doc, indent=1))
    except PlacerError as e:
        print(f"python -m bench.offload_homes: {e}", file=sys.stderr)
        return 2
    table = markdown(docs)
    write_text_atomic(os.path.join(args.out_dir, "table.md"), table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
