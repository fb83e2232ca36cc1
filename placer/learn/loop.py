"""Train a placement policy with REINFORCE (or PPO) against a scorer.

One readable loop, in the spirit of CleanRL: build env and policy, (optionally)
warm-start by imitation, then repeat: sample K placements -> score them in one
batch -> rewards and advantages -> update -> log -> checkpoint. The options are
:class:`placer.learn.config.TrainConfig`; the algorithm (reward, reward baselines,
advantages, the loss per log-probability term, schedules) is
:mod:`placer.learn.algos`; the loop's state is a :class:`RunState`, saved in every
checkpoint.

Reward and failing signal. The paper's reward is ``-sqrt(runtime)`` with a failing
runtime of 100 s for placements that do not run, i.e. about 10x its models' step
times. Absolute seconds do not transfer between a 2 ms and a 2 s model, so here
every step time is divided by ``t_ref``, the best single-device step time
(ignoring memory) of the graph on this cluster: the reward is
``-sqrt(step_time_s / t_ref)`` (about -1 for a no-better-than-one-device
placement) and a failed (OOM) placement counts as ``fail_factor * t_ref``
(:func:`placer.learn.algos.reward`).

Warm start (``warm_start="best"``, the default; honest labelling). Before RL, the
policy is trained for a few steps to imitate the best heuristic placement (by
simulated step time), contracted to the policy's groups by majority vote. RL then
starts from a policy whose greedy decoding is (close to) that heuristic. The best
placement reported is always one the policy sampled or greedily decoded; its
``meta`` says which, at which iteration, and which heuristic it was warm-started
from. ``warm_start="none"`` trains from scratch. So that the incumbent can be
imitated exactly, the seq2seq policy's items are the coarsened co-location
groups further cut wherever the incumbent changes device along the topological
order (``graphs.grouping.refine_grouping``): more items (e.g. 100 -> 333 on
nmt-2 with annealing's placement), but majority-voting an incumbent onto the
plain coarse groups lost 10-18% of its quality on nmt-2.

Reward baseline. The paper's EMA reward baseline (decay 0.9) is available (``baseline="ema"``)
and always logged, but the default is leave-one-out: each of the K samples is
compared with the mean reward of the other K-1, so advantages have zero mean in
every batch (an EMA lagging above a falling batch mean makes them all negative
and pushes the mode's probability down). Advantages are divided by the batch's
reward std. After a warm start the RL learning rate must be small (5e-4):
measured on nmt-2, 2e-3 raises the entropy from 0.09 to 0.13 within five steps
and 1e-2 to 0.9 within a hundred, and the samples get worse with it. The
papers' settings are one switch away (``TrainConfig.from_preset("paper")``,
``placer train --preset paper``; see :data:`placer.learn.config.PRESETS`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np
import torch
from torch.utils import tensorboard

import envs
from envs.cluster import Cluster
from envs.real.profiler import with_profile
from graphs import OpGraph, PlacerError
from graphs.grouping import default_num_groups
from graphs.plan import Placement
from placer.checks import check_output_dir
from placer.compare import compare, default_methods
from placer.learn import checkpoint
from placer.learn.algos import (
    ALGOS,
    advantages,
    imitate,
    learning_rate,
    logit_noise,
    reward,
    set_logit_noise,
    term_credits,
)
from placer.learn.config import TrainConfig
from placer.learn.move_learner import MoveLearner, RunScorer, equal_budget_search
from placer.learn.progress import Progress
from placer.learn.rundir import (
    BEST_NAME,
    RIVAL_NAME,
    adopt_newer_best,
    check_compatible,
    check_fresh,
    default_logdir,
    run_best_placement,
    run_lock,
    run_placement,
    save_best,
)
from placer.learn.scoring import ENVS, CachedScorer, Scorer, measured_heuristics, reference_time
from placer.learn.state import RunState, TrainResult
from placer.sources import resolve_graph
from policies import POLICIES, policy_file
from policies.base import Policy


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise PlacerError(f"--device {name!r}: not a torch device (cpu, cuda, cuda:N, auto)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PlacerError(f"--device {name!r}: CUDA is not available on this machine")
    return dev


def _heuristics(
    graph: OpGraph, cluster: Cluster, config: TrainConfig, progress: Progress
) -> tuple[dict[str, tuple[float, np.ndarray | None]], int]:
    """name -> (simulated step time, op devices) of the heuristics, via ``placer.compare``; and the placements
    they simulated in all (their searches and their scoring).

    Methods that cannot run get ``inf``.
    """
    # by default every heuristic but ilp: a solver run of a minute whose plan rests on its own issue order
    methods = list(config.heuristics) if config.heuristics is not None else default_methods(exclude=("ilp",))
    if methods == []:
        return {}, 0
    progress.phase(f"scoring {len(methods)} heuristics on {cluster.name} (simulated), the rivals and the warm start")
    progress.start("scoring", total=len(methods), unit="heuristics")
    try:
        report = compare(
            graph,
            cluster,
            methods=methods,
            seed=config.seed,
            executor=config.executor,
            microbatches=config.microbatches,
            inflight=config.inflight,
            score_order=config.score_order,
            progress=lambda done, name: progress.update(done, name),
        )
    finally:  # Ctrl-C here too: the bar ends before the message that follows
        progress.close()
    out: dict[str, tuple[float, np.ndarray | None]] = {}
    for row in report.rows:
        if row.kind not in ("heuristic", "baseline"):  # a heuristic's row ("baseline" before the compare split)
            continue
        ok = row.status == "ok" and row.step_time_s is not None and row.placement is not None
        idx = row.placement.indices(graph, cluster.device_names) if row.placement is not None else None
        out[row.method] = (float(row.step_time_s) if ok else float("inf"), idx)
    return out, sum(row.simulated for row in report.rows if row.kind in ("heuristic", "baseline"))


def _hparams_table(config: TrainConfig, extra: dict[str, Any]) -> str:
    rows = {**dataclasses.asdict(config), **extra}
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in rows.items())


def train(
    config: TrainConfig,
    *,
    graph: OpGraph | None = None,
    cluster: Cluster | None = None,
    env: Scorer | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Train a placement policy; see :class:`TrainConfig`. Returns the best placement found.

    ``graph``, ``cluster`` and ``env`` may be given directly (tests, notebooks);
    otherwise they are resolved from ``config.source`` / ``config.cluster`` / ``config.env``.
    ``progress``: where the run reports its phases (default: stderr, unless ``config.progress`` is off).
    """
    progress = progress if progress is not None else Progress(enabled=config.progress)
    # ---- validate and resolve
    config.validate()
    config = config.resolved(env)
    device = resolve_device(config.device)
    if graph is None:
        graph = resolve_graph(config.source)
    if cluster is None:
        cluster = envs.resolve_cluster(config.cluster)
        if config.profile:
            graph, cluster = with_profile(graph, cluster, config.profile, device_map=config.device_map)
    if graph.num_ops == 0:
        raise PlacerError(
            f"{config.source or graph.name or 'graph'}: the graph has no ops, so there is nothing to place"
        )
    logdir = config.logdir or default_logdir(config, graph)
    check_output_dir(logdir, "--logdir")
    os.makedirs(logdir, exist_ok=True)
    with run_lock(logdir):
        saved = None
        if not config.resume:
            check_fresh(logdir)
        if config.resume:  # before anything is built on it: a checkpoint of another graph is a user error
            if not checkpoint.exists(logdir):
                raise PlacerError(f"--resume: {logdir} has no {checkpoint.CHECKPOINT_PT}")
            saved = checkpoint.load(logdir, map_location=device)
            check_compatible(saved[1], config, graph, list(cluster.device_names), logdir)
        owns_env = env is None
        env = env if env is not None else ENVS[config.env](config, graph, cluster, logdir)  # checked by validate()
        try:
            return _train(config, graph, cluster, env, logdir, device, saved, progress)
        finally:
            if owns_env and hasattr(env, "close"):
                env.close()


def _train(
    config: TrainConfig,
    graph: OpGraph,
    cluster: Cluster,
    env: Scorer,
    logdir: str,
    device: torch.device,
    saved: tuple[dict[str, Any], dict[str, Any]] | None,
    progress: Progress,
) -> TrainResult:
    """The training run proper, in a locked ``logdir``; ``saved``: the checkpoint to resume (checked)."""
    run = _Run(config, graph, cluster, env, logdir, device, saved, progress)
    writer = tensorboard.SummaryWriter(logdir)
    interrupted = False
    try:
        run.start(writer)
        measure = _start_rl_progress(config, run, progress)
        while not run.done():
            if run.state.iteration % config.eval_every == 0:  # greedy first: the warm start's mode is scored at 0
                run.evaluate_greedy(writer)
            run.iterate(writer)
            progress.update(measure(), run.status())
            if run.state.iteration % config.checkpoint_every == 0:
                run.save_checkpoint()
        progress.update(float("inf"), run.status())  # done: the budget is spent (its last second may fall short)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
        writer.close()
    run.save_checkpoint()
    return run.result(interrupted)


def _start_rl_progress(config: TrainConfig, run: "_Run", progress: Progress) -> Any:
    """Start the RL phase's progress (what is left of the budget); returns how far the phase has got, in its units."""
    s = run.state
    if config.iterations is not None:
        first = s.iteration
        progress.phase(
            f"{run.phase_name()}: {config.iterations - first} iterations of {run.iteration_text()}; "
            f"best so far {run.best_text()}"
        )
        progress.start(run.phase_name(), total=config.iterations - first, unit="it")
        return lambda: s.iteration - first
    begun = run.elapsed()
    left_s = int(np.ceil(max(float(config.time_budget_s) - begun, 0.0)))
    progress.phase(
        f"{run.phase_name()}: {left_s} s left of the {config.time_budget_s:g} s budget, "
        f"{run.iteration_text()} an iteration; best so far {run.best_text()}"
    )
    progress.start(run.phase_name(), total=left_s, unit="s")
    return lambda: run.elapsed() - begun


class _Run:
    """One training run: the objects it works with and its :class:`RunState` (what the checkpoint keeps)."""

    def __init__(
        self,
        config: TrainConfig,
        graph: OpGraph,
        cluster: Cluster,
        env: Scorer,
        logdir: str,
        device: torch.device,
        saved: tuple[dict[str, Any], dict[str, Any]] | None,
        progress: Progress,
    ) -> None:
        self.config, self.graph, self.cluster, self.logdir, self.device = config, graph, cluster, logdir, device
        self.progress = progress
        self.algo = ALGOS.get(config.algo)  # None for "moves", whose learner is not a policy-gradient algorithm
        self.score = CachedScorer(env, "planned" if config.score_order == "planned" else None)
        self.devices = list(cluster.device_names)
        # ---- reference times: the reward scale, heuristics and the lower bound
        setup_start = time.perf_counter()
        progress.phase(
            f"setting up: {graph.name or 'graph'} ({graph.num_ops:,} ops) on {cluster.name}, "
            f"scored by {'the simulator' if config.env == 'sim' else 'real training steps'}"
        )
        self.t_ref = reference_time(self.score, graph, cluster, config.executor)
        self._found_heuristics()
        # the simulator of this problem (executor, microbatches): the lower bound, and under --env sim the
        # planner of the best placement's issue order; the scorer itself when it is one
        sim = (
            env
            if isinstance(env, envs.SimEnv)
            else envs.SimEnv(
                graph, cluster, executor=config.executor, microbatches=config.microbatches, inflight=config.inflight
            )
        )
        self.lower_bound_s: float | None = float(sim.lower_bound())
        self.state = RunState(setup_s=time.perf_counter() - setup_start)
        # ---- seed, policy, optimizer
        torch.manual_seed(config.seed)
        self.max_groups = config.max_groups if config.max_groups is not None else default_num_groups(len(self.devices))
        moves = config.algo == "moves"  # the best heuristic is the move search's start, not an imitation target
        self.warm = config.warm_start == "best" and np.isfinite(self.best_h[1]) and saved is None and not moves
        target = self.best_h_op_devices if self.warm else None
        if saved is not None:  # the items must be those the checkpoint was trained on
            self.state = RunState.from_dict(saved[1]["run"])
            target = (
                np.asarray(self.state.warm_start_indices, dtype=np.int32) if self.state.warm_start_indices else None
            )
        self.target = target
        p = config.policy_options
        self.policy: Policy = POLICIES[config.policy](
            graph,
            len(self.devices),
            max_groups=self.max_groups,
            hidden=p.hidden,
            layers=p.layers,
            temperature=p.temperature,
            tanh_c=p.tanh_c,
            refine=target,
            cluster=cluster,
            **({"net": policy_file.load(p.init).net} if p.init is not None else {}),  # --init: pretrained weights
        ).to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.gen = torch.Generator(device=device).manual_seed(config.seed)
        if saved is not None:
            self._load(saved[0])
            adopt_newer_best(self.state, logdir, graph, self.devices, self.score, config)
        self.fail_cost = config.fail_factor * self.t_ref
        # the simulator that picks the best placement's issue order (built once; --env sim only)
        self.planner = sim if config.env == "sim" else None
        self.sim = sim
        self.mover = None
        if moves:
            start = (
                np.asarray(self.state.best_indices)
                if saved is not None and self.state.best_indices
                else self.best_h_op_devices
                if config.warm_start == "best"
                else None
            )
            # module_search's share of the time left: under the simulator, with a time budget; not on --resume
            # (the run's best is the start), nor with measured steps (a round of module moves is measured whole)
            timed = config.time_budget_s is not None and saved is None and config.env == "sim"
            left = (lambda: config.time_budget_s - self.elapsed()) if timed else (lambda: None)
            self.mover = MoveLearner(
                graph,
                cluster,
                RunScorer(self.score, sim, self.consider),
                start,
                seed=config.seed,
                proposals=config.proposals,
                order=self.score.order,
                time_left=left,
            )
            if saved is None:
                self.state.warm_start = f"move search from {self.best_h[0]}" if start is not None else "move search"
        self.t0 = time.perf_counter() - self.state.elapsed_s

    def _found_heuristics(self) -> None:
        """Score the heuristics as the run scores: sets ``heuristics``, ``best_h`` and its ``best_h_op_devices``."""
        found, self.heuristics_simulated = _heuristics(self.graph, self.cluster, self.config, self.progress)
        if self.score.order is not None:
            # compare searched and scored them in the run's order already; scored again through the run's
            # scorer, so the warm start, the rival's start and "beat the best heuristic" are its own numbers
            found = {
                name: (self._scored(idx) if idx is not None and np.isfinite(t) else t, idx)
                for name, (t, idx) in found.items()
            }
        self.heuristics = {name: t for name, (t, _) in found.items()}
        # --env measured: the rivals measured on the same workers, so the comparison is measured with measured
        measured = self.config.env == "measured"
        if measured and self.config.measure_heuristics:
            self.progress.phase(
                f"measuring the heuristics of the {self.config.measure_heuristics} fastest simulated "
                "placements on the workers"
            )
        self.measured = measured_heuristics(self.score, found, self.config.measure_heuristics) if measured else {}
        rivals = self.measured or self.heuristics
        self.best_h = min(rivals.items(), key=lambda kv: kv[1]) if rivals else ("none", float("inf"))
        # the time to beat, scored as the samples are (None: a measured run that measured no heuristic has none)
        self.rival_s = self.best_h[1] if self.measured or not measured else None
        self.best_h_op_devices = found[self.best_h[0]][1] if np.isfinite(self.best_h[1]) else None
        if found:
            kind = " (measured)" if self.measured else " (simulated)" if measured else ""
            self.progress.phase(
                f"best heuristic: {self.best_h[0]} {_ms(self.best_h[1])}{kind}"
                if self.best_h_op_devices is not None
                else "no heuristic placement fits"
            )

    def _scored(self, op_devices: np.ndarray) -> float:
        t, failed = self.score(np.asarray(op_devices, dtype=np.int32)[None])
        return float("inf") if failed[0] else float(t[0])

    def _load(self, tensors: dict[str, Any]) -> None:
        try:
            self.policy.load_state_dict(tensors["policy"])
            self.optimizer.load_state_dict(tensors["optimizer"])
            self.gen.set_state(tensors["generator"].cpu())
        except (KeyError, RuntimeError, ValueError) as e:
            raise PlacerError(
                f"--resume: {os.path.join(self.logdir, checkpoint.CHECKPOINT_PT)} does not fit this run "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def done(self) -> bool:
        c = self.config
        return (c.iterations is not None and self.state.iteration >= c.iterations) or (
            c.time_budget_s is not None and self.elapsed() >= c.time_budget_s
        )

    def start(self, writer: Any) -> None:
        """Log the hyperparameters; the best heuristic's placement as the incumbent; warm start; first checkpoint."""
        c, s = self.config, self.state
        if not c.resume:
            writer.add_text(
                "hyperparameters",
                _hparams_table(
                    c,
                    {
                        "graph": self.graph.name,
                        "num_ops": self.graph.num_ops,
                        "items": self.num_items,
                        "devices": ",".join(self.devices),
                        "reference_step_time_s": self.t_ref,
                        "device": str(self.device),
                        "best_heuristic": f"{self.best_h[0]} {self.best_h[1]}",
                        "setup_s": s.setup_s,
                    },
                ),
            )
        if self.best_h_op_devices is not None and self.rival_s is not None:
            # the incumbent: best_placement.json is never slower than the best placement scored, heuristics included
            # (a measured run's heuristics count when it measured them: their simulated times say nothing here)
            idx = np.asarray(self.best_h_op_devices, dtype=np.int32)[None]
            self.consider(idx, *self.score(idx), f"heuristic:{self.best_h[0]}")
        if self.warm:
            self._warm_start()
        if not c.resume:
            # resumable from here on: a run killed before its first periodic checkpoint keeps its policy and items,
            # and the best it wrote to best_placement.json since is adopted on --resume (adopt_newer_best)
            self.save_checkpoint()
        if self.warm:
            g_idx = self.policy.greedy()[None]
            g_t, g_failed = self.score(g_idx)
            s.warm_start_step_time_s = float(g_t[0]) if not g_failed[0] else None
            self.consider(g_idx, g_t, g_failed, "greedy")  # a run whose budget ends here still has a placement
            self.progress.phase(
                f"warm start: {s.warm_start}{', cut short by the time budget' if s.warm_start_cut_short else ''}"
                f"; the policy's greedy placement: {_ms(s.warm_start_step_time_s)}"
            )

    def _warm_start(self) -> None:
        """Imitate the best heuristic's placement, within half the time budget (so RL always gets its turn)."""
        c, s = self.config, self.state
        most = c.algo_options.warm_start_steps
        deadline = self.t0 + 0.5 * c.time_budget_s if c.time_budget_s is not None else None
        limit = f", {max(deadline - time.perf_counter(), 0.0):.3g} s at most" if deadline is not None else ""
        self.progress.phase(f"warm start: imitating {self.best_h[0]}'s placement, up to {most} steps{limit}")
        steps = imitate(self.policy, self.target, c.algo_options, deadline=deadline)
        s.warm_start, s.warm_start_indices = f"imitation of {self.best_h[0]} ({steps} steps)", self.target.tolist()
        # imitate stops at the deadline (cut short) or once the greedy decoding is the target (done)
        s.warm_start_cut_short = steps < most and deadline is not None and time.perf_counter() >= deadline

    @property
    def num_items(self) -> int:
        if self.mover is not None:  # the move search's finest level
            return self.mover.search.levels[-1].num_items
        return getattr(self.policy, "num_items", self.max_groups)

    def phase_name(self) -> str:
        """The learning phase's name in progress lines: the move search, or RL for a policy network."""
        return "move search" if self.mover is not None else "RL"

    def iteration_text(self) -> str:
        """What one iteration does, for the phase's first line."""
        if self.mover is not None:
            return (
                f"one round of {self.config.proposals}-ranked moves ({self.mover.search.levels[0].num_items} "
                f"to {self.num_items} items)"
            )
        return f"{self.config.samples} sampled placements ({self.num_items} items each)"

    def best_text(self) -> str:
        """The incumbent's step time and where it came from, e.g. ``237.345 ms (module_search)``."""
        s = self.state
        by = (
            s.best_found_by.removeprefix("heuristic:")
            if s.best_found_by.startswith("heuristic:")
            else ("policy" if s.best_found_by in ("sample", "greedy", "") else s.best_found_by)
        )  # or the move search's
        return f"{_ms(s.best_step_time_s)} ({by})" if np.isfinite(s.best_step_time_s) else "none yet"

    def status(self) -> str:
        """What the RL progress shows beside its count."""
        return f"iteration {self.state.iteration}, best {self.best_text()}"

    def evaluate_greedy(self, writer: Any) -> None:
        if self.mover is not None:  # no policy is trained
            return
        g_idx = self.policy.greedy()[None]
        g_t, g_failed = self.score(g_idx)
        self.consider(g_idx, g_t, g_failed, "greedy")
        writer.add_scalar(
            "charts/greedy_step_time_s", g_t[0] if not g_failed[0] else self.fail_cost, self.state.iteration
        )

    def iterate(self, writer: Any) -> None:
        """One iteration: sample K placements, score them in one batch, reward -> advantage -> update, log."""
        c, s, it = self.config, self.state, self.state.iteration
        if self.mover is not None:
            if not self.mover.begun:
                first = self.mover.module_seconds()
                if first > 0:
                    self.progress.phase(
                        f"move search: module_search first, for {first:.0f} s "
                        f"({self.mover.search.options.module_share:.0%} of the time left); the moves "
                        "start from the best of its placement and the warm start"
                    )
                self.mover.begin(first)
            self.mover.iterate(writer, it)
            s.iteration = it + 1
            return
        set_logit_noise(self.policy, logit_noise(c, it))
        sample = self.algo.sample(self.policy, c.samples, self.gen)
        t, failed = self.score(sample.op_devices)
        self.consider(sample.op_devices, t, failed, "sample")
        r = reward(t, failed, self.t_ref, c.fail_factor)
        adv = advantages(r, failed, s.baseline, c, it)
        adv_t = torch.as_tensor(adv.advantages, dtype=torch.float32, device=self.device)
        lr = learning_rate(c, it)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        policy_loss, entropy = self.algo.update(self.policy, self.optimizer, sample, adv_t, c)
        s.baseline, s.iteration = adv.baseline, it + 1
        ok_t = t[~failed]
        scalars = {
            "charts/best_step_time_s": s.best_step_time_s,
            "charts/reward": float(r.mean()),
            "charts/step_time_s": float(ok_t.mean()) if len(ok_t) else self.fail_cost,
            "charts/failed_fraction": float(failed.mean()),
            "charts/baseline": s.baseline,
            "charts/elapsed_s": self.elapsed(),
            "charts/learning_rate": lr,
            "charts/logit_noise": logit_noise(c, it),
            "losses/policy_loss": policy_loss,
            "losses/entropy": entropy,
            **{f"losses/credit/{name}": v for name, v in term_credits(sample, adv_t).items()},
        }
        share = np.bincount(sample.op_devices.ravel(), minlength=len(self.devices)) / sample.op_devices.size
        scalars.update({f"charts/device_share/{dev}": float(share[d]) for d, dev in enumerate(self.devices)})
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, it)

    def consider(self, op_devices: np.ndarray, t: np.ndarray, failed: np.ndarray, found_by: str) -> None:
        """Keep the best successful placement; rewrite best_placement.json when it improves."""
        ok = np.flatnonzero(~failed & np.isfinite(t))
        if not len(ok):
            return
        j = ok[np.argmin(t[ok])]
        s = self.state
        if not found_by.startswith("heuristic:"):  # the policy's own best, apart from the incumbent
            s.policy_step_time_s = min(s.policy_step_time_s, float(t[j]))
            if s.time_to_beat_heuristic_s is None and self.rival_s is not None and t[j] <= self.rival_s:
                s.time_to_beat_heuristic_s = self.elapsed()
        if t[j] < s.best_step_time_s:
            s.best_step_time_s, s.best_indices, s.best_found_by = float(t[j]), op_devices[j].tolist(), found_by
            s.best_iteration, s.time_to_best_s = s.iteration, self.elapsed()
            save_best(os.path.join(self.logdir, BEST_NAME), self.best_placement())

    def best_placement(self) -> Placement:
        return run_best_placement(self.graph, self.devices, self.cluster, self.config, self.state, self.planner)

    def save_checkpoint(self) -> None:
        self.state.elapsed_s = self.elapsed()
        tensors = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.gen.get_state(),
        }
        checkpoint.save(
            self.logdir,
            tensors,
            {
                "config": dataclasses.asdict(self.config),
                "graph_hash": self.graph.content_hash,
                "devices": self.devices,
                "run": self.state.to_dict(),
            },
        )

    def _keep_rival(self, eq: dict[str, Any]) -> None:
        """Where the equal-budget search found a placement faster than the run's best, write it beside the best
        (``RIVAL_NAME``, with its issue order; ``eq["placement"]`` its path): the comparison stays as it was, and
        the faster placement is not lost. The run's best is left as the learner's."""
        x = eq.pop("op_devices")
        t, best = eq.get("step_time_s"), self.state.best_step_time_s
        if t is None or not (best is None or t < best * (1 - 1e-12)):
            return
        meta = {"step_time_s": t, "found_by": "equal-budget search", "evals": eq["simulated"]}
        path = os.path.join(self.logdir, RIVAL_NAME)
        save_best(
            path,
            run_placement(self.graph, self.devices, self.cluster, self.config, x, eq["method"], meta, self.planner),
        )  # a resumed run's earlier, faster one stays
        eq["placement"] = path

    def _rematch(self, rounds: int) -> dict[str, Any] | None:
        """Measure the best placement and the best measured heuristic's ``rounds`` more times each, the two in one
        batch each round, so they share the workers' conditions: the best placement's time is the least of many
        noisy measurements, the heuristic's a single one, so comparing those two favours the learner. None when
        there is nothing to compare (no heuristic measured, or the best placement is the heuristic's)."""
        s, name, rival = self.state, self.best_h[0], self.best_h_op_devices
        if not self.measured or rival is None or s.best_indices is None or not np.isfinite(self.best_h[1]):
            return None
        pair = np.stack([np.asarray(s.best_indices, dtype=np.int32), np.asarray(rival, dtype=np.int32)])
        if np.array_equal(pair[0], pair[1]):
            return None
        self.progress.phase(
            f"re-measuring the best placement and {name}'s side by side, {rounds} times each (--rematch 0 skips it)"
        )
        learned, heuristic = [], []
        for _ in range(rounds):
            t, failed = self.score.fresh(pair)
            learned.append(float("inf") if failed[0] else float(t[0]))
            heuristic.append(float("inf") if failed[1] else float(t[1]))
        return {
            "heuristic": name,
            "rounds": rounds,
            "learned_s": _median(learned),
            "heuristic_s": _median(heuristic),
            "learned_times_s": [t if np.isfinite(t) else None for t in learned],
            "heuristic_times_s": [t if np.isfinite(t) else None for t in heuristic],
        }

    def result(self, interrupted: bool) -> TrainResult:
        s = self.state
        best = self.best_placement() if s.best_indices is not None else None
        result = TrainResult(
            best_step_time_s=s.best_step_time_s,
            best_placement=best,
            iterations=s.iteration,
            elapsed_s=s.elapsed_s,
            time_to_best_s=s.time_to_best_s,
            logdir=self.logdir,
            heuristics=self.heuristics,
            measured_heuristics=self.measured,
            env=self.config.env,
            score_order=self.config.score_order,
            lower_bound_s=self.lower_bound_s,
            reference_step_time_s=self.t_ref,
            time_to_beat_heuristic_s=s.time_to_beat_heuristic_s,
            interrupted=interrupted,
            setup_s=s.setup_s,
            num_items=self.num_items if self.mover is not None else getattr(self.policy, "num_items", 0),
            warm_start=s.warm_start,
            warm_start_step_time_s=s.warm_start_step_time_s,
            warm_start_cut_short=s.warm_start_cut_short,
            policy_step_time_s=s.policy_step_time_s,
            found_by=s.best_found_by,
        )
        if self.config.equal_budget_search and self.config.env == "sim" and not interrupted:
            # every placement the run simulated: the heuristics' searches and scoring, the scorer's, and the
            # incumbents' schedules the move search read
            simulated = (
                self.heuristics_simulated
                + self.score.evaluated
                + (self.mover.search.schedules if self.mover is not None else 0)
            )
            limit = max(self.elapsed(), 1.0)  # never longer than the run itself
            self.progress.phase(
                f"equal budget: module_search given the {simulated:,} placements this run simulated "
                "(outside the budget; --no-equal-budget-search skips it)"
            )
            result.equal_budget_search = equal_budget_search(
                self.graph,
                self.cluster,
                self.sim,
                simulated,
                time_limit_s=limit,
                order=self.score.order,
                seed=self.config.seed,
            )
            if result.equal_budget_search is not None:
                result.equal_budget_search["heuristics_simulated"] = self.heuristics_simulated
                self._keep_rival(result.equal_budget_search)
        if self.config.env == "measured" and self.config.rematch and not interrupted:
            result.rematch = self._rematch(self.config.rematch)
        if best is not None:
            save_best(os.path.join(self.logdir, BEST_NAME), best)
        checkpoint.write_json(os.path.join(self.logdir, "summary.json"), result.to_dict())
        return result


def _median(times: list[float]) -> float | None:
    ok = [t for t in times if np.isfinite(t)]
    return float(np.median(ok)) if ok else None


def _ms(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x * 1e3:.3f} ms"
