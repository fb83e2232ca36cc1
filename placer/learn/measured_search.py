"""Search steered by measurements: the simulator, corrected by a model of its error, chooses what to measure next.

A measurement costs seconds; a simulation, milliseconds. The simulator is wrong where it is not calibrated (a
device slower than its cluster file says, copies costlier), and then its best placement is not the fastest for
real. :class:`CorrectedSearch` measures few placements and learns from each:

- :meth:`~CorrectedSearch.begin`: the move search (:class:`placer.learn.move_search.MoveSearch`) on the plain
  simulator finds the simulator's best placement, which is measured first, with ``initial - 1`` others among the
  simulator's good ones, chosen far apart in feature space (a first fit needs spread; across ranks, two of them
  the simulator's best plans on one rank fewer);
- :meth:`~CorrectedSearch.step`, one round, top to bottom: fit the correction to every measurement so far, in two
  parts: the cluster's rates (:class:`placer.learn.rates.RateFit`: each device's speed and the links', the simulator
  then run on them, so that it knows where the bottleneck moves), and the residual log(real / simulated) that they
  leave on the placement's features (:class:`placer.learn.correction.Correction`; ``rates=False``: this alone, on
  the plain simulator); run the move search on the corrected simulator (:class:`CorrectedSimulator`: each
  placement's simulated step time times exp(mean - ``kappa`` std) of the residual, an optimistic bound, so that
  what the measurements have not ruled out still looks as good as it may be) from the fastest placement measured;
  every placement it simulates joins a pool of candidates; measure the ``batch`` candidates with the lowest bound
  that are not measured yet;
- with ``confirm``, before a round, where the fastest placement measured has one measurement only and did not win
  by far, it is measured again instead, and judged by that measurement from then on;
- :meth:`~CorrectedSearch.rematch`: the fastest placement measured (the ``finalists`` fastest), the one the
  correction (fitted to every measurement) predicts fastest, and the simulator's best, measured again side by side
  ``rematch`` times each. The loop's plan is the one whose reads and prediction together (:func:`posterior_choice`:
  the prediction weighs as much as the correction's error against the measurements allows) say is fastest; without
  the correction, the one with the lowest median. The best of many noisy measurements is biased low (the winner's
  curse), and a few fresh reads are noisy too: on stand-in splits under 8.5 % noise, they chose plans 2.0 % from the
  stand-in's best by the median of 30 runs and 11.2 % at worst; with the correction's pick and its prediction, 0.9 %
  and 5.1 % (BENCHMARKS.md, "The correction's pick in the side-by-side").

Where the simulator scores one stage per rank only (a contiguous split across processes: ``RankSim`` with
``one_stage_per_rank``), moving an op or an item almost always makes more stages than ranks, and the simulator
refuses it. There the searches move cuts instead (:meth:`~CorrectedSearch._cut_search`, as ``stage_search`` does):
each cut in turn to every position between its neighbours, one batch a cut, the best taken, from the fastest split
measured (the simulator's best: from the fastest of the splits people use). A cut may also move onto a neighbour
(``merge``), which leaves a stage empty: a plan on fewer ranks than the cluster has devices, which is what a slow
rank can call for.

``correction=False`` is the ablation: no model; each round searches the plain simulator from the fastest placement
measured and measures the simulator's own next-best candidates.

The real scorer is anything with the scorer protocol (:mod:`envs.scorer`): the Ray env
(:class:`envs.real.measured.MeasuredEnv`), the in-process one (:class:`envs.real.local.LocalEnv`), multi-process
runs, or a stand-in (:class:`placer.learn.stand_in.StandIn`). Measurements go through its ``step_times``;
re-measurements through ``measure_again`` where it has one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

import envs
from envs.cluster import Cluster
from envs.real.distributed.cut import split_sequence
from envs.scorer import measure_again
from graphs import OpGraph, PlacerError
from placer.learn.corrected_sim import CorrectedSimulator, Pool, placement_key
from placer.learn.correction import Correction, PlacementFeatures
from placer.learn.move_search import MoveSearch, MoveSearchOptions
from placer.learn.rates import RateFit
from placer.methods.heuristics.costs import gpu_devices
from placer.methods.heuristics.stage_search import cut_range, cuts_of, split_of, stages_of, starting_cuts
from policies.moves import ItemLevel, item_levels

#: With merges, the first measurements hold up to this many of the simulator's best plans on one rank fewer
#: (:meth:`CorrectedSearch._merged`): a slow rank can make fewer ranks faster, which the simulator cannot know.
MERGED_FIRST = 2

#: A placement that measures fastest by more than this many noise widths (in log) is not measured again.
CONFIRM_MARGIN = 3.0


def noise_width(repeats: Sequence[Sequence[float]]) -> float | None:
    """The measurements' noise in log: the median, over the placements measured more than once, of the standard
    deviation of their log step times (None: none yet). A median: the first measurement of a placement measured
    again was chosen for being fastest, and one lucky draw must not make every later one look like noise.

    >>> round(noise_width([[1.0], [1.0, 1.0], [0.3, 1.0], [2.0, 2.0]]), 6)
    0.0
    """
    widths = [np.std(np.log(r), ddof=1) for r in repeats if len(r) > 1 and np.isfinite(r).all()]
    return float(np.median(widths)) if widths else None


def worth_confirming(step_time_s: float, runner_up_s: float, noise: float | None) -> bool:
    """Whether a placement that measured ``step_time_s``, fastest ahead of ``runner_up_s``, should be measured again
    before it is taken as the fastest: unless it won by over :data:`CONFIRM_MARGIN` noise widths, or had nothing to
    beat (the first measured: not chosen among others for being low).

    >>> worth_confirming(1.0, 1.05, None), worth_confirming(1.0, 1.05, 0.1), worth_confirming(1.0, 2.0, 0.1)
    (True, True, False)
    >>> worth_confirming(1.0, float("inf"), None)
    False
    """
    if not np.isfinite(runner_up_s):
        return False
    return noise is None or not np.log(runner_up_s / step_time_s) > CONFIRM_MARGIN * noise


def side_by_side(
    real: Any, candidates: Sequence[np.ndarray], rounds: int, on_round: Callable[[int], Any] | None = None
) -> list[list[float]]:
    """Each placement of ``candidates`` measured again ``rounds`` times, all of them in one batch a round
    (interleaved: a drift of the machine hits them alike); each one's times, inf where a measurement failed.
    ``on_round(r)`` after round ``r`` (1, 2...): a progress bar's update."""
    times: list[list[float]] = [[] for _ in candidates]
    if not len(candidates):
        return times
    both = np.stack([np.asarray(p, dtype=np.int32) for p in candidates])
    for r in range(rounds):
        step_time_s, failed = measure_again(real, both)
        step_time_s = np.where(np.asarray(failed, dtype=bool), np.inf, np.asarray(step_time_s, dtype=float))
        for k, t in enumerate(step_time_s):
            times[k].append(float(t))
        if on_round is not None:
            on_round(r + 1)
    return times


def finalist_names(n: int) -> list[str]:
    """The side-by-side's names of the ``n`` fastest placements measured.

    >>> finalist_names(4)
    ['best', '2nd', '3rd', '4th']
    """
    return ["best"] + [f"{k}{'nd' if k == 2 else 'rd' if k == 3 else 'th'}" for k in range(2, n + 1)]


def lowest_median(times: Sequence[Sequence[float]]) -> int:
    """The index of the times with the lowest median (a failed measurement counts as inf; ties: the first).

    >>> lowest_median([[1.0, 3.0, 3.0], [2.0, 2.0, 9.0], [2.0, 2.0, 2.0]])
    1
    """
    medians = [float(np.median(t)) if len(t) else float("inf") for t in times]
    return int(np.argmin(medians))


def finalists_of(fastest: Sequence[np.ndarray], simulator: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """The side-by-side at the end of a measured search: ``fastest`` (its fastest placements measured, fastest
    first: "best", "2nd"...) and the simulator's best ("simulator", there even where it is one of them)."""
    return finalist_names(len(fastest)) + ["simulator"], [*fastest, np.asarray(simulator, dtype=np.int32)]


def choose(
    real: Any, names: list[str], candidates: list[np.ndarray], rounds: int
) -> tuple[dict[str, list[float]], str, np.ndarray]:
    """The side-by-side of ``candidates`` (:func:`side_by_side`, ``rounds`` rounds): ``(each one's times by name, the
    name of the one with the lowest median, its placement)``."""
    times = side_by_side(real, candidates, rounds)
    k = lowest_median(times)
    return dict(zip(names, times)), names[k], candidates[k]


def posterior_choice(
    times: Sequence[Sequence[float]], predicted_s: Sequence[float], spread: float, fitted: int, measured: int
) -> tuple[int, list[float]] | None:
    """The side-by-side's winner judged by its reads and the model's prediction together: ``(its index, each one's
    posterior step time)``, or None where the reads give no noise width (fewer than two reads of any candidate).

    Each candidate's log step time has the model's prediction ``log predicted_s[k]`` as its prior, of variance
    ``tau2``, and its fresh reads ``times[k]`` as measurements, each of variance ``sigma2``: the posterior mean is
    their precision-weighted mean (a candidate with a failed read is out; one without a prediction is judged by its
    reads alone). ``sigma2`` is the reads' pooled variance in log. ``tau2`` is the model's own error:
    ``spread`` (the mean square of log(measured / predicted) over the loop's measurements, noise and model error
    together) less ``sigma2``, and at least the error of a fit of ``fitted`` parameters to ``measured`` measurements,
    ``sigma2 * fitted / measured``. A model that explains the measurements to their noise counts as many reads; one
    that misses them by far counts as none, and the reads decide.

    >>> k, post = posterior_choice([[1.0, 1.2], [1.1, 1.1]], [1.3, 1.0], spread=0.02, fitted=1, measured=100)
    >>> k, [round(t, 3) for t in post]
    (1, [1.146, 1.073])
    """
    logs = [np.log(np.asarray(t, dtype=np.float64)) for t in times]
    widths = [(len(r) - 1, float(np.var(r, ddof=1))) for r in logs if len(r) > 1 and np.isfinite(r).all()]
    dof = sum(d for d, _ in widths)
    if not dof:
        return None
    sigma2 = max(sum(d * v for d, v in widths) / dof, 1e-12)
    tau2 = max(float(spread) - sigma2, sigma2 * fitted / max(measured, 1))
    post = []
    for r, p in zip(logs, predicted_s):
        if not len(r) or not np.isfinite(r).all():
            post.append(float("inf"))
            continue
        num, den = float(np.sum(r)) / sigma2, len(r) / sigma2
        if np.isfinite(p) and p > 0:
            num, den = num + float(np.log(p)) / tau2, den + 1.0 / tau2
        post.append(float(np.exp(num / den)))
    return int(np.argmin(post)), post


#: Draws :meth:`CorrectedSearch._kicked` makes for a placement near the best that is new and that the simulator scores.
KICKED_TRIES = 64


@dataclass
class CorrectedSearchOptions:
    """The measured loop's settings (chosen on stand-ins of TRAIN-family graphs; BENCHMARKS.md, "Learning from
    measurements")."""

    measurements: int = 30
    """real measurements in all, the first ones included (the side-by-side re-measurements at the end are not)."""
    initial: int = 4
    """placements measured before the first fit: the simulator's best and ``initial - 1`` good ones far apart (with
    ``merge`` across ranks, two of those its best plans on one rank fewer, :data:`MERGED_FIRST`)."""
    batch: int = 1
    """placements measured per round (a measured env with several workers measures a batch at once)."""
    sim_evals: int = 4000
    """simulated placements of the search for the simulator's best, before the first measurement."""
    round_evals: int = 1000
    """simulated placements of each round's search on the corrected simulator."""
    kappa: float = 1.0
    """exploration: a placement's corrected step time is taken at the residual's mean minus this many standard
    deviations."""
    correction: bool = True
    """fit the correction (False: the ablation, the simulator's own ranking)."""
    rates: bool = True
    """with the correction, refit the cluster's rates first (:class:`placer.learn.rates.RateFit`: each device's
    speed and the links') and simulate on them; the linear correction then fits what the rates leave (False: the
    linear correction on the plain simulator alone)."""
    pool: int = 256
    """candidates each round's search keeps (the lowest bounds); the measured loop re-ranks them every round."""
    rematch: int = 3
    """re-measurements at the end, side by side, of the ``finalists`` fastest placements measured, the correction's
    pick and the simulator's best; the loop's plan is the one judged fastest (:meth:`CorrectedSearch.rematch`; 0:
    off, the fastest measured is)."""
    finalists: int = 2
    """the fastest placements measured that go into the side-by-side at the end with the simulator's best (the
    runner-up too: where the fastest was a lucky read, the simulator's best may be far behind what was found)."""
    confirm: bool = False
    """a placement that measures fastest is measured once more (the budget pays) before the searches start from it,
    and is judged by that re-measurement from then on: the measurement that made it fastest was chosen for being low
    (the best of many noisy ones is biased low, the winner's curse), the one after it was not. Skipped where it won
    by over :data:`CONFIRM_MARGIN` noise widths (:meth:`CorrectedSearch.noise_width`). Off by default: on the
    stand-ins (2 % noise) it cost more measurements than the curse did (BENCHMARKS.md, "The winner's curse"), and on
    real CPU ranks one run could not tell."""
    merge: bool = True
    """where the searches move cuts (one stage per rank), a cut may also move onto its neighbour, which empties the
    stage between them: its ops join a neighbour's device, and the plan runs on one rank fewer. On two pinned CPU
    ranks, one of them shared with a busy loop, the whole LM on the free rank measured 0.894x its fastest split over
    both by the medians (faster in 4 rounds of 5; BENCHMARKS.md, "Fewer ranks than devices"); without merges the
    loops could not propose that plan (False: splits over every rank only, as before). The first measurements then
    hold the simulator's best plans on one rank fewer too (:data:`MERGED_FIRST`): the plain simulator cannot tell
    that a rank is slow, and without a measurement of such a plan neither can the correction."""


@dataclass
class Measurement:
    """One real measurement and what the simulator and the correction predicted for it beforehand."""

    round: int
    real_s: float
    simulated_s: float
    predicted_s: float  # the corrected simulator's mean prediction before it was measured
    bound_s: float  # the optimistic bound that chose it
    best_s: float  # the fastest measured so far, this one included
    found_by: str

    def to_dict(self) -> dict[str, Any]:
        return {k: (v if not isinstance(v, float) or np.isfinite(v) else None) for k, v in self.__dict__.items()}


@dataclass
class CorrectedSearchResult:
    """The loop's outcome: its plan, the simulator's best, the side-by-side, the curve."""

    op_devices: np.ndarray  # the loop's plan: the side-by-side's winner (without one: the fastest measured)
    step_time_s: float  # the plan's step time: its median in the side-by-side (without one: as measured)
    simulator_op_devices: np.ndarray
    simulator_step_time_s: float  # the simulator's best, measured
    rematch: dict[str, list[float]]  # "best", "2nd"..., "simulator": the side-by-side re-measurements
    curve: list[Measurement]
    weights: dict[str, float]  # the correction's weights by feature
    noise_std: float
    elapsed_s: float
    simulated: int
    fastest_measured_s: float = float("inf")  # the fastest measurement (judged as :attr:`CorrectedSearch.real_s`)
    chosen: str = "best"  # which of the side-by-side the plan is ("best": the fastest measured, "model"...)
    posterior: dict[str, float] = field(default_factory=dict)  # the finalists as the correction judged them

    @property
    def measurements(self) -> int:
        return len(self.curve)

    def speedup(self) -> float | None:
        """Median of the simulator's best over the median of the best, re-measured side by side (None: no rematch)."""
        best, sim = self.rematch.get("best") or [], self.rematch.get("simulator") or []
        if not best or not sim:
            return None
        return float(np.median(sim) / np.median(best))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "simulator_step_time_s": self.simulator_step_time_s,
            "rematch": self.rematch,
            "speedup_over_simulator": self.speedup(),
            "fastest_measured_s": self.fastest_measured_s,
            "chosen": self.chosen,
            "posterior_s": self.posterior,
            "measurements": self.measurements,
            "curve": [m.to_dict() for m in self.curve],
            "weights": self.weights,
            "noise_std": self.noise_std,
            "elapsed_s": self.elapsed_s,
            "simulated": self.simulated,
        }


class CorrectedSearch:
    """One run of the measured loop (module doc): :meth:`run`, or :meth:`begin`, :meth:`step`... :meth:`result`.

    Args:
        graph, cluster: the problem; the simulator is ``sim`` (default ``envs.SimEnv(graph, cluster)``).
        real: the scorer that measures (the scorer protocol).
        options: :class:`CorrectedSearchOptions`.
        seed: the searches' seed.
        search_options: the move search's options for every search the loop runs. Its levels are taken in turn
            unless they say otherwise (``levels``): the loop's searches are short (``round_evals``), a first pass
            over the levels is most of each, and with learned levels the loop did worse in both stand-in tests:
            across processes it ended 1.173x from the stand-in's best, against 1.147x with the levels in turn.
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        real: Any,
        *,
        sim: Any = None,
        options: CorrectedSearchOptions | None = None,
        seed: int = 0,
        search_options: MoveSearchOptions | None = None,
    ) -> None:
        self.options = o = options or CorrectedSearchOptions()
        if (
            o.measurements < 1
            or o.initial < 1
            or o.batch < 1
            or o.sim_evals < 1
            or o.round_evals < 1
            or o.pool < 1
            or o.finalists < 1
        ):
            raise PlacerError(f"corrected search: bad options {o}")
        if o.kappa < 0 or o.rematch < 0:
            raise PlacerError(f"corrected search: kappa and rematch must be >= 0, got {o.kappa}, {o.rematch}")
        self.graph, self.cluster, self.real, self.seed = graph, cluster, real, seed
        self.sim = sim if sim is not None else envs.SimEnv(graph, cluster)
        self.search_options = search_options or MoveSearchOptions()
        if self.search_options.levels is None:
            self.search_options = replace(self.search_options, levels="cycle")
        self.levels: list[ItemLevel] = item_levels(graph)
        self.cut_moves = bool(getattr(self.sim, "one_stage_per_rank", False))
        # cuts are positions of the sequence the splits cut (node order unless ops write a buffer in place)
        self.cut_order = split_sequence(graph)[0] if self.cut_moves else np.arange(graph.num_ops)
        self.cut_position = np.argsort(self.cut_order)
        """the searches move cuts, not items (module doc): the simulator scores one stage per rank only."""
        self.features = PlacementFeatures(graph, cluster)
        self.model = Correction(self.features.width)
        self.rate_fit = (
            RateFit(cluster, self.sim) if o.correction and o.rates and hasattr(self.sim, "with_cluster") else None
        )
        self.pool = Pool(o.pool)
        self.measured: dict[bytes, int] = {}  # placement -> its row below
        self.x: list[np.ndarray] = []
        self.residual: list[float] = []
        self.op_devices: list[np.ndarray] = []
        # each placement's step time as judged: its first measurement, or once re-measured (``confirm``) the median of
        # those after the first; every measurement of it; its step time on the plain simulator
        self.real_s: list[float] = []
        self.repeats: list[list[float]] = []
        self.simulated_s: list[float] = []
        self.curve: list[Measurement] = []
        self.rounds = self.simulated = 0
        self.rematched: dict[str, list[float]] = {}
        self.chosen, self.chosen_op_devices = "best", None  # the side-by-side's winner (rematch)
        self.posterior: dict[str, float] = {}  # the finalists' step times as the correction judged them (rematch)

    # ------------------------------------------------------------------ the loop
    def run(self, start: np.ndarray | None = None) -> CorrectedSearchResult:
        """Begin from ``start`` (op devices; None: the search's draws), measure until the budget is spent, rematch."""
        self.begin(start)
        while self.left() > 0 and self.step():
            pass
        self.rematch()
        return self.result()

    def left(self) -> int:
        """Measurements the budget has left."""
        return self.options.measurements - len(self.curve)

    def begin(self, start: np.ndarray | None = None) -> None:
        """Find the simulator's best (a search on the plain simulator) and measure it with ``initial - 1`` others."""
        self.t0 = time.perf_counter()
        o = self.options
        self.simulator_op_devices = self.simulator_best(start)
        first = [self.simulator_op_devices]
        if start is not None:
            first.append(np.asarray(start, dtype=np.int32))
        first += self._merged(self.simulator_op_devices, min(MERGED_FIRST, o.initial - len(first) - 1), first)
        first += self._spread(max(o.initial - len(first), 0), exclude=first)
        self._measure(np.stack(first[: max(min(o.initial, self.left()), 1)]), "simulator")
        self.simulator_step_time_s = self.real_s[0]

    def simulator_best(self, start: np.ndarray | None = None) -> np.ndarray:
        """The simulator's best: the search on the plain simulator from ``start`` (``sim_evals`` placements); what
        it simulates joins the pool. Measures nothing."""
        plain = CorrectedSimulator(self.sim, self.features, None, 0.0, self.pool)
        return self._search(plain, start, self.options.sim_evals).astype(np.int32)

    def step(self) -> bool:
        """One round: fit the correction, search the corrected simulator, measure the best-bounded candidates.

        False where it measured nothing: the search found nothing unmeasured, and neither did :meth:`_kicked`
        (every placement near the fastest measured is measured already, or refused by the simulator, as plans of
        more stages than ranks are under ``one_stage_per_rank``). The loop ends there, short of its budget."""
        o = self.options
        self.rounds += 1
        if o.confirm and self._confirm():
            return True
        # fit the correction to every measurement so far: the rates (the simulator run again on them), then the
        # linear residual of what they leave
        sim, x, residual = self.sim, np.stack(self.x), np.asarray(self.residual)
        if self.rate_fit is not None:
            sim, _, x, residual = self._refit_rates()
        ok = np.isfinite(residual)
        model = self.model.fit(x[ok], residual[ok]) if o.correction else None
        corrected = CorrectedSimulator(sim, self.features, model, o.kappa, self.pool)
        # search the corrected simulator from the fastest placement measured; its finds join the pool
        self._search(corrected, self.best_op_devices(), o.round_evals)
        # measure the candidates with the lowest bound that are not measured yet
        simulated_s, x = np.asarray(self.pool.simulated_s), np.stack(self.pool.features)
        mean_s, bound_s = corrected.bound(simulated_s, x)
        fresh = np.array([placement_key(p) not in self.measured for p in self.pool.op_devices])
        rank = np.where(fresh, bound_s, np.inf)
        picks = [k for k in np.argsort(rank, kind="stable")[: min(o.batch, self.left())] if np.isfinite(rank[k])]
        if picks:
            rows = [self.pool.op_devices[k] for k in picks]
        else:  # the pool holds nothing unmeasured: the search found nothing new
            kicked = self._kicked()
            if kicked is None:
                self.pool.prune(rank)
                return False
            picks, rows = [None], [kicked]
        self._measure(
            np.stack(rows),
            "corrected" if o.correction else "simulator rank",
            predicted=[mean_s[k] if k is not None else np.nan for k in picks],
            bound=[bound_s[k] if k is not None else np.nan for k in picks],
        )
        self.pool.prune(rank)
        return True

    def rematch(self) -> None:
        """The finalists measured again side by side, ``rematch`` times each (:meth:`finalists`: the ``finalists``
        fastest placements measured, with the correction the one it predicts fastest, and the simulator's best). With
        the correction the one judged fastest by its reads and its prediction together (:func:`posterior_choice`)
        becomes the loop's plan, without it the one with the lowest median: the fastest measurement of many noisy
        ones is biased low (the winner's curse), a fresh side-by-side is not."""
        n = self.options.rematch
        self.posterior = {}
        if not n or not self.curve:
            return
        if not self.options.correction:
            self.rematched, self.chosen, self.chosen_op_devices = choose(self.real, *self.finalists(), n)
            return
        # the correction fitted to every measurement, the last round's too: its pick joins the side-by-side, and its
        # predictions judge the finalists with their reads
        predicted = self.predict_measured()
        names, candidates = self.finalists(predicted)
        times = side_by_side(self.real, candidates, n)
        self.rematched = dict(zip(names, times))
        ok = np.isfinite(predicted) & np.isfinite(self.real_s)
        spread = float(np.mean((np.log(np.asarray(self.real_s)[ok]) - np.log(predicted[ok])) ** 2)) if ok.any() else 0.0
        at = {placement_key(p): k for k, p in enumerate(self.op_devices)}
        priors = [predicted[at[placement_key(c)]] if placement_key(c) in at else np.nan for c in candidates]
        fitted = len(self.rate_fit.theta) if self.rate_fit is not None else self.features.width
        judged = posterior_choice(times, priors, spread, fitted, int(ok.sum()))
        if judged is None:  # one read each: no noise width to weigh them by; the lowest median
            k = lowest_median(times)
        else:
            k, post = judged
            self.posterior = dict(zip(names, post))
        self.chosen, self.chosen_op_devices = names[k], candidates[k]

    def predict_measured(self) -> np.ndarray:
        """The correction, fitted to every measurement so far, its mean prediction (seconds) of each placement
        measured (the rates refitted, then the linear residual; inf where the simulator refuses one)."""
        sim, simulated_s = self.sim, np.asarray(self.simulated_s)
        x, residual = np.stack(self.x), np.asarray(self.residual)
        if self.rate_fit is not None:
            sim, simulated_s, x, residual = self._refit_rates()
        ok = np.isfinite(residual)
        self.model.fit(x[ok], residual[ok])
        mean_s, _ = CorrectedSimulator(sim, self.features, self.model, 0.0, self.pool).bound(simulated_s, x)
        return np.where(np.isfinite(mean_s), mean_s, np.inf)

    def finalists(self, predicted: np.ndarray | None = None) -> tuple[list[str], list[np.ndarray]]:
        """The side-by-side's placements and their names: the ``finalists`` fastest measured ("best", "2nd"...),
        the one the correction predicts fastest ("model", with ``predicted``, each measured placement's prediction;
        where it is not one of the others), then the simulator's best ("simulator"; measured again beside the best
        even where it is the best)."""
        real_s = np.asarray(self.real_s)
        order = [int(k) for k in np.argsort(real_s, kind="stable") if np.isfinite(real_s[k])]
        order = order[: self.options.finalists] or [int(np.argmin(real_s))]
        names, candidates = finalists_of([self.op_devices[k] for k in order], self.simulator_op_devices)
        if predicted is None:
            return names, candidates
        predicted = np.where(np.isfinite(real_s), predicted, np.inf)  # only placements that ran for real
        if np.isfinite(predicted).any():
            pick = self.op_devices[int(np.argmin(predicted))]
            if all(placement_key(pick) != placement_key(c) for c in candidates):
                names.insert(-1, "model")
                candidates.insert(-1, pick)
        return names, candidates

    def result(self) -> CorrectedSearchResult:
        names = self.features.names(list(self.cluster.device_names))
        fastest_s = float(min(self.real_s)) if self.real_s else float("inf")
        if self.rematched:
            op_devices, chosen = self.chosen_op_devices, self.chosen
            step_time_s = float(np.median(self.rematched[chosen]))
        else:
            op_devices, chosen, step_time_s = self.best_op_devices(), "best", fastest_s
        return CorrectedSearchResult(
            op_devices,
            step_time_s,
            self.simulator_op_devices,
            self.simulator_step_time_s,
            self.rematched,
            self.curve,
            {name: float(w) for name, w in zip(names, self.model.mean)}
            | ({} if self.rate_fit is None else self.rate_fit.weights()),
            self.model.noise_std,
            time.perf_counter() - self.t0,
            self.simulated,
            fastest_s,
            chosen,
            dict(self.posterior),
        )

    def best_op_devices(self) -> np.ndarray:
        """The fastest placement measured (the simulator's best before any measurement)."""
        if not self.real_s:
            return self.simulator_op_devices
        return self.op_devices[int(np.argmin(self.real_s))]

    # ------------------------------------------------------------------ the parts
    def _refit_rates(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """Fit the rates to every measurement; the simulator on them, and each measurement's simulated step time,
        features and residual log(real / simulated) on it. The pool is simulated again on it."""
        op_devices, real_s = np.stack(self.op_devices), np.asarray(self.real_s)
        sim = self.rate_fit.fit(op_devices, real_s).simulator
        simulated_s, _ = sim.step_times(op_devices)
        simulated_s = np.asarray(simulated_s, dtype=np.float64)
        self.pool.rescore(sim, self.features)
        with np.errstate(divide="ignore", invalid="ignore"):
            residual = np.where(np.isfinite(real_s), np.log(real_s / simulated_s), np.nan)
        return sim, simulated_s, self.features(op_devices, simulated_s), residual

    def _search(self, scorer: CorrectedSimulator, start: np.ndarray | None, evals: int) -> np.ndarray:
        """The move search on ``scorer`` from ``start`` for ``evals`` placements (the cut search where the simulator
        scores one stage per rank); its best placement."""
        if self.cut_moves:
            return self._cut_search(scorer, start, evals)
        search = MoveSearch(
            self.graph,
            self.cluster,
            scorer,
            options=self.search_options,
            seed=self.seed + 1000 * self.rounds,
            levels=self.levels,
        )
        found = search.run(start, max_evals=evals)
        self.simulated += found.evals
        return found.op_devices

    def _cut_search(self, scorer: CorrectedSimulator, start: np.ndarray | None, evals: int) -> np.ndarray:
        """Cuts moved on ``scorer`` from ``start``'s split (None: the fastest on ``scorer`` of the splits people use),
        ``evals`` placements at most: each cut in turn to every position between its neighbours (the nearest ones
        where the budget has fewer left), the best kept; until a pass over the cuts moves none."""
        n = self.graph.num_ops
        if start is None:
            devices = gpu_devices(self.cluster)
            cuts, best_s = starting_cuts(self.graph, self.cluster, scorer, devices, 1)
            sequence = devices[np.arange(len(cuts) + 1) % len(devices)]
            spent = 3  # the splits people use, scored
        else:
            start = np.asarray(start, dtype=np.int32)
            cuts = cuts_of(start[self.cut_order])
            sequence = start[self.cut_order][[0, *cuts]]
            t, failed = scorer.step_times(start[None])
            best_s, spent = (float("inf") if failed[0] else float(t[0])), 1
        moved = True
        while moved and spent < evals:
            moved = False
            for k in range(len(cuts)):
                lo, hi = cut_range(cuts, k, n, merge=self.options.merge)
                positions = np.array([c for c in range(lo, hi + 1) if c != cuts[k]], dtype=np.int64)
                positions = positions[np.argsort(np.abs(positions - cuts[k]), kind="stable")][: evals - spent]
                if not len(positions):
                    continue
                tried = [cuts[:k] + [int(c)] + cuts[k + 1 :] for c in positions]
                batch = np.stack([sequence[stages_of(c, n)][self.cut_position] for c in tried]).astype(np.int32)
                t, failed = scorer.step_times(batch)
                spent += len(tried)
                t = np.where(np.asarray(failed, dtype=bool), np.inf, np.asarray(t, dtype=np.float64))
                j = int(np.argmin(t))
                if t[j] < best_s * (1 - 1e-9):
                    _, sequence, cuts = split_of(sequence, tried[j], n)
                    best_s, moved = float(t[j]), True
                if spent >= evals or len(cuts) < len(tried[0]):  # spent, or a stage merged away: a new pass
                    break
        self.simulated += spent
        return sequence[stages_of(cuts, n)][self.cut_position].astype(np.int32)

    def _merged(self, split: np.ndarray, k: int, exclude: list[np.ndarray]) -> list[np.ndarray]:
        """With merges (cut moves and ``merge``): the ``k`` plans the plain simulator scores fastest among ``split``
        with one stage merged into a neighbour (each cut onto the next or the one before: a plan on one rank fewer).
        On two ranks these are the whole model on either device (where each logical device is a machine of its own,
        each device's speed alone; where ranks take cores or GPUs in rank order, as ``placer run``'s default device
        map does, both run as rank 0, and the second is a second read of the first)."""
        split = np.asarray(split)[self.cut_order]  # by position in the sequence the cuts move in
        cuts, n = cuts_of(split), self.graph.num_ops
        if k <= 0 or not (self.cut_moves and self.options.merge and cuts):
            return []
        sequence, excluded, plans = split[[0, *cuts]], {placement_key(p) for p in exclude}, []
        for j in range(len(cuts)):
            for c in cut_range(cuts, j, n, merge=True):
                plan = split_of(sequence, cuts[:j] + [c] + cuts[j + 1 :], n)[0][self.cut_position].astype(np.int32)
                if placement_key(plan) not in excluded:
                    excluded.add(placement_key(plan))
                    plans.append(plan)
        if not plans:
            return []
        simulated_s, _ = self.sim.step_times(np.stack(plans))
        self.simulated += len(plans)
        order = [i for i in np.argsort(np.asarray(simulated_s), kind="stable") if np.isfinite(simulated_s[i])]
        return [plans[i] for i in order[:k]]

    def _spread(self, k: int, exclude: list[np.ndarray]) -> list[np.ndarray]:
        """``k`` pooled placements among the simulator's better half, each the farthest (in standardized features)
        from those chosen before."""
        if k <= 0 or not len(self.pool):
            return []
        simulated_s = np.asarray(self.pool.simulated_s)
        good = np.flatnonzero(simulated_s <= np.median(simulated_s))
        x = np.stack(self.pool.features)[good]
        scale = x.std(axis=0)
        z = x / np.where(scale > 0, scale, 1.0)
        chosen_z = [z[int(np.argmin(simulated_s[good]))]]
        excluded = {placement_key(p) for p in exclude}
        picks: list[np.ndarray] = []
        while len(picks) < k:
            dist = np.min([np.linalg.norm(z - c, axis=1) for c in chosen_z], axis=0)
            for j in np.argsort(-dist, kind="stable"):
                p = self.pool.op_devices[good[j]]
                if placement_key(p) not in excluded and dist[j] > 0:
                    break
            else:
                return picks
            excluded.add(placement_key(p))
            picks.append(p)
            chosen_z.append(z[j])
        return picks

    def _kicked(self) -> np.ndarray | None:
        """The fastest placement measured with one item moved to a random device (nothing new was found): one that
        is not measured yet and that the simulator scores (a finite step). Items of the coarsest level first, then of
        finer ones, :data:`KICKED_TRIES` draws in all; None if every draw was measured or refused. With cut moves,
        one cut moved to a random position between its neighbours instead."""
        rng = np.random.default_rng(self.seed + len(self.curve))
        best = self.best_op_devices()
        n, cuts = self.graph.num_ops, cuts_of(best[self.cut_order])
        if self.cut_moves and not cuts:
            return None  # the whole graph on one rank: no cut to move
        for t in range(KICKED_TRIES):
            if self.cut_moves:
                k = int(rng.integers(0, len(cuts)))
                lo, hi = cut_range(cuts, k, n, merge=self.options.merge)
                moved = cuts[:k] + [int(rng.integers(lo, hi + 1))] + cuts[k + 1 :]
                in_order = best[self.cut_order]
                op_devices = in_order[[0, *cuts]][stages_of(moved, n)][self.cut_position].astype(np.int32)
            else:
                level = self.levels[min(t * len(self.levels) // KICKED_TRIES, len(self.levels) - 1)]
                op_devices = best.copy()
                op_devices[level.op_group == rng.integers(0, level.num_items)] = rng.integers(
                    0, self.cluster.num_devices
                )
            if placement_key(op_devices) in self.measured:
                continue
            simulated_s, _ = self.sim.step_times(op_devices[None].astype(np.int32))
            self.simulated += 1
            if np.isfinite(simulated_s[0]):
                return op_devices
        return None

    def noise_width(self) -> float | None:
        """The measurements' noise in log (:func:`noise_width`) over this loop's placements (None: none re-measured)."""
        return noise_width(self.repeats)

    def _confirm(self) -> bool:
        """Measure the fastest placement again where it has one measurement and did not win by over
        :data:`CONFIRM_MARGIN` noise widths; True where it did (the round's measurement)."""
        real_s = np.asarray(self.real_s)
        if self.left() <= 0 or not np.isfinite(real_s).any():
            return False
        order = np.argsort(real_s, kind="stable")
        b = int(order[0])
        if len(self.repeats[b]) > 1:
            return False
        if not worth_confirming(real_s[b], real_s[order[1]] if len(order) > 1 else np.inf, self.noise_width()):
            return False
        t, failed = measure_again(self.real, self.op_devices[b][None].astype(np.int32))
        t = float(t[0]) if not bool(np.asarray(failed)[0]) else float("inf")
        self.repeats[b].append(t)
        self.real_s[b] = float(np.median(self.repeats[b][1:]))
        with np.errstate(divide="ignore", invalid="ignore"):
            self.residual[b] = float(np.log(self.real_s[b] / self.simulated_s[b])) if np.isfinite(t) else np.nan
        self.curve.append(
            Measurement(
                self.rounds,
                t,
                self.simulated_s[b],
                float(real_s[b]),  # what it was expected to measure: its first measurement
                float("nan"),
                float(min(self.real_s)),
                "confirm",
            )
        )
        return True

    def _measure(
        self,
        op_devices: np.ndarray,
        found_by: str,
        predicted: Sequence[float] | None = None,
        bound: Sequence[float] | None = None,
    ) -> None:
        """Measure ``op_devices`` (each once), record each with its simulated time and features."""
        op_devices = np.asarray(op_devices, dtype=np.int32)
        fresh = [k for k, p in enumerate(op_devices) if placement_key(p) not in self.measured]
        if not fresh:
            return
        op_devices = op_devices[fresh]
        simulated_s, _ = self.sim.step_times(op_devices)
        simulated_s = np.asarray(simulated_s, dtype=np.float64)
        x = self.features(op_devices, simulated_s)
        real_s, failed = self.real.step_times(op_devices)
        real_s = np.where(np.asarray(failed, dtype=bool), np.inf, np.asarray(real_s, dtype=np.float64))
        for j, k in enumerate(fresh):
            self.measured[placement_key(op_devices[j])] = len(self.real_s)
            self.op_devices.append(op_devices[j].copy())
            self.real_s.append(float(real_s[j]))
            self.repeats.append([float(real_s[j])])
            self.simulated_s.append(float(simulated_s[j]))
            self.x.append(x[j])
            self.residual.append(float(np.log(real_s[j] / simulated_s[j])) if np.isfinite(real_s[j]) else np.nan)
            pred = predicted[k] if predicted is not None else simulated_s[j]
            self.curve.append(
                Measurement(
                    self.rounds,
                    float(real_s[j]),
                    float(simulated_s[j]),
                    float(pred),
                    float(bound[k]) if bound is not None else float(simulated_s[j]),
                    float(min(self.real_s)),
                    found_by,
                )
            )
