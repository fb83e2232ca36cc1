"""One training run's shared part, whichever learner runs it: set up, the best placement, checkpoints, the result.

A :class:`Session` sets the run up (the scorer and its cache, the reward scale,
the heuristics and the incumbent, the lower bound, the run's :class:`RunState`,
continued from a checkpoint on ``--resume``), and then serves the learner:
:meth:`Session.score` scores a batch and keeps its best in
``best_placement.json``, :meth:`Session.iteration_done` counts an iteration,
reports it and writes the checkpoint when due, :meth:`Session.result` is the
run's :class:`TrainResult`. :class:`RunScorer` lends the session's scoring to a
search as a scorer (:class:`envs.scorer.Scorer`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import numpy as np
import torch

import envs
from envs.cluster import Cluster
from envs.scorer import Scorer
from envs.sim.ranks import RankSim
from graphs import OpGraph
from graphs.plan import Placement
from placer.learn import checkpoint
from placer.learn.checkpoint_choice import CheckpointScorer
from placer.learn.checkpoint_moves import BlockCodes
from placer.learn.config import TrainConfig
from placer.learn.home_moves import HomeCodeScorer
from placer.learn.progress import Progress, ms
from placer.learn.run_heuristics import FSDP2_OFFLOAD, score_heuristics, with_offload_baselines
from placer.learn.run_scorers import CachedScorer, checkpointing_blocks, home_codes, rank_sim, reference_time
from placer.learn.rundir import BEST_NAME, adopt_newer_best, run_best_placement, save_best, save_pruned
from placer.learn.state import RunState, TrainResult


class Session:
    """One training run: what it works with, its :class:`RunState` (what the checkpoint keeps), its best placement.

    ``saved``: the run state of the checkpoint to continue (``checkpoint.json``'s document, checked), or None.
    The clock of the budget starts at :meth:`start_clock`, once the learner is built.
    """

    def __init__(
        self,
        config: TrainConfig,
        graph: OpGraph,
        cluster: Cluster,
        env: Scorer,
        logdir: str,
        device: torch.device,
        saved: dict[str, Any] | None,
        progress: Progress,
    ) -> None:
        self.config, self.graph, self.cluster, self.logdir, self.device = config, graph, cluster, logdir, device
        self.progress = progress
        self.side_by_side: dict[str, Any] | None = None  # the side-by-side that chose the run's best (adopt)
        self.devices = list(cluster.device_names)
        # with home moves (--homes), a placement is a code per op (placer.learn.home_moves): scored with its homes
        self.codes = home_codes(config, graph, cluster)
        if self.codes is not None and self.codes.has_homes:  # scored on the simulator (home moves need it)
            env.host_step = "backward" if config.host_step == "auto" else config.host_step  # --host-step
        # with --checkpointing, the move search's codes carry a bit per op that checkpoints its layer
        # (placer.learn.checkpoint_moves); a policy's placements checkpoint every layer they keep whole
        # (placer.learn.checkpoint_choice.CheckpointScorer)
        self.blocks = checkpointing_blocks(config, graph, self.codes is not None)
        self.block_moves = bool(self.blocks) and config.algo == "moves"
        if self.block_moves:
            self.codes = BlockCodes(graph, self.blocks, self.codes, cluster.num_devices)
        base = CheckpointScorer(env, graph, self.blocks) if self.blocks and not self.block_moves else env
        scoring = base if self.codes is None else HomeCodeScorer(base, self.codes)
        order = "planned" if config.score_order == "planned" else None
        self.scorer = CachedScorer(scoring, order, overflow=self.codes is not None)  # home or checkpoint moves
        # ---- reference times: the reward scale, the heuristics and the lower bound
        setup_start = time.perf_counter()
        scored_by = "the simulator" if config.env == "sim" else "real training steps"
        if config.ranks:
            scored_by += " across processes, one per device"
            if config.one_stage_per_rank:  # the simulator's side; real steps (--env measured) run any plan
                scored_by += ", one stage per rank (--looped allows more)"
        if self.homes_searched:
            scored_by += ", with home moves (layers on the GPU with their parameters on the host; --homes off: none)"
            scored_by += (
                ", stepped during the backward" if env.host_step == "backward" else ", stepped after the backward"
            )
        if self.block_moves:
            scored_by += (
                f", with checkpoint moves (each of {len(self.blocks)} layers' activations computed again in the"
                " backward, or not; --checkpointing off: none)"
            )
        elif self.blocks:
            scored_by += (
                f", its {len(self.blocks)} layers checkpointed where a placement keeps them whole (--checkpointing off:"
                " none)"
            )
        progress.phase(
            f"setting up: {graph.name or 'graph'} ({graph.num_ops:,} ops) on {cluster.name}, scored by {scored_by}"
        )
        self.t_ref = reference_time(self.scorer, graph, cluster, config.executor)
        self.heuristics = score_heuristics(graph, cluster, config, self.scorer, progress)
        if self.homes_searched:  # FSDP2's offload as a plan: the rival of a model that does not fit the GPUs
            self.heuristics = with_offload_baselines(self.heuristics, graph, cluster, self.codes, self.scorer)
            fsdp2 = self.heuristics.times.get(FSDP2_OFFLOAD)
            if fsdp2 is not None:
                progress.phase(
                    "FSDP2's offload as a plan (every op on the GPU, every parameter homed on the host, stepped as "
                    f"this run steps them): {ms(fsdp2)}; "
                    f"best heuristic: {self.heuristics.best_name} {ms(self.heuristics.best_step_time_s)}"
                )
        # the simulator of this problem (executor, microbatches): the lower bound, the move search's schedules, and
        # under --env sim the planner of the best placement's issue order; the scorer itself when it is one
        # (across processes, --ranks: the simulator of ranks, which has no planned order; its bound is that of ranks)
        self.sim: Any
        if config.ranks:
            self.sim = env if isinstance(env, RankSim) else rank_sim(config, graph, cluster)
        elif isinstance(env, envs.SimEnv):
            self.sim = env
        else:
            self.sim = envs.SimEnv(
                graph, cluster, executor=config.executor, microbatches=config.microbatches, inflight=config.inflight
            )
        self.planner = self.sim if config.env == "sim" and not config.ranks else None
        # at the run's M; across processes, of ranks; of plans whose homed parameters are stepped during the backward
        backward = self.homes_searched and env.host_step == "backward"
        bound = self.sim.lower_bound(host_step="backward") if backward else self.sim.lower_bound()
        self.lower_bound_s: float | None = float(bound)
        self.state = RunState(setup_s=time.perf_counter() - setup_start)
        if saved is not None:
            self.state = RunState.from_dict(saved["run"])
            adopt_newer_best(self.state, logdir, graph, self.devices, self.scorer, config, self.codes, self.blocks)
        # placements simulated in the run's earlier sessions (a resumed run), and in this one besides the heuristics'
        # and the scorer's: the simulator's schedules a search reads (the move search's incumbents)
        self.simulated_before, self.heuristics_simulated_before = self.state.simulated, self.state.heuristics_simulated
        self.schedules = 0
        self.measure: Callable[[], float] = lambda: 0.0  # how far the learner's phase has got (start_progress)
        self.start_clock()

    @property
    def homes_searched(self) -> bool:
        """Whether the run's codes name parameter homes (``--homes``)."""
        return self.codes is not None and self.codes.has_homes

    # ------------------------------------------------------------------ the budget
    def start_clock(self) -> None:
        """The budget's clock starts now (at the time the run had spent before, on --resume)."""
        self.t0 = time.perf_counter() - self.state.elapsed_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def done(self) -> bool:
        c = self.config
        return (c.iterations is not None and self.state.iteration >= c.iterations) or (
            c.time_budget_s is not None and self.elapsed() >= c.time_budget_s
        )

    def simulated(self) -> int:
        """Placements the whole run has simulated: earlier sessions', the heuristics', the scorer's, schedules."""
        return self.simulated_before + self.heuristics.simulated + self.scorer.evaluated + self.schedules

    def heuristics_simulated(self) -> int:
        """Of :meth:`simulated`, the heuristics' (their searches and scoring), in every session of the run."""
        return self.heuristics_simulated_before + self.heuristics.simulated

    # ------------------------------------------------------------------ the start
    def begin(self, writer: Any, num_items: int) -> None:
        """Log the hyperparameters (a fresh run); the best heuristic's placement as the incumbent."""
        c, s, h = self.config, self.state, self.heuristics
        if not c.resume:
            extra = {
                "graph": self.graph.name,
                "num_ops": self.graph.num_ops,
                "items": num_items,
                "devices": ",".join(self.devices),
                "reference_step_time_s": self.t_ref,
                "device": str(self.device),
                "best_heuristic": f"{h.best_name} {h.best_step_time_s}",
                "setup_s": s.setup_s,
            }
            params = {**dataclasses.asdict(c), **extra}
            table = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in params.items())
            writer.add_text("hyperparameters", table)
        if h.best_op_devices is not None and h.time_to_beat_s is not None:
            # the incumbent: best_placement.json is never slower than the best placement scored, heuristics included
            # (a measured run's heuristics count when it measured them: their simulated times say nothing here)
            self.score(np.asarray(h.best_op_devices, dtype=np.int32)[None], f"heuristic:{h.best_name}")

    def start_progress(self, phase: str, iteration: str) -> None:
        """Start the learner's progress (what is left of the budget); ``iteration``: what one iteration does."""
        c, s = self.config, self.state
        if c.iterations is not None:
            first = s.iteration
            self.progress.phase(
                f"{phase}: {c.iterations - first} iterations of {iteration}; best so far {self.best_text()}"
            )
            self.progress.start(phase, total=c.iterations - first, unit="it")
            self.measure = lambda: s.iteration - first
            return
        begun = self.elapsed()
        left_s = int(np.ceil(max(float(c.time_budget_s) - begun, 0.0)))
        self.progress.phase(
            f"{phase}: {left_s} s left of the {c.time_budget_s:g} s budget, {iteration} an iteration; "
            f"best so far {self.best_text()}"
        )
        self.progress.start(phase, total=left_s, unit="s")
        self.measure = lambda: self.elapsed() - begun

    # ------------------------------------------------------------------ each iteration
    def score(self, op_devices: np.ndarray, found_by: str) -> tuple[np.ndarray, np.ndarray]:
        """``(step_time_s, failed)`` of a batch ``[K, num_ops]``; its best is kept as found by ``found_by``."""
        return self.score_overflow(op_devices, found_by)[:2]

    def score_overflow(self, op_devices: np.ndarray, found_by: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`score`, with how far over capacity each placement is (``CachedScorer.scored``)."""
        step_time_s, failed, over = self.scorer.scored(op_devices)
        self.keep_best(np.asarray(op_devices), step_time_s, failed, found_by)
        return step_time_s, failed, over

    def keep_best(self, op_devices: np.ndarray, step_time_s: np.ndarray, failed: np.ndarray, found_by: str) -> None:
        """Keep the best successful placement; rewrite best_placement.json when it improves."""
        ok = np.flatnonzero(~failed & np.isfinite(step_time_s))
        if not len(ok):
            return
        j = ok[np.argmin(step_time_s[ok])]
        s, batch_best_s = self.state, float(step_time_s[j])
        if not found_by.startswith("heuristic:"):  # the learner's own best, apart from the incumbent
            s.policy_step_time_s = min(s.policy_step_time_s, batch_best_s)
            beat = self.heuristics.time_to_beat_s
            if s.time_to_beat_heuristic_s is None and beat is not None and batch_best_s <= beat:
                s.time_to_beat_heuristic_s = self.elapsed()
        if batch_best_s < s.best_step_time_s:
            s.best_step_time_s, s.best_indices, s.best_found_by = batch_best_s, op_devices[j].tolist(), found_by
            s.best_iteration, s.time_to_best_s = s.iteration, self.elapsed()
            save_best(os.path.join(self.logdir, BEST_NAME), self.best_placement())

    def adopt(self, op_devices: np.ndarray, step_time_s: float, found_by: str, evidence: dict[str, Any]) -> None:
        """Make ``op_devices`` the run's best at ``step_time_s``: the winner of a side-by-side re-measurement
        (``evidence``: what it measured), judged by its median where the best so far was judged by its fastest
        measurement, which is biased low (the winner's curse). :meth:`finish` writes it over best_placement.json
        though that file records a lower time (the lucky one). Where the winner is the best so far, only its time
        (and ``found_by``) changes: it keeps the iteration that found it. Each side-by-side's evidence is kept
        (``--algo corrected``'s own, then the run's against the best heuristic)."""
        s = self.state
        indices = np.asarray(op_devices).astype(int).tolist()
        if indices != s.best_indices:
            s.best_indices, s.best_iteration = indices, s.iteration
        s.best_step_time_s, s.best_found_by = float(step_time_s), found_by
        self.side_by_side = {**(self.side_by_side or {}), **evidence}  # the loop's own, then the run's

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        """The simulator's schedule of a placement (a search reads it), counted as a placement simulated."""
        self.schedules += 1
        return self.sim.schedule(self.op_devices(op_devices), order)

    def op_devices(self, placements: np.ndarray) -> np.ndarray:
        """The device of each op of ``placements`` (codes, with home moves: their homes dropped)."""
        return placements if self.codes is None else self.codes.decode(placements)[0].astype(np.int32)

    def iteration_done(self, tensors: Callable[[], dict[str, Any]]) -> None:
        """Count the iteration, show it, and write the checkpoint (``tensors()``: the learner's) when it is due."""
        s = self.state
        s.iteration += 1
        self.progress.update(self.measure(), self.status())
        if s.iteration % self.config.checkpoint_every == 0:
            self.save_checkpoint(tensors())

    def best_text(self) -> str:
        """The incumbent's step time and where it came from, e.g. ``237.345 ms (module_search)``."""
        by = self.state.best_found_by
        if by.startswith("heuristic:"):
            by = by.removeprefix("heuristic:")
        elif by in ("sample", "greedy", ""):
            by = "policy"
        return f"{ms(self.state.best_step_time_s)} ({by})" if np.isfinite(self.state.best_step_time_s) else "none yet"

    def status(self) -> str:
        """What the learner's progress shows beside its count."""
        return f"iteration {self.state.iteration}, best {self.best_text()}"

    # ------------------------------------------------------------------ what the run keeps
    def best_placement(self, prune: bool = False) -> Placement:
        """The run's best as a file; ``prune`` (the run's end): its checkpointed layers that do not pay turned off,
        each variant a placement simulated (:func:`placer.learn.rundir.run_placement`)."""
        evals = (len(self.blocks) + 1) * len(self.blocks) if prune else 0
        placement = run_best_placement(
            self.graph,
            self.devices,
            self.cluster,
            self.config,
            self.state,
            self.planner,
            self.codes,
            self.blocks,
            evals,
        )
        self.schedules += placement.meta.get("checkpoint_pruned", {}).get("evals", 0)
        return placement

    def save_checkpoint(self, tensors: dict[str, Any]) -> None:
        """The learner's ``tensors`` and the run's state, atomically (:mod:`placer.learn.checkpoint`)."""
        s = self.state
        s.elapsed_s = self.elapsed()
        s.simulated = self.simulated()
        s.heuristics_simulated = self.heuristics_simulated()
        doc = {
            "config": dataclasses.asdict(self.config),
            "graph_hash": self.graph.content_hash,
            "devices": self.devices,
            "run": s.to_dict(),
        }
        checkpoint.save(self.logdir, tensors, doc)

    def result(self, interrupted: bool, num_items: int) -> TrainResult:
        """The run's result, the comparisons after the budget aside (:mod:`placer.learn.comparisons`)."""
        s, h = self.state, self.heuristics
        return TrainResult(
            best_step_time_s=s.best_step_time_s,
            best_placement=self.best_placement(prune=True) if s.best_indices is not None else None,
            iterations=s.iteration,
            elapsed_s=s.elapsed_s,
            time_to_best_s=s.time_to_best_s,
            logdir=self.logdir,
            heuristics=h.times,
            measured_heuristics=h.measured,
            env=self.config.env,
            score_order=self.config.score_order,
            lower_bound_s=self.lower_bound_s,
            reference_step_time_s=self.t_ref,
            time_to_beat_heuristic_s=s.time_to_beat_heuristic_s,
            interrupted=interrupted,
            setup_s=s.setup_s,
            num_items=num_items,
            warm_start=s.warm_start,
            warm_start_step_time_s=s.warm_start_step_time_s,
            warm_start_cut_short=s.warm_start_cut_short,
            policy_step_time_s=s.policy_step_time_s,
            found_by=s.best_found_by,
            homes_searched=self.homes_searched,
            checkpointing_searched=bool(self.blocks),
            critic=self.config.critic_used,
        )

    def finish(self, result: TrainResult) -> None:
        """Write the run's best placement (never over a faster one, unless a side-by-side chose it: :meth:`adopt`)
        and ``summary.json``."""
        if result.best_placement is not None:
            path = os.path.join(self.logdir, BEST_NAME)
            if self.side_by_side is not None:
                result.best_placement.meta["side_by_side"] = self.side_by_side
                result.best_placement.save(path)
            elif not save_best(path, result.best_placement) and "checkpoint_pruned" in result.best_placement.meta:
                save_pruned(path, result.best_placement)
        checkpoint.write_json(os.path.join(self.logdir, "summary.json"), result.to_dict())


class RunScorer:
    """The session's scoring as a scorer (:class:`envs.scorer.Scorer`) for a search.

    Every batch is scored through the session (cached, in the run's order, its best
    kept as found by ``source``, which the search may change while it scores), and
    the simulator's schedules of the search's placements are counted as simulated.
    """

    def __init__(self, session: Session, source: str) -> None:
        self.session, self.source = session, source
        if session.scorer.overflows:  # a search asks how far over capacity (envs.scorer.can_overflow) only then
            self.overflow = self._overflow

    @property
    def home_codes(self) -> Any:
        """The run's home codes (:mod:`placer.learn.home_moves`): this scorer scores codes; None: op devices."""
        return self.session.codes

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        return self.session.score(np.asarray(op_devices, dtype=np.int32), self.source)  # in the run's score order

    def _overflow(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.session.score_overflow(np.asarray(op_devices, dtype=np.int32), self.source)

    def schedule(self, op_devices: np.ndarray, order: Any = None) -> Any:
        return self.session.schedule(op_devices, order)

    def schedule_order(self, op_devices: np.ndarray) -> np.ndarray:
        return self.session.sim.schedule_order(self.session.op_devices(op_devices))


def device_share(op_devices: np.ndarray, devices: list[str]) -> dict[str, float]:
    """``charts/device_share/<device>``: the share of the ops of ``op_devices`` (one or a batch) on each device."""
    share = np.bincount(np.ravel(op_devices), minlength=len(devices)) / np.size(op_devices)
    return {f"charts/device_share/{device}": float(share[d]) for d, device in enumerate(devices)}


def add_scalars(writer: Any, scalars: dict[str, float], step: int) -> None:
    for tag, value in scalars.items():
        writer.add_scalar(tag, float(value), step)
