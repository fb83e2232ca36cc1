"""How far a better split can take a pipeline over `equal_layers` on the models of ``measure.sh``: each plan's
compute per rank (the forward and backward of one microbatch, the per-op simulator's times on the model's own
profile, M = 4) and its busiest rank over an even half of the whole (``max/half``). At one schedule, a plan whose
busiest rank holds ``r`` times an even share is at most about ``r / r'`` times slower than one whose holds ``r'``:
the fill, the sends and the optimizer step come on top of both. Then the bound of ranks (``placer compare --ranks``'s)
at M = 4 and each plan's simulated step over it.

    PYTHONPATH=. python docs/ranks/auto/balance.py [--dir docs/ranks/auto/again2] [MODEL ...]
"""

import argparse
from pathlib import Path

import numpy as np

import envs
from envs.real.profiler.fit import with_profile
from envs.sim.cost import op_times
from envs.sim.ranks import RankSim
from graphs.plan import Placement
from graphs.sources import resolve_graph

PLANS = ("gpipe_equal", "best_equal", "best_flops", "gpipe_placer", "auto")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="docs/ranks/auto/again2")
    ap.add_argument("models", nargs="*", default=["lm", "encoder_decoder", "unet"])
    args = ap.parse_args()
    d = Path(args.dir)
    for m in args.models:
        graph = resolve_graph(f"bench.rank_models:{m}")
        cluster = envs.resolve_cluster(str(d / f"ranks_{m}.json"))
        timed = with_profile(graph, cluster, str(d / f"ops_{m}.json"), ranks=True)[0]
        fwd, bwd = op_times(timed, cluster, 4)
        work = (fwd + bwd)[:, 0]
        half = work.sum() / 2
        print(f"{m}: {2 * half * 1e3:.1f} ms of compute per microbatch")
        balance = {}
        for p in PLANS:
            plan = Placement.load(str(d / f"plan_{m}_{p}.json"))
            ranks = np.asarray(plan.indices(timed))
            per = [float(work[ranks == r].sum()) for r in sorted(set(ranks.tolist()))]
            balance[p] = max(per) / half
            print(
                f"  {p:13} {plan.meta.get('ranks_schedule') or plan.meta.get('schedule') or 'gpipe':17} per rank "
                + " / ".join(f"{x * 1e3:5.1f}" for x in per)
                + f" ms   max/half {balance[p]:.3f}"
            )
        best = min(balance["best_equal"], balance["gpipe_equal"])
        print(
            f"  an even split over equal_layers' own split: at most {best:.3f}x; placer's split leaves "
            f"{balance['auto']:.3f} of it, so about {best / balance['auto']:.3f}x"
        )
        sim = RankSim(timed, cluster)
        bound = sim.lower_bound(4)
        steps = {p: sim.simulate(Placement.load(str(d / f"plan_{m}_{p}.json"))).step_time_s for p in PLANS}
        print(
            f"  the bound of ranks at M = 4: {bound * 1e3:.1f} ms ({bound.name}); simulated over it: "
            + ", ".join(f"{p} {steps[p] / bound:.2f}x" for p in PLANS)
        )


if __name__ == "__main__":
    main()
