"""Summarize measure.sh's runs: per model and plan the simulated step (on the model's fresh profile) against the
measured median of the repeats; MAPE and Spearman per model and over all; and, over every action of every run,
the measured duration over the simulated one by kind (F, B, I, W; O the optimizer step), and each rank's time
outside actions (waits and sends) measured against simulated.

    PYTHONPATH=. python docs/ranks/fidelity_v/summarize.py [--dir D] [--clusters C] [--one-factor] [MODEL ...]

``--dir``: the runs (default: beside this script), and where ``summary.json`` is written (``summary_<tag>.json``
with ``--tag``); ``--clusters``: where each model's ``ranks_<model>.json`` is read (default: the runs' folder);
``--one-factor``: the clusters' split backward as before its parts were timed apart (``split_input_factor`` and
``split_weight_factor`` set to 0: both parts take ``split_backward_factor``); ``--ops``: each op's time from the
model's one-process profile (``ops_<model>.json`` beside the runs, ``placer profile --microbatches 4``), as ``placer
place --ranks --profile`` takes it, instead of the roofline's.
"""

import argparse
import dataclasses
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

import envs
from envs.sim.ranks import RankSim
from envs.timeline import rank_phases
from graphs.plan import Placement
from graphs.sources import resolve_graph

PLANS = ("zbv_placer", "zbv_equal", "dpv_placer", "zb_placer", "i1f1b_placer", "gpipe_equal")


def one_factor(cluster):
    """``cluster`` with the split backward's two parts priced alike (``split_backward_factor``): what placer does
    without ``split_parts.patch``, whose devices have no factor per part."""
    if not hasattr(cluster.devices[0], "split_input_factor"):
        return cluster
    devices = [dataclasses.replace(x, split_input_factor=0.0, split_weight_factor=0.0) for x in cluster.devices]
    return envs.Cluster(name=cluster.name, devices=devices, links=cluster.links, description=cluster.description)


def summarize(
    d: Path, models: list[str], quiet: bool = False, clusters: Path | None = None, one: bool = False, ops: bool = False
) -> dict:
    out, pooled, kinds = {}, [], defaultdict(list)
    for m in models:
        graph = resolve_graph(f"bench.rank_models:{m}")
        cluster = envs.resolve_cluster(str((clusters or d) / f"ranks_{m}.json"))
        cluster = one_factor(cluster) if one else cluster
        if ops:
            from envs.real.profiler.fit import with_profile

            graph = with_profile(graph, cluster, str(d / f"ops_{m}.json"), ranks=True)[0]
        rows = {}
        for p in PLANS:
            runs = sorted(d.glob(f"run_{m}_{p}_[0-9]*.json"))
            if not runs:
                continue
            plan = Placement.load(str(d / f"plan_{m}_{p}.json"))
            res, events = RankSim(graph, cluster).timeline(plan)
            sim_of = {(e.rank, e.stage, e.kind, e.microbatch): e.end_s - e.start_s for e in events}
            sim_other = {r: ph["other_s"] for r, ph in rank_phases(events).items()}
            docs = [json.loads(f.read_text()) for f in runs]
            steps = [doc["step_time_s"] for doc in docs]
            other = defaultdict(list)
            for doc in docs:
                by_rank = defaultdict(list)
                for r, s, k, mb, a, b in doc["timeline"]["events"]:
                    by_rank[r].append((a, b))
                    if sim_of.get((r, s, k, mb)):
                        kinds[(m, k)].append((b - a) / sim_of[(r, s, k, mb)])
                for r, spans in by_rank.items():
                    other[r].append(max(b for _, b in spans) - sum(b - a for a, b in spans))
            med = statistics.median(steps)
            rows[p] = {
                "schedule": res.extra.get("schedule"),
                "simulated_s": res.step_time_s,
                "measured_s": steps,
                "median_s": med,
                "error": res.step_time_s / med - 1,
                "other_measured_s": {r: statistics.median(v) for r, v in other.items()},
                "other_simulated_s": sim_other,
            }
            pooled.append((m, p, res.step_time_s, med))
            if not quiet:
                print(
                    f"{m:16} {p:13} {rows[p]['schedule']:17} simulated {res.step_time_s * 1e3:7.2f} ms  measured "
                    f"{med * 1e3:7.2f} [{min(steps) * 1e3:.1f}-{max(steps) * 1e3:.1f}]  error {rows[p]['error']:+.1%}  "
                    "waits meas/sim ms "
                    + " ".join(
                        f"r{r} {rows[p]['other_measured_s'][r] * 1e3:.1f}/{sim_other.get(r, 0) * 1e3:.1f}"
                        for r in sorted(other)
                    )
                )
        errs = [abs(r["error"]) for r in rows.values()]
        rho = spearmanr([r["simulated_s"] for r in rows.values()], [r["median_s"] for r in rows.values()]).correlation
        # the error once the model's plans are scaled alike (their geometric mean ratio): what is left when the
        # host's speed at the profile's moment is taken out
        ratios = np.array([r["simulated_s"] / r["median_s"] for r in rows.values()])
        scale = float(np.exp(np.mean(np.log(ratios))))
        free = float(np.mean(np.abs(ratios / scale - 1)))
        out[m] = {
            "plans": rows,
            "mape": float(np.mean(errs)),
            "spearman": float(rho),
            "scale": scale,
            "scale_free": free,
        }
        if not quiet:
            print(
                f"{m:16} MAPE {np.mean(errs):.1%}  Spearman {rho:.2f}  scaled by {scale:.2f}: {free:.1%}  "
                f"over {len(rows)} plans"
            )
    all_errs = [abs(s / x - 1) for _, _, s, x in pooled]
    rho = spearmanr([s for *_, s, _ in pooled], [x for *_, x in pooled]).correlation
    per_model = [v["spearman"] for v in out.values()]
    out["all"] = {
        "mape": float(np.mean(all_errs)),
        "spearman_pooled": float(rho),
        "spearman_per_model_mean": float(np.mean(per_model)),
        "scale_free_mean": float(np.mean([v["scale_free"] for k, v in out.items()])),
        "plans": len(pooled),
    }
    out["kinds"] = {f"{m}:{k}": statistics.median(v) for (m, k), v in sorted(kinds.items())}
    if not quiet:
        print(
            f"all: MAPE {np.mean(all_errs):.1%}, Spearman (pooled) {rho:.2f}, per model (mean) "
            f"{out['all']['spearman_per_model_mean']:.2f}, scaled per model {out['all']['scale_free_mean']:.1%}, "
            f"{len(pooled)} plans"
        )
        print(
            "measured / simulated action, median by kind: " + ", ".join(f"{k} {v:.2f}" for k, v in out["kinds"].items())
        )
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["lm", "encoder_decoder", "unet"])
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--clusters", default=None)
    ap.add_argument("--one-factor", action="store_true")
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    d = Path(args.dir)
    doc = summarize(d, args.models, clusters=args.clusters and Path(args.clusters), one=args.one_factor, ops=args.ops)
    (d / f"summary{'_' + args.tag if args.tag else ''}.json").write_text(json.dumps(doc, indent=1, default=str))
