"""Does the calibrated simulator rank and predict real multi-device steps? (issue 11, item 4)

For each model, on the cluster ``h200x1`` (``cpu:0`` + ``gpu:0``, run as ``cpu`` +
``cuda:0``): profile the model once on both torch devices (``envs.real.profiler``),
then measure at least ``--placements`` distinct placements for real, as
``placer run`` would: the code of ``envs.MeasuredEnv``'s worker builds the
module ``placer.apply`` builds and times ``--steps`` Adam steps after
``--warmup`` (median, wall clock, CUDA synchronised), in this process
(``--real local``, the default) or in a Ray actor (``--real ray``). The placements:

* a learned one: a short ``placer.train`` run (``--train-budget`` s) on the
  calibrated simulator, with the issue order it stores;
* every heuristic baseline's (``placer.compare``), with the issue order
  ``SimEnv.plan_order`` chose for it, as ``placer place`` stores it;
* both single-device placements, and random ones (``calibrate_sim``'s generator,
  node order) until there are ``--placements`` distinct ones.

Each placement is scored by the calibrated simulator under both executor models
(``eager``: the PyTorch runtime, following the placement's issue order;
``dataflow``: TensorFlow's executor), and per model and executor we report
Spearman's rank correlation, the MAPE of simulated vs real step time, n, and
the *best ratio*: the real step time of the placement the simulator ranks best
over the best real step time. Targets: Spearman >= 0.9, MAPE <= 15%, ratio <= 1.05.

Two checks run in this process, on the devices:

* ``placer.apply`` on the learned placement keeps the loss and every parameter's
  gradient equal to the unplaced model's (on the CPU), to ``--tolerance``
  relative to each tensor's largest magnitude, with TF32 off;
* for the learned placement and the (at most ``--order-checks`` - 1) measured
  placements whose planned issue order is not the node order, the planned
  order is as fast as the node order or faster when measured: two placed
  copies of the model, their Adam steps timed alternately (``--order-steps``
  each, after ``--warmup``), medians compared; the check passes at a
  planned/node ratio <= 1 + ``--order-slack`` (timer noise).

The GPU command, for one GPU and 16 host cores (``h200x1``'s ``gpu:0`` runs on
``cuda:0``, ``cpu:0`` on the host; on an H200, 2026-11-26: 295 s with these
defaults, 291 s with ``--train-budget 20 --warmup 3 --steps 12 --order-steps 10``,
whose results are in ``docs/calibration/``); the defaults are these options::

    PYTHONPATH=. python3 scripts/validate_gpu.py --models rnnlm,nmt-2,resnet50 --size medium \\
        --device-map gpu:0=cuda:0,cpu:0=cpu --out-dir docs/calibration

On the lent GPU machines (the device tool: no Ray there, and only files under
``$OUT`` come back, at most 8; this writes 7), run it from the repository root as::

    PYTHONPATH=. python3 scripts/validate_gpu.py --out-dir $OUT/calibration

and copy the files that come back into ``docs/calibration/``. Each model's
profile, learned placement and measurements are kept under ``--work-dir``
(default ``runs/validate_gpu``), so a run cut short resumes where it stopped
while the machine is still warm. If the three models do not fit in one 10-minute
command, run them one per call (``--models rnnlm``, then ``nmt-2``, ...), each
after copying the previous call's files into ``docs/calibration/``, and start
each command with ``mkdir -p $OUT/calibration && cp docs/calibration/summary.json
$OUT/calibration/;``: ``summary.json`` keeps the entries of models this run does
not measure.

On a machine without a GPU, ``--tiny`` runs the same pipeline with every
logical device on the CPU (one small model, few placements, a short training
run): a smoke test of the script, whose figures mean nothing (one physical
device: every placement simulates alike, so ranks are undefined)::

    python scripts/validate_gpu.py --tiny --out-dir /tmp/validate

Output: a markdown report on stdout (``--json``: a JSON document instead),
progress on stderr, and under ``--out-dir`` ``<model>.jsonl`` (one line per
placement: what it is, its devices and issue order, the real step times and
both simulated ones), ``<model>.profile.json`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

import calibrate_sim as cs
from graphs import PlacerError

EXECUTORS = ("eager", "dataflow")
TARGETS = {"spearman_min": 0.9, "mape_max": 0.15, "best_ratio_max": 1.05}
# Per mode, the defaults of the options left unset on the command line.
DEFAULTS = {
    "gpu": dict(models="rnnlm,nmt-2,resnet50", size="medium", device_map="gpu:0=cuda:0,cpu:0=cpu", placements=30,
                train_budget=30.0, warmup=2, steps=5, repeats=5, order_checks=3, order_steps=20, cpus=os.cpu_count() or 1),
    "tiny": dict(models="rnnlm", size="small", device_map="*=cpu", placements=6, train_budget=4.0, warmup=1, steps=2,
                 repeats=2, order_checks=1, order_steps=3, cpus=1),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- candidates
def candidates(name: str, args: argparse.Namespace, graph, logical, model, work: str) -> list[dict]:
    """The placements to measure: learned, baselines, single devices, random; distinct, with their issue orders."""
    from envs.sim.simulator import plan_order
    from placer.compare import compare, default_methods

    names = logical.device_names
    out: list[dict] = []
    seen: dict[tuple, dict] = {}

    def add(kind: str, method: str, idx, order=None, order_name: str = "node") -> None:
        idx = np.asarray(idx, dtype=np.int32)
        order = None if order is None else np.asarray(order, dtype=np.int64)
        key = (idx.tobytes(), None if order is None else order.tobytes())
        if key in seen:
            seen[key]["methods"].append(method)
            return
        seen[key] = {"kind": kind, "methods": [method], "idx": idx, "order": order, "order_name": order_name}
        out.append(seen[key])

    # every baseline but ilp: a time-limited solve may give another plan on a rerun (so a resumed run could
    # not reuse its measurements), and it adds a minute per model
    report = compare(graph, logical, model=model, seed=args.seed, executor="eager", methods=default_methods(exclude=("ilp",)))
    baselines = [r for r in report.rows if r.kind == "baseline"]
    skipped = [f"{r.method} ({r.status})" for r in baselines if r.status != "ok" or r.placement is None]
    ok = [r for r in baselines if r.status == "ok" and r.placement is not None]
    best = min(ok, key=lambda r: r.step_time_s).method if ok else None
    learned = learn(name, args, graph, logical, best, work)
    if learned is not None:
        add("learned", learned.method or "rl", learned.indices(graph, names), learned.order, learned.meta.get("issue_order", "?"))
    for r in ok:
        idx = r.placement.indices(graph, names)
        order, how, _ = plan_order(graph, idx, logical)  # the order `placer place` stores with it
        add("baseline", r.method, idx, order, how)
    for d, dev in enumerate(names):
        add("single", f"all on {dev}", np.full(graph.num_ops, d))
    pool = cs.random_placements(graph.num_ops, logical.num_devices, 50 * args.placements, seed=args.seed)
    for k, idx in enumerate(pool):
        if len(out) >= args.placements:
            break
        add("random", f"random {k}", idx)
    if skipped:
        log(f"[{name}] baselines not measured: {', '.join(skipped)}")
    return out


def learn(name: str, args: argparse.Namespace, graph, logical, heuristic: str | None, work: str):
    """The learned placement: a short ``placer.train`` run on the calibrated simulator (reused when its run finished)."""
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
    config = TrainConfig(source=name, cluster=args.cluster, env="sim", executor="eager", time_budget_s=args.train_budget,
                         seed=args.seed, logdir=logdir, progress=False, heuristics=(heuristic,) if heuristic else ())
    t0 = time.time()
    result = train(config, graph=graph, cluster=logical)
    log(f"[{name}] trained {result.iterations} iterations in {time.time() - t0:.0f}s: simulated best "
        f"{result.best_step_time_s * 1e3:.2f} ms (best heuristic {heuristic})")
    return result.best_placement


# ------------------------------------------------------------- device checks
def _rel_err(got, want) -> float:
    """max |got - want| / max |want| (0 for two zero tensors)."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    scale = float(want.abs().max()) if want.numel() else 0.0
    diff = float((got - want).abs().max()) if want.numel() else 0.0
    return diff / scale if scale > 0 else diff


def grad_errors(name: str, size: str, placement, graph, device_map: str) -> dict:
    """The placed model's loss and gradients (float32) and the CPU model's (float32) against a float64 CPU reference.

    Per tensor, ``max |got - want| / max |want|`` (``*_max_rel``) and ``|got - want| / |want|``
    in the 2-norm (``*_norm_rel``). TF32 is off. The float32 CPU model's own error says
    how well float32 can compute each gradient at all: a gradient that is mostly
    cancellation (a batch-norm layer on a 4x4 feature map) is off by percents in
    float32 on any device.
    """
    import torch

    from envs.real.timing import default_loss
    from placer.apply import apply

    model, inputs = cs.build(name, size)
    ref64 = copy.deepcopy(model).double()
    cpu32 = copy.deepcopy(model)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        placed = apply(model, placement, inputs, device_map=device_map, graph=graph)
        runs, losses = {}, {}
        for label, module, args in (("placed", placed, inputs), ("cpu32", cpu32, inputs),
                                    ("ref64", ref64, tuple(t.double() if t.is_floating_point() else t for t in inputs))):
            torch.manual_seed(5)  # dropout draws alike where they run on the CPU
            out = module(*args)
            loss = default_loss(out)
            loss.backward()
            losses[label] = loss.detach().double().cpu().reshape(1)
            runs[label] = {k: p.grad.detach().double().cpu() for k, p in module.named_parameters() if p.grad is not None}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    def rel(got, want, norm: bool) -> float:
        if norm:
            return float((got - want).norm()) / (float(want.norm()) or 1.0)
        return float((got - want).abs().max()) / (float(want.abs().max()) or 1.0)

    rows = []
    for k, want in runs["ref64"].items():
        row = {"param": k, "max_abs": float(want.abs().max())}
        for label in ("placed", "cpu32"):
            got = runs[label].get(k)
            row[f"{label}_max_rel"] = None if got is None else rel(got, want, False)
            row[f"{label}_norm_rel"] = None if got is None else rel(got, want, True)
        rows.append(row)
    rows.sort(key=lambda r: -(r["placed_norm_rel"] if r["placed_norm_rel"] is not None else float("inf")))
    return {"grads": len(rows), "missing": sorted(set(runs["ref64"]) - set(runs["placed"])),
            "extra": sorted(set(runs["placed"]) - set(runs["ref64"])), "rows": rows,
            "loss_placed_rel": rel(losses["placed"], losses["ref64"], True), "loss_cpu32_rel": rel(losses["cpu32"], losses["ref64"], True)}


def check_apply(name: str, args: argparse.Namespace, placement, graph) -> dict:
    """``placer.apply(model, placement)``'s loss and gradients against a float64 reference, beside float32 on the CPU.

    Passes when the placed model has every gradient the unplaced one has and
    each of its errors (loss and every gradient, relative in the 2-norm) is at
    most ``--tolerance`` or twice the float32 CPU model's own error, whichever is
    larger: the placed module runs the same ATen ops, on the GPU through
    cuBLAS/cuDNN (TF32 off), whose float32 sums run in another order, so it is
    as far from the exact gradient as float32 on the CPU is, while a wrong
    placement (a lost gradient, a stale copy) is off by O(1). (A float32 CPU
    reference alone is not enough: in a batch-norm network some gradients are
    mostly cancellation, and float32 on either device is percents off them.)
    """
    e = grad_errors(name, args.size, placement, graph, args.device_map)
    allowed = lambda cpu32: max(args.tolerance, 2.0 * cpu32)  # noqa: E731
    bad = [r["param"] for r in e["rows"] if r["placed_norm_rel"] is None or r["placed_norm_rel"] > allowed(r["cpu32_norm_rel"] or 0.0)]
    worst = e["rows"][0] if e["rows"] else None
    loss_ok = e["loss_placed_rel"] <= allowed(e["loss_cpu32_rel"])
    return {"placement": placement.method, "reference": "float64 on the CPU", "output_rel_err": e["loss_placed_rel"],
            "output_cpu32_rel_err": e["loss_cpu32_rel"],
            "grad_max_rel_err": worst["placed_norm_rel"] if worst else float("nan"),
            "grad_worst_cpu32_rel_err": worst["cpu32_norm_rel"] if worst else float("nan"),
            "grad_worst": worst["param"] if worst else None, "grads": e["grads"], "over_allowed": bad[:10],
            "same_grad_keys": not e["missing"] and not e["extra"] and bool(e["rows"]), "tolerance": args.tolerance,
            "worst": e["rows"][:5],
            "ok": bool(not e["missing"] and not e["extra"] and e["rows"] and not bad and loss_ok)}


def check_order(name: str, args: argparse.Namespace, graph, cand: dict, sim_node_s: float, sim_planned_s: float) -> dict:
    """Real step time of ``cand`` in its planned issue order vs node order: steps timed alternately, medians."""
    import torch

    from envs.real.placing import resolve_devices
    from envs.real.timing import synchronize, train_step
    from placer.apply import apply
    from graphs.plan import Placement

    placement = Placement.from_indices(graph, args.logical_devices, cand["idx"])
    devices = list(resolve_devices(args.logical_devices, args.device_map).values())
    runs = {}
    for label, order in (("planned", cand["order"]), ("node", np.arange(graph.num_ops))):
        model, inputs = cs.build(name, args.size)
        module = apply(model, placement, inputs, device_map=args.device_map, graph=graph, order=order)
        runs[label] = (module, torch.optim.Adam(module.parameters(), lr=1e-3), inputs, [])
    for k in range(args.warmup + args.order_steps):
        for label in (("planned", "node") if k % 2 == 0 else ("node", "planned")):  # alternate who goes first
            module, opt, inputs, times = runs[label]
            synchronize(devices)
            t0 = time.perf_counter()
            train_step(module, inputs, opt)
            synchronize(devices)
            if k >= args.warmup:
                times.append(time.perf_counter() - t0)
    planned, node = (statistics.median(runs[k][3]) for k in ("planned", "node"))
    return {"placement": ", ".join(cand["methods"]), "order": cand["order_name"], "steps": args.order_steps,
            "real_planned_s": planned, "real_node_s": node, "ratio": planned / node,
            "sim_planned_s": sim_planned_s, "sim_node_s": sim_node_s, "slack": args.order_slack,
            "ok": bool(planned <= node * (1 + args.order_slack))}


# ------------------------------------------------------------------ one model
def scores(sim: np.ndarray, real: np.ndarray) -> dict:
    """Spearman, MAPE, n and the best ratio of one executor's simulated times against the real ones."""
    best = int(np.argmin(sim))  # ties: the first in measuring order (learned, baselines, singles, random)
    rho, err, ratio = cs.spearman(sim, real), cs.mape(sim, real), float(real[best] / real.min())
    return {"spearman": rho, "mape": err, "n": int(len(real)), "best_ratio": ratio,
            "sim_best": best, "sim_best_ties": int(np.sum(sim == sim[best])),
            "pass": {"spearman": bool(rho >= TARGETS["spearman_min"]), "mape": bool(err <= TARGETS["mape_max"]),
                     "best_ratio": bool(ratio <= TARGETS["best_ratio_max"])}}


def simulate_both(graph_p, phys, idx: list, orders: list) -> dict[str, np.ndarray]:
    """Each placement's simulated step under each executor model.

    Rounded to picoseconds: the same schedule summed in another order differs in the last float bits, which
    must not rank placements (e.g. on one physical device, where every placement simulates alike).
    """
    return {e: np.round(cs.sim_times(graph_p, phys, idx, {"executor": e}, orders), 12) for e in EXECUTORS}


def score_both(sims: dict[str, np.ndarray], real: np.ndarray, methods: list[list[str]]) -> tuple[dict, str | None]:
    """:func:`scores` per executor, its ``sim_best`` named by the placement's methods; and the real best's name."""
    if not len(real):
        return {e: None for e in EXECUTORS}, None
    per_exec = {}
    for e in EXECUTORS:
        per_exec[e] = scores(sims[e], real)
        per_exec[e]["sim_best"] = ", ".join(methods[per_exec[e]["sim_best"]])
    return per_exec, ", ".join(methods[int(np.argmin(real))])


def _profile(name: str, args: argparse.Namespace, model: Any, inputs: tuple, graph: Any, work: str) -> dict:
    """The model's profile on ``args.torch_devices``: the one in ``work`` if it is this graph's and covers them, else a new one."""
    import torch

    from envs.real.profiler import check_profile, load_profile, profile_model, save_profile

    prof_path = os.path.join(work, "profile.json")
    prof = load_profile(prof_path) if os.path.exists(prof_path) else None
    if prof is not None and (prof.get("graph_hash") != graph.content_hash or not set(args.torch_devices) <= set(prof["devices"])):
        prof = None
    if prof is None:
        torch.set_num_threads(max(1, args.cpus))  # the threads the measuring actor uses
        prof = profile_model(model, inputs, args.torch_devices, warmup=1, repeats=args.repeats)
        check_profile(prof)
        save_profile(prof, prof_path)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    else:
        log(f"[{name}] reusing {prof_path}")
    return prof


def _rows(name: str, args: argparse.Namespace, graph: Any, logical: Any, cands: list[dict], results: list, sims: dict) -> list[dict]:
    """One JSONL row per measured placement: what it is, its real and simulated step times."""
    from envs.real.measured import placement_hash

    rows = []
    for k, (c, r) in enumerate(zip(cands, results)):
        devs = [logical.device_names[i] for i in c["idx"].tolist()]
        order = None if c["order"] is None else [graph.names[i] for i in c["order"].tolist()]
        rows.append({"model": name, "size": args.size, "kind": c["kind"], "methods": c["methods"],
                     "placement_hash": placement_hash(devs, order), "issue_order": c["order_name"],
                     "status": r.status, "message": r.message, "real_step_s": r.step_time_s if r.ok else None,
                     "real_step_times_s": r.extra.get("step_times_s"), "peak_bytes": r.peak_bytes,
                     "sim_step_s": {e: float(sims[e][k]) for e in EXECUTORS},
                     "ops_per_device": {d: devs.count(d) for d in logical.device_names},
                     "devices": c["idx"].tolist(), "order": None if c["order"] is None else c["order"].tolist()})
    return rows


def _checks(name: str, args: argparse.Namespace, graph: Any, graph_p: Any, phys: Any, to_phys: np.ndarray, logical: Any,
            cands: list[dict], ok: np.ndarray) -> dict:
    """``placer.apply``'s gradients against float64 (the learned placement), and planned issue orders run for real."""
    from envs.sim.simulator import SimEnv
    from graphs.plan import Placement

    checks: dict = {"apply": None, "orders": []}
    learned = [c for c in cands if c["kind"] == "learned"]
    if learned:
        lp = Placement.from_indices(graph, logical.device_names, learned[0]["idx"], method="learned", order=learned[0]["order"])
        checks["apply"] = check_apply(name, args, lp, graph)
        log(f"[{name}] apply check vs float64: loss rel err {checks['apply']['output_rel_err']:.1e}, worst gradient "
            f"{checks['apply']['grad_max_rel_err']:.1e} (float32 CPU {checks['apply']['grad_worst_cpu32_rel_err']:.1e}) "
            f"-> {'ok' if checks['apply']['ok'] else 'FAILED'}")
    eager = SimEnv(graph_p, phys, executor="eager")

    def sim_pair(c: dict) -> tuple[float, float]:
        idx = to_phys[c["idx"]]
        node = round(eager.simulate(idx, order=np.arange(graph.num_ops)).extra["sim_step_time_s"], 12)
        return node, (round(eager.simulate(idx, order=c["order"]).extra["sim_step_time_s"], 12) if c["order"] is not None else node)

    ordered = [c for k, c in enumerate(cands) if ok[k] and c["kind"] != "learned" and c["order"] is not None
               and not np.array_equal(c["order"], np.arange(graph.num_ops))]
    gain = {id(c): np.subtract(*sim_pair(c)) for c in ordered}  # node - planned, simulated
    ordered.sort(key=lambda c: -gain[id(c)])  # the largest simulated gain first
    for c in (learned + ordered)[: args.order_checks]:
        if c["order"] is None:
            continue
        node_s, planned_s = sim_pair(c)
        checks["orders"].append(check_order(name, args, graph, c, node_s, planned_s))
        o = checks["orders"][-1]
        log(f"[{name}] order check ({o['placement']}, {o['order']}): planned {o['real_planned_s'] * 1e3:.2f} ms vs "
            f"node {o['real_node_s'] * 1e3:.2f} ms -> {'ok' if o['ok'] else 'SLOWER'}")
    return checks


def run_model(name: str, args: argparse.Namespace) -> dict:
    import envs
    from envs.real.profiler import save_profile
    from graphs.io import write_text_atomic
    from graphs.plan import Placement
    from graphs.torch_capture import capture

    times: dict[str, float] = {}
    work = os.path.join(args.work_dir, name)
    os.makedirs(work, exist_ok=True)
    cluster = envs.resolve_cluster(args.cluster)
    model, inputs = cs.build(name, args.size)
    graph = capture(model, inputs, name=name)
    log(f"[{name}] {args.size}: {graph.num_ops} ops; profiling on {', '.join(args.torch_devices)}")

    t0 = time.time()
    prof = _profile(name, args, model, inputs, graph, work)
    times["profile_s"] = time.time() - t0
    graph_p, logical, phys, to_phys = cs.calibrated(graph, prof, cluster, args.device_map)

    t0 = time.time()
    cands = candidates(name, args, graph_p, logical, model, work)
    times["place_s"] = time.time() - t0
    kinds = {k: sum(c["kind"] == k for c in cands) for k in ("learned", "baseline", "single", "random")}
    log(f"[{name}] measuring {len(cands)} placements ({', '.join(f'{v} {k}' for k, v in kinds.items())})")

    t0 = time.time()
    placements = [Placement.from_indices(graph, logical.device_names, c["idx"], order=c["order"]) for c in cands]
    measure = cs.measure_ray if args.real == "ray" else cs.measure_here
    results = measure(name, args.size, cluster, graph, placements, work, device_map=args.device_map,
                      warmup=args.warmup, steps=args.steps, cpus=args.cpus, timeout=args.timeout)
    times["measure_s"] = time.time() - t0

    sims = simulate_both(graph_p, phys, [to_phys[c["idx"]] for c in cands], [c["order"] for c in cands])
    ok = np.array([r.ok for r in results])
    real = np.array([r.step_time_s for r in results])
    rows = _rows(name, args, graph, logical, cands, results, sims)
    write_text_atomic(os.path.join(args.out_dir, f"{name}.jsonl"), "".join(json.dumps(row) + "\n" for row in rows))
    save_profile(prof, os.path.join(args.out_dir, f"{name}.profile.json"))
    per_exec, real_best = score_both({e: sims[e][ok] for e in EXECUTORS}, real[ok], [c["methods"] for c, good in zip(cands, ok) if good])

    t0 = time.time()
    checks = _checks(name, args, graph, graph_p, phys, to_phys, logical, cands, ok)
    times["checks_s"] = time.time() - t0
    failed = [f"{', '.join(c['methods'])}: {r.status}: {r.message}" for c, r in zip(cands, results) if not r.ok]
    return {"model": name, "size": args.size, "ops": graph.num_ops, "graph_hash": graph.content_hash,
            "placements": len(cands), "measured_ok": int(ok.sum()), "kinds": kinds, "failed": failed[:10],
            "profile_errors": dict(list(prof.get("errors", {}).items())[:10]),  # ops a device could not run, and why
            "real_step_s_range": [float(real[ok].min()), float(real[ok].max())] if ok.sum() else None,
            "real_best": real_best, "executors": per_exec, "checks": checks, "times_s": times}


# -------------------------------------------------------------------- rescore
def rescore_model(name: str, args: argparse.Namespace) -> dict:
    """Score an earlier run's measurements again with a (new) profile and the current simulator; no device needed.

    Reads ``<model>.jsonl`` (the placements and their real step times) from
    ``--rescore`` and the profile ``<model>.profile.json`` from ``--profile-dir``
    (default the same folder), captures the model here (its graph must be the
    profiled one) and simulates every measured placement under both executors.
    """
    from envs.real.profiler import load_profile
    from graphs.torch_capture import capture
    import envs

    folder = args.rescore
    rows_path = os.path.join(folder, f"{name}.jsonl")
    prof_path = os.path.join(args.profile_dir or folder, f"{name}.profile.json")
    for path in (rows_path, prof_path):
        if not os.path.exists(path):
            raise PlacerError(f"{path}: not found")
    with open(rows_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    prof = load_profile(prof_path)
    cluster = envs.resolve_cluster(args.cluster)
    model, inputs = cs.build(name, args.size)
    graph = capture(model, inputs, name=name)
    if prof.get("graph_hash") != graph.content_hash:
        raise PlacerError(f"{prof_path}: profiled graph {prof.get('graph_hash')}, not {name} ({args.size}) as captured here ({graph.content_hash})")
    graph_p, logical, phys, to_phys = cs.calibrated(graph, prof, cluster, args.device_map)
    ok_rows = [r for r in rows if r.get("real_step_s")]
    idx = [to_phys[np.asarray(r["devices"], dtype=np.int32)] for r in ok_rows]
    orders = [None if r.get("order") is None else np.asarray(r["order"], dtype=np.int64) for r in ok_rows]
    real = np.array([r["real_step_s"] for r in ok_rows])
    per_exec, best = score_both(simulate_both(graph_p, phys, idx, orders), real, [r["methods"] for r in ok_rows])
    log(f"[{name}] rescored {len(real)} measured placements with {prof_path}")
    return {"model": name, "size": args.size, "ops": graph.num_ops, "graph_hash": graph.content_hash, "placements": len(rows),
            "measured_ok": len(ok_rows), "real_step_s_range": [float(real.min()), float(real.max())] if len(real) else None,
            "real_best": best, "executors": per_exec, "checks": {"apply": None, "orders": []}, "failed": []}


# -------------------------------------------------------------------- output
def _fmt(x, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x * scale:{spec}}{suffix}"


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def markdown(rows: list[dict], args: argparse.Namespace, device: str) -> str:
    t = TARGETS
    lines = [
        f"Calibrated simulator vs real steps on {device} (cluster {args.cluster}, `--device-map {args.device_map}`, "
        f"size {args.size}, median of {args.steps} Adam steps after {args.warmup}; `{' '.join(args.command)}`).",
        "",
        f"| model | ops | executor | n | Spearman (target ≥ {t['spearman_min']}) | MAPE (≤ {100 * t['mape_max']:.0f}%) | "
        f"sim-best / real-best (≤ {t['best_ratio_max']}) | simulator's best | real best | real step range |",
        "|---|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        rng = r["real_step_s_range"]
        for e in EXECUTORS:
            s = r["executors"].get(e)
            if s is None:
                lines.append(f"| {r['model']} | {r['ops']} | {e} | 0 | — | — | — | — | — | — |")
                continue
            p = s["pass"]
            ties = f" ({s['sim_best_ties']} tied)" if s["sim_best_ties"] > 1 else ""
            lines.append(
                f"| {r['model']} | {r['ops']} | {e} | {s['n']} | {_fmt(s['spearman'], '.3f')}{_mark(p['spearman'] if np.isfinite(s['spearman']) else None)} | "
                f"{_fmt(s['mape'], '.1f', 100, '%')}{_mark(p['mape'])} | {_fmt(s['best_ratio'], '.3f')}{_mark(p['best_ratio'])} | "
                f"{s['sim_best']}{ties} | {r['real_best']} | "
                f"{rng[0] * 1e3:.1f}-{rng[1] * 1e3:.1f} ms |")
    lines += ["", "| model | check | placement | result | target |", "|---|---|---|---|---|"]
    for r in rows:
        a = r["checks"]["apply"]
        if a is not None:
            lines.append(f"| {r['model']} | `placer.apply`: loss and {a['grads']} gradients vs float64 on the CPU (float32 on the CPU) | "
                         f"{a['placement']} | loss {a['output_rel_err']:.1e} ({a['output_cpu32_rel_err']:.1e}), worst gradient "
                         f"{a['grad_max_rel_err']:.1e} ({a['grad_worst_cpu32_rel_err']:.1e}) {a['grad_worst']} (2-norm rel. err){_mark(a['ok'])} | "
                         f"≤ max({a['tolerance']:g}, 2 × float32 CPU's) |")
        for o in r["checks"]["orders"]:
            lines.append(f"| {r['model']} | issue order `{o['order']}` vs node order, median of {o['steps']} interleaved steps | "
                         f"{o['placement']} | {o['real_planned_s'] * 1e3:.2f} vs {o['real_node_s'] * 1e3:.2f} ms "
                         f"({o['ratio']:.3f}; simulated {o['sim_planned_s'] * 1e3:.2f} vs {o['sim_node_s'] * 1e3:.2f} ms){_mark(o['ok'])} | "
                         f"≤ {1 + o['slack']:g} |")
    for r in rows:
        if r["failed"]:
            lines.append(f"\n{r['model']}: {len(r['failed'])} placement(s) failed: " + "; ".join(r["failed"]))
    return "\n".join(lines) + "\n"


def _num(x):
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _num(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_num(v) for v in x]
    return x


def summary(rows: list[dict], args: argparse.Namespace, device: str) -> dict:
    """The ``--json`` document: one row per model and executor, the device checks, the targets."""
    return _num({
        "device": device, "command": " ".join(args.command), "targets": TARGETS,
        "models": [{"model": r["model"], "executor": e, **{k: s[k] for k in ("spearman", "mape", "n", "best_ratio")}}
                   for r in rows for e in EXECUTORS if (s := r["executors"].get(e)) is not None],
        "checks": [{"model": r["model"], **r["checks"]} for r in rows],
    })


def device_name(args: argparse.Namespace) -> str:
    import torch

    cuda = [d for d in args.torch_devices if d.startswith("cuda")]
    gpus = ", ".join(torch.cuda.get_device_name(d) for d in cuda)
    host = f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}, {args.cpus} threads"
    return f"{gpus} + {host}" if gpus else f"CPU only: {host}"


# ---------------------------------------------------------------------- CLI
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = cs.OneLineParser(prog="validate_gpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU-only smoke test: every logical device on the CPU, one small model")
    p.add_argument("--models", help=f"comma-separated zoo names (default {DEFAULTS['gpu']['models']})")
    p.add_argument("--size", choices=("small", "medium", "full"), help="model sizes: calibrate_sim's tables or the zoo's (default medium)")
    p.add_argument("--cluster", default="h200x1", help="cluster whose logical devices placements use (default h200x1)")
    p.add_argument("--device-map", help=f"logical -> torch devices (default {DEFAULTS['gpu']['device_map']}; --tiny: *=cpu)")
    p.add_argument("--placements", type=int, help="distinct placements measured per model (default 30)")
    p.add_argument("--train-budget", "--time-budget", dest="train_budget", type=float,
                   help="seconds of placer.train for the learned placement (default 30; --tiny: 4)")
    p.add_argument("--warmup", type=int, help="untimed steps before the timed ones (default 2)")
    p.add_argument("--steps", type=int, help="timed steps per placement (default 5)")
    p.add_argument("--repeats", type=int, help="profiler repeats (default 5)")
    p.add_argument("--order-checks", type=int, help="placements whose issue order is checked for real (default 3; 0: none)")
    p.add_argument("--order-steps", type=int, help="timed steps per order in the order check (default 20)")
    p.add_argument("--order-slack", type=float, default=0.02, help="planned order passes at <= (1 + this) x node order (default 0.02)")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="apply check: an error against float64 always allowed, beside twice the float32 CPU model's own (default 1e-3)")
    p.add_argument("--cpus", type=int, help="CPU threads for profiling and the measuring actor (default: all cores)")
    p.add_argument("--real", choices=("local", "ray"), default="local",
                   help="measure in this process (default; the lent GPU machines have no Ray) or in a Ray actor (envs.MeasuredEnv); "
                        "the same code, placed module and log either way")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per measured placement (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rescore", metavar="DIR", help="no device: score the measurements of an earlier run (DIR/<model>.jsonl) "
                   "again with the current simulator and a profile (--profile-dir, default DIR/<model>.profile.json)")
    p.add_argument("--profile-dir", help="with --rescore: the folder of the <model>.profile.json to score with")
    p.add_argument("--json", action="store_true", help="print the JSON summary instead of the markdown report")
    p.add_argument("--out-dir", default="docs/calibration", help="raw measurements and summary.json (default docs/calibration)")
    p.add_argument("--work-dir", default="runs/validate_gpu", help="resumable state: Ray log, profile, training run (default runs/validate_gpu)")
    args = p.parse_args(argv)
    args.command = ["python", "scripts/validate_gpu.py", *(sys.argv[1:] if argv is None else argv)]
    for key, value in DEFAULTS["tiny" if args.tiny else "gpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def check(args: argparse.Namespace) -> None:
    """PlacerError (one line, naming the option) for a bad option, before any work."""
    import envs
    from envs.real.placing import check_available, resolve_devices
    from placer.checks import check_float, check_int, check_output_dir, check_seed

    args.model_names = cs.model_names(args.models, args.size)
    check_int(args.placements, "--placements", least=2)
    check_int(args.warmup, "--warmup", least=0)
    for opt in ("steps", "repeats", "order_steps", "cpus"):
        check_int(getattr(args, opt), f"--{opt.replace('_', '-')}", least=1)
    check_int(args.order_checks, "--order-checks", least=0)
    check_seed(args.seed)
    check_float(args.train_budget, "--train-budget", above=0)
    check_float(args.timeout, "--timeout", above=0)
    check_float(args.order_slack, "--order-slack", least=0)
    check_float(args.tolerance, "--tolerance", above=0)
    cluster = envs.resolve_cluster(args.cluster)
    torch_of = resolve_devices(cluster.device_names, args.device_map)
    if args.rescore:  # scores stored measurements: no device, nothing written
        if not os.path.isdir(args.rescore):
            raise PlacerError(f"--rescore {args.rescore}: not a folder")
        args.logical_devices, args.torch_devices = list(cluster.device_names), list(dict.fromkeys(str(d) for d in torch_of.values()))
        return
    check_available(torch_of)
    args.logical_devices = list(cluster.device_names)
    args.torch_devices = list(dict.fromkeys(str(d) for d in torch_of.values()))
    check_output_dir(args.out_dir, "--out-dir")
    check_output_dir(args.work_dir, "--work-dir")


def merged_summary(path: str, rows: list[dict], args: argparse.Namespace, device: str) -> dict:
    """``summary.json``: this run's models replace their earlier entries; other models' stay (one model per call works)."""
    from graphs.io import read_json

    doc = read_json(path) if os.path.exists(path) else {}
    old = [m for m in doc.get("models", []) if isinstance(m, dict) and m.get("model") not in {r["model"] for r in rows}]
    new = [{**r, "device": device, "command": " ".join(args.command), "time_unix": time.time()} for r in rows]
    return _num({"format": "placer-gpu-validation/1", "targets": TARGETS, "models": old + new})


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        check(args)
        return run(args)
    except PlacerError as e:  # bad options or a failed run: one line, exit status 2
        print(f"validate_gpu: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from placer.learn.checkpoint import write_json

    if args.rescore:
        rows = [rescore_model(name, args) for name in args.model_names]
        device = f"measurements of {args.rescore}, rescored here"
        print(json.dumps(summary(rows, args, device), indent=1) if args.json else markdown(rows, args, device))
        return 0

    os.makedirs(args.out_dir, exist_ok=True)
    device = device_name(args)
    log(f"validate_gpu: {device}; models {', '.join(args.model_names)} ({args.size})")
    rows = []
    path = os.path.join(args.out_dir, "summary.json")
    for name in args.model_names:
        t0 = time.time()
        rows.append(run_model(name, args))
        write_json(path, merged_summary(path, rows[-1:], args, device))  # after each model: a run cut short keeps it
        log(f"[{name}] done in {time.time() - t0:.0f}s")
    print(json.dumps(summary(rows, args, device), indent=1) if args.json else markdown(rows, args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
