"""REINFORCE on measured rewards, continued from the simulator-trained policy, and its three curves (issue 34).

:func:`fine_tune` continues a ``placer.train`` run made on the simulator with
the reward measured by :class:`envs.real.local.LocalEnv` (the Ray worker's
code, in this process): :func:`hand_off` copies the simulator run's checkpoint
(policy, optimizer, RNG and the policy's items) into a new run directory with
a fresh record (no best yet, iteration 0, no elapsed time), and ``placer.train``
resumes from it with ``env="measured"``. Every placement is measured once
(:class:`LocalEnv` caches and logs by placement and order, as the Ray path does).

:class:`Recorder` sits between the learner and the env and writes one line per
new placement to ``curves.jsonl`` (appended as it comes, flushed and fsynced):
the real step time and status, the simulator's for the same placement, and the
op-device vector. :func:`curves` reads that file back as the three curves the
issue asks for:

* real: the real step time of each measurement, in order, and its running best;
* simulated: the simulator's prediction for the same placements, and the real
  time of the placement the simulator would pick among those measured so far;
* where they part: the first measurement after which the simulator's pick is no
  longer the real best, and each placement the simulator says fits that ran out
  of memory for real (or the reverse).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Sequence

import numpy as np

from envs.real.measure_log import append_log_line
from envs.result import Result
from graphs import OpGraph, PlacerError
from placer.learn import checkpoint
from placer.learn.state import RunState

CURVES_NAME = "curves.jsonl"


def hand_off(sim_logdir: str, logdir: str) -> dict[str, Any]:
    """Copy the simulator run's checkpoint to ``logdir`` with a fresh record; returns the copied config.

    The policy, its optimizer, the sampler's RNG and the items it places
    (``warm_start_indices``, which cut the policy's groups) are kept; the best,
    the iteration count and the elapsed time start again, since the simulator's
    times are not the measured ones.
    """
    if checkpoint.exists(logdir):
        raise PlacerError(
            f"{logdir}: already holds a checkpoint (a fine-tuning run there would not start from the simulator's)"
        )
    tensors, state = checkpoint.load(sim_logdir)
    old = RunState.from_dict(state["run"], where=os.path.join(sim_logdir, checkpoint.CHECKPOINT_PT))
    fresh = RunState(
        warm_start=f"the simulator-trained policy ({old.iteration} iterations; {old.warm_start})",
        warm_start_indices=old.warm_start_indices,
    )
    checkpoint.save(logdir, tensors, {**state, "run": fresh.to_dict()})
    return state["config"]


class Recorder:
    """A scorer that passes placements to ``env`` and records each new one with the simulator's view of it."""

    def __init__(self, env: Any, sim: Any, path: str) -> None:
        self.env, self.sim, self.path = env, sim, path
        earlier = read_curves(path) if os.path.exists(path) else []  # a resumed run goes on with its records
        self.seen: set[bytes] = {np.asarray(r["op_devices"], dtype=np.int32).tobytes() for r in earlier}
        self.count = len(earlier)
        self.t0 = time.perf_counter() - (earlier[-1]["elapsed_s"] if earlier else 0.0)

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        results = self.env.evaluate(placements)
        for p, r in zip(placements, results):
            op_devices = np.asarray(p, dtype=np.int32)
            key = op_devices.tobytes()
            if key in self.seen:
                continue
            self.seen.add(key)
            s = self.sim.simulate(op_devices)
            self.count += 1
            append_log_line(
                self.path,
                json.dumps(
                    {
                        "n": self.count,
                        "elapsed_s": time.perf_counter() - self.t0,
                        "real_status": r.status,
                        "real_step_time_s": _finite(r.step_time_s),
                        "real_peak_bytes": r.peak_bytes,
                        "sim_status": s.status,
                        "sim_step_time_s": _finite(s.extra.get("sim_step_time_s", s.step_time_s)),
                        "sim_peak_bytes": s.peak_bytes,
                        "op_devices": op_devices.tolist(),
                    }
                ),
            )
        return results

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        if order is not None:
            raise PlacerError("the measured fine-tuning measures each placement in node order; give order=None")
        results = self.evaluate(list(np.asarray(op_devices)))
        return np.array([r.step_time_s for r in results]), np.array([not r.ok for r in results])


def _finite(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def fine_tune(
    graph: OpGraph,
    cluster: Any,
    cluster_path: str,
    env: Any,
    sim_logdir: str,
    logdir: str,
    *,
    time_budget_s: float | None = None,
    iterations: int | None = None,
    fail_factor: float | None = None,
    exploration: float = 0.0,
    progress: bool = False,
) -> Any:
    """Continue the simulator run of ``sim_logdir`` with rewards measured by ``env``, for ``time_budget_s`` in all
    (or ``iterations``).

    A ``logdir`` that already holds this fine-tuning's checkpoint (a run cut
    short) is resumed, with the time it has left. ``fail_factor``: what a
    placement that does not run costs, in units of the reward scale (default:
    the simulator run's). ``exploration``: the std of the noise on the policy's
    logits while sampling (``logit_noise``, for the whole run): a policy trained
    to convergence on the simulator samples its own mode almost only, and a
    measured reward can only move it toward placements it samples. Returns
    ``placer.train``'s result.
    """
    import envs
    from placer.learn.config import TrainConfig
    from placer.learn.loop import train

    saved = checkpoint.load(logdir)[1]["config"] if checkpoint.exists(logdir) else hand_off(sim_logdir, logdir)
    keep = {
        k: saved[k]
        for k in (
            "policy",
            "samples",
            "max_groups",
            "hidden",
            "layers",
            "algo",
            "seed",
            "lr",
            "entropy_coef",
            "temperature",
            "tanh_c",
            "baseline",
            "fail_factor",
        )
        if k in saved
    }
    if fail_factor is not None:
        keep["fail_factor"] = fail_factor
    keep.update(logit_noise=exploration, logit_noise_steps=1 << 30)
    config = TrainConfig(
        **keep,
        source=graph.name,
        cluster=cluster_path,
        env="measured",
        resume=True,
        logdir=logdir,
        time_budget_s=time_budget_s,
        iterations=iterations,
        heuristics=(),
        progress=progress,
    )
    recorder = Recorder(env, envs.SimEnv(graph, cluster), os.path.join(logdir, CURVES_NAME))
    return train(config, graph=graph, cluster=cluster, env=recorder)


# ------------------------------------------------------------------ curves
def read_curves(path: str) -> list[dict[str, Any]]:
    """The records of a ``curves.jsonl`` (a torn last line of a killed run is skipped)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def curves(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The three curves of a fine-tuning run (see the module doc), as lists over the measurements in order."""
    real = [r["real_step_time_s"] if r["real_status"] == "ok" else None for r in records]
    sim = [r["sim_step_time_s"] if r["sim_status"] == "ok" else None for r in records]
    real_best, sim_pick_real, sim_pick = [], [], None
    best = math.inf
    parted_at = None
    for i, (t, s) in enumerate(zip(real, sim)):
        best = min(best, t if t is not None else math.inf)
        real_best.append(best if math.isfinite(best) else None)
        if s is not None and (sim_pick is None or s < sim[sim_pick]):
            sim_pick = i
        pick_t = real[sim_pick] if sim_pick is not None else None
        sim_pick_real.append(pick_t)
        if parted_at is None and sim_pick is not None and math.isfinite(best) and (pick_t is None or pick_t > best):
            parted_at = i  # the simulator's pick failed for real, or runs slower than the real best
    disagree = [i for i, r in enumerate(records) if (r["real_status"] == "ok") != (r["sim_status"] == "ok")]
    both = [(t, s) for t, s in zip(real, sim) if t is not None and s is not None]
    return {
        "n": len(records),
        "real_step_time_s": real,
        "real_best_s": real_best,
        "sim_step_time_s": sim,
        "sim_pick_real_s": sim_pick_real,
        "parted_at": parted_at,
        "fit_disagreements": disagree,
        "spearman": _spearman(both),
        "median_real_over_sim": float(np.median([t / s for t, s in both])) if both else None,
    }


def _spearman(pairs: list[tuple[float, float]]) -> float | None:
    if len(pairs) < 3:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr([p[0] for p in pairs], [p[1] for p in pairs]).statistic
    return float(rho) if math.isfinite(rho) else None


def plot_curves(c: dict[str, Any], path: str, *, title: str = "", dpi: int = 100) -> None:
    """Draw the three curves of :func:`curves`: real and simulated step time per measurement, the running best,
    the real time of the simulator's pick, and where they part."""
    from bench.plots import pyplot, save_figure  # matplotlib: the plot extra, loaded when drawing

    plt = pyplot()
    n = range(1, c["n"] + 1)

    def ms(xs: list) -> list:
        return [x * 1e3 if x is not None else float("nan") for x in xs]

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(n, ms(c["real_step_time_s"]), "o", color="C0", markersize=4, label="real step time")
    ax.plot(n, ms(c["sim_step_time_s"]), "x", color="C1", markersize=4, label="simulated, same placement")
    ax.step(n, ms(c["real_best_s"]), where="post", color="C0", label="real best so far")
    ax.step(
        n, ms(c["sim_pick_real_s"]), where="post", color="C1", linestyle="--", label="real time of the simulator's pick"
    )
    if c.get("parted_at") is not None:
        ax.axvline(c["parted_at"] + 1, color="0.4", linestyle=":", label="they part")
    for i in c.get("fit_disagreements", []):
        ax.axvline(i + 1, color="C3", alpha=0.25, linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("placements measured (in order)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title or "REINFORCE on measured step times")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi)


__all__ = ["CURVES_NAME", "Recorder", "curves", "fine_tune", "hand_off", "plot_curves", "read_curves"]
