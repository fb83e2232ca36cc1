"""Learning from measurements: the corrected loop against its ablations, at an equal number of measurements.

    python -m bench.correction stand-in --graphs unet-80,moe-60 --slow gpu:1 --slowdown 3 --seeds 0,1
    python -m bench.correction local --scenario tiny --measurements 20 --out-dir runs/correction-tiny
    python -m bench.correction local --source nmt-2 --cluster k80x2 --device-map '*=cpu' --measurements 30
    python -m bench.correction ranks --source bench.rank_models:lm --cluster k80x2 --microbatches 4 --measurements 20
    python -m bench.correction --report a.json b.json --plot curves.png   # earlier runs' --json: table, curves
    python -m bench.correction ranks --source bench.rank_models:lm --plans a.json b.json a.json:simulator  # again

Each method gets the same number of real measurements and keeps its fastest measured placement:

* **simulator**: the simulator's best (the move search on the simulator), measured once;
* **measured moves**: the move search from the simulator's best whose every placement is measured, no model
  (:func:`placer.learn.measured_moves.measured_move_search`; what ``placer train --env measured --algo moves``
  does);
* **simulator rank**: the measured loop without its correction: each round measures the simulator's own next-best
  candidate (:class:`placer.learn.measured_search.CorrectedSearch`, ``correction=False``);
* **linear correction**: the measured loop with the linear correction only (``rates=False``): the plain simulator's
  step time times a model of its error, linear in the placement's features, fitted to the measurements so far,
  chooses what to measure next;
* **corrected**: the measured loop (``CorrectedSearch``): the cluster's rates (each device's speed, the links')
  refitted to the measurements so far and the simulator run on them, then the linear correction of what they leave
  (:mod:`placer.learn.rates`).

``--methods`` runs some of the measured methods only (a real run of all four takes four times one's measurements);
the simulator's best is measured whichever run.

Each measured method ends as ``placer train`` does: its ``--finalists`` fastest placements measured and the
simulator's best are measured again side by side (``--finals`` rounds; the same for every method, outside the
budget), and the one with the lowest median is its placement (``--finals 0``: the fastest measured is; the
corrected loop adds the measured placement its final fit predicts fastest and weighs each finalist's reads with
its prediction, :func:`placer.learn.measured_search.posterior_choice`). Then every
method's placement and the simulator's best are measured again side by side (``--rematch`` rounds, interleaved) and
compared by their medians: the best of many noisy measurements is biased low. On a stand-in, each method's fastest
measured placement's true step is kept too (``true_fastest_s``), to show what the final side-by-side changed.

``stand-in``: the reality is the simulator on a distorted copy of the cluster (:class:`placer.learn.stand_in.StandIn`:
a device ``--slowdown`` times slower, host links ``--copy-factor`` times slower, each op's FLOPs off by its own
hidden factor with ``--op-noise``, lognormal ``--noise``); its true
best (a long search on the distorted simulator) is known, and the table says how far each method is from it.
With ``--split M``, plans across processes instead: the stand-in is the simulator of ranks at M microbatches, the
searches' simulator scores one stage per rank (as in ``ranks``), and the true best is ``stage_search`` on the
distorted cluster or the whole graph on one GPU, whichever is faster there (exact on two ranks: every position of
the one cut is tried, and the loops' merges reach no other plan). Each method draws the stand-in's
noise from a stream of its own, the same for every method (common random numbers: :meth:`StandIn.stream`), and
the side-by-side from another, so that no method's draws move another's.
``local``: real training steps in this process (:class:`envs.real.local.LocalEnv`): a zoo name or
``module:callable`` (``--source``), or the offload scenario (``--scenario tiny`` on a CPU, ``llama-256k`` on a GPU
capped at 24 GiB, as in ``bench.gpu_offload``). Each method measures anew (a placement measured by another method
is measured again for it), so no method is helped by another's measurements.
``ranks``: plans across processes, each placement one job of one gloo process per device on a local Ray
(:class:`envs.real.ray.jobs.RanksEnv`, ``--microbatches`` M, ``--inflight`` W), the simulator the simulator of ranks
(:class:`envs.sim.ranks.RankSim`) on ``--cluster``: a preset such as ``k80x2`` is an uncalibrated cluster for this
machine's CPU ranks (its devices are GPUs), where the simulator misranks. The simulator scores plans of one stage
per rank only, as ``placer train --ranks`` does, unless ``--looped``. ``--pin`` runs rank r on the r-th core this
process may use; ``--busy-core K`` also keeps a busy loop pinned to core K for the whole run (:func:`busy_core`):
the rank pinned there computes at about half its speed, a real slow device that no cluster file knows (CPU ranks
are otherwise alike, and a preset's error is then mostly one scale, which moves no split).

Every run stores each method's plan (``plans``: the placements its side-by-side measured). ``--plans RUN.json[:METHOD]
...`` searches nothing: it measures the plans earlier runs stored side by side (``--rematch`` interleaved rounds) on
the mode's reality, so that two runs' plans, found at different times on a shared host, are compared in one run.

A markdown table on stdout (``--json``: every run with its curves); progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import numpy as np

import envs
from bench.common import OneLineParser, parse_list, print_report
from bench.graph_sources import graphs_and_clusters
from envs.real.slices import HELPER_SLICE_US
from graphs import PlacerError
from placer.learn.measured_moves import measured_move_search
from placer.learn.measured_search import CorrectedSearch, CorrectedSearchOptions, side_by_side
from placer.learn.move_search import MoveSearch
from placer.learn.stand_in import SLOW_PARTS, StandIn

METHODS = ("simulator", "measured moves", "simulator rank", "linear correction", "corrected")
#: The measured methods ``--methods`` chooses among (the simulator's best is always measured: the reference).
MEASURED = METHODS[1:]
#: ``--methods``' names of :data:`MEASURED` (a hyphen for each space), to the methods they name.
METHOD_NAMES = {m.replace(" ", "-"): m for m in MEASURED}


class Fresh:
    """A method's own measurements on a shared real env: each new placement measured anew (``measure_again``
    where the env has it), cached for this method only; counts them."""

    def __init__(self, real: Any) -> None:
        self.real, self.cache, self.measured = real, {}, 0

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        op_devices = np.atleast_2d(np.asarray(op_devices, dtype=np.int32))
        keys = [hashlib.blake2b(p.tobytes(), digest_size=16).digest() for p in op_devices]
        todo = [k for k, key in enumerate(keys) if key not in self.cache]
        if todo:
            again = getattr(self.real, "measure_again", self.real.step_times)
            step_time_s, failed = again(op_devices[todo])
            self.measured += len(todo)
            for j, k in enumerate(todo):
                self.cache[keys[k]] = (float(step_time_s[j]), bool(failed[j]))
        out = [self.cache[key] for key in keys]
        return np.array([t for t, _ in out]), np.array([f for _, f in out])

    def measure_again(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.real.measure_again(op_devices)


def own_stream(real: Any, name: str) -> Any:
    """``real``'s noise stream ``name`` where it draws its noise (a :class:`StandIn`: each method's measurements,
    and the side-by-side's, from streams of their own, so that what one draws moves no other); else ``real``, a
    machine, whose noise no one chooses."""
    return real.stream(name) if isinstance(real, StandIn) else real


def run_methods(
    graph: Any,
    cluster: Any,
    real: Any,
    *,
    options: CorrectedSearchOptions,
    seed: int,
    rematch: int,
    say: Callable[[str], Any],
    out: dict[str, Any],
    sim: Any = None,
    methods: Sequence[str] = MEASURED,
) -> None:
    """Every method of ``methods`` (of :data:`MEASURED`; the simulator's best always) at ``options.measurements``
    measurements, then the side-by-side, filled into ``out`` as each method ends, so that an interrupted run keeps
    the methods it finished. ``sim``: the simulator the searches use (default :class:`envs.SimEnv` of the graph and
    cluster)."""
    out.update({"measurements": options.measurements, "methods": {}})
    found: dict[str, np.ndarray] = {}  # each method's placement (its final side-by-side's winner)
    fastest: dict[str, np.ndarray] = {}  # each method's fastest measured placement
    variants = {"corrected": (True, True), "linear correction": (True, False), "simulator rank": (False, False)}
    variants = {name: v for name, v in variants.items() if name in methods}
    if not variants:  # the simulator's best without a measured loop: the same search as the loops' first
        found["simulator"] = CorrectedSearch(graph, cluster, real, sim=sim, options=options, seed=seed).simulator_best()
    for name, (correction, rates) in variants.items():
        t0, scorer = time.perf_counter(), Fresh(own_stream(real, "methods"))
        o = dataclasses.replace(options, correction=correction, rates=rates)
        search = CorrectedSearch(graph, cluster, scorer, sim=sim, options=o, seed=seed)
        result = search.run(None)
        found[name], fastest[name] = result.op_devices, search.best_op_devices()
        found["simulator"] = result.simulator_op_devices  # the same search, the same seed: the same placement
        out["methods"][name] = {
            "best_s": result.fastest_measured_s,
            "measured": scorer.measured,
            "wall_s": time.perf_counter() - t0,
            "curve": [m.to_dict() for m in result.curve],
            "finals": result.rematch,
            "chosen": result.chosen,
            **(
                {"weights": result.weights, "noise_std": result.noise_std, "posterior_s": result.posterior}
                if correction
                else {}
            ),
        }
        fastest_ms = result.fastest_measured_s * 1e3
        say(f"    {name}: {fastest_ms:.3f} ms ({scorer.measured} measured; {result.chosen} chosen)")
    if variants:  # every loop measures the simulator's best first
        sim_first = out["methods"][next(iter(variants))]["curve"][0]
        out["methods"]["simulator"] = {"best_s": sim_first["real_s"], "measured": 1, "curve": [sim_first]}
    if "measured moves" in methods:
        run_measured_moves(
            graph, cluster, real, options=options, seed=seed, say=say, out=out, sim=sim, found=found, fastest=fastest
        )
    names = list(found)
    out["plans"] = {m: found[m].tolist() for m in names}  # what the side-by-side measures: for --plans later
    times = side_by_side(own_stream(real, "side-by-side"), [found[m] for m in names], rematch)
    out["side_by_side"] = dict(zip(names, times))
    if isinstance(real, StandIn):
        out["true_s"] = {m: float(real.true_step_times(p)[0][0]) for m, p in found.items()}
        out["true_fastest_s"] = {m: float(real.true_step_times(p)[0][0]) for m, p in fastest.items()}


def run_measured_moves(
    graph: Any,
    cluster: Any,
    real: Any,
    *,
    options: CorrectedSearchOptions,
    seed: int,
    say: Callable[[str], Any],
    out: dict[str, Any],
    sim: Any,
    found: dict[str, np.ndarray],
    fastest: dict[str, np.ndarray],
) -> None:
    """:func:`run_methods`' rival that measures every placement, from the simulator's best (``found["simulator"]``);
    its plan and fastest placement into ``found`` and ``fastest``, its run into ``out``."""
    t0, scorer = time.perf_counter(), Fresh(own_stream(real, "methods"))
    moves = measured_move_search(
        graph,
        cluster,
        scorer,
        found["simulator"],
        measurements=options.measurements,
        seed=seed,
        sim=sim,
        confirm=options.confirm,
        rematch=options.rematch,
        finalists=options.finalists,
        merge=options.merge,
    )
    found["measured moves"] = moves.plan if moves.plan is not None else found["simulator"]
    fastest["measured moves"] = moves.best_op_devices if moves.best_op_devices is not None else found["simulator"]
    out["methods"]["measured moves"] = {
        "best_s": moves.best_s,
        "measured": scorer.measured,
        "wall_s": time.perf_counter() - t0,
        "curve": [{"best_s": b} for b in moves.curve],
        "finals": moves.rematched,
        "chosen": moves.chosen,
    }
    say(f"    measured moves: {moves.best_s * 1e3:.3f} ms ({scorer.measured} measured; {moves.chosen} chosen)")
    if "simulator" not in out["methods"] and moves.curve:  # its first measurement: the simulator's best, its start
        out["methods"]["simulator"] = {"best_s": moves.curve[0], "measured": 1}


def run_cell(
    args: argparse.Namespace,
    graph: Any,
    cluster: Any,
    real: Any,
    *,
    seed: int,
    say: Callable[[str], Any],
    out: dict[str, Any],
    sim: Any = None,
    plans: dict[str, np.ndarray] | None = None,
) -> None:
    """:func:`run_methods` with the command line's options (``--methods``, ``--rematch``, the loops' settings); given
    ``plans`` (``--plans``, read by :func:`stored_plans` before anything ran), :func:`run_again` instead."""
    if plans is not None:
        run_again(graph, cluster, real, plans, args.rematch, say, out)
        return
    options = _options(args)
    run_methods(
        graph,
        cluster,
        real,
        options=options,
        seed=seed,
        rematch=args.rematch,
        say=say,
        out=out,
        sim=sim,
        methods=args.methods,
    )


def read_json(path: str) -> Any:
    """A run file's JSON; unreadable or not JSON: :class:`PlacerError` naming ``path``."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise PlacerError(f"{path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlacerError(f"{path}: not JSON ({e})") from None


def stored_plans(specs: Sequence[str], source: str, graph: Any, cluster: Any) -> dict[str, np.ndarray]:
    """``--plans``: each ``RUN.json[:METHOD]`` the placement an earlier run (its ``--json``, one seed) stored for
    ``METHOD`` (a ``--methods`` name or ``simulator``; default ``corrected``: what its side-by-side measured), by
    label (the spec). A file that is not such a run, a method it did not run, or a plan made for another graph or
    cluster: :class:`PlacerError` naming the file."""
    known = {"simulator": "simulator", **METHOD_NAMES}
    plans: dict[str, np.ndarray] = {}
    for spec in specs:
        path, _, name = spec.rpartition(":")
        if path and name not in known and os.path.isfile(path) and not os.path.isfile(spec):
            raise PlacerError(f"{spec}: no method {name} (one of {', '.join(known)})")
        if not path or name not in known:
            path, name = spec, "corrected"
        doc = read_json(path)
        cells = doc.get("cells") if isinstance(doc, dict) else None
        if not isinstance(cells, list) or not cells or not all(isinstance(c, dict) for c in cells):
            raise PlacerError(f"{path}: not a bench.correction run (its --json)")
        if len(cells) != 1:
            raise PlacerError(f"{path}: {len(cells)} cells (seeds or graphs); --plans takes a run of one")
        (cell,) = cells
        stored = cell.get("plans")
        if not isinstance(stored, dict):
            raise PlacerError(f"{path}: stores no plans (a run before plans were kept, or an interrupted one)")
        if known[name] not in stored:
            raise PlacerError(f"{path}: no plan of {name} (it has {', '.join(sorted(stored))})")
        if cell.get("graph") != source or cell.get("cluster") != cluster.name:
            there = f"{cell.get('graph')} on {cell.get('cluster')}"
            raise PlacerError(f"{path}: its plans are for {there}, not {source} on {cluster.name}")
        plan = stored[known[name]]
        n = cluster.num_devices
        if (
            not isinstance(plan, list)
            or len(plan) != graph.num_ops
            or not all(isinstance(d, int) and 0 <= d < n for d in plan)
        ):
            raise PlacerError(f"{path}: the plan of {name} is not {graph.num_ops} device indices below {n}")
        plans[spec] = np.asarray(plan, dtype=np.int32)
    return plans


def run_again(
    graph: Any,
    cluster: Any,
    real: Any,
    plans: dict[str, np.ndarray],
    rounds: int,
    say: Callable[[str], Any],
    out: dict[str, Any],
) -> None:
    """``--plans``: earlier runs' placements measured again side by side, ``rounds`` interleaved rounds, into
    ``out`` (``side_by_side`` by label; ``methods`` empty: no search ran); on a stand-in, each one's true step."""
    say(f"    {len(plans)} stored plans, {rounds} rounds side by side")
    labels = list(plans)
    done = lambda r: say(f"    round {r}/{rounds}")  # noqa: E731
    times = side_by_side(own_stream(real, "side-by-side"), [plans[k] for k in labels], rounds, on_round=done)
    out.update(methods={}, again=labels, plans={k: plans[k].tolist() for k in labels})
    out["side_by_side"] = dict(zip(labels, times))
    if isinstance(real, StandIn):
        out["true_s"] = {k: float(real.true_step_times(p)[0][0]) for k, p in plans.items()}


def log_ratio_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The geometric mean of the round-by-round ratio ``a / b`` of two plans measured side by side, with its 95 %
    t-interval (on the logs of the ratios; one round: no interval, nan). Rounds where either failed are left out.

    >>> [round(x, 3) for x in log_ratio_interval([1.0, 2.0, 1.0], [1.0, 2.0, 1.0])]
    [1.0, 1.0, 1.0]
    """
    from scipy import stats

    logs = [float(np.log(x / y)) for x, y in zip(a, b) if np.isfinite(x) and np.isfinite(y)]
    if not logs:
        return float("nan"), float("nan"), float("nan")
    mean = float(np.mean(logs))
    if len(logs) < 2:
        return float(np.exp(mean)), float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(logs) - 1) * np.std(logs, ddof=1) / np.sqrt(len(logs)))
    return float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half))


def again_table(cells: list[dict[str, Any]]) -> str:
    """``--plans``' cells: each stored plan's median re-measured, and over the first plan named: the ratio of the
    medians and the geometric mean of the round-by-round ratio with its 95 % interval. A plan named twice (two runs
    that found the same placement) is measured once a round and says which it is the same as."""
    head = ["graph", "cluster", "plan", "rounds", "median ms", "/ first (medians)", "/ first (rounds, 95 % interval)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * 4]
    for c in cells:
        reads = c["side_by_side"]
        first = reads[c["again"][0]]
        seen: dict[tuple[int, ...], str] = {}
        for label in c["again"]:
            r = reads[label]
            mean, lo, hi = log_ratio_interval(r, first)
            key = tuple(c.get("plans", {}).get(label, ()))
            same = f" (the same plan as {seen[key]})" if key and key in seen else ""
            seen.setdefault(key, label)
            row = [c["graph"], c["cluster"], label + same, str(len(r)), f"{_median(r) * 1e3:.3f}"]
            row += [f"{_median(r) / _median(first):.3f}", f"{mean:.3f} ({lo:.3f}-{hi:.3f})"]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def tables(cells: list[dict[str, Any]]) -> str:
    """The methods' table (:func:`markdown_table`) and, for ``--plans``' cells, :func:`again_table`."""
    again = [c for c in cells if "again" in c]
    parts = [markdown_table([c for c in cells if "again" not in c])] if len(again) < len(cells) else []
    return "\n\n".join(parts + ([again_table(again)] if again else []))


def stand_in_cells(args: argparse.Namespace, say: Callable[[str], Any], cells: list[dict[str, Any]]) -> None:
    """The stand-in's cells, appended to ``cells`` as each starts (see :func:`run_methods`)."""
    graphs, clusters = graphs_and_clusters(args.graphs, args.clusters)
    for graph in graphs:
        for cluster in clusters:
            distortion = dict(
                slow_device=args.slow,
                slowdown=args.slowdown,
                copy_factor=args.copy_factor,
                slow_part=args.slow_part,
                machine_slowdown=args.machine_slowdown,
                op_noise=args.op_noise,
            )
            plans = stored_plans(args.plans, graph.name, graph, cluster) if args.plans else None
            simulator, sim = split_simulators(graph, cluster, args.split) if args.split else (None, None)
            truth = StandIn(graph, cluster, **distortion, simulator=simulator).truth
            if args.split:  # the best split, exact on two ranks (stage_search tries every position of the one cut),
                # or the whole graph on one device where that is faster (the loops' merges reach it)
                bests = np.stack([split_truth(truth.graph, truth.cluster, args.split), *one_device_plans(truth)])
                best = float(np.min(truth.step_times(bests.astype(np.int32))[0]))
            else:
                best = MoveSearch(graph, cluster, truth, seed=0).run(None, max_evals=args.truth_evals).step_time_s
            for seed in _seeds(args.seeds):
                say(f"  {graph.name} on {cluster.name}, seed {seed} (the stand-in's best {best * 1e3:.3f} ms)")
                real = StandIn(graph, cluster, **distortion, simulator=simulator, noise=args.noise, seed=seed)
                cell = {"graph": graph.name, "cluster": cluster.name, "seed": seed, "stand_in_best_s": best}
                cells.append(cell)
                run_cell(args, graph, cluster, real, seed=seed, say=say, out=cell, sim=sim, plans=plans)


def split_simulators(graph: Any, cluster: Any, microbatches: int) -> tuple[Callable[..., Any], Any]:
    """``--split``: the stand-in's simulator (of ranks, any plan) and the searches' (one stage per rank)."""
    from envs.sim.ranks import RankSim

    def ranks(g: Any, c: Any) -> Any:
        return RankSim(g, c, microbatches=microbatches)

    return ranks, RankSim(graph, cluster, microbatches=microbatches, one_stage_per_rank=True)


def split_truth(graph: Any, truth_cluster: Any, microbatches: int) -> np.ndarray:
    """``--split``: the stand-in's best split, ``stage_search`` on its (distorted) graph and cluster."""
    from types import SimpleNamespace

    from placer.methods.heuristics.stage_search import stage_search

    return stage_search(graph, truth_cluster, env=SimpleNamespace(microbatches=microbatches))


def one_device_plans(truth: Any) -> list[np.ndarray]:
    """``--split``: the whole graph on each GPU of ``truth``'s cluster (the plans a merge of every stage gives)."""
    from placer.methods.heuristics.costs import gpu_devices

    return [np.full(truth.graph.num_ops, d, dtype=np.int32) for d in gpu_devices(truth.cluster)]


def local_cells(args: argparse.Namespace, say: Callable[[str], Any], cells: list[dict[str, Any]]) -> None:
    """Real steps' cells, appended to ``cells`` as each starts (see :func:`run_methods`)."""
    from envs.real.local import LocalEnv  # torch: only for real steps

    if args.scenario:
        from bench.offload import builder, check_scenario, scenario_cluster

        scenario = check_scenario(args.scenario)
        source, cluster, name = builder(scenario), scenario_cluster(scenario), f"offload-{scenario.name}"
    else:
        source, cluster, name = args.source, envs.resolve_cluster(args.cluster), args.source
    real = LocalEnv(
        source,
        cluster,
        device_map=args.device_map,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        measure_timeout_s=args.measure_timeout,
        run_dir=args.out_dir,
        threads=args.threads,
    )
    try:
        plans = stored_plans(args.plans, name, real.graph, cluster) if args.plans else None
        for seed in _seeds(args.seeds):
            say(f"  {name} on {cluster.name} ({real.graph.num_ops} ops), seed {seed}, real steps")
            cell = {"graph": name, "cluster": cluster.name, "seed": seed, "device_map": args.device_map}
            cells.append(cell)
            run_cell(args, real.graph, cluster, real, seed=seed, say=say, out=cell, plans=plans)
    finally:
        real.close()


def ranks_cells(args: argparse.Namespace, say: Callable[[str], Any], cells: list[dict[str, Any]]) -> None:
    """Plans across processes, measured as Ray jobs of gloo ranks (see the module doc)."""
    from envs.real.distributed.worker import one_core_each
    from envs.real.ray.jobs import RanksEnv  # torch and ray: only for real steps
    from envs.sim.ranks import RankSim

    cluster = envs.resolve_cluster(args.cluster)
    M, W = args.microbatches, args.inflight
    rank_cpus = one_core_each() if args.pin else None  # rank r on the r-th core
    cores = [c for (c,) in rank_cpus or ()]
    if args.busy_core is not None and not args.pin:
        raise PlacerError(f"--busy-core {args.busy_core}: give --pin too (unpinned ranks share the busy core alike)")
    if args.busy_core is not None and args.busy_core not in cores:
        raise PlacerError(f"--busy-core {args.busy_core}: not one of the cores this process may use, {cores}")
    slice_us = HELPER_SLICE_US if args.short_slices else None
    real = RanksEnv(
        args.source,
        cluster,
        microbatches=M,
        inflight=W,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        measure_timeout_s=args.measure_timeout,
        run_dir=args.out_dir,
        rank_cpus=rank_cpus,
        helper_slice_us=slice_us,
    )
    try:
        # one stage per rank unless --looped, as `placer train --ranks` scores plans: looped plans measured far
        # slower than simulated on CPU ranks (BENCHMARKS.md, "A learned looped plan, 63 % slower than simulated")
        sim = RankSim(real.graph, cluster, microbatches=M, inflight=W, one_stage_per_rank=not args.looped)
        plans = stored_plans(args.plans, args.source, real.graph, cluster) if args.plans else None
        for seed in _seeds(args.seeds):
            say(f"  {args.source} on {cluster.name} ({real.graph.num_ops} ops), M={M}, seed {seed}, gloo ranks")
            cell = {"graph": args.source, "cluster": cluster.name, "seed": seed, "microbatches": M, "inflight": W}
            cell.update(
                rank_cpus=rank_cpus and [list(c) for c in rank_cpus], busy_core=args.busy_core, helper_slice_us=slice_us
            )
            cells.append(cell)
            with busy_core(args.busy_core):
                run_cell(args, real.graph, cluster, real, seed=seed, say=say, out=cell, sim=sim, plans=plans)
    finally:
        real.close()


#: What :func:`busy_core` runs: pinned to the core its argument names, it spins.
BUSY_LOOP = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@contextlib.contextmanager
def busy_core(core: int | None) -> Iterator[subprocess.Popen | None]:
    """A process spinning on ``core`` (pinned there) while the block runs, killed after; None: nothing. A process
    pinned to the same core then gets about half of it (the kernel shares a core fairly between the two)."""
    if core is None:
        yield None
        return
    spin = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core)], stdin=subprocess.DEVNULL)
    try:
        yield spin
    finally:
        spin.kill()
        spin.wait()


def _seeds(text: str) -> list[int]:
    return [int(s) for s in parse_list(text, what="seeds") if s.isdigit()] or [0]


def _options(args: argparse.Namespace) -> CorrectedSearchOptions:
    return CorrectedSearchOptions(
        measurements=args.measurements,
        sim_evals=args.sim_evals,
        round_evals=args.round_evals,
        kappa=args.kappa,
        confirm=args.confirm == "on",
        merge=args.merge == "on",
        rematch=args.finals,
        finalists=args.finalists,
    )


def _median(times: list[float]) -> float:
    ok = [t for t in times if np.isfinite(t)]
    return float(np.median(ok)) if ok else float("inf")


def markdown_table(cells: list[dict[str, Any]]) -> str:
    """One row per cell and method: its best measured, its re-measured median, over the simulator's best (and, on a
    stand-in, its true step time over the stand-in's best)."""
    stand_in = any("true_s" in c for c in cells)
    head = [
        "graph",
        "cluster",
        "seed",
        "method",
        "measured",
        "best measured ms",
        "re-measured ms",
        "/ simulator's best",
    ]
    head += ["chosen"]
    head += ["true / stand-in's best", "its fastest measured's"] if stand_in else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * 4 + "---|" + "---:|" * (len(head) - 9)]
    for c in cells:  # an interrupted run's cell lacks what it did not reach: "-" there
        again_by = {m: _median(t) for m, t in c.get("side_by_side", {}).items() if t}
        sim = again_by.get("simulator")
        for m in METHODS:
            r = c.get("methods", {}).get(m)
            if r is None:
                continue
            row = [c["graph"], c["cluster"], str(c["seed"]), m, str(r["measured"]), f"{r['best_s'] * 1e3:.3f}"]
            again = again_by.get(m)
            row += [f"{again * 1e3:.3f}", f"{again / sim:.3f}"] if again is not None and sim else ["-", "-"]
            row += [r.get("chosen", "best") if m != "simulator" else "-"]
            if stand_in:
                truth = [c.get(k, {}).get(m) for k in ("true_s", "true_fastest_s")]
                row += [f"{t / c['stand_in_best_s']:.3f}" if t is not None else "-" for t in truth]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bench.correction", description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", choices=("stand-in", "local", "ranks"), help="where the measurements come from")
    ap.add_argument(
        "--report",
        default=None,
        nargs="+",
        metavar="RUN.json",
        help="measure nothing: print earlier runs' table (each run's --json, or a placer train run's "
        "correction.json), and with --plot draw their curves",
    )
    ap.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="draw each measured loop's curve (real step, the simulator's and the correction's predictions, against "
        "the measurements taken; the side-by-side's medians) into FILE.png (the plot extra)",
    )
    ap.add_argument("--graphs", default="unet-80,moe-60", help="stand-in: graphs (zoo, files, family-ops[-seed])")
    ap.add_argument("--clusters", default="k80x4", help="stand-in: comma list of presets or files")
    ap.add_argument("--slow", default="gpu:1", help="stand-in: the device that is slower than the cluster says")
    ap.add_argument("--slowdown", type=float, default=3.0, help="stand-in: how many times slower (default 3)")
    ap.add_argument(
        "--slow-part",
        choices=SLOW_PARTS,
        default="all",
        help="stand-in: what of the slow device is slower: all (FLOPs and memory bandwidth: one speed explains it), "
        "compute or memory (only the ops that rate bounds: a slowdown that depends on the plan's ops there)",
    )
    ap.add_argument(
        "--machine-slowdown",
        type=float,
        default=1.0,
        help="stand-in: besides, every device and link this many times slower (a cluster file made for another "
        "machine, as a GPU preset is for CPU ranks; default 1)",
    )
    ap.add_argument("--copy-factor", type=float, default=1.0, help="stand-in: host copies this many times slower")
    ap.add_argument(
        "--op-noise",
        type=float,
        default=0.0,
        help="stand-in: each op's FLOPs off by its own hidden lognormal factor of this log-std (an error of the cost "
        "model per op, outside what refitted rates can explain; default 0)",
    )
    ap.add_argument("--noise", type=float, default=0.02, help="stand-in: lognormal noise of a measurement")
    ap.add_argument("--truth-evals", type=int, default=5000, help="stand-in: simulations to find its true best")
    ap.add_argument(
        "--split",
        type=int,
        default=0,
        metavar="M",
        help="stand-in: plans across processes, one stage per rank, M microbatches (the simulator of ranks); "
        "0 (default): one-process plans",
    )
    ap.add_argument("--source", default="", help="local: a zoo name or module:callable")
    ap.add_argument("--scenario", default="", help="local: the offload scenario instead (tiny, llama-256k)")
    ap.add_argument("--cluster", default="k80x2", help="local, ranks: the cluster of --source")
    ap.add_argument("--microbatches", type=int, default=4, help="ranks: M microbatches of every plan (default 4)")
    ap.add_argument("--inflight", type=int, default=None, help="ranks: W in flight (default all M: GPipe)")
    ap.add_argument(
        "--looped",
        action="store_true",
        help="ranks: the simulator also scores plans of more stages than ranks (looped); by default one stage per "
        "rank, as placer train --ranks",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="ranks: rank r runs on the r-th core this process may use (default: unpinned)",
    )
    ap.add_argument(
        "--short-slices",
        action="store_true",
        help=f"ranks: gloo's threads in each rank ask the scheduler for a {HELPER_SLICE_US} us slice, so a message's "
        "hand-off need not wait for the tick (envs.real.slices; builds agree better, BENCHMARKS.md 'A woken thread "
        "waits for the tick')",
    )
    ap.add_argument(
        "--busy-core",
        type=int,
        default=None,
        metavar="K",
        help="ranks, with --pin: a busy loop pinned to core K for the whole run, so that the rank there computes at "
        "about half speed: a real slow device no cluster file knows",
    )
    ap.add_argument("--device-map", default=None, help="local: logical -> torch devices (e.g. '*=cpu')")
    ap.add_argument("--warmup", type=int, default=1, help="local, ranks: warm-up steps per measurement")
    ap.add_argument("--steps", type=int, default=3, help="local, ranks: timed steps per measurement")
    ap.add_argument(
        "--measure-timeout", type=float, default=120.0, help="local, ranks: seconds one measurement may take"
    )
    ap.add_argument("--out-dir", default=None, help="local, ranks: the measurement log's directory")
    ap.add_argument(
        "--threads", type=int, default=None, help="local: torch's threads (default: as they are; 1 on a shared host)"
    )
    ap.add_argument("--measurements", type=int, default=20, help="real measurements per method (default 20)")
    ap.add_argument("--sim-evals", type=int, default=CorrectedSearchOptions.sim_evals, help="simulations, first")
    ap.add_argument("--round-evals", type=int, default=CorrectedSearchOptions.round_evals, help="simulations a round")
    ap.add_argument("--kappa", type=float, default=CorrectedSearchOptions.kappa, help="exploration (std)")
    ap.add_argument("--rematch", type=int, default=3, help="side-by-side re-measurements of every method's best")
    ap.add_argument(
        "--finals",
        type=int,
        default=CorrectedSearchOptions.rematch,
        help="rounds of each measured method's own side-by-side at the end, which chooses its placement among its "
        "--finalists fastest and the simulator's best (0: its fastest measured is its placement); default %(default)s",
    )
    ap.add_argument(
        "--finalists",
        type=int,
        default=CorrectedSearchOptions.finalists,
        help="fastest measured placements in each method's own side-by-side (with the simulator's best); default "
        "%(default)s",
    )
    for flag, on, what in (
        (
            "--confirm",
            CorrectedSearchOptions.confirm,
            "every measured search measures a new fastest placement again before it takes it (the winner's curse; "
            "CorrectedSearchOptions.confirm)",
        ),
        (
            "--merge",
            CorrectedSearchOptions.merge,
            "where plans are splits (ranks), a cut may also move onto its neighbour, merging a stage away: a plan on "
            "fewer ranks (CorrectedSearchOptions.merge); off: splits over every rank only",
        ),
    ):
        ap.add_argument(flag, choices=("on", "off"), default="on" if on else "off", help=f"{what}; default %(default)s")
    ap.add_argument(
        "--methods",
        default=",".join(METHOD_NAMES),
        help="comma list of the measured methods to run (the simulator's best is always measured, the reference): "
        "a real run of all four takes four times one's measurements; default %(default)s",
    )
    ap.add_argument(
        "--plans",
        nargs="+",
        default=None,
        metavar="RUN.json[:METHOD]",
        help="search nothing: measure the plans earlier runs stored (each run's --json, one seed; METHOD a --methods "
        "name or simulator, default corrected) side by side, --rematch interleaved rounds, on this mode's reality; "
        "the table gives each over the first named",
    )
    ap.add_argument("--seeds", default="0", help="comma list of seeds")
    ap.add_argument("--json", action="store_true", help="print every run and its curves as JSON")
    args = ap.parse_args(argv)
    try:
        chosen = parse_list(args.methods, what="methods", known=list(METHOD_NAMES))
    except PlacerError as e:
        ap.error(str(e))
    args.methods = [m for name, m in METHOD_NAMES.items() if name in chosen]
    if (args.mode is None) == (args.report is None):
        ap.error("give a mode (stand-in, local or ranks) to measure, or --report RUN.json to read a run, not both")
    if args.mode == "local" and not (args.source or args.scenario):
        ap.error("local: give --source or --scenario")
    if not args.noise >= 0:  # (NaN too)
        ap.error(f"--noise: the noise must be >= 0, got {args.noise}")
    if args.split < 0:
        ap.error(f"--split must be 0 (off) or the number of microbatches, got {args.split}")
    if args.plans is not None and len(_seeds(args.seeds)) > 1:
        ap.error("--plans measures stored plans once: give one seed (--seeds), or none")
    if args.mode == "ranks" and not args.source:
        ap.error("ranks: give --source (a zoo name or module:callable whose forward returns the loss)")
    return args


def say(line: str) -> None:
    """Progress and notes: to stderr, at once (the table or the JSON goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report is not None:
        return report(args.report, args)
    cells: list[dict[str, Any]] = []
    interrupted = False
    try:
        if args.measurements < 2 or args.rematch < 1 or args.finals < 0 or args.finalists < 1:
            raise PlacerError("--measurements must be at least 2, --rematch and --finalists at least 1, --finals >= 0")
        {"stand-in": stand_in_cells, "local": local_cells, "ranks": ranks_cells}[args.mode](args, say, cells)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the deadline (timeout --signal=INT): print what is done, marked as interrupted
        say("interrupted: the table has the methods that finished")
        interrupted = True
    print_report(args.json, {**({"interrupted": True} if interrupted else {}), "cells": cells}, lambda: tables(cells))
    if args.plot and cells:
        try:
            draw(cells, args.plot)
        except PlacerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 130 if interrupted else 0


def draw(cells: list[dict[str, Any]], path: str) -> None:
    from bench.plots import plot_measured_curves

    drawn = plot_measured_curves(cells, path)
    say(f"{len(drawn)} measured curves drawn into {path}")


def from_train_run(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The ``correction.json`` that ``placer train --algo corrected`` writes, as a run of one cell: the corrected loop,
    its side-by-side's other finalists by name, its plan as "corrected"; the run directory's name as the graph's."""
    rematch, chosen = doc["rematch"], doc.get("chosen", "best")
    method = {
        "curve": doc["curve"],
        "measured": doc.get("measurements", len(doc["curve"])),
        "best_s": doc.get("fastest_measured_s", float("nan")),
        "chosen": chosen,
    }
    finals = {f"finalist {k}": t for k, t in rematch.items() if k not in (chosen, "simulator")}
    side = {"corrected": rematch.get(chosen, []), **finals, "simulator": rematch.get("simulator", [])}
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    cell = {"graph": name, "cluster": "-", "seed": "-", "methods": {"corrected": method}, "side_by_side": side}
    return {"cells": [cell]}


def cell_problems(cell: Any) -> list[str]:
    """What a run's cell lacks for the table and the curves (empty: nothing)."""
    if not isinstance(cell, dict):
        return ["graph, cluster, seed, methods"]
    missing = [key for key in ("graph", "cluster", "seed", "methods") if key not in cell]
    if missing:
        return missing
    if not isinstance(cell["methods"], dict):
        return ["methods (a mapping)"]
    for m, run in cell["methods"].items():
        if not isinstance(run, dict) or not isinstance(run.get("measured"), int):
            missing.append(f"methods.{m}.measured")
        elif not isinstance(run.get("best_s"), (int, float)) or not isinstance(run.get("curve", []), list):
            missing.append(f"methods.{m}.best_s or .curve")
    side = cell.get("side_by_side", {})
    seconds = isinstance(side, dict) and all(
        isinstance(t, list) and all(isinstance(x, (int, float)) for x in t) for t in side.values()
    )
    return missing or ([] if seconds else ["side_by_side (each plan's list of seconds)"])


def run_cells(doc: Any, path: str) -> list[dict[str, Any]]:
    """The cells of a run read back: ``bench.correction --json`` output, or a ``placer train`` run's
    ``correction.json`` (:func:`from_train_run`). Anything else: :class:`PlacerError` naming ``path`` and what is
    missing."""
    if isinstance(doc, dict) and isinstance(doc.get("curve"), list) and isinstance(doc.get("rematch"), dict):
        doc = from_train_run(doc, path)
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if not isinstance(cells, list) or not cells:
        raise PlacerError(f"{path}: not a bench.correction run (its --json) nor a placer train run's correction.json")
    for k, cell in enumerate(cells):
        missing = cell_problems(cell)
        if missing:
            raise PlacerError(f"{path}: not a bench.correction run (cell {k} lacks {', '.join(missing)})")
    return cells


def report(paths: list[str], args: argparse.Namespace) -> int:
    """``--report``: earlier runs' table (``--json``: their cells again), and with ``--plot`` their curves; measures
    nothing. A file that is not such a run: status 2 and one line."""
    try:
        cells = []
        for path in paths:
            cells += run_cells(read_json(path), path)
        print_report(args.json, {"cells": cells}, lambda: tables(cells))
        if args.plot:
            draw(cells, args.plot)
    except PlacerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
