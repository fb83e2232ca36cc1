"""``placer train --algo moves`` (the default): the move search with its learned critic as the run's learner.

One iteration is one round of :class:`placer.learn.move_search.MoveSearch`: a
batch of moves from the incumbent, ranked by the critic, simulated, the critic
trained on the outcome. The search starts from the best of the best heuristic's
placement (the run's warm start; no imitation: there is no policy to imitate
with) and what ``module_search`` finds before the first round, given the
search's ``module_share`` of the time left (a simulated run with a time budget
only); or, on ``--resume``, from the run's best placement (the critic starts
afresh: its weights and the search's memory are not in the checkpoint, which
holds the run's state only). Every placement it simulates goes through the
run's scorer (:class:`~placer.learn.session.RunScorer`), so the run keeps the
best one (``best_placement.json``) and knows which part of the search found it.

The features of a move read the simulator's schedule of the incumbent, so the
simulator is needed even when the scorer measures real steps (``--env
measured``): it describes the moves, the scorer judges them.

TensorBoard, per round: ``charts/best_step_time_s`` (the run's best, which the
curve ends at), ``charts/incumbent_step_time_s`` (where the search is now; above
the best after a kick), ``charts/device_share/<device>`` (the incumbent's ops
per device), the item level, kicks, placements simulated, and the hit rates of
the critic's and the uniform proposals. A round takes milliseconds, and writing its
dozen scalars took a fifth (nmt-2) to a third (inception-v3) of the search's time, so a round is logged when
:data:`LOG_EVERY_S` has passed since the last logged one, when it improved the
run's best, and when it is the last (:class:`RoundLog`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from placer.learn.config import TrainConfig
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.session import RunScorer, Session, add_scalars, device_share
from placer.learn.state import MOVE_SEARCH

#: The move search logs a round to TensorBoard at most this often (seconds), besides every round that improved the
#: run's best and the last: ten points a second per curve (TensorBoard shows 1,000 of a curve's points anyway).
LOG_EVERY_S = 0.1


class RoundLog:
    """Which of the move search's rounds are written to TensorBoard: the first, every one that improved the run's best,
    the last, and otherwise one every :data:`LOG_EVERY_S` seconds (``clock``: the seconds now)."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Any = time.perf_counter) -> None:
        self.every_s, self.clock = every_s, clock
        self.logged_at, self.logged_best = -float("inf"), float("inf")

    def due(self, best_s: float, last: bool) -> bool:
        """Whether the round just done is logged (``best_s``: the run's best after it; ``last``: the run ends)."""
        now = self.clock()
        if not (last or best_s < self.logged_best or now - self.logged_at >= self.every_s):
            return False
        self.logged_at, self.logged_best = now, best_s
        return True


def search_options(config: TrainConfig, homes: bool = False, blocks: bool = False) -> MoveSearchOptions:
    """The move search's options a run's config asks for: its proposals, the critic it starts from, fine-tuned or
    not; ``homes``: with home moves (the run's, :func:`placer.learn.run_scorers.home_codes`); ``blocks``: with
    checkpoint moves (the run's codes, :mod:`placer.learn.checkpoint_moves`)."""
    return MoveSearchOptions(
        proposals=config.proposals,
        critic=None if config.critic_used in (None, "fresh") else config.critic_used,
        fine_tune=config.fine_tune_critic,
        homes=homes,
        checkpoint_moves=blocks,
    )


def ranking_text(config: TrainConfig) -> str:
    """How a round's moves are chosen, for the progress line: by which critic, or uniformly.

    >>> ranking_text(TrainConfig(algo="moves"))
    'moves ranked by the pretrained critic (fine-tuned as it goes)'
    >>> ranking_text(TrainConfig(algo="moves", critic="fresh"))
    'moves ranked by a fresh critic (learned as it goes)'
    >>> ranking_text(TrainConfig(algo="moves", ranks=True))  # auto: the critic was pretrained in one process
    'moves ranked by a fresh critic (learned as it goes)'
    >>> ranking_text(TrainConfig(algo="moves", proposals="uniform"))
    'moves drawn uniformly (the levels in turn)'
    """
    if config.proposals == "uniform":
        return "moves drawn uniformly (the levels in turn)"
    critic = config.critic_used
    if critic == "fresh":
        return "moves ranked by a fresh critic (learned as it goes)"
    which = "the pretrained critic" if critic == "pretrained" else f"the critic {critic}"
    return f"moves ranked by {which} ({'fine-tuned as it goes' if config.fine_tune_critic else 'frozen'})"


def run_start(session: Session, resumed: bool, search: str) -> np.ndarray | None:
    """Where a ``search`` run starts: a resumed run from its best (its critic or correction is not in the checkpoint,
    its best is), else from the best heuristic (``--warm-start best``) or the search's own draws; records the warm
    start."""
    c, s, h = session.config, session.state, session.heuristics
    if resumed and s.best_indices:
        return np.asarray(s.best_indices)
    start = h.best_op_devices if c.warm_start == "best" else None
    if not resumed:
        s.warm_start = f"{search} from {h.best_name}" if start is not None else search
    return start


class MoveRunner:
    """``--algo moves``: the move search as the run's learner; :meth:`run` is the loop.

    ``saved``: the checkpoint's tensors (none are kept for the move search; an older checkpoint's policy is
    ignored), or None for a fresh run.
    """

    phase = "move search"

    def __init__(self, session: Session, saved: dict[str, Any] | None) -> None:
        c = session.config
        self.session, self.resumed = session, saved is not None
        self.search = MoveSearch(
            session.graph,
            session.cluster,
            RunScorer(session, MOVE_SEARCH),
            options=search_options(c, homes=session.homes_searched, blocks=session.block_moves),
            seed=c.seed,
            order=session.scorer.order,
        )
        self.start = run_start(session, self.resumed, "move search")

    @property
    def num_items(self) -> int:
        """The items of the search's finest level."""
        return self.search.levels[-1].num_items

    def tensors(self) -> dict[str, Any]:
        """Nothing: a resumed move search starts from the run's best (in the run's state) with the critic it started
        with (the pretrained one, or a fresh one), not the one it had fine-tuned."""
        return {}

    def run(self, writer: Any) -> None:
        """Until the budget is spent: one round of ranked moves -> log -> checkpoint (module_search first)."""
        session, c, s = self.session, self.session.config, self.session.state
        if not c.resume:
            session.save_checkpoint(self.tensors())  # resumable from here on
        levels = self.search.levels
        session.start_progress(
            self.phase, f"one round of {ranking_text(c)} ({levels[0].num_items} to {self.num_items} items)"
        )
        if session.done():
            return
        self._begin()
        if not self.search.has_moves:  # one device to place on (and no home moves): nothing to search
            session.progress.phase(
                f"move search: nothing to move, every op can only go on {session.devices[0]}; "
                f"the run keeps {session.best_text()}"
            )
            return
        log = RoundLog()
        while True:
            it = s.iteration
            # one round: a batch of moves from the incumbent, ranked, simulated (through the run's scorer), learned
            self.search.step()
            # checkpoint (when due)
            session.iteration_done(self.tensors)
            done = session.done()
            # log (when due)
            if log.due(s.best_step_time_s, last=done):
                add_scalars(writer, self._scalars(session), it)
            if done:
                return

    def _scalars(self, session: Session) -> dict[str, float]:
        """What a logged round writes to TensorBoard (see the module docstring)."""
        search = self.search
        ranked, uniform = search.tries[1], search.tries[0]
        return {
            "charts/best_step_time_s": session.state.best_step_time_s,
            "charts/incumbent_step_time_s": search.cost,
            "charts/level": search.level,
            "charts/kicks": search.kicks,
            "charts/simulated": search.budget.evals,
            "charts/module_search_simulated": search.module_evals,
            "losses/critic_hit_rate": search.hits[1] / ranked if ranked else 0.0,
            "losses/uniform_hit_rate": search.hits[0] / uniform if uniform else 0.0,
            **device_share(session.op_devices(search.op_devices), session.devices),
        }

    def _begin(self) -> None:
        """Score the search's start, after module_search's share of the time left where it has one."""
        session, c = self.session, self.session.config
        module_s = 0.0
        # module_search's share of the time left: under the simulator, with a time budget; not on --resume (the
        # run's best is the start), nor with measured steps (a round of module moves is measured whole); not
        # without module paths (nothing for it to search)
        timed = c.time_budget_s is not None and not self.resumed and c.env == "sim"
        if timed and any(level.name.startswith("modules ") for level in self.search.levels):
            share = self.search.options.module_share
            module_s = share * max(c.time_budget_s - session.elapsed(), 0.0)
            if module_s > 0:
                session.progress.phase(
                    f"move search: module_search first, for {module_s:.0f} s ({share:.0%} of the time left); the "
                    "moves start from the best of its placement and the warm start"
                )
        self.search.begin(self.start, time_budget_s=float("inf"), module_s=module_s)
