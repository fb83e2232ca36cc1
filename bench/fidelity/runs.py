"""One model's fidelity run: the placements to measure, their real steps (interleaved), their simulated ones, the rows.

:func:`candidates` picks the placements (learned, every heuristic's with its planned
issue order, both single devices, random ones: :func:`random_placements`). :func:`measure` builds every placed
module once and times them in interleaved rounds (:func:`envs.real.timing.measure_interleaved`),
beside a second build of a few placements (repeatability) and each ordered placement
in node order (the order check), logging every block so a run cut short resumes.
:func:`simulated` scores them with the calibrated simulator; :func:`rows` writes one
row per placement (``docs/calibration/README.md`` has the fields).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

from bench.fidelity.metrics import EXECUTORS
from bench.fidelity.models import build
from graphs.io import write_text_atomic


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- calibration
def profiled(name: str, args: Any, model, inputs: tuple, graph, work: str) -> dict:
    """The model's profile on ``args.torch_devices``: the one in ``work`` if it is this graph's and covers them, else a
    new one (with ``args.cpus`` intra-op threads, the measurement's)."""
    import torch

    from envs.real.profiler import check_profile, load_profile, profile_model, save_profile

    prof_path = os.path.join(work, "profile.json")
    prof = load_profile(prof_path) if os.path.exists(prof_path) else None
    if prof is not None and (
        prof.get("graph_hash") != graph.content_hash or not set(args.torch_devices) <= set(prof["devices"])
    ):
        prof = None
    if prof is None:
        torch.set_num_threads(max(1, args.cpus))
        prof = profile_model(model, inputs, args.torch_devices, warmup=1, repeats=args.repeats)
        check_profile(prof)
        save_profile(prof, prof_path)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    else:
        log(f"[{name}] reusing {prof_path}")
    return prof


def calibrated(graph, prof: dict, cluster, device_map):
    """``(profiled graph, calibrated cluster, its physical cluster, logical -> physical device index)``."""
    from envs.real.profiler import apply_profile, calibrate_cluster

    logical = calibrate_cluster(cluster, prof, graph=graph, device_map=device_map)
    phys, to_phys = physical(logical, device_map)
    return apply_profile(graph, prof), logical, phys, to_phys


def physical(cluster, device_map):
    """The cluster of distinct torch devices, and each logical device's index into it.

    Logical devices mapped to one torch device share its queue in reality (on a
    CPU-only machine every placement is a single-device run), so the calibrated
    simulation runs on the physical devices.
    """
    import envs
    from envs.real.placing import resolve_devices

    torch_of = resolve_devices(cluster.device_names, device_map)
    first: dict[str, int] = {}
    for i, name in enumerate(cluster.device_names):
        first.setdefault(str(torch_of[name]), i)
    keep = sorted(first.values())
    to_phys = np.array([keep.index(first[str(torch_of[name])]) for name in cluster.device_names], dtype=np.int32)
    names = [cluster.device_names[i] for i in keep]
    links = {(a, b): link for (a, b), link in cluster.links.items() if a in names and b in names}
    phys = envs.Cluster(
        name=cluster.name, devices=[cluster.devices[i] for i in keep], links=links, description=cluster.description
    )
    return phys, to_phys


# ----------------------------------------------------------------- candidates
def random_placements(num_ops: int, num_devices: int, count: int, seed: int) -> list[np.ndarray]:
    """Half draw each op's device with a per-placement bias, half cut the op sequence into 2-6 segments."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        if k % 2 == 0:
            bias = rng.dirichlet(np.ones(num_devices))
            out.append(rng.choice(num_devices, size=num_ops, p=bias).astype(np.int32))
        else:
            cuts = np.sort(rng.choice(np.arange(1, num_ops), size=min(rng.integers(1, 6), num_ops - 1), replace=False))
            seg_dev = rng.integers(0, num_devices, size=len(cuts) + 1)
            out.append(np.repeat(seg_dev, np.diff(np.concatenate([[0], cuts, [num_ops]]))).astype(np.int32))
    return out


def candidates(name: str, args: Any, graph, logical, model, work: str) -> list[dict]:
    """The placements to measure: learned, heuristics' (``args.heuristic_names``), single devices, random; distinct,
    with their issue orders.

    A heuristic's placement carries the order the planner picks for it with no margin (:meth:`envs.SimEnv.plan_order`):
    the orders whose error the run measures.
    """
    from envs.sim.simulator import SimEnv
    from placer.compare import compare

    names = logical.device_names
    out: list[dict] = []
    seen: dict[tuple, dict] = {}

    def add(kind: str, method: str, op_devices, order=None, order_name: str = "node") -> None:
        op_devices = np.asarray(op_devices, dtype=np.int32)
        in_node_order = order is None or np.array_equal(order, np.arange(len(op_devices)))
        order = None if in_node_order else np.asarray(order, dtype=np.int64)
        key = (op_devices.tobytes(), None if order is None else order.tobytes())
        if key in seen:
            seen[key]["methods"].append(method)
            return
        seen[key] = {
            "kind": kind,
            "methods": [method],
            "op_devices": op_devices,
            "order": order,
            "order_name": order_name if order is not None else "node",
        }
        out.append(seen[key])

    # bench.validate_gpu's --heuristics (by default every heuristic but ilp: a time-limited solve may give another
    # plan on a rerun, so a resumed run could not reuse its measurements, and it adds a minute per model)
    report = compare(graph, logical, model=model, seed=args.seed, executor="eager", methods=args.heuristic_names)
    heuristics = [r for r in report.rows if r.kind == "heuristic"]
    ok = [r for r in heuristics if r.status == "ok" and r.placement is not None]
    best = min(ok, key=lambda r: r.step_time_s).method if ok else None
    learned = learn(name, args, graph, logical, best, work)
    if learned is not None:
        add(
            "learned",
            learned.method or "rl",
            learned.indices(graph, names),
            learned.order,
            learned.meta.get("issue_order", "?"),
        )
    planner = SimEnv(graph, logical, order_margin=0.0)
    for r in ok:
        op_devices = r.placement.indices(graph, names)
        order, how, _ = planner.plan_order(op_devices)
        add("baseline", r.method, op_devices, order, how)
    for d, dev in enumerate(names):
        add("single", f"all on {dev}", np.full(graph.num_ops, d))
    pool = random_placements(graph.num_ops, logical.num_devices, 50 * args.placements, seed=args.seed)
    for k, op_devices in enumerate(pool):
        if len(out) >= args.placements:
            break
        add("random", f"random {k}", op_devices)
    skipped = [f"{r.method} ({r.status})" for r in heuristics if r.status != "ok" or r.placement is None]
    if skipped:
        log(f"[{name}] heuristics not measured: {', '.join(skipped)}")
    return out


def learn(name: str, args: Any, graph, logical, heuristic: str | None, work: str):
    """The learned placement: a short ``placer.train`` run on the calibrated simulator (reused when its run
    finished)."""
    from graphs.plan import Placement
    from placer.learn.config import TrainConfig
    from placer.learn.loop import train
    from placer.learn.rundir import BEST_NAME

    logdir = os.path.join(work, "train")
    best = os.path.join(logdir, BEST_NAME)
    if os.path.exists(os.path.join(logdir, "summary.json")) and os.path.exists(best):
        p = Placement.load(best)
        if p.graph_hash == graph.content_hash and p.devices == list(logical.device_names):
            log(f"[{name}] learned placement: reusing {best}")
            return p
    config = TrainConfig(
        source=name,
        cluster=args.cluster,
        env="sim",
        executor="eager",
        time_budget_s=args.train_budget,
        seed=args.seed,
        logdir=logdir,
        progress=False,
        heuristics=(heuristic,) if heuristic else (),
    )
    t0 = time.time()
    result = train(config, graph=graph, cluster=logical)
    log(
        f"[{name}] trained {result.iterations} iterations in {time.time() - t0:.0f}s: simulated best "
        f"{result.best_step_time_s * 1e3:.2f} ms (best heuristic {heuristic})"
    )
    return result.best_placement


# ------------------------------------------------------------------ measuring
def labels(cands: list[dict], graph, logical, repeats: int) -> dict[str, dict]:
    """What is measured: every candidate, each ordered one in node order too (right after it), and a second build of
    the first ``repeats`` of (all on the GPU, the learned placement, the first random one), last in each round.

    Label -> ``{"cand": index, "what": "placement" | "node" | "repeat", "order": issue order or None}``.
    """
    from envs.real.worker import placement_hash  # not envs.real.measured: that imports ray, which the GPU machines lack

    out: dict[str, dict] = {}
    for k, c in enumerate(cands):
        key = placement_hash(
            [logical.device_names[i] for i in c["op_devices"].tolist()],
            None if c["order"] is None else [graph.names[i] for i in c["order"].tolist()],
        )
        c["key"] = key
        out[key] = {"cand": k, "what": "placement", "order": c["order"]}
        if c["order"] is not None:
            out[key + "@node"] = {"cand": k, "what": "node", "order": None}
    gpu = [i for i, name in enumerate(logical.device_names) if name.startswith("gpu")][:1]
    firsts = [
        next((k for k, c in enumerate(cands) if pred(c)), None)
        for pred in (
            lambda c: bool(gpu) and bool(np.all(c["op_devices"] == gpu[0])),
            lambda c: c["kind"] == "learned",
            lambda c: c["kind"] == "random",
        )
    ]
    for k in [k for k in dict.fromkeys(firsts) if k is not None][:repeats]:
        out[cands[k]["key"] + "~2"] = {"cand": k, "what": "repeat", "order": cands[k]["order"]}
    return out


def _runs(name: str, args: Any, graph, logical, cands: list[dict], todo: dict[str, dict]) -> dict[str, Any]:
    """Every placed module of ``todo``, built once from one export (each from the same initial weights)."""
    import torch

    from envs.real.interleaved import Run
    from envs.real.placing import place_module, resolve_devices
    from envs.real.timing import adam
    from graphs.torch_capture import export_program

    model, inputs = build(name, args.size)
    ep = export_program(model, inputs)
    snapshot = {k: v.detach().clone() for k, v in ep.state_dict.items()}
    runs, failed = {}, {}
    for label, spec in todo.items():
        with torch.no_grad():
            for k, v in ep.state_dict.items():
                v.copy_(snapshot[k])
        c = cands[spec["cand"]]
        assignment = {op: logical.device_names[d] for op, d in zip(graph.names, c["op_devices"].tolist())}
        order = None if spec["order"] is None else [graph.names[i] for i in spec["order"].tolist()]
        try:
            module = place_module(ep, assignment, args.device_map, order=order)
            devices = resolve_devices(sorted(set(assignment.values())), args.device_map)
            runs[label] = Run(module, adam(module.parameters(), lr=1e-3), devices)
        except Exception as e:  # placing failed: a result for this placement, the others go on
            failed[label] = {
                "status": "error",
                "message": f"placing: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "step_time_s": float("inf"),
                "step_times_s": [],
                "round_medians_s": [],
                "peak_bytes": {},
            }
    return {"runs": runs, "inputs": inputs, "failed": failed}


def measure(name: str, args: Any, graph, logical, cands: list[dict], work: str) -> dict[str, dict]:
    """Each label's measurement (:func:`envs.real.timing.measure_interleaved`), resumed from ``work/blocks.jsonl``."""
    from envs.real.interleaved import measure_interleaved, summarize_blocks
    from envs.real.timing import Protocol

    todo = labels(cands, graph, logical, args.repeat_placements)
    path = os.path.join(work, "blocks.jsonl")
    done: dict[str, list[dict]] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if rec["label"] in todo:
                    done.setdefault(rec["label"], []).append(rec["block"])
    cpus = sorted(os.sched_getaffinity(0))[: args.cpus] if hasattr(os, "sched_getaffinity") else None
    protocol = Protocol(threads=args.cpus, cpus=tuple(cpus) if cpus else None, gc_off=True, warmup_s=args.warmup_s)
    # a label whose every round is in the log (or that failed there) is not run again: not built again either
    finished = {
        label: summarize_blocks(blocks)
        for label, blocks in done.items()
        if len(blocks) >= args.rounds or any(b.get("status", "ok") != "ok" for b in blocks)
    }
    pending = {label: spec for label, spec in todo.items() if label not in finished}
    built = _runs(name, args, graph, logical, cands, pending) if pending else {"runs": {}, "inputs": (), "failed": {}}
    log(
        f"[{name}] measuring {len(todo)} placed modules in {args.rounds} interleaved rounds of {args.steps} steps "
        f"({len(done)} resumed, {len(finished)} of them done)"
    )

    def record(label: str, r: int, block: dict) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"label": label, "round": r, "block": block}) + "\n")

    measured = measure_interleaved(
        built["runs"],
        built["inputs"],
        rounds=args.rounds,
        steps=args.steps,
        warmup_steps=args.warmup,
        protocol=protocol,
        timeout_s=args.timeout,
        done=done,
        on_block=record,
    )
    got = {**finished, **measured, **built["failed"]}
    out = {label: got[label] for label in todo if label in got}
    for label, m in out.items():
        m.update(todo[label])
    return out


# ----------------------------------------------------------------- simulating
def simulated(graph_p, phys, to_phys: np.ndarray, logical, cands: list[dict]) -> list[dict]:
    """Each candidate's simulated step under both executors (its order), in node order (eager), and peak bytes per
    logical device (eager). Rounded to picoseconds: the same schedule summed in another order differs in the last
    float bits, which must not rank placements (on one physical device every placement simulates alike)."""
    from envs.sim.simulator import SimEnv

    sim_envs = {e: SimEnv(graph_p, phys, executor=e) for e in EXECUTORS}
    out = []
    for c in cands:
        phys_devices = to_phys[c["op_devices"]]
        res = {e: sim_envs[e].simulate(phys_devices, order=c["order"]) for e in EXECUTORS}
        row = {
            "sim_step_s": {e: round(float(r.extra["sim_step_time_s"]), 12) for e, r in res.items()},
            "sim_peak_bytes": {
                name: int(res["eager"].peak_bytes[phys.device_names[to_phys[i]]])
                for i, name in enumerate(logical.device_names)
            },
        }
        if c["order"] is not None:
            row["sim_node_step_s"] = round(float(sim_envs["eager"].simulate(phys_devices).extra["sim_step_time_s"]), 12)
        out.append(row)
    return out


def resimulated(graph, prof: dict, rows_: list[dict], cluster, device_map) -> list[dict]:
    """Stored rows (their ``devices`` and ``order``) with their simulated fields recomputed under ``prof``."""
    graph_p, logical, phys, to_phys = calibrated(graph, prof, cluster, device_map)
    cands = [
        {
            "op_devices": np.asarray(r["devices"], dtype=np.int32),
            "order": None if r.get("order") is None else np.asarray(r["order"], dtype=np.int64),
        }
        for r in rows_
    ]
    return [{**r, **sim} for r, sim in zip(rows_, simulated(graph_p, phys, to_phys, logical, cands))]


def rows(
    name: str, group: str, args: Any, logical, cands: list[dict], measured: dict[str, dict], sims: list[dict]
) -> list[dict]:
    """One row per candidate: what it is, its real step (and its second build's, its node order's), its simulated
    ones."""
    by_cand: dict[int, dict[str, dict]] = {}
    for m in measured.values():
        by_cand.setdefault(m["cand"], {})[m["what"]] = m
    out = []
    for k, c in enumerate(cands):
        got = by_cand.get(k, {})
        m = got.get("placement", {"status": "error", "message": "not measured", "step_time_s": float("inf")})
        devs = [logical.device_names[i] for i in c["op_devices"].tolist()]
        ok = m["status"] == "ok"
        row = {
            "model": name,
            "size": args.size,
            "group": group,
            "kind": c["kind"],
            "methods": c["methods"],
            "placement_hash": c["key"],
            "issue_order": c["order_name"],
            "status": m["status"],
            "message": m.get("message", ""),
            "real_step_s": m["step_time_s"] if ok else None,
            "real_step_times_s": m.get("step_times_s"),
            "round_medians_s": m.get("round_medians_s"),
            "real_peak_bytes": m.get("peak_bytes") or {},
            **sims[k],
            "ops_per_device": {d: devs.count(d) for d in logical.device_names},
            "devices": c["op_devices"].tolist(),
            "order": None if c["order"] is None else c["order"].tolist(),
        }
        for what, field in (("repeat", "repeat"), ("node", "node_order")):
            if what in got:
                g = got[what]
                row[field] = {
                    "status": g["status"],
                    "real_step_s": g["step_time_s"] if g["status"] == "ok" else None,
                    "real_step_times_s": g.get("step_times_s"),
                    "round_medians_s": g.get("round_medians_s"),
                }
        out.append(row)
    return out


def write_rows(path: str, rows_: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(_finite(r)) + "\n" for r in rows_))


def _finite(x):
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x
