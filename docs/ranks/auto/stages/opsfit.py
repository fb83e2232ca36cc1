"""The ranks' cost per action and hand-off fitted on per-op times instead of the roofline: does the simulator then
rank a plan of more stages than ranks against one stage per rank as measured more often?

Each model profiled anew (``placer profile bench.rank_models:MODEL --ranks 2 -o opsfit/ranks_MODEL.json --ops
opsfit/ops_MODEL.json --json > opsfit/profile_MODEL.json``); then the cluster as written (its hand-off fitted on the
roofline), with no hand-off, and with the cost per action and the hand-off fitted again on the per-op times
(:func:`envs.real.distributed.profile_ranks.fit_waits`, the same fit on the timed graph), each simulating the plans of
``handoff.py`` with the per-op times, against the ratios measured there (``variants_*.json``, ``heldout_*.json``).

    PYTHONPATH=. python docs/ranks/auto/stages/opsfit.py > docs/ranks/auto/stages/opsfit/ratios.txt
"""

import json
import statistics
from pathlib import Path

import envs
from envs.real.distributed import profile_ranks as pr
from envs.real.profiler.fit import with_profile
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

S = Path(__file__).resolve().parent
D, T = S.parent, S / "opsfit"
FITS = ("none", "roofline", "per-op")


def medians(path: Path) -> dict:
    out: dict = {}
    for r in json.loads(path.read_text())["rows"]:
        out.setdefault((r["plan"], r["setting"]), []).append(r["step_s"])
    return {k: statistics.median(v) for k, v in out.items()}


def per_op_fit(timed, cluster, parts):
    """``cluster``'s waits fitted again on the per-op times of ``timed`` (the calibration pipelines of the profile)."""
    runs, looped = pr.pipeline_steps(parts, pr.work_runs(timed, 4) % 2)
    return pr.fit_waits(timed, cluster, pr.work_runs(timed, 2), runs, looped)


def main() -> None:
    rows = []
    for m in ["text_classifier", "mobilenet_v2", "encoder_decoder", "unet", "vgg16", "lm", "convnet"]:
        held = (S / f"heldout_{m}.json").exists()
        meas = medians(S / (f"heldout_{m}.json" if held else f"variants_{m}.json"))
        many = next(p for p, _ in meas if "/" in p) if held else "auto"
        measured = meas[(many, "os" if held else "early")] / meas[("gpipe_placer", "os")]
        cluster = envs.resolve_cluster(str(T / f"ranks_{m}.json"))
        timed = with_profile(resolve_graph(f"bench.rank_models:{m}"), cluster, str(T / f"ops_{m}.json"), ranks=True)[0]
        fitted = per_op_fit(timed, cluster, json.loads((T / f"profile_{m}.json").read_text())["measured"])
        clusters = dict(zip(FITS, (pr.with_device_fields(cluster, handoff_s=0.0), cluster, fitted)))
        out = {"model": m, "measured": measured}
        for label, c in clusters.items():
            sim = RankSim(timed, c)
            step = {
                p: sim.evaluate([Placement.load(p if "/" in p else str(D / f"plan_{m}_{p}.json"))])[0].step_time_s
                for p in (many, "gpipe_placer")
            }
            out[label] = step[many] / step["gpipe_placer"]
            out[f"{label}_handoff_ms"] = c.devices[0].handoff_s * 1e3
            out[f"{label}_overhead_ms"] = c.devices[0].action_overhead_s * 1e3
        rows.append(out)
        said = [
            f"{k} {out[k]:.3f} ({'right' if (out[k] < 1) == (measured < 1) else 'wrong'}; hand-off "
            f"{out[f'{k}_handoff_ms']:.2f} ms, {out[f'{k}_overhead_ms']:.2f} ms per action)"
            for k in FITS
        ]
        print(f"{m:16} more stages over one per rank, measured {measured:.3f}; simulated: {'; '.join(said)}")
    for k in FITS:
        right = sum((r[k] < 1) == (r["measured"] < 1) for r in rows)
        error = statistics.mean(abs(r[k] - r["measured"]) for r in rows)
        print(f"{k}: ranked as measured on {right} of {len(rows)}, mean error of the ratio {error:.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
