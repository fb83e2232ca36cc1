"""Tried, not kept (BENCHMARKS.md, "The correction's pick in the side-by-side"): the corrected loop on stand-in
splits under variants of the rates' prior, and what its final fit would pick. Needs the variants' code:
``git apply docs/correction/pick/tried/rates_prior_variants.patch`` on commit f2e2cdb, then
``PYTHONPATH=. python docs/correction/pick/tried/variants.py file|scale|gauss|both|off GRAPHS SEEDS`` (one JSON line per
run; ``prior_file.jsonl`` and ``prior_scale.jsonl`` hold the runs quoted, graphs ``bench.rank_models:lm_b32`` and
``unet-200,chain-200,attention-200,moe-200``, seeds 0-7 and 0-5). "true" is the loop's plan at the time (before the
correction's pick joined the side-by-side), "model_measured" the measured placement the final fit predicts fastest,
"posterior" that pick added to the finalists and judged with 3 fresh reads by the rule now in
``placer.learn.measured_search.posterior_choice`` (in this script's own version: the rates alone, no linear part)."""

import json
import sys

import numpy as np

import envs
import placer.learn.measured_search as ms
from bench.correction import split_simulators, split_truth
from bench.graph_sources import resolve
from placer.learn.measured_search import CorrectedSearch, CorrectedSearchOptions
from placer.learn.rates import RateFit
from placer.learn.stand_in import StandIn

variant = sys.argv[1]
graphs = sys.argv[2].split(",")
seeds = [int(x) for x in sys.argv[3].split(",")]
ms_ = float(sys.argv[4]) if len(sys.argv) > 4 else 50
noise = float(sys.argv[5]) if len(sys.argv) > 5 else 0.085
meas = int(sys.argv[6]) if len(sys.argv) > 6 else 36
kw = {
    "file": {},
    "gauss": dict(gaussian_prior=True),
    "scale": dict(centre="scale"),
    "both": dict(centre="scale", gaussian_prior=True),
    "off": None,
}[variant]


class RF(RateFit):
    def __init__(self, c, s, **k):
        super().__init__(c, s, **(kw or {}), **k)


ms.RateFit = RF
cluster = envs.resolve_cluster("k80x2")
for gname in graphs:
    g = resolve(gname)
    simulator, sim = split_simulators(g, cluster, 4)
    dist = dict(slow_device="gpu:1", slowdown=2.0, machine_slowdown=ms_)
    truth = StandIn(g, cluster, **dist, simulator=simulator).truth
    best = float(truth.step_times(split_truth(truth.graph, truth.cluster, 4)[None])[0][0])
    for seed in seeds:
        real = StandIn(g, cluster, **dist, simulator=simulator, noise=noise, seed=seed)
        o = CorrectedSearchOptions(measurements=meas, correction=kw is not None)
        s = CorrectedSearch(g, cluster, real, sim=sim, options=o, seed=seed)
        r = s.run(None)
        t = float(real.true_step_times(r.op_devices)[0][0]) / best
        tf = float(real.true_step_times(s.best_op_devices())[0][0]) / best
        extra = {}
        if s.rate_fit is not None:
            ops = np.stack(s.op_devices)
            pred, _ = s.rate_fit.simulator.step_times(ops)
            k = int(np.argmin(pred))
            extra["model_measured"] = round(float(real.true_step_times(ops[k])[0][0]) / best, 4)
            # the posterior rule: finalists + the model's pick, 3 fresh reads each, combined with the prediction
            names, cands = s.finalists()
            if not any(np.array_equal(ops[k], c) for c in cands):
                names, cands = names + ["model"], cands + [ops[k]]
            reads = [np.log(real.measure_again(np.stack([c] * 3))[0]) for c in cands]
            sigma = float(np.sqrt(np.mean([np.var(r, ddof=1) for r in reads])))
            p_all, _ = s.rate_fit.simulator.step_times(ops)
            res = np.log(np.asarray(s.real_s)) - np.log(p_all)
            tau2 = max(float(np.var(res)) - sigma**2, (0.2 * sigma) ** 2)
            pc, _ = s.rate_fit.simulator.step_times(np.stack(cands))
            post = [
                (r.sum() / sigma**2 + (np.log(p) + res.mean()) / tau2) / (len(r) / sigma**2 + 1 / tau2)
                for r, p in zip(reads, pc)
            ]
            j = int(np.argmin(post))
            extra["posterior"] = round(float(real.true_step_times(cands[j])[0][0]) / best, 4)
            extra["median3"] = round(
                float(real.true_step_times(cands[int(np.argmin([np.median(r) for r in reads]))])[0][0]) / best, 4
            )
            extra["tau_sigma"] = (round(float(np.sqrt(tau2)), 4), round(sigma, 4))
            fitted = split_truth(g, s.rate_fit.cluster_at(s.rate_fit.theta), 4)
            extra["model_best"] = round(float(real.true_step_times(fitted)[0][0]) / best, 4)
        w = {k: round(v, 4) for k, v in r.weights.items() if k.startswith("speed/gpu") or k == "device links"}
        print(
            json.dumps(
                dict(
                    variant=variant,
                    graph=gname,
                    seed=seed,
                    true=round(t, 4),
                    fastest=round(tf, 4),
                    chosen=r.chosen,
                    **extra,
                    w=w,
                )
            ),
            flush=True,
        )
