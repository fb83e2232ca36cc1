"""A plan's stages run in one process, one after the other, on one thread (no pipeline runtime, no messages): each
stage's forward and backward per microbatch, timed, beside the simulator's per-op time of the same stage. Tells
whether a rank's stages are slow as cut (the stage program) or only inside the pipeline.

    PYTHONPATH=. python docs/ranks/auto/stages/alone.py MODEL PLAN ... [--steps N]   # plans: auto gpipe_placer
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import envs
from envs.real.distributed.stage_modules import place_stage, stage_programs
from envs.real.pipeline import split_batch
from envs.real.profiler.fit import with_profile
from envs.real.worker import build_model
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph
from placer.distributed import compile_for_model

D = Path(__file__).resolve().parent.parent


def detach(values):
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v = v.detach().requires_grad_(True)
        out.append(v)
    return tuple(out)


def run(model_name: str, plan_name: str, steps: int, mode: str) -> dict:
    model, inputs = build_model(f"bench.rank_models:{model_name}")
    plan_file = D / f"plan_{model_name}_{plan_name}.json"
    placement = Placement.load(str(plan_file))
    plan, program = compile_for_model(model, inputs, placement, nproc_per_node=2)
    modules = stage_programs(program.module(), [s.ops for s in plan.stages])
    modules = [place_stage(m, torch.device("cpu")) for m in modules]
    M = plan.microbatches
    parts = split_batch(tuple(inputs), M)
    times: dict = {}
    S = len(modules)
    order = (
        [(s, m) for s in range(S) for m in range(M)]
        if mode == "stagewise"
        else [(s, m) for m in range(M) for s in range(S)]
    )
    for step in range(steps + 2):
        for mod in modules:
            for p in mod.parameters():
                p.grad = None
        saved = {}
        for s, m in order:  # forwards: stage by stage (each stage's microbatches back to back), or chain by chain
            args = parts[m] if s == 0 else detach(saved[(s - 1, m)][1])
            t = time.perf_counter()
            out = modules[s](*args)
            out = out if isinstance(out, tuple) else (out,)
            dt = time.perf_counter() - t
            saved[(s, m)] = (args, out)
            if step >= 2:
                times.setdefault((s, "F"), []).append(dt)
        grads = {}
        for s, m in reversed(order):
            args, out = saved[(s, m)]
            if s == S - 1:
                outs, gs = [out[0]], [None]
            else:
                pairs = [(o, g) for o, g in zip(out, grads[(s + 1, m)]) if g is not None]
                outs, gs = [o for o, _ in pairs], [g for _, g in pairs]
            t = time.perf_counter()
            torch.autograd.backward(outs, gs)
            dt = time.perf_counter() - t
            grads[(s, m)] = [a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args]
            if step >= 2:
                times.setdefault((s, "B"), []).append(dt)
    graph = resolve_graph(f"bench.rank_models:{model_name}")
    cluster = envs.resolve_cluster(str(D / f"ranks_{model_name}.json"))
    timed = with_profile(graph, cluster, str(D / f"ops_{model_name}.json"), ranks=True)[0]
    _, events = RankSim(timed, cluster).timeline(placement)
    sim = {(e.stage, e.kind): e.end_s - e.start_s for e in events if e.kind in "FB"}
    runs = [json.loads(f.read_text()) for f in sorted(D.glob(f"run_{model_name}_{plan_name}_[0-9]*.json"))]
    piped: dict = {}
    for r in runs:
        for e in r["timeline"]["events"]:
            piped.setdefault((e[1], e[2]), []).append(e[5] - e[4])
    rows = {}
    for key in sorted(times):
        alone = statistics.median(times[key])
        rows[f"{key[0]}{key[1]}"] = {
            "alone_s": alone,
            "simulated_s": sim.get(key),
            "pipeline_s": statistics.median(piped[key]) if key in piped else None,
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--mode", choices=["stagewise", "chain"], default="stagewise")
    ap.add_argument("--cpu", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    out = {}
    for p in a.plans:
        rows = run(a.model, p, a.steps, a.mode)
        out[p] = rows
        for k, v in rows.items():
            sim, pipe = v["simulated_s"], v["pipeline_s"]
            print(
                f"{a.model:16} {p:13} stage {k:4} alone {v['alone_s'] * 1e3:7.2f} ms   simulated "
                f"{sim * 1e3 if sim else float('nan'):7.2f}   in the pipeline "
                f"{pipe * 1e3 if pipe else float('nan'):7.2f}"
                f"   alone/simulated {v['alone_s'] / sim if sim else float('nan'):.2f}"
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
