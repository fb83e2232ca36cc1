"""Placer's pipeline split against the splits people use, simulated and measured on this machine's CPU ranks.

For each model (:data:`MODELS`: an LM with a large vocabulary head, an encoder-decoder,
a U-Net, a convnet whose dense layers hold its parameters) and each method (:data:`METHODS`:
torchtitan's ``equal_layers``, the
``flops_balanced`` and ``parameters_balanced`` splits, placer's ``stage_search``), every
plan shape of :data:`envs.sim.ranks.PIPELINE_SHAPES` (M microbatches, W in flight: GPipe, or 1F1B) is scored by
the simulator of ranks (:class:`envs.sim.ranks.RankSim`) on the cluster ``placer profile
SOURCE --ranks N`` wrote, and each method keeps its fastest. Those plans then run on N
gloo ranks (:func:`placer.distributed.run`, what ``placer run --nproc-per-node N`` runs),
``--repeats`` times, the methods interleaved, so a change of the machine's load falls on
all of them alike; the medians and their spread (fastest and slowest repeat) are
reported. The simulated and measured step times of every plan give the simulator's
fidelity on ranks: MAPE and Spearman's rank correlation. Where its error lies: each
rank's step in phases (:func:`envs.timeline.phases`: forward and backward compute, the
optimizer step, the rest), measured (the median over the repeats of each repeat's
medians) and simulated (:meth:`envs.sim.ranks.RankSim.timeline`), and per phase the
median ratio measured / simulated over every plan's ranks (:func:`phase_error`)::

    python -m placer profile bench.rank_models:lm --ranks 2 -o ranks.json
    python -m bench.rank_splits --cluster ranks.json --repeats 3 --json

Methods that make the same plan (the same cut, M, W and schedule: ``flops_balanced`` and
``stage_search`` often do) are measured once per round, and their rows share those
measurements (``same_plan_as``). :func:`pooled` pools every repeat of one plan, for runs
made before that too, and the report's speed-ups are between those pooled medians;
``--report RUN.json`` prints an earlier run's report so, measuring nothing.

``--cluster-of MODEL=FILE`` gives a model its own profile, as a user profiles the model
they train (``placer profile bench.rank_models:unet --ranks 2 -o unet.json``); the others
keep ``--cluster``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.common import OneLineParser, parse_list
from bench.fidelity.metrics import mape, spearman
from envs.cluster import resolve_cluster
from envs.sim.ranks import RankSim
from envs.timeline import median_phases, rank_phases
from graphs import PlacerError
from graphs.plan import Placement, check_inflight
from placer.learn.shapes import SPLITS, fastest, split_table

MODELS = {
    "lm": "bench.rank_models:lm",
    "encoder_decoder": "bench.rank_models:encoder_decoder",
    "unet": "bench.rank_models:unet",
    "convnet": "bench.rank_models:convnet",
    "lm_b32": "bench.rank_models:lm_b32",
    "encoder_decoder_b32": "bench.rank_models:encoder_decoder_b32",
    "unet_b32": "bench.rank_models:unet_b32",
    "convnet_b32": "bench.rank_models:convnet_b32",
    "text_classifier": "bench.rank_models:text_classifier",
    "text_classifier_b32": "bench.rank_models:text_classifier_b32",
    "text_classifier_256k": "bench.rank_models:text_classifier_256k",
    "text_classifier_256k_b32": "bench.rank_models:text_classifier_256k_b32",
    "mobilenet_v2": "bench.rank_models:mobilenet_v2",
    "mobilenet_v2_b32": "bench.rank_models:mobilenet_v2_b32",
    "mobilenet_v2_b128": "bench.rank_models:mobilenet_v2_b128",
    "vgg16": "bench.rank_models:vgg16",
    "vgg16_b32": "bench.rank_models:vgg16_b32",
    "deepseek_moe": "bench.rank_models:deepseek_moe",
    "deepseek_moe_b32": "bench.rank_models:deepseek_moe_b32",
}
#: What ``--models`` runs unless told: the batch-8 models (the batch-32 ones take 4x as long to measure).
DEFAULT_MODELS = ("lm", "encoder_decoder", "unet", "convnet")
METHODS = SPLITS  # the splits placer train --ranks --choose-shape scores shapes by


def best_plans(graph: Any, cluster: Any, methods: Sequence[str] = METHODS) -> dict[str, Any]:
    """Each of ``methods``' fastest plan over :data:`~envs.sim.ranks.PIPELINE_SHAPES` on the simulator of ranks
    (:func:`placer.learn.shapes.split_table`, what ``--choose-shape`` scores): ``{method: (plan, its time, every
    shape's row)}``, or ``{method: PlacerError}`` where it makes no plan that runs at any shape."""
    table = split_table(graph, cluster, methods)
    out: dict[str, Any] = {}
    for m, best in fastest(table, lambda r: r["method"]).items():
        shapes = [
            {"microbatches": r["microbatches"], "inflight": r["inflight"], "sim_s": r["step_time_s"]}
            for r in table
            if r["method"] == m
        ]
        if best["placement"] is None:
            why = best["message"].removeprefix("PlacerError: ")
            out[m] = PlacerError(why or f"{m}: no plan of {graph.name or 'the model'} runs on the simulator of ranks")
        else:
            out[m] = (best["placement"], best["step_time_s"], shapes)
    return out


def measure(source: str, plan: Placement, steps: int, warmup: int) -> tuple[float, list[dict[str, float]]]:
    """The median step time of ``plan`` on gloo ranks of this machine, one per device of the plan's cluster, and
    each rank's phases (medians over the steps).

    What ``placer run --nproc-per-node N`` runs, N the cluster's devices (the ranks ``placer profile --ranks N``
    measured).
    """
    from graphs import sources
    from placer import distributed

    n = len(plan.devices)
    model, inputs = sources.resolve_model(source)
    compiled, _ = distributed.compile_for_model(model, inputs, plan, backend="gloo", nproc_per_node=n)
    report = distributed.run(source, compiled, nproc_per_node=n, steps=steps, warmup=warmup)
    return float(report["step_time_s"]), [r["phases"] for r in report["ranks"]]


def simulated_phases(graph: Any, cluster: Any, plan: Placement) -> list[dict[str, float]]:
    """Each rank's phases in the plan's simulated step (its timeline), in rank order."""
    return list(rank_phases(RankSim(graph, cluster).timeline(plan)[1]).values())


#: The phases compared, each a sum of :data:`envs.timeline.PHASES`.
PHASE_GROUPS = {"compute": ("forward_s", "backward_s"), "optimizer": ("optimizer_s",), "other": ("other_s",)}


def phase_error(models: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase group, over every measured plan's ranks: the median and range of measured / simulated seconds."""
    out = {}
    for group, keys in PHASE_GROUPS.items():
        ratios = []
        for m in models:
            for r in _ok(m["rows"]):
                for real, sim in zip(r["phases"]["measured"], r["phases"]["simulated"]):
                    a, b = sum(real[k] for k in keys), sum(sim[k] for k in keys)
                    if b > 0:
                        ratios.append(a / b)
        if ratios:
            out[group] = {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios), "n": len(ratios)}
    return out


def model_graph(source: str, profile: str | None = None) -> Any:
    """The captured graph of ``source``, with the per-op times of ``profile`` (a `placer profile SOURCE` file) on it
    as ``--ranks --profile`` puts them (the cluster keeps its own rates and links)."""
    from envs.real.profiler import apply_profile, load_profile
    from graphs import sources
    from graphs.torch_capture import capture

    graph = capture(*sources.resolve_model(source))
    return apply_profile(graph, load_profile(profile), source=profile) if profile else graph


def plan_key(placement: Mapping[str, Any]) -> tuple:
    """What makes two plans one plan: each op's device, M, W (None: all M) and the schedule named.

    >>> a = {"assignment": {"x": "cpu:0", "y": "cpu:1"}, "microbatches": 4}
    >>> plan_key(a) == plan_key({**a, "inflight": 4}), plan_key(a) == plan_key({**a, "microbatches": 2})
    (True, False)
    """
    M = int(placement.get("microbatches") or 1)
    return (
        tuple(sorted(placement["assignment"].items())),
        M,
        check_inflight(placement.get("inflight"), M),
        placement.get("schedule"),
    )


def pooled(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ok row: the median over every repeat of its plan, whichever rows measured it (``median_s``), their number
    (``n``) and the other methods with that plan (``same_plan_as``). Rows that share one list of measurements (a run
    that measured the plan once) count it once. Empty where a row lacks its placement or its repeats.

    >>> p = {"assignment": {"x": "cpu:0"}}
    >>> rows = [{"method": "a", "placement": p, "repeats_s": [1.0, 2.0, 3.0]},
    ...         {"method": "b", "placement": p, "repeats_s": [4.0, 5.0]},
    ...         {"method": "c", "placement": {"assignment": {"x": "cpu:1"}}, "repeats_s": [9.0]}]
    >>> out = pooled(rows)
    >>> out["a"]["median_s"], out["a"]["n"], out["b"]["same_plan_as"], out["c"]["n"]
    (3.0, 5, ['a'], 1)
    """
    if not all("placement" in r and "repeats_s" in r for r in _ok(rows)):
        return {}  # rows that do not say which plan they measured: nothing to pool
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in _ok(rows):
        groups.setdefault(plan_key(r["placement"]), []).append(r)
    out = {}
    for members in groups.values():
        lists = list(dict.fromkeys(tuple(r["repeats_s"]) for r in members))
        times = [t for one in lists for t in one]
        for r in members:
            out[r["method"]] = {
                "median_s": float(statistics.median(times)),
                "n": len(times),
                "same_plan_as": [o["method"] for o in members if o is not r],
            }
    return out


def run_model(
    name: str,
    cluster: Any,
    repeats: int,
    steps: int,
    warmup: int,
    given: Sequence[tuple[str, str]] = (),
    profile: str | None = None,
) -> dict[str, Any]:
    """One model: every method's best simulated plan, and the plan of each ``(label, placement file)`` given (a
    ``placer train --ranks`` run's best), measured ``repeats`` times, interleaved.

    A method that makes no plan for this model on this cluster (``equal_layers`` with more ranks than layers)
    is a row with its reason; the other methods run.
    """
    source = MODELS[name]
    graph = model_graph(source, profile)
    plans, failed = {}, {}
    for m, best in best_plans(graph, cluster).items():
        if isinstance(best, PlacerError):
            failed[m] = str(best)
            print(f"  {name} {m}: no plan: {best}", file=sys.stderr, flush=True)
        else:
            plans[m] = best
    for label, path in given:  # a placement made for another model is one line, before anything is measured
        plan = Placement.load(path)
        plan.indices(graph, cluster.device_names, source=path)
        plans[label] = (plan, RankSim(graph, cluster).simulate(plan).step_time_s, [])
    # one plan made by several methods is measured once per round, and they share its measurements
    keys = {m: plan_key(plans[m][0].to_dict()) for m in plans}
    same = {m: [o for o in plans if keys[o] == keys[m]] for m in plans}  # the methods of each one's plan, in order
    first = {keys[m]: same[m][0] for m in plans}
    measured: dict[str, list[float]] = {m: [] for m in plans}
    measured_phases: dict[str, list[list[dict[str, float]]]] = {m: [] for m in plans}
    for k in range(repeats):
        for m in first.values():
            step_s, ranks = measure(source, plans[m][0], steps, warmup)
            for o in same[m]:
                measured[o].append(step_s)
                measured_phases[o].append(ranks)
            # every measurement is in the log as it is taken: a run stopped at a deadline keeps them
            label = m + (f" (= {', '.join(same[m][1:])})" if len(same[m]) > 1 else "")
            print(f"  {name} {label} repeat {k + 1}: {step_s * 1e3:.1f} ms", file=sys.stderr, flush=True)
    rows = []
    for m in [*METHODS, *(label for label, _ in given)]:
        if m in failed:
            rows.append({"method": m, "status": "no plan", "message": failed[m]})
            continue
        plan, sim_s, shapes = plans[m]
        times = measured[m]
        rows.append(
            {
                "method": m,
                "status": "ok",
                "microbatches": plan.microbatches,
                "inflight": plan.inflight,
                "sim_s": sim_s,
                "measured_s": statistics.median(times),
                "spread_s": [min(times), max(times)],
                "repeats_s": times,
                "same_plan_as": [o for o in same[m] if o != m],
                "shapes": shapes,
                "placement": plan.to_dict(),
                "phases": {
                    "measured": [median_phases(list(ranks)) for ranks in zip(*measured_phases[m])],
                    "simulated": simulated_phases(graph, cluster, plan),
                },
            }
        )
    return {"model": name, "source": source, "ops": graph.num_ops, "profile": profile, "rows": rows}


def _ok(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status", "ok") == "ok"]


def fidelity(models: Sequence[dict[str, Any]], key: str = "sim_s") -> dict[str, Any]:
    """MAPE and Spearman of simulated (each row's ``key``) against measured over every measured plan.

    A plan that several methods made is one point (its first row's simulated step, its measured median pooled over
    every repeat: :func:`pooled`), not one per row: two rows of one plan would count it twice, and a run that
    measured it once would give Spearman ties of its own making. Rows without their placement count one each.
    """
    sim, real = [], []
    for m in models:
        rows, pool, seen = _ok(m["rows"]), pooled(m["rows"]), set()
        if not pool:
            sim += [r[key] for r in rows]
            real += [r["measured_s"] for r in rows]
            continue
        for r in rows:
            k = plan_key(r["placement"])
            if k not in seen:
                seen.add(k)
                sim.append(r[key])
                real.append(pool[r["method"]]["median_s"])
    sim_a, real_a = np.array(sim), np.array(real)
    return {"plans": len(sim), "models": len(models), "mape": mape(sim_a, real_a), "spearman": spearman(sim_a, real_a)}


def rescore(
    models: Sequence[dict[str, Any]], cluster: Any, own: Mapping[str, Any] = {}, profiles: Mapping[str, str] = {}
) -> dict[str, Any]:
    """The measured plans simulated on another ``cluster`` (another calibration of the same ranks; ``own``: a model's
    own, by name) and with a model's ``profiles`` (by name): the fidelity, and each row's step there
    (``rescored_s``). The plans are rebuilt exactly: each row keeps its placement."""
    for m in models:
        graph = model_graph(m["source"], profiles.get(m["model"]))
        sim = RankSim(graph, own.get(m["model"], cluster))
        for r in _ok(m["rows"]):
            r["rescored_s"] = sim.evaluate([Placement.from_dict(r["placement"])])[0].step_time_s
    return {"cluster": cluster.name, **fidelity(models, "rescored_s")}


def table(models: Sequence[dict[str, Any]]) -> list[str]:
    """The text report: per model, each method's plan, simulated and measured step (the median of its own repeats
    [fastest, slowest], and pooled over every repeat of its plan: :func:`pooled`), and how much faster placer's plan
    is, pooled against pooled."""
    lines = []
    for m in models:
        rows = _ok(m["rows"])  # placer's plan: a given (learned) one where there is one, else stage_search's
        ours = next((r for r in rows if r["method"] not in METHODS), None) or next(
            (r for r in rows if r["method"] == "stage_search"), None
        )
        pool = pooled(rows)

        def median(r: dict[str, Any]) -> float:  # pooled where the rows say which plan they measured
            return pool[r["method"]]["median_s"] if pool else r["measured_s"]

        lines.append(f"{m['model']} ({m['source']}, {m['ops']} ops)")
        for r in m["rows"]:
            if r.get("status", "ok") != "ok":
                lines.append(f"  {r['method']:<20} no plan: {r['message']}")
                continue
            lo, hi = r["spread_s"]
            gain = f"  {ours['method']} {median(r) / median(ours):.2f}x faster" if ours else ""
            shared = ""
            if pool and pool[r["method"]]["same_plan_as"]:
                p = pool[r["method"]]
                shared = f"  pooled {p['median_s'] * 1e3:.1f} ms of {p['n']} (= {', '.join(p['same_plan_as'])})"
            lines.append(
                f"  {r['method']:<20} M={r['microbatches']} W={r['inflight']}  sim {r['sim_s'] * 1e3:8.1f} ms  "
                f"measured {r['measured_s'] * 1e3:8.1f} ms [{lo * 1e3:.1f}, {hi * 1e3:.1f}]{shared}{gain}"
            )
    return lines


def model_files(items: Sequence[str], option: str) -> dict[str, list[str]]:
    """``OPTION MODEL=FILE`` values: model name -> its files, in order (a PlacerError names a bad item)."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or name not in MODELS:
            raise PlacerError(f"{option} {item!r}: give MODEL=FILE, MODEL one of {', '.join(MODELS)}")
        out.setdefault(name, []).append(path)
    return out


def given_placements(items: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """``--placement MODEL=FILE`` values: model name -> its ``(label, file)`` (the label: the file's name)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, paths in model_files(items, "--placement").items():
        for path in paths:
            Placement.load(path)  # a missing or malformed file: one line, before anything runs
            label = os.path.splitext(os.path.basename(path))[0]
            if label in METHODS:
                raise PlacerError(f"--placement {f'{name}={path}'!r}: name the file other than a method ({label})")
            out.setdefault(name, []).append((label, path))
    return out


def resimulate(path: str, cluster: Any, own: Mapping[str, Any], profiles: Mapping[str, str], as_json: bool) -> int:
    """``--resimulate``: an earlier run's measured plans simulated now (:func:`rescore`), beside the fidelity that
    run recorded; every model's row, and all of them."""
    doc = read_run(path)
    models = doc["models"]
    out = {"run": path, "recorded": doc.get("fidelity"), "now": rescore(models, cluster, own, profiles)}
    out["per_model"] = {m["model"]: {"now": fidelity([m], "rescored_s")} for m in models}
    if as_json:
        print(json.dumps(out, indent=1))
        return 0
    for m in models:
        for r in _ok(m["rows"]):
            print(
                f"  {m['model']:<16} {r['method']:<24} measured {r['measured_s'] * 1e3:7.1f} ms  recorded sim "
                f"{r['sim_s'] * 1e3:7.1f}  now {r['rescored_s'] * 1e3:7.1f}"
            )
    was, now = out["recorded"] or {}, out["now"]
    nan = float("nan")
    print(f"recorded: MAPE {was.get('mape', nan) * 100:.1f}%, Spearman {was.get('spearman', nan):.2f}")
    print(f"now:      MAPE {now['mape'] * 100:.1f}%, Spearman {now['spearman']:.2f} over {now['plans']} plans")
    for name, f in out["per_model"].items():
        print(f"  {name:<16} MAPE {f['now']['mape'] * 100:.1f}%, Spearman {f['now']['spearman']:.2f}")
    return 0


def report(path: str) -> int:
    """``--report``: an earlier run's report (:func:`table`), measuring nothing."""
    print("\n".join(table(read_run(path)["models"])))
    return 0


def read_run(path: str) -> dict[str, Any]:
    """A ``python -m bench.rank_splits --json`` run, checked to have its models with rows (a PlacerError names a
    file that is not one)."""
    from graphs.io import read_json

    doc = read_json(path)
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) and "rows" in m for m in models):
        raise PlacerError(f"{path}: not a `python -m bench.rank_splits --json` run (no models with rows)")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.rank_splits", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cluster", default=None, help="the cluster of `placer profile SOURCE --ranks N`: N ranks (not with --report)"
    )
    parser.add_argument(
        "--cluster-of",
        action="append",
        default=[],
        metavar="MODEL=FILE",
        help="this model's own cluster (`placer profile` of that model), instead of --cluster (repeatable)",
    )
    parser.add_argument(
        "--profile-of",
        action="append",
        default=[],
        metavar="MODEL=FILE",
        help="this model's per-op times (`placer profile SOURCE` of that model) on its graph, as `placer train --ranks "
        "--profile` puts them: the splits are chosen and every plan simulated with them (repeatable)",
    )
    parser.add_argument(
        "--resimulate",
        default=None,
        metavar="RUN.json",
        help="measure nothing: simulate the plans an earlier run measured (its --json) with this simulator, --cluster "
        "(--cluster-of) and --profile-of, and give the fidelity against its measurements",
    )
    parser.add_argument(
        "--report",
        default=None,
        metavar="RUN.json",
        help="measure nothing: print an earlier run's (its --json) report, every repeat of one plan pooled",
    )
    parser.add_argument(
        "--placement",
        action="append",
        default=[],
        metavar="MODEL=FILE",
        help="also measure this placement of MODEL (e.g. `placer train --ranks`'s best_placement.json), a row named "
        "after the file (repeatable)",
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated, of {', '.join(MODELS)} (default {','.join(DEFAULT_MODELS)})",
    )
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each plan, interleaved (default 3)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per measurement (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per measurement (default 1)")
    parser.add_argument(
        "--rescore",
        default=None,
        metavar="CLUSTER",
        help="also simulate every measured plan on this cluster (another calibration of the same ranks) and give "
        "its fidelity beside",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.report:
        try:
            return report(args.report)
        except PlacerError as e:
            print(f"python -m bench.rank_splits: {e}", file=sys.stderr)
            return 2
    try:
        if args.cluster is None:
            raise PlacerError("--cluster: give the ranks' cluster (`placer profile SOURCE --ranks N -o ranks.json`)")
        names = parse_list(args.models, what="models", known=list(MODELS))
        cluster = resolve_cluster(args.cluster)
        files = {name: paths[-1] for name, paths in model_files(args.cluster_of, "--cluster-of").items()}
        own = {name: resolve_cluster(path) for name, path in files.items()}
        profiles = {name: paths[-1] for name, paths in model_files(args.profile_of, "--profile-of").items()}
        if args.resimulate:
            return resimulate(args.resimulate, cluster, own, profiles, args.json)
        given = given_placements(args.placement)
        other = resolve_cluster(args.rescore) if args.rescore else None
        if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
            raise PlacerError("--repeats and --steps: at least 1; --warmup: at least 0")
        models = [
            run_model(n, own.get(n, cluster), args.repeats, args.steps, args.warmup, given.get(n, ()), profiles.get(n))
            for n in names
        ]
    except PlacerError as e:
        print(f"python -m bench.rank_splits: {e}", file=sys.stderr)
        return 2
    doc = {"cluster": cluster.name, "models": models, "fidelity": fidelity(models), "phase_error": phase_error(models)}
    doc["cluster_files"] = {n: files.get(n, args.cluster) for n in names}  # which profile each model was simulated on
    if other is not None:
        doc["rescored"] = rescore(models, other)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print("\n".join(table(models)))
    if files:
        print("simulated on: " + ", ".join(f"{n} {path}" for n, path in doc["cluster_files"].items()))
    f = doc["fidelity"]
    mape_pct, rho = f["mape"] * 100, f["spearman"]
    print(f"fidelity over {f['plans']} plans of {f['models']} models: MAPE {mape_pct:.1f}%, Spearman {rho:.2f}")
    if other is not None:
        f = doc["rescored"]
        print(f"the same plans simulated on {args.rescore}: MAPE {f['mape'] * 100:.1f}%, Spearman {f['spearman']:.2f}")
    for group, e in doc["phase_error"].items():
        print(
            f"  {group:<10} measured / simulated: median {e['median']:.2f}x (range {e['min']:.2f}-{e['max']:.2f}, "
            f"{e['n']} ranks of plans)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
