"""The plans of more stages than ranks over one stage per rank, simulated with a cluster whose hand-off
``placer profile --ranks`` fitted (``ranks_MODEL.json`` here) and with the cluster they were placed on (no hand-off),
each with the model's per-op times (``../../ops_MODEL.json``), against the ratio measured (``../variants_*.json``:
receives posted early; ``../heldout_*.json``).

    PYTHONPATH=. python docs/ranks/auto/stages/handoff/ratios.py > docs/ranks/auto/stages/handoff/ratios.txt
"""

import json
import statistics
from pathlib import Path

import envs
from envs.real.profiler.fit import with_profile
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

H = Path(__file__).resolve().parent
S = H.parent
D = S.parent


def medians(path: Path) -> dict:
    out: dict = {}
    for r in json.loads(path.read_text())["rows"]:
        out.setdefault((r["plan"], r["setting"]), []).append(r["step_s"])
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    rows = []
    for m in ["text_classifier", "mobilenet_v2", "encoder_decoder", "unet", "vgg16", "lm", "convnet"]:
        held = m in ("lm", "convnet")
        meas = medians(S / (f"heldout_{m}.json" if held else f"variants_{m}.json"))
        many = next(p for p, _ in meas if "/" in p) if held else "auto"
        measured = meas[(many, "os" if held else "early")] / meas[("gpipe_placer", "os")]
        graph = resolve_graph(f"bench.rank_models:{m}")
        out = {"model": m, "held_out": held, "measured": measured}
        for label, cluster_file in (("without", D / f"ranks_{m}.json"), ("with", H / f"ranks_{m}.json")):
            cluster = envs.resolve_cluster(str(cluster_file))
            timed = with_profile(graph, cluster, str(D / f"ops_{m}.json"), ranks=True)[0]
            sim = RankSim(timed, cluster)
            step = {
                p: sim.evaluate([Placement.load(p if "/" in p else str(D / f"plan_{m}_{p}.json"))])[0].step_time_s
                for p in (many, "gpipe_placer")
            }
            out[label] = step[many] / step["gpipe_placer"]
        out["handoff_ms"] = envs.resolve_cluster(str(H / f"ranks_{m}.json")).devices[0].handoff_s * 1e3
        rows.append(out)
        right = [(out[k] < 1) == (measured < 1) for k in ("without", "with")]
        verdict = ["right" if r else "wrong" for r in right]
        print(
            f"{m:16} hand-off {out['handoff_ms']:4.2f} ms: more stages over one per rank, measured {measured:.3f}; "
            f"simulated without {out['without']:.3f} ({verdict[0]}), with {out['with']:.3f} ({verdict[1]})"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
