"""Move search with a learned critic: local search whose moves a network ranks before they are simulated.

The loop, in the spirit of CleanRL, reads top to bottom in :meth:`MoveSearch.run`:
from the incumbent placement, describe every move of the current item level
(:class:`policies.moves.MoveFeatures`), rank them by the critic's predicted change
of the step time, simulate a batch of the best-ranked ones (and a few drawn
uniformly, to keep the critic's data honest), train the critic on what the
simulator returned, and take the best move if it is faster. The first pass over
the levels is a variable neighbourhood descent: a level on which ``patience``
batches in a row found nothing (or whose every move has been tried) hands over to
the next finer one. From then on the levels are learned too: each round's level is
drawn by Thompson sampling of the levels' hit rates (the share of a level's moves
that were faster, forgetting 1 % a round), so the rounds go where moves pay; on a
graph of 1,500 ops the ops level's moves paid and the coarse levels' did not, and a
cycle spent most of its budget handing over (BENCHMARKS.md, "Levels chosen by their
hit rates"). Where a batch holds faster moves of two or more items, the incumbent
with all of them is simulated too and taken if it is faster still. When nothing
has been faster for ``patience`` rounds per level, the best placement is kicked (a
few random moves of single ops) and the descent starts again from there (iterated
local search).

The start: the best of the given placement, a few uniform draws of a device per
coarse item and, first, :func:`module_search` given ``module_share`` of the
budget. A descent finds better placements inside its start's basin than the
restarts of ``module_search`` do, and those restarts find better basins than
one start does (BENCHMARKS.md, "Eight seeds, and a share of the budget for module_search").
Where a start is out of memory by at most :data:`NEAR_FIT` and costs less than the best
that fits (:func:`placer.learn.search_budget.oom_costs`: a plan out of memory costs more the
further over it is), the descent begins there: at a tight GPU the best plan that fits among
the starts may be everything on the host, and the plans that fit on the GPU lie a few moves
from the one just over it (BENCHMARKS.md, "Homes inside checkpointed layers").

``proposals="uniform"`` is the ablation: the same loop, every batch drawn
uniformly among the untried moves, the critic never consulted, and the levels in
turn throughout. The gain of ``"critic"`` over it, at the same budget from the same
start, is what the search learned (BENCHMARKS.md, "The learner against search at
equal budget"); ``levels`` takes the two halves apart.

``homes=True`` adds *home moves* (:mod:`placer.learn.home_moves`): each item level gets a twin
whose moves send an item to a GPU with its parameters, gradient and Adam state homed
on the host (or bring them back onto its GPU), and the start competes with everything
on the first GPU, homed; the twins' moves are drawn uniformly and the critic neither
ranks nor learns from them. Where the descent begins elsewhere, the first kick is instead a
restart from the homed start (the faster of it and it with every block on, if it fits or nearly
does): on the 1.54 B llama of the offload scenario at 24 GiB, module_search's plan (the
embedding on the host) is a basin no single move leaves, 2.5x slower than the plans the homed
start's descent finds. With home or checkpoint moves, the descent after each kick first runs
under a soft memory penalty, then the hard one (``oscillate``, strategic oscillation): a state
moved to the GPU while a little is homed to make room is two moves, the first out of memory.
Off by default.

``checkpoint_moves=True`` (with ``checkpoint``, the candidate layers) adds *checkpoint moves*
(:mod:`placer.learn.checkpoint_moves`): one more level whose moves turn one layer's activation
checkpointing on or off, drawn uniformly like the home moves, visited first; the other moves keep
each op's choice, and every other kick turns every layer on (the level is then visited last, after
the placement has adapted to the memory freed). Without it, ``checkpoint`` checkpoints every
candidate in every placement that keeps it whole
(:class:`placer.learn.checkpoint_choice.CheckpointScorer`).

Every placement simulated counts against ``max_evals`` (the start's draws, the
moves, the kicks); ``time_budget_s`` stops the run between batches
(:mod:`placer.learn.search_budget`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from envs.cluster import Cluster
from graphs import OpGraph, PlacerError
from graphs.grouping import vote
from placer.learn.checkpoint_choice import CheckpointScorer
from placer.learn.checkpoint_moves import BlockCodes
from placer.learn.home_moves import HomeCodes, HomeCodeScorer
from placer.learn.search_budget import (
    OOM_FACTOR,
    BudgetScorer,
    BudgetSpent,
    SearchBudget,
    SearchCurve,
    oom_costs,
    soft_costs,
)
from placer.learn.state import MODULE_SHARE
from placer.methods.heuristics.costs import candidate_devices
from placer.methods.heuristics.module_search import module_search
from placer.methods.registry import HeuristicUnavailable
from policies.moves import (
    NUM_FEATURES,
    CriticFit,
    ItemLevel,
    MoveCritic,
    MoveFeatures,
    MoveMemory,
    item_levels,
)
from policies.policy_file import load_critic

ProposalName = Literal["critic", "uniform"]
#: A start out of memory by at most this factor (its peak / the memory) may be where the descent begins (``_start``).
NEAR_FIT = 1.25
PROPOSALS = ("critic", "uniform")
#: How a kick picks what it moves (``MoveSearchOptions.kicks``).
KICKS = ("uniform", "policy")
#: Where a kick moves its items (``MoveSearchOptions.kick_at``).
KICK_LEVELS = ("ops", "coarse")
#: A coarse kick's level has at most this many items.
COARSE_ITEMS = 64
#: How each round's level is chosen (``MoveSearchOptions.levels``).
LEVEL_CHOICES = ("learned", "cycle")
#: Per round, the weight each level's earlier hits and misses keep (the Thompson draw follows the last ~100 rounds).
LEVEL_DECAY = 0.99
#: The least weight of a level's hits, and of its misses, in its Beta posterior (a level left alone for long is
#: uncertain again, so it is drawn now and then).
LEVEL_PRIOR = 0.5
#: ``MoveSearchOptions.critic`` naming the critic shipped with placer (:data:`policies.policy_file.DEFAULT_CRITIC`).
PRETRAINED = "pretrained"
#: module_search's share of a budget of placements is spent only when it comes to at least this many: at 1k
#: placements its 200 cost the descent more than its few restarts found (nmt-2, nmt-4, inception-v3 at 1k).
MODULE_MIN_EVALS = 1000
#: Kicks drawn before the search gives up kicking and goes on from the best placement (a scorer may refuse them).
KICK_TRIES = 4
#: The change recorded for a move the scorer refuses (an infinite step): as bad as running out of memory.
REFUSED_CHANGE = OOM_FACTOR - 1.0


def top_ranked(scores: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` highest scores, highest first, ties in position order: ``np.argsort(-scores,
    kind="stable")[:k]`` without sorting them all (a round ranks every move of a level, thousands on a large graph,
    to simulate a few).

    >>> top_ranked(np.array([0.1, 0.9, 0.5, 0.9, 0.2, 0.0, 0.3, 0.4, 0.6, 0.7], dtype=np.float32), 3).tolist()
    [1, 3, 9]
    """
    n = len(scores)
    if k >= n // 8:  # few enough to sort them all
        return np.argsort(-scores, kind="stable")[:k]
    neg = -scores
    kth = np.partition(neg, k - 1)[k - 1]
    within = np.flatnonzero(neg <= kth)  # every score at least the k-th highest, in position order
    if len(within) < k:  # NaN among the first k (sorted last, as argsort does)
        return np.argsort(neg, kind="stable")[:k]
    return within[np.argsort(neg[within], kind="stable")[:k]]


def relative_change(costs: np.ndarray, cost: float) -> np.ndarray:
    """``(costs - cost) / cost``, kept finite where the scorer refused a placement (an infinite step).

    A refused move from a finite incumbent is :data:`REFUSED_CHANGE`; any move that the scorer accepts from a refused
    incumbent is -1 (the whole step saved); one refused placement after another is no change. The move memory and
    the critic's features take these, and a NaN or an infinity there would spread to the critic's weights.

    >>> relative_change(np.array([1.5, np.inf]), 2.0).tolist()
    [-0.25, 9.0]
    >>> relative_change(np.array([1.5, np.inf]), np.inf).tolist()
    [-1.0, 0.0]
    """
    costs = np.asarray(costs, dtype=np.float64)
    if not np.isfinite(cost):
        return np.where(np.isfinite(costs), -1.0, 0.0)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(costs), (costs - cost) / cost, REFUSED_CHANGE)


@dataclass
class MoveSearchOptions:
    """The move search's settings (tuned on nmt-2 and inception-v3 on k80x4; BENCHMARKS.md)."""

    proposals: ProposalName = "critic"
    """"critic": moves ranked by the learned critic; "uniform": drawn uniformly (the ablation)."""
    batch: int = 4
    """moves simulated per round. Small, so that the critic's ranking decides which moves are tried: at 16 the
    descent tried most of a level's good moves whichever proposer drew them, and the critic made no difference
    (BENCHMARKS.md, "A smaller batch: the critic's ranking counts")."""
    explore: float = 0.25
    """share of each batch drawn uniformly among the untried moves (critic only)."""
    adaptive: bool = False
    """each round, Thompson sampling between the critic's ranking and uniform draws, from their hit rates so far:
    a round whose draw favours uniform draws its whole batch uniformly (critic only). Off by default: on the tuning
    cells (k80x4, 4 seeds at 10k) it was no better (inception-v3 316.1 against 316.1 ms, nmt-2 203.6 against 200.8);
    on nmt-2 / v100x4, where the critic hurts, 67.9 against 68.4 (uniform 68.0). BENCHMARKS.md, "Adaptive rounds"."""
    patience: int = 6
    """rounds in a row without a faster move before a level hands over to the next (the levels in turn), and, times
    the number of levels, before the best is kicked (learned levels)."""
    starts: int = 16
    """uniform draws at the coarsest level that compete with the given start."""
    kick: int = 3
    """items moved at random when every level is at a local optimum (at the level ``kick_at`` names)."""
    kick_at: str | None = None
    """the level a kick's items are drawn from: "ops", the finest level (single ops, or the ops colocated with
    them), or "coarse", a random level of at most :data:`COARSE_ITEMS` items. None: "ops" for a search of item levels
    with uniform kicks; "coarse" with policy kicks or home or checkpoint moves (what those were measured with). On a
    graph of 1,500 ops a coarse kick moves up to three eighths of it, and the descent spends most of its budget
    repairing that; the kicks of single ops let it go on where it was. Chosen on moe-1500-0 at 10k (0.963x the coarse
    kicks in node order, 4 seeds; in planned order every plan there is equal); 1.013x on recurrent-1500-0, whose big
    gains are coarse moves; 0.993-0.998x on the held-out graphs at 10k (BENCHMARKS.md, "Kicks of single ops, and
    faster moves combined")."""
    hidden: int = 64
    """units of the critic's two hidden layers."""
    lr: float = 2e-3
    """Adam learning rate of the critic."""
    train_steps: int = 1
    """critic updates per round, each on ``train_batch`` moves drawn from the last 32,768 simulated."""
    train_batch: int = 128
    """moves per critic update (2 updates of 256 took twice the time for no better placements on nmt-2 and
    inception-v3, 6 seeds at 1k and 10k placements)."""
    module_share: float = 0.2
    """share of the budget (placements, else seconds) spent first on :func:`module_search` (uniform draws per module,
    descents over whole modules); the move search then starts from the best of its placement and the given start.
    0: none; nor when the share of a budget of placements is under :data:`MODULE_MIN_EVALS`. Chosen among 0, 0.2 and
    0.5 on nmt-2 / k80x4 (10k placements, 8 seeds: 203.1, 199.7, 200.3 ms), nmt-2 / v100x4 and nmt-4 / k80x4
    (BENCHMARKS.md, "Eight seeds, and a share of the budget for module_search")."""
    critic: str | None = None
    """the critic to start from: a critic file (:func:`policies.policy_file.load_critic`), ``"pretrained"`` for the
    one shipped with placer (pretrained across graphs: ranks moves from the first round), or None: a fresh,
    untrained critic that ranks once it has seen a round."""
    fine_tune: bool = True
    """train the critic on the moves simulated (False: it ranks as it started; with a pretrained critic, the
    ablation that shows what the online training adds)."""
    accept: float = 0.0
    """temperature, relative to the incumbent's step time, at which the best move of a batch that found nothing
    faster is taken anyway (Metropolis: with probability exp(-slowdown / temperature)), cooled linearly to 0 over
    the budget (placements, else seconds); 0 (default): never, a pure descent. Off by default: tried on moe-400
    (k80x4) only so far (BENCHMARKS.md, "Accepting slower moves")."""
    homes: bool = False
    """home moves too: items sent to a GPU with their parameters homed on the host (the module docstring); needs the
    simulator as scorer and a host device."""
    checkpoint: list[str] | None = None
    """blocks (module paths) checkpointed in every placement that keeps them whole on one device
    (:class:`placer.learn.checkpoint_choice.CheckpointScorer`); needs the simulator as scorer. None: none."""
    kicks: str = "uniform"
    """how a kick picks what it moves: "uniform" (``kick`` random items of a random coarse level to random devices) or
    "policy", expert iteration (Anthony et al. 2017): the local optima the descents found (the search's finds, the
    ``elite`` fastest) train a policy network (:class:`policies.gnn.GNNPolicy`, independent decoder) by imitation,
    and a kick moves the items where a draw of that policy puts them elsewhere than the best placement does, to the
    devices drawn (up to ``kick`` of them, the rest drawn uniformly: a kick moves as many items either way). The
    network reads what ops are (kind, sizes, neighbours), not which op each is, so it learns the devices the optima
    give each kind of op more than each op's own. Ops only (not with home or checkpoint moves). Off by default: 0.978x
    the uniform kicks on branches-1500-0 (8 seeds), 0.997-1.004x on four other cells (BENCHMARKS.md, "Expert
    iteration")."""
    elite: int = 8
    """local optima the policy imitates (``kicks="policy"``): the fastest distinct ones."""
    policy_steps: int = 10
    """Adam steps of imitation before each policy kick (the policy carries over from kick to kick)."""
    policy_lr: float = 1e-2
    """Adam learning rate of the kicks' policy."""
    levels: str | None = None
    """which item level each round's moves come from: "learned" (after a first pass over every level in turn, each
    round draws the level by Thompson sampling of the levels' hit rates, the share of their moves simulated that were
    faster, discounted by :data:`LEVEL_DECAY` a round; the best is kicked after ``patience`` rounds per level without
    a faster move), or "cycle" (variable neighbourhood descent: a level hands over to the next after ``patience``
    rounds without one, and the best is kicked when every level has). None: "learned" with the critic's proposals,
    "cycle" with uniform ones, so that the uniform ablation learns nothing. Learned levels are for item levels only:
    with home or checkpoint moves the levels cycle. Chosen on nmt-2, inception-v3 and the recurrent family at 1k
    placements (where a choice of levels from the start, with no first pass, lost 7-9 % on recurrent-1500);
    BENCHMARKS.md, "Levels chosen by their hit rates"."""
    combine: bool = True
    """where a round's batch has faster moves of two or more items, simulate the incumbent with all of them too (the
    fastest move of each item; one more placement) and take it if it beats the fastest single move (item levels only,
    either proposals). With batches of 4 this happened 2-54 times in 1k placements on the held-out graphs (most on
    the 1,500-op ones), and the combination was taken 92 % of the times it was tried; alone, 0.9956x on inception-v3
    and 1.000x on nmt-2 at 1k (8 seeds; BENCHMARKS.md, "Kicks of single ops, and faster moves combined")."""
    oscillate: float = 4.0
    """with home or checkpoint moves, the descent after each kick first runs under a soft memory penalty, then the
    hard one (strategic oscillation, Glover): a plan out of memory costs its step time times ``1 + oscillate *
    (over - 1)``, ``over`` its peak / the memory (:func:`placer.learn.search_budget.soft_costs`), where it would
    cost ``OOM_FACTOR * over`` times. So the soft descent crosses plans a few percent over the memory toward faster
    ones, and when it finds nothing faster the hard descent goes on from its incumbent and brings it back within
    the memory. What one move at a time cannot do: a large state moved to the GPU and a little homed to make room
    (on the 3 B model of the offload scenario at 16 GiB, the embedding's state on the host and the head's on the GPU,
    then layers homed: 0.828 s against 0.917 s, median of 9 seeds at 20,000 placements; BENCHMARKS.md, "Crossing
    the memory limit"). 0: off, every descent hard. Only where the scorer says how far over a plan is: the
    simulator, and a run's scorer with home or checkpoint moves (``placer train --homes``, ``CachedScorer``'s
    ``overflow``)."""
    checkpoint_moves: bool = False
    """``checkpoint``'s blocks chosen by moves instead (:mod:`placer.learn.checkpoint_moves`; the module docstring):
    each placement checkpoints the blocks its codes turn on; the search starts with none on (and tries all on)."""


@dataclass
class MoveSearchResult:
    op_devices: np.ndarray
    step_time_s: float
    oom: bool
    evals: int
    elapsed_s: float
    curve: SearchCurve
    rounds: int
    kicks: int
    levels: list[str]
    homes: np.ndarray | None = None
    """per op, the host device index its parameters are homed on, -1 for its own device (None: no home moves)."""
    checkpoint: list[str] | None = None
    """with checkpoint moves, the blocks the best placement turns on (each checkpointed where the placement keeps it
    whole, :func:`placer.learn.checkpoint_choice.kept_blocks`); None: no checkpoint moves."""


class Replay:
    """The critic's data: the features of the last ``capacity`` moves simulated and whether each was faster."""

    def __init__(self, width: int, capacity: int = 32768) -> None:
        self.features = np.zeros((capacity, width), dtype=np.float32)
        self.faster = np.zeros(capacity, dtype=np.float32)
        self.size = self.next = 0

    def add(self, features: np.ndarray, faster: np.ndarray) -> None:
        at = (self.next + np.arange(len(faster))) % len(self.faster)
        self.features[at], self.faster[at] = features, faster
        self.next = int((self.next + len(faster)) % len(self.faster))
        self.size = min(self.size + len(faster), len(self.faster))

    def draw(self, rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
        drawn = rng.integers(0, self.size, size=min(k, self.size))
        return self.features[drawn], self.faster[drawn]


@dataclass
class _Candidates:
    """The moves of one level from one incumbent: item and device of each, their features, and which were simulated."""

    level: int
    item: np.ndarray
    device: np.ndarray
    features: np.ndarray
    keys: np.ndarray
    tried: np.ndarray

    def refresh(self, memory: MoveMemory, round_: int) -> None:
        """Update the columns that remember earlier moves (the rest depend on the incumbent only)."""
        self.features[:, 16:19] = memory.lookup(self.level, self.item, self.device, round_)


class MoveSearch:
    """One run of the move search (see the module docstring); :meth:`run` returns a :class:`MoveSearchResult`."""

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        env: Any,
        *,
        options: MoveSearchOptions | None = None,
        seed: int = 0,
        order: str | None = None,
        levels: list[ItemLevel] | None = None,
        critic: MoveCritic | None = None,
    ) -> None:
        """``critic``: a critic to start from (trained elsewhere), instead of the one ``options.critic`` names."""
        self.options = o = options or MoveSearchOptions()
        if o.proposals not in PROPOSALS:
            raise PlacerError(f"move search: proposals {o.proposals!r}: unknown (known: {', '.join(PROPOSALS)})")
        if (
            o.batch < 1
            or o.patience < 1
            or o.starts < 0
            or o.kick < 1
            or not 0 <= o.explore <= 1
            or not o.accept >= 0
            or not 0 <= o.module_share < 1
            or o.elite < 1
            or o.policy_steps < 0
        ):
            raise PlacerError(f"move search: bad options {o}")
        if o.kicks not in KICKS:
            raise PlacerError(f"move search: kicks {o.kicks!r}: unknown (known: {', '.join(KICKS)})")
        if o.kick_at is not None and o.kick_at not in KICK_LEVELS:
            raise PlacerError(f"move search: kick_at {o.kick_at!r}: unknown (known: {', '.join(KICK_LEVELS)})")
        if o.levels is not None and o.levels not in LEVEL_CHOICES:
            raise PlacerError(f"move search: levels {o.levels!r}: unknown (known: {', '.join(LEVEL_CHOICES)})")
        if o.kicks != "uniform" and (o.homes or o.checkpoint_moves):
            raise PlacerError("move search: policy kicks move ops only, not with home or checkpoint moves")
        if o.checkpoint and not o.checkpoint_moves:
            env = CheckpointScorer(env, graph, o.checkpoint)
        self.graph, self.cluster, self.env, self.order = graph, cluster, env, order
        self.levels = levels if levels is not None else item_levels(graph)
        if not self.levels:
            raise PlacerError(f"move search: {graph.name or 'the graph'} has fewer than 2 ops to move")
        self.features = MoveFeatures(graph, cluster, self.levels)
        self.memory = MoveMemory(self.levels, cluster.num_devices)
        self.rng, self.seed = np.random.default_rng(seed), seed
        torch.manual_seed(seed)
        self.optima: list[tuple[float, bytes, np.ndarray]] = []  # the local optima the kicks' policy imitates
        self.policy: Any = None  # built at the first policy kick
        self.critic, self.pretrained = self._initial_critic(critic)
        self.fit = CriticFit(self.critic, o.lr)  # its Adam steps (the same bits as autograd's and Adam's, faster)
        self.replay = Replay(NUM_FEATURES)
        self.tries, self.hits = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)  # [uniform, ranked] moves
        self.schedules = 0  # incumbents' schedules simulated for the features
        self.devices = candidate_devices(cluster, "auto", graph)  # the GPUs, the host too if they cannot hold it
        # with home moves, placements are codes (placer.learn.home_moves) and each level has a twin of home moves;
        # with checkpoint moves, codes with a bit per op (placer.learn.checkpoint_moves) and one more level last.
        # An env that scores codes itself (a training run's scorer, placer.learn.session.RunScorer) names its own
        coded = o.homes or o.checkpoint_moves
        self.codes = getattr(env, "home_codes", None) if coded else None
        if coded and self.codes is None:
            homes = HomeCodes(graph, cluster, cluster.gpu_indices()) if o.homes else None
            self.codes = (
                BlockCodes(graph, o.checkpoint or [], homes, cluster.num_devices) if o.checkpoint_moves else homes
            )
            self.env = HomeCodeScorer(env, self.codes)
        self.blocks = self.codes if isinstance(self.codes, BlockCodes) else None
        if o.checkpoint_moves and self.blocks is None:
            raise PlacerError("move search: checkpoint moves need the blocks (options.checkpoint)")
        self.home_levels = len(self.levels) if o.homes else 0
        self.num_levels = len(self.levels) + self.home_levels + (self.blocks is not None)
        # the levels in the order the descent visits them: the block level (last index) first, a few moves that
        # decide what fits, then the item levels coarse to fine, then their home twins
        self.sequence = list(range(self.num_levels))
        if self.blocks is not None:
            self.sequence = self.sequence[-1:] + self.sequence[:-1]
        choice = o.levels or ("learned" if o.proposals == "critic" else "cycle")
        self.learned_levels = choice == "learned" and self.codes is None
        self.kick_at = o.kick_at or ("ops" if o.kicks == "uniform" and self.codes is None else "coarse")

    # ------------------------------------------------------------------ the loop
    def run(
        self, start: np.ndarray | None = None, *, max_evals: int | None = None, time_budget_s: float | None = None
    ) -> MoveSearchResult:
        """Search from ``start`` (op devices; None: the best uniform draw) until the budget is spent."""
        if max_evals is None and time_budget_s is None:
            raise PlacerError("move search: give max_evals or time_budget_s")
        try:
            self.begin(start, max_evals=max_evals, time_budget_s=time_budget_s)
            while True:
                self.step()
        except BudgetSpent:
            pass
        return self.result()

    def begin(
        self,
        start: np.ndarray | None = None,
        *,
        max_evals: int | None = None,
        time_budget_s: float | None = None,
        module_s: float | None = None,
    ) -> None:
        """Score the start (module_search's share first, then the draws competing with the start);
        :class:`BudgetSpent` if the budget allows none.

        ``module_s``: module_search's seconds, where the run's budget is kept by the caller (``time_budget_s``
        infinite); by default ``module_share`` of ``max_evals``, else of ``time_budget_s``.
        """
        self.t0 = time.perf_counter()
        deadline = self.t0 + time_budget_s if time_budget_s is not None else None
        self.budget = SearchBudget(self.env, max_evals, deadline, self.order)
        self.stale = self.exhausted = self.kicks = self.rounds = self.version = self.accepted = 0
        self.level = self.sequence[0]
        self.soft = False  # the descent under the soft memory penalty (options.oscillate), after a kick
        self.hard_cost = float("inf")  # the incumbent's cost under the hard penalty (oom_costs)
        self.module_evals = 0
        self.combined = [0, 0]  # combinations of a round's faster moves simulated, and taken (options.combine)
        self._scheduled: tuple[int | None, Any] = (None, None)
        self._tried_keys: set[float] = set()  # the placements tried from the incumbent (by their move's key)
        self._tried_version: int | None = None
        # learned levels: each level's Beta posterior of its hit rate, the levels visited in the first pass, the rounds
        # since the incumbent last changed, and the candidates of each level from the incumbent
        self.level_hits = np.full(self.num_levels, LEVEL_PRIOR)
        self.level_misses = np.full(self.num_levels, LEVEL_PRIOR)
        self.first_pass, self.visited, self.since = self.learned_levels, set(), 0
        self._level_cands: dict[int, _Candidates] = {}
        self._module_phase(max_evals, time_budget_s, module_s)
        self.op_devices, self.cost = self._start(start)
        self.hard_cost = self.cost
        self._fresh_candidates()

    def step(self) -> None:
        """One round: a batch of moves from the incumbent simulated, the critic trained, the best taken if faster.

        The round's level: with learned levels, after a first pass over every level in turn, drawn by the levels'
        hit rates (:meth:`_learned_level`); else the cycle's (:meth:`_cycle_level`: a level whose moves are spent
        hands over to the next; when every level is, the best is kicked).
        Raises :class:`BudgetSpent` when the budget is used up, or at once where nothing can move
        (:attr:`has_moves`).
        """
        if not self.has_moves:
            raise BudgetSpent
        if self.first_pass or not self.learned_levels:
            level, kicks = self.level, self.kicks
            self._cycle_level()
            self.visited.add(level)
            done = self.kicks > kicks or (len(self.visited) == self.num_levels and self.level != level)
            if self.first_pass and done:  # every level visited in turn: the hit rates choose from now on
                self.first_pass, self.since = False, 0
        else:
            self._learned_level()
        self._round()

    def _cycle_level(self) -> None:
        """The level of the next round, variable neighbourhood descent: the current one until ``patience`` rounds
        in a row find nothing faster (or its moves are spent), then the next; the best kicked when every level has
        handed over with the same incumbent."""
        untried = np.flatnonzero(~self.cand.tried)
        while self.stale >= self.options.patience or not len(untried):
            self.stale, self.exhausted = 0, self.exhausted + 1
            if self.exhausted < self.num_levels:
                self.level = self._next_level(self.level)  # the next level, same incumbent
            elif self.soft:  # the soft descent's end: the hard descent goes on from its incumbent
                self.soft, self.cost, self.level = False, self.hard_cost, self.sequence[0]
                self.version, self._level_cands = self.version + 1, {}
            else:  # a local optimum at every level: kick the best
                every_on = self.blocks is not None and self.kicks % 2 == 1  # this kick turns every block on
                self._kick_best()
                # after a kick that turned every block on, the op placement and the homes adapt first (the blocks
                # free memory), and the block level turns off what does not pay last
                self.level = self.sequence[1] if every_on else self.sequence[0]
            self._fresh_candidates()
            untried = np.flatnonzero(~self.cand.tried)

    def _learned_level(self) -> None:
        """The level of the next round, learned: each level's hit rate drawn from its posterior, the level of the
        highest draw among those with moves left to try from the incumbent; the best kicked after ``patience``
        rounds per level without a faster move, or when no level has a move left."""
        while True:
            if self.since >= self.options.patience * self.num_levels:
                self._kick_best()
                self._fresh_candidates()
            draw = self.rng.beta(self.level_hits, self.level_misses)
            for level in np.argsort(-draw, kind="stable").tolist():
                if level != self.level:
                    self.level = level
                    if level in self._level_cands:  # kept from this incumbent: what other levels tried since counts
                        self.cand = self._level_cands[level]
                        self.cand.tried |= self._tried(self.cand.keys)
                    else:
                        self._fresh_candidates()
                    if level < len(self.levels):
                        self.cand.refresh(self.memory, self.rounds)
                if not self.cand.tried.all():
                    return
            self.since = self.options.patience * self.num_levels  # every move of every level tried: kick

    def _combine(
        self,
        cand: "_Candidates",
        pick: np.ndarray,
        delta: np.ndarray,
        op_devices: np.ndarray,
        costs: np.ndarray,
        j: int,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The round's placements and costs, and the index of the fastest, with the incumbent with every faster move
        of a distinct item (the fastest of each) added where there are two or more (``options.combine``)."""
        won = np.flatnonzero(delta < 0)
        won = won[np.argsort(delta[won], kind="stable")]  # fastest first, so unique keeps each item's fastest
        _, first = np.unique(cand.item[pick[won]], return_index=True)
        won = won[np.sort(first)]
        if len(won) < 2 or self.budget.left() <= 0:
            return op_devices, costs, j
        both = self.op_devices.copy()
        for w in won:  # each row is the incumbent with its move applied: take what the move changed
            moved = op_devices[w] != self.op_devices
            both[moved] = op_devices[w][moved]
        cost, _ = self.budget.score(both[None])
        self.combined[0] += 1
        if cost[0] >= costs[j]:
            return op_devices, costs, j
        self.combined[1] += 1
        return np.concatenate([op_devices, both[None]]), np.concatenate([costs, cost]), len(costs)

    def _score(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(cost, hard cost)`` of the placements: the cost the descent compares (the soft penalty's in a soft
        descent, :func:`placer.learn.search_budget.soft_costs`), and :func:`oom_costs`'."""
        step_time_s, oom, over = self.budget.simulate(op_devices, overflow=True)
        hard = oom_costs(step_time_s, oom, over)
        return (soft_costs(step_time_s, oom, over, self.options.oscillate) if self.soft else hard), hard

    def _fresh_candidates(self) -> None:
        """The current level's moves from the incumbent, computed and kept (:meth:`_candidates`) until the incumbent
        changes."""
        self.cand = self._level_cands[self.level] = self._candidates(self.op_devices, self.cost)

    def _kick_best(self) -> None:
        """Kick the best placement (see :meth:`_kick`) and descend from there: first under the soft memory penalty,
        with home or checkpoint moves (``options.oscillate``; :meth:`_cycle_level` ends that descent)."""
        self._remember_optimum()
        self.soft = self.options.oscillate > 0 and self.codes is not None and self.budget.overflow
        if self.restart is not None:
            self.op_devices, self.hard_cost, soft_cost = self.restart
            self.cost = soft_cost if self.soft else self.hard_cost
        else:
            self.op_devices, self.cost = self._kick()
        self.restart = None
        self.kicks, self.exhausted, self.version, self.since = self.kicks + 1, 0, self.version + 1, 0
        self._level_cands = {}

    def _round(self) -> None:
        """A batch of the current level's untried moves simulated, the critic trained, the best taken if faster."""
        cand = self.cand
        untried = np.flatnonzero(~cand.tried)
        pick, ranked = self._choose(cand, untried)
        op_devices = self._apply(self.op_devices, cand, pick)
        costs, hard = self._score(op_devices)
        pick, op_devices, ranked = pick[: len(costs)], op_devices[: len(costs)], ranked[: len(costs)]
        delta = relative_change(costs, self.cost)
        np.add.at(self.hits, ranked, delta < 0)
        np.add.at(self.tries, ranked, 1)
        if self.level < len(self.levels):  # the critic neither ranks nor learns home moves
            self.memory.record(self.level, cand.item[pick], cand.device[pick], delta, self.rounds)
            self._learn(cand.features[pick], delta)
        cand.tried[pick] = True
        self._tried_keys.update(cand.keys[pick].tolist())
        self.rounds += 1
        hits = int((delta < 0).sum())
        self.level_hits = np.maximum(self.level_hits * LEVEL_DECAY, LEVEL_PRIOR)
        self.level_misses = np.maximum(self.level_misses * LEVEL_DECAY, LEVEL_PRIOR)
        self.level_hits[self.level] += hits
        self.level_misses[self.level] += len(delta) - hits
        j = int(np.argmin(costs))
        if self.options.combine and self.codes is None and self.level < len(self.levels):
            op_devices, costs, j = self._combine(cand, pick, delta, op_devices, costs, j)
            hard = costs  # item levels without codes: never soft
        faster = bool(costs[j] < self.cost * (1 - 1e-12))
        if faster or self._accepts(float(costs[j])):  # a slower one only when options.accept > 0
            self.accepted += not faster
            self.op_devices, self.cost, self.stale, self.exhausted = op_devices[j].copy(), float(costs[j]), 0, 0
            self.hard_cost = float(hard[j])
            self.version, self.since, self._level_cands = self.version + 1, 0 if faster else self.since + 1, {}
            self._fresh_candidates()
        else:
            self.stale, self.since = self.stale + 1, self.since + 1
            if self.level < len(self.levels):
                cand.refresh(self.memory, self.rounds)

    @property
    def has_moves(self) -> bool:
        """Whether any move exists: a cluster of at least two devices (a move may go to any of them), or home moves.
        Where none does (one device), the rounds would find nothing to try and kick for ever."""
        return self.cluster.num_devices > 1 or self.codes is not None

    def _next_level(self, level: int) -> int:
        return self.sequence[(self.sequence.index(level) + 1) % self.num_levels]

    def _accepts(self, cost: float) -> bool:
        """Whether to move to a slower placement of ``cost`` (Metropolis at the cooled temperature; never when off)."""
        if self.options.accept <= 0 or not np.isfinite(cost):
            return False
        b = self.budget
        if b.max_evals is not None:
            left = 1.0 - b.evals / max(b.max_evals, 1)
        elif b.deadline is not None and b.deadline > b.t0:
            left = (b.deadline - time.perf_counter()) / (b.deadline - b.t0)
        else:
            left = 1.0
        temperature = self.options.accept * max(left, 0.0) * self.cost
        return temperature > 0 and self.rng.random() < np.exp(-(cost - self.cost) / temperature)

    def result(self) -> MoveSearchResult:
        """The best placement simulated so far (one that fits in memory, if any did)."""
        b = self.budget
        if b.best_op_devices is None:
            raise PlacerError("move search: the budget does not allow simulating the start")
        op_devices, homes, blocks = b.best_op_devices, None, None
        if self.blocks is not None:
            blocks = self.blocks.names(op_devices)
        if self.codes is not None:
            op_devices, homes = self.codes.decode(op_devices)
            homes = homes if self.home_levels else None
        return MoveSearchResult(
            op_devices.astype(np.int32),
            b.best_cost / OOM_FACTOR if b.best_oom else b.best_cost,
            b.best_oom,
            b.evals,
            time.perf_counter() - self.t0,
            b.curve,
            self.rounds,
            self.kicks,
            [lv.name for lv in self.levels],
            homes,
            blocks,
        )

    # ------------------------------------------------------------------ the parts
    def _initial_critic(self, critic: MoveCritic | None) -> tuple[MoveCritic, bool]:
        """The critic the search starts with, and whether it was trained before (then it ranks from the first
        round)."""
        if critic is not None:
            return critic, True
        name = self.options.critic
        if name is None or self.options.proposals == "uniform":  # uniform proposals: no critic ranks, none is loaded
            return MoveCritic(self.options.hidden), False
        return load_critic(None if name == PRETRAINED else name).critic, True

    def _module_phase(self, max_evals: int | None, time_budget_s: float | None, module_s: float | None) -> None:
        """:func:`module_search` on ``module_share`` of the budget, scored through it (nothing without module paths)."""
        share = self.options.module_share
        if share <= 0:
            return
        n = int(share * max_evals) if max_evals is not None else None
        seconds = (
            module_s
            if module_s is not None
            else (share * time_budget_s if time_budget_s is not None and np.isfinite(time_budget_s) else None)
        )
        if n is None and seconds is None:  # a budget of unknown length
            return
        if (n is not None and n < MODULE_MIN_EVALS) or (seconds is not None and seconds <= 0):
            return
        source = getattr(self.env, "source", None)  # a run's scorer says who found what it scores
        if source is not None:
            self.env.source = MODULE_SHARE
        try:
            module_search(
                self.graph,
                self.cluster,
                seed=self.seed,
                n=n if n is not None else 1 << 40,
                env=BudgetScorer(self.budget),
                deadline=None if seconds is None else time.perf_counter() + seconds,
            )
        except HeuristicUnavailable:  # the graph records no modules
            pass
        finally:
            if source is not None:
                self.env.source = source
        self.module_evals = self.budget.evals

    def _start(self, start: np.ndarray | None) -> tuple[np.ndarray, float]:
        """The best of ``start``, ``starts`` uniform draws of a device per item of the coarsest level and the
        placements already simulated (module_search's)."""
        op_devices = [] if start is None else [np.asarray(start, dtype=np.int64)]
        g = self.levels[0].op_group
        for _ in range(self.options.starts):
            op_devices.append(self.devices[self.rng.integers(0, len(self.devices), size=self.levels[0].num_items)][g])
        if not op_devices and self.budget.best_op_devices is None:
            op_devices.append(np.full(self.graph.num_ops, self.devices[0], dtype=np.int64))
        if self.home_levels:  # everything on the first GPU, homed on the host (its code: the first after D)
            op_devices.append(np.full(self.graph.num_ops, self.codes.num_devices, dtype=np.int64))
        scored = [] if not op_devices else [(np.stack(op_devices), *self.budget.simulate(np.stack(op_devices), True))]
        if self.blocks is not None:  # each start with every block on competes too
            rows = np.stack(op_devices) if op_devices else self.budget.best_op_devices[None].astype(np.int64)
            rows = self.blocks.all_on(rows)
            scored.append((rows, *self.budget.simulate(rows, True)))
        # The descent starts from the best that fits, or from a start out of memory that costs less (oom_costs) and
        # is near fitting (its peak at most NEAR_FIT times the memory): there the best that fits may be far worse
        # (everything on the host), and a start a few ops over the GPU's memory is the basin of the plans that fit
        # it. What the search returns is still the best that fits.
        start_op, start_cost = self.budget.best_op_devices.astype(np.int64), float(self.budget.best_cost)
        homed: list[tuple[np.ndarray, float]] = []  # the homed start (each scored set's last row), if near fitting
        for rows, step_time_s, oom, over in scored:
            over = None if over is None else np.asarray(over[: len(step_time_s)])
            costs = oom_costs(step_time_s, oom, over)
            near = np.flatnonzero(~oom if over is None else ~oom | (over <= NEAR_FIT))
            j = int(near[np.argmin(costs[near])]) if len(near) else -1
            if j >= 0 and costs[j] < start_cost:
                start_op, start_cost = rows[j].astype(np.int64), float(costs[j])
            if self.home_levels and len(rows) - 1 in near:  # as it is, or with every block on
                soft = soft_costs(
                    step_time_s[-1:], oom[-1:], None if over is None else over[-1:], self.options.oscillate
                )
                homed.append((rows[-1].astype(np.int64), float(costs[-1]), float(soft[0])))
        # The homed start's basin is descended from too, in place of the first kick, where the descent begins
        # elsewhere: module_search's plan (the op placement that fits, a host embedding) can be a local optimum
        # that no single move leaves, when the faster plans hold more ops on the GPU with a few parameters homed
        # (BENCHMARKS.md, "The homed start's basin").
        restart = min(homed, key=lambda t: t[1]) if homed else None
        self.restart = None if restart is None or np.array_equal(restart[0], start_op) else restart
        return start_op, start_cost

    def _candidates(self, op_devices: np.ndarray, cost: float) -> "_Candidates":
        """Every move of the current level from ``op_devices``; those that make a placement already tried from it
        count as tried."""
        if self._tried_version != self.version:
            self._tried_keys, self._tried_version = set(), self.version
        if self.level >= len(self.levels) + self.home_levels:  # the block level: a layer's checkpointing flipped
            items, devices, keys = self.blocks.block_moves(op_devices)
            feats = np.zeros((len(items), NUM_FEATURES), dtype=np.float32)
        elif self.level >= len(self.levels):  # a home level: the twin of an item level
            lv = self.levels[self.level - len(self.levels)]
            items, devices, keys = self.codes.moves(lv.op_group, lv.num_items, op_devices)
            feats = np.zeros((len(items), NUM_FEATURES), dtype=np.float32)
        else:
            decoded = op_devices if self.codes is None else self.codes.decode(op_devices)[0]
            items, devices, feats, keys = self.features.features(
                self.level, decoded, cost, self._schedule(op_devices, self.version), self.memory, self.rounds
            )
        return _Candidates(self.level, items, devices, feats, keys, self._tried(keys))

    def _tried(self, keys: np.ndarray) -> np.ndarray:
        """Whether each move's placement was tried from the incumbent, by a move of any level."""
        tried = np.fromiter(self._tried_keys, dtype=np.float64, count=len(self._tried_keys))
        return np.isin(keys, tried) if len(tried) else np.zeros(len(keys), dtype=bool)

    def _apply(self, op_devices: np.ndarray, cand: "_Candidates", pick: np.ndarray) -> np.ndarray:
        """``op_devices`` with each picked move applied, one row per move."""
        moved = np.repeat(op_devices[None], len(pick), axis=0)
        if cand.level >= len(self.levels) + self.home_levels:  # the block level
            for r, j in enumerate(pick):
                moved[r] = self.blocks.flip(op_devices, int(cand.item[j]))
            return moved
        lv = self.levels[cand.level % len(self.levels)]  # a home level moves its twin's items
        for r, j in enumerate(pick):
            moved[r, lv.op_group == cand.item[j]] = cand.device[j]
        return moved if self.blocks is None else self.blocks.keep_bits(moved, op_devices[None])

    def _schedule(self, op_devices: np.ndarray, version: int) -> Any:
        """The incumbent's simulated schedule (cached per incumbent; counted as a simulated placement)."""
        if self._scheduled[0] != version:
            if self.budget.left() <= 0:
                raise BudgetSpent
            self.budget.evals += 1
            self.schedules += 1
            order = None if self.order is None else self.env.schedule_order(op_devices.astype(np.int32))
            self._scheduled = (version, self.env.schedule(op_devices.astype(np.int32), order))
        return self._scheduled[1]

    def _choose(self, cand: "_Candidates", untried: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the moves to simulate, and which of them the critic ranked (1) or were drawn uniformly (0)."""
        o = self.options
        b = min(o.batch, len(untried))
        ready = self.pretrained or self.replay.size  # a fresh critic ranks once it has seen a round
        uniform = o.proposals == "uniform" or not ready or cand.level >= len(self.levels)  # home moves: uniform
        n_ranked = 0 if uniform else b - int(round(o.explore * b))
        if n_ranked and o.adaptive:  # [uniform, ranked]: the arm whose sampled hit rate is higher takes the round
            rate = self.rng.beta(1 + self.hits, 1 + self.tries - self.hits)
            if rate[1] < rate[0]:
                n_ranked = 0
        chosen, rest = [], untried  # untried: ascending, as np.flatnonzero gives it
        if n_ranked:
            pred = self.critic.rank(cand.features, untried)
            top = top_ranked(pred, n_ranked)
            chosen, rest = list(untried[top]), np.delete(untried, top)
        if b > n_ranked and len(rest):
            chosen += list(self.rng.choice(rest, size=min(b - n_ranked, len(rest)), replace=False))
        return np.asarray(chosen, dtype=np.int64), (np.arange(len(chosen)) < n_ranked).astype(np.int64)

    def _learn(self, feats: np.ndarray, delta: np.ndarray) -> None:
        """Add the simulated moves to the critic's data; a few Adam steps of logistic regression on "was it faster"
        (critic only)."""
        o = self.options
        self.replay.add(feats, (delta < 0).astype(np.float32))
        if o.proposals == "uniform" or not o.fine_tune:
            return
        for _ in range(o.train_steps):
            x, y = self.replay.draw(self.rng, o.train_batch)
            self.fit.step(torch.from_numpy(x), torch.from_numpy(y))

    def _kick(self) -> tuple[np.ndarray, float]:
        """The best placement with ``kick`` random items of the kick's level (``kick_at``: the finest, or a random
        coarse one) moved to random devices (with checkpoint moves, one block's checkpointing flipped too).

        A kick the scorer refuses (an infinite step, e.g. more than one stage per rank) is drawn again, up to
        :data:`KICK_TRIES` times; then the search goes on from the best placement itself.
        """
        if self.kick_at == "ops":
            kick_levels = [len(self.levels) - 1]  # the finest level (item_levels: coarse to fine)
        else:
            kick_levels = [k for k, lv in enumerate(self.levels) if lv.num_items <= COARSE_ITEMS] or [0]
        for _ in range(KICK_TRIES):
            lv = self.levels[int(self.rng.choice(kick_levels))]
            best = self.budget.best_op_devices.astype(np.int64)
            op_devices = best.copy()
            k = min(self.options.kick, lv.num_items)
            items, devices = self._policy_moves(lv, best, k) if self.options.kicks != "uniform" else ([], [])
            for g, d in zip(items, devices):
                op_devices[lv.op_group == g] = d
            rest = np.setdiff1d(np.arange(lv.num_items), items)  # the kick's other items, drawn uniformly
            for g in self.rng.choice(rest, size=min(k - len(items), len(rest)), replace=False):
                op_devices[lv.op_group == g] = self.devices[self.rng.integers(0, len(self.devices))]
            if self.blocks is not None:  # the moved ops keep their blocks' choice; then one block flipped at random,
                # or (every other kick) every block turned on: the descent from there turns off what does not pay
                op_devices = self.blocks.keep_bits(op_devices, best)
                if self.kicks % 2:
                    op_devices = self.blocks.all_on(op_devices)
                else:
                    op_devices = self.blocks.flip(op_devices, int(self.rng.integers(0, len(self.blocks.first))))
            costs, hard = self._score(op_devices[None])
            if np.isfinite(costs[0]):
                self.hard_cost = float(hard[0])
                return op_devices, float(costs[0])
        self.hard_cost = float(self.budget.best_cost)
        return self.budget.best_op_devices.astype(np.int64), float(self.budget.best_cost)

    # ------------------------------------------------------------------ expert iteration (kicks="policy")
    def _remember_optimum(self) -> None:
        """The incumbent, at a local optimum of every level, joins the optima the kicks' policy imitates (the
        ``elite`` fastest distinct ones)."""
        if self.options.kicks == "uniform" or not np.isfinite(self.cost):
            return
        key = self.op_devices.astype(np.int64).tobytes()
        if all(k != key for _, k, _ in self.optima):
            self.optima.append((self.cost, key, self.op_devices.astype(np.int64).copy()))
            self.optima.sort(key=lambda t: t[0])
            del self.optima[self.options.elite :]

    def _fit_policy(self) -> None:
        """``policy_steps`` Adam steps of imitation of the optima: the mean over them of each op's negative
        log-likelihood of its device."""
        from policies.gnn import GNNPolicy

        o = self.options
        if self.policy is None:
            self.policy = GNNPolicy(self.graph, self.cluster.num_devices, cluster=self.cluster, decoder="independent")
            self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), lr=o.policy_lr)
            self.policy_generator = torch.Generator().manual_seed(self.seed)
        targets = torch.as_tensor(np.stack([self.policy.contract(t) for _, _, t in self.optima]))  # [E, items]
        for _ in range(o.policy_steps):
            logp = self.policy.log_probs()  # [items, D]
            loss = -logp.gather(1, targets.T).mean()
            self.policy_optimizer.zero_grad()
            loss.backward()
            self.policy_optimizer.step()

    def _policy_moves(self, lv: ItemLevel, best: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``k`` items of ``lv`` and their devices: those where a draw of the policy (fitted to the optima
        first) puts most of an item's ops elsewhere than ``best`` does, drawn in proportion to that share."""
        if not self.optima:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self._fit_policy()
        draw = self.policy.decode(1, generator=self.policy_generator)[0].astype(np.int64)
        device = vote(lv.op_group, draw, lv.num_items, self.cluster.num_devices)
        size = np.maximum(np.bincount(lv.op_group, minlength=lv.num_items), 1)
        differ = np.bincount(lv.op_group, weights=(draw != best).astype(float), minlength=lv.num_items) / size
        items = np.flatnonzero((differ > 0.5) & np.isin(device, self.devices))
        if len(items) > k:
            items = np.sort(self.rng.choice(items, size=k, replace=False, p=differ[items] / differ[items].sum()))
        return items, device[items]
