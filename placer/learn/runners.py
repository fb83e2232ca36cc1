"""``placer train`` (``train(config)``): the learner's runner, picked by name, in a locked run directory.

The walk of a run, down and back once: resolve the graph, cluster and scorer,
lock ``--logdir`` (and read the checkpoint on ``--resume``); set the run up
(:class:`~placer.learn.session.Session`: the scorer, the heuristics, the
incumbent); build the learner's runner from :data:`RUNNERS` and run it until the
budget is spent; then the comparisons after the budget
(:mod:`placer.learn.comparisons`); write ``best_placement.json`` and
``summary.json``; return the :class:`~placer.learn.state.TrainResult`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Protocol

from torch.utils import tensorboard

import envs
from envs.cluster import Cluster
from envs.real.profiler import with_profile
from envs.scorer import Scorer
from graphs import OpGraph, PlacerError
from graphs.sources import resolve_graph
from placer.learn import checkpoint
from placer.learn.checkpoint import write_json
from placer.learn.comparisons import compare_after_learning
from placer.learn.config import TrainConfig
from placer.learn.corrected_runner import CorrectedRunner
from placer.learn.loop import PolicyGradient, resolve_device
from placer.learn.move_runner import MoveRunner
from placer.learn.progress import Progress
from placer.learn.run_scorers import ENVS, checkpointing_blocks, home_codes
from placer.learn.rundir import check_compatible, check_fresh, default_logdir, run_lock
from placer.learn.session import Session
from placer.learn.shapes import SHAPES_JSON, choose_shape, with_shape
from placer.learn.state import TrainResult
from placer.option_checks import check_output_dir


class Runner(Protocol):
    """A learner of ``placer train``: built on the run's session (and the checkpoint's tensors on ``--resume``),
    it learns until the session's budget is spent, keeping every placement it scores through the session."""

    phase: str
    """its name in progress lines ("move search", "RL")."""

    def __init__(self, session: Session, saved: dict[str, Any] | None) -> None: ...

    @property
    def num_items(self) -> int:
        """the items it places (the policy's, the move search's finest level)."""
        ...

    def run(self, writer: Any) -> None:
        """Learn until the budget is spent, logging to ``writer`` (TensorBoard) and checkpointing as it goes."""
        ...

    def tensors(self) -> dict[str, Any]:
        """What a checkpoint keeps of the learner."""
        ...


#: ``--algo`` -> its runner.
RUNNERS: dict[str, type[Runner]] = {
    "moves": MoveRunner,
    "reinforce": PolicyGradient,
    "ppo": PolicyGradient,
    "corrected": CorrectedRunner,
}


def train(
    config: TrainConfig,
    *,
    graph: OpGraph | None = None,
    cluster: Cluster | None = None,
    env: Scorer | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Learn a placement; see :class:`TrainConfig`. Returns the best placement found.

    ``graph``, ``cluster`` and ``env`` may be given directly (tests, notebooks);
    otherwise they are resolved from ``config.source`` / ``config.cluster`` / ``config.env``.
    ``progress``: where the run reports its phases (default: stderr, unless ``config.progress`` is off).
    """
    progress = progress if progress is not None else Progress(enabled=config.progress)
    # ---- validate and resolve
    config.validate()
    if config.algo == "corrected" and env is None and config.env == "sim":  # before the heuristics are scored
        raise PlacerError("--algo corrected: needs real measurements (--env measured); the simulator has no error")
    auto_order = config.score_order == "auto"
    config = config.resolved(env)
    device = resolve_device(config.device)
    if graph is None:
        graph = resolve_graph(config.source)
    if cluster is None:
        cluster = envs.resolve_cluster(config.cluster)
        if config.profile:
            graph, cluster = with_profile(
                graph, cluster, config.profile, device_map=config.device_map, ranks=config.ranks
            )
    if graph.num_ops == 0:
        raise PlacerError(
            f"{config.source or graph.name or 'graph'}: the graph has no ops, so there is nothing to place"
        )
    if (
        auto_order
        and config.score_order == "planned"
        and checkpointing_blocks(config, graph, home_codes(config, graph, cluster) is not None)
    ):
        # a planned issue order interleaves a layer's ops with others', and a layer so issued cannot be checkpointed:
        # a run that checkpoints layers scores (and ships) node order
        config = dataclasses.replace(config, score_order="node")
    logdir = config.logdir or default_logdir(config, graph)
    check_output_dir(logdir, "--logdir")
    os.makedirs(logdir, exist_ok=True)
    with run_lock(logdir):
        tensors, state = None, None  # the checkpoint's, on --resume
        chosen = 0  # placements the shape choice simulated
        if not config.resume:
            check_fresh(logdir)
            if config.choose_shape:  # before the scorer is built: a measured job of ranks runs the run's shape
                choice = choose_shape(graph, cluster, config, progress)
                write_json(os.path.join(logdir, SHAPES_JSON), choice.to_dict())
                config, chosen = with_shape(config, choice), choice.simulated
        else:  # before anything is built on it: a checkpoint of another graph is a user error
            if not checkpoint.exists(logdir):
                raise PlacerError(f"--resume: {logdir} has no {checkpoint.CHECKPOINT_PT}")
            tensors, state = checkpoint.load(logdir, map_location=device)
            check_compatible(state, config, graph, list(cluster.device_names), logdir)
        owns_env = env is None
        env = env if env is not None else ENVS[config.env](config, graph, cluster, logdir)  # checked by validate()
        try:
            session = Session(config, graph, cluster, env, logdir, device, state, progress)
            # the shape choice's placements, counted with the heuristics' (so the equal budget has them too)
            session.simulated_before += chosen
            session.heuristics_simulated_before += chosen
            return _learn(session, tensors)
        finally:
            if owns_env and hasattr(env, "close"):
                env.close()


def _learn(session: Session, saved: dict[str, Any] | None) -> TrainResult:
    """Run the learner in a set-up session (``saved``: the checkpoint's tensors), then the comparisons after it."""
    runner = RUNNERS[session.config.algo](session, saved)
    session.start_clock()
    writer = tensorboard.SummaryWriter(session.logdir)
    interrupted = False
    try:
        session.begin(writer, runner.num_items)
        runner.run(writer)
        session.progress.update(float("inf"), session.status())  # done: the budget is spent (its last second too)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        session.progress.close()
        writer.close()
    session.save_checkpoint(runner.tensors())
    result = session.result(interrupted, runner.num_items)
    if not interrupted:
        compare_after_learning(session, result)
    session.finish(result)
    return result
