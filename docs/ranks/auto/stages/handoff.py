"""What if every message between CPU ranks arrived H later (its data waiting for a gloo thread to get a busy core),
without holding the sender's core longer: the simulator of ranks run again with that delay on the plans measured in
this folder, against their measured steps. Fitted on the five models of ``confirm.sh`` (the MAPE of the plans
posting early and of one stage per rank; whether the plan of more stages than ranks and the one-stage plan are
ranked as measured), and checked on the two held out (``heldout_*.json``: the LM and the convnet, a looped
Interleaved 1F1B plan beside one stage per rank). The simulator is patched in this process only.

    PYTHONPATH=. python docs/ranks/auto/stages/handoff.py > handoff.txt
"""

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


def main() -> None:
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
