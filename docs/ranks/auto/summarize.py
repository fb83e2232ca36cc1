"""Summarize ``measure.sh``: per model and plan, the schedule, simulated (per-op times, fresh profile) and measured
(median of the repeats [fastest-slowest]); placer's ``auto`` plan over each rival, repeat by repeat (the repeats
are interleaved, so repeat k of each plan ran within the same minute): median [range]; and the simulator's error.

``--pick``: also which of the measured plans ``stage_search --option schedule=auto`` gives today (its margin
included), placed again on each model's saved profile, and that plan over each rival (``placer`` in the JSON).

    PYTHONPATH=. python docs/ranks/auto/summarize.py [--dir DIR] [MODEL ...]   # writes DIR/summary.json
"""

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

PLANS = ("auto", "gpipe_placer", "gpipe_equal", "best_equal", "best_flops")
MODELS = ("text_classifier", "vgg16", "mobilenet_v2", "convnet", "lm", "encoder_decoder", "unet")


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else float("nan")


def pick(d: Path, m: str) -> str:
    """Which measured plan (``auto`` or ``gpipe_placer``) ``stage_search --option schedule=auto`` places today on
    model ``m``'s saved ranks and per-op profile (the same ops on the same devices, stage cuts and schedule)."""
    import envs
    from envs.real.profiler.fit import with_profile
    from graphs.sources import resolve_graph
    from placer.methods import registry

    graph = resolve_graph(f"bench.rank_models:{m}")
    cluster = envs.resolve_cluster(str(d / f"ranks_{m}.json"))
    timed = with_profile(graph, cluster, str(d / f"ops_{m}.json"), ranks=True)[0]
    today = registry.place("stage_search", timed, cluster, microbatches=4, schedule="auto")
    for p in ("auto", "gpipe_placer"):
        plan = json.loads((d / f"plan_{m}_{p}.json").read_text())
        if (
            plan["assignment"] == today.assignment
            and (plan.get("stage_cuts") or []) == list(today.stage_cuts or [])
            and (plan.get("schedule") or "gpipe") == today.schedule
        ):
            return p
    raise SystemExit(f"{m}: today's schedule=auto plan is none of those measured")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--pick", action="store_true", help="also the plan today's schedule=auto picks, over each rival")
    ap.add_argument("models", nargs="*")
    a = ap.parse_args()
    d = Path(a.dir)
    out: dict = {}
    errors, sims, meas = [], [], []
    for m in a.models or [m for m in MODELS if (d / f"plan_{m}_auto.json").exists()]:
        rows = {}
        for p in PLANS:
            runs = sorted(d.glob(f"run_{m}_{p}_[0-9]*.json"))
            docs = [json.loads(f.read_text()) for f in runs if f.stat().st_size]
            steps = [doc["step_time_s"] for doc in docs if doc.get("step_time_s")]
            plan = json.loads((d / f"plan_{m}_{p}.json").read_text())
            if not steps:
                continue
            rows[p] = {
                "schedule": plan["meta"].get("ranks_schedule"),
                "simulated_s": plan["meta"].get("ranks_step_time_s"),
                "measured_s": steps,
                "median_s": statistics.median(steps),
            }
            if "schedules" in plan["meta"]:
                rows[p]["schedules"] = plan["meta"]["schedules"]
            r = rows[p]
            print(
                f"{m:16} {p:12} {str(r['schedule']):17} simulated {r['simulated_s'] * 1e3:8.1f} ms  measured "
                f"{r['median_s'] * 1e3:8.1f} [{min(steps) * 1e3:.1f}-{max(steps) * 1e3:.1f}]"
            )
            errors.append(abs(r["simulated_s"] / r["median_s"] - 1))
            sims.append(r["simulated_s"])
            meas.append(r["median_s"])
        if "auto" not in rows:
            continue
        ours = ["auto"]
        if a.pick:
            rows["placer"] = {"plan": pick(d, m)}
            ours.append(rows["placer"]["plan"])
            print(f"{m:16} today's schedule=auto gives the plan measured as {ours[-1]}")
        for mine in dict.fromkeys(ours):
            for p in PLANS[1:]:
                if p not in rows or p == mine:
                    continue
                ratios = [b / a for a, b in zip(rows[mine]["measured_s"], rows[p]["measured_s"])]
                s = {
                    "median": statistics.median(ratios),
                    "of_medians": rows[p]["median_s"] / rows[mine]["median_s"],
                    "range": [min(ratios), max(ratios)],
                    "simulated": rows[p]["simulated_s"] / rows[mine]["simulated_s"],
                }
                rows[mine][f"speedup_over_{p}"] = s
                print(
                    f"{m:16} {mine} over {p:12}: {s['of_medians']:.3f}x by the medians, per repeat "
                    f"{s['median']:.3f}x [{s['range'][0]:.3f}-{s['range'][1]:.3f}]; simulated {s['simulated']:.3f}x"
                )
        out[m] = rows
    if errors:
        out["_fidelity"] = {"plans": len(errors), "mape": float(np.mean(errors)), "spearman": spearman(sims, meas)}
        print(
            f"simulated against measured over {len(errors)} plans: MAPE {np.mean(errors) * 100:.1f} %, "
            f"Spearman {spearman(sims, meas):.2f}"
        )
    (d / "summary.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
