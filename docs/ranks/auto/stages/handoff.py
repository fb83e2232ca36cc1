"""What if every message between CPU ranks arrived H later (its data waiting for a gloo thread to get a busy core),
without holding the sender's core longer: the simulator of ranks run again with that delay on the plans measured in
this folder, against their measured steps. Fitted on the five models of ``confirm.sh`` (the MAPE of the plans
posting early and of one stage per rank; whether the plan of more stages than ranks and the one-stage plan are
ranked as measured), and checked on the two held out (``heldout_*.json``: the LM and the convnet, a looped
Interleaved 1F1B plan beside one stage per rank). The simulator is patched in this process only.

``--fitted``: instead, the hand-off ``placer profile --ranks`` fitted on each model (``handoff/ranks_MODEL.json``),
unpatched: the same ratios simulated with those clusters and with the clusters the plans were placed on.

    PYTHONPATH=. python docs/ranks/auto/stages/handoff.py > docs/ranks/auto/stages/handoff.txt
    PYTHONPATH=. python docs/ranks/auto/stages/handoff.py --fitted > docs/ranks/auto/stages/handoff/ratios.txt
"""

import argparse
import json
import statistics
from pathlib import Path

import envs
import envs.sim.ranks as ranks_sim
from envs.real.profiler.fit import with_profile
from graphs.plan import Placement
from graphs.sources import resolve_graph

S = Path(__file__).resolve().parent
D = S.parent
FITTED = ["text_classifier", "mobilenet_v2", "encoder_decoder", "unet", "vgg16"]
HELD_OUT = ["lm", "convnet"]
DELAYS_S = [0.0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3]
_send = ranks_sim._Links.send
DELAY = [0.0]


def delayed_send(self, src, dst, ready_s, nbytes, tensors):
    arrived, took = _send(self, src, dst, ready_s, nbytes, tensors)
    return (arrived, took) if src == dst or tensors == 0 else (arrived + DELAY[0], took)


def medians(path: Path) -> dict:
    out: dict = {}
    for r in json.loads(path.read_text())["rows"]:
        out.setdefault((r["plan"], r["setting"]), []).append(r["step_s"])
    return {k: statistics.median(v) for k, v in out.items()}


def fitted() -> None:
    """``--fitted`` (module doc)."""
    rows = []
    for m in FITTED + HELD_OUT:
        held = m in HELD_OUT
        meas = medians(S / (f"heldout_{m}.json" if held else f"variants_{m}.json"))
        many = next(p for p, _ in meas if "/" in p) if held else "auto"
        measured = meas[(many, "os" if held else "early")] / meas[("gpipe_placer", "os")]
        graph = resolve_graph(f"bench.rank_models:{m}")
        out = {"model": m, "measured": measured}
        for label, cluster_file in (("without", D / f"ranks_{m}.json"), ("with", S / "handoff" / f"ranks_{m}.json")):
            cluster = envs.resolve_cluster(str(cluster_file))
            timed = with_profile(graph, cluster, str(D / f"ops_{m}.json"), ranks=True)[0]
            sim = ranks_sim.RankSim(timed, cluster)
            step = {
                p: sim.evaluate([Placement.load(p if "/" in p else str(D / f"plan_{m}_{p}.json"))])[0].step_time_s
                for p in (many, "gpipe_placer")
            }
            out[label] = step[many] / step["gpipe_placer"]
            if label == "with":
                out["handoff_ms"] = cluster.devices[0].handoff_s * 1e3
        rows.append(out)
        verdict = ["right" if (out[k] < 1) == (measured < 1) else "wrong" for k in ("without", "with")]
        print(
            f"{m:16} hand-off {out['handoff_ms']:4.2f} ms: more stages over one per rank, measured {measured:.3f}; "
            f"simulated without {out['without']:.3f} ({verdict[0]}), with {out['with']:.3f} ({verdict[1]})"
        )
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fitted", action="store_true", help="the hand-off profile --ranks fitted (module doc)")
    if ap.parse_args().fitted:
        return fitted()
    ranks_sim._Links.send = delayed_send
    models = {}
    for m in FITTED + HELD_OUT:
        graph = resolve_graph(f"bench.rank_models:{m}")
        cluster = envs.resolve_cluster(str(D / f"ranks_{m}.json"))
        models[m] = (with_profile(graph, cluster, str(D / f"ops_{m}.json"), ranks=True)[0], cluster)

    def simulate(m: str, plan: str) -> float:
        timed, cluster = models[m]
        placement = Placement.load(plan if "/" in plan else str(D / f"plan_{m}_{plan}.json"))
        return ranks_sim.RankSim(timed, cluster).evaluate([placement])[0].step_time_s

    for delay in DELAYS_S:
        DELAY[0] = delay
        errors, right, cells = [], 0, []
        for m in FITTED:
            meas = medians(S / f"variants_{m}.json")
            many, one = simulate(m, "auto"), simulate(m, "gpipe_placer")
            m_many, m_one = meas[("auto", "early")], meas[("gpipe_placer", "os")]
            errors += [abs(many - m_many) / m_many, abs(one - m_one) / m_one]
            right += (many < one) == (m_many < m_one)
            cells.append(f"{m} {many / one:.3f}/{m_many / m_one:.3f}")
        held = []
        for m in HELD_OUT:
            meas = medians(S / f"heldout_{m}.json")
            looped = next(p for p, _ in meas if "/" in p)
            many, one = simulate(m, looped), simulate(m, "gpipe_placer")
            held.append(f"{m} {many / one:.3f}/{meas[(looped, 'os')] / meas[('gpipe_placer', 'os')]:.3f}")
        print(
            f"H = {delay * 1e3:.1f} ms: MAPE {100 * statistics.mean(errors):.1f} %, ranked as measured {right}/"
            f"{len(FITTED)}; more stages over one per rank, simulated/measured: {', '.join(cells)}; held out: "
            f"{', '.join(held)}"
        )


if __name__ == "__main__":
    main()
