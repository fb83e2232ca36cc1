"""``placer train --algo corrected``: the measured loop, the simulator corrected by what the measurements say.

One iteration is one round of :class:`placer.learn.measured_search.CorrectedSearch`: fit the correction of the
simulator to every measurement so far (the cluster's rates, then the error they leave), search the corrected
simulator, measure the most promising placement(s) (``--workers`` at once under Ray). Before the first round the
simulator's own best is found and measured, with a few others; the run's warm start (the best measured heuristic) is
measured too. Every measurement goes through the run's scorer (:class:`~placer.learn.session.RunScorer`), so
``best_placement.json`` is the fastest placement measured until the side-by-side at the end. It needs real steps
(``--env measured``, or a scorer given to :func:`placer.train`): under the simulator there is no error to correct.

After the budget, the two fastest measured placements, the one the correction predicts fastest and the simulator's
best are measured again side by side (``--rematch`` times each); the one judged fastest by its reads and the
correction's prediction together is the run's best at its median (``best_placement.json``; the fastest single
measurement is biased low; :meth:`placer.learn.measured_search.CorrectedSearch.rematch`). The run's usual rematch
against the best measured heuristic follows, and ``correction.json`` in the run directory holds the curve (each
measurement with what the simulator and the correction predicted for it), the side-by-side and the correction's
weights.

TensorBoard, per round: ``charts/best_step_time_s``, ``charts/measured_step_time_s`` (this round's measurement),
``charts/simulated_step_time_s`` and ``charts/corrected_step_time_s`` (what the simulator and the correction
predicted for it), ``losses/correction_noise_std`` (the residual's fitted noise), ``rates/speed/<device>`` and
``rates/host links``, ``rates/device links`` (each rate refitted, over the cluster file's).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import envs
from graphs import PlacerError
from placer.learn import checkpoint
from placer.learn.measured_search import CorrectedSearch, CorrectedSearchOptions
from placer.learn.move_runner import run_start, search_options
from placer.learn.session import RunScorer, Session, add_scalars
from placer.learn.state import CORRECTED_SEARCH

#: The run directory's record of the measured loop.
CORRECTION_NAME = "correction.json"


class SessionMeasurements:
    """The session's scorer as the loop's real scorer: measurements through the run (cached, its best kept),
    re-measurements past every cache."""

    def __init__(self, session: Session) -> None:
        self.session, self.scorer = session, RunScorer(session, CORRECTED_SEARCH)

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        return self.scorer.step_times(op_devices, order)

    def measure_again(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.session.scorer.fresh(np.asarray(op_devices, dtype=np.int32))


class CorrectedRunner:
    """``--algo corrected``: the measured loop as the run's learner; :meth:`run` is the loop.

    ``saved``: the checkpoint's tensors (the loop keeps none: a resumed run starts from the run's best with a
    fresh correction, its measurements read back from the measured env's log, not measured again).
    """

    phase = "corrected search"

    def __init__(self, session: Session, saved: dict[str, Any] | None) -> None:
        c = session.config
        if isinstance(session.scorer.env, envs.SimEnv):
            raise PlacerError(
                "--algo corrected: needs real measurements (--env measured); under the simulator there is no "
                "error to correct"
            )
        self.session, self.resumed = session, saved is not None
        self.search = CorrectedSearch(
            session.graph,
            session.cluster,
            SessionMeasurements(session),
            sim=session.sim,
            options=CorrectedSearchOptions(measurements=1 << 30, batch=c.workers or 1, rematch=c.rematch),
            seed=c.seed,
            search_options=search_options(c),
        )
        self.start = run_start(session, self.resumed, "corrected search")

    @property
    def num_items(self) -> int:
        """The items of the searches' finest level."""
        return self.search.levels[-1].num_items

    def tensors(self) -> dict[str, Any]:
        """Nothing: the correction is refitted from the measurements (see the class doc)."""
        return {}

    def run(self, writer: Any) -> None:
        """The simulator's best measured, then until the budget is spent: fit -> search -> measure -> log ->
        checkpoint; then the side-by-side with the simulator's best."""
        session, c, s = self.session, self.session.config, self.session.state
        if not c.resume:
            session.save_checkpoint(self.tensors())
        session.start_progress(self.phase, "one round of fit, search on the corrected simulator, measure")
        if session.done():
            return
        self.search.begin(self.start)
        while not session.done():
            it = s.iteration
            # one round: fit the correction, search the corrected simulator, measure the most promising
            if not self.search.step():
                session.progress.phase(
                    "nothing new to measure near the best placement (every placement the simulator scores there is"
                    " measured): ending early"
                )
                break
            # log
            last = self.search.curve[-1]
            scalars = {
                "charts/best_step_time_s": s.best_step_time_s,
                "charts/measured_step_time_s": last.real_s,
                "charts/simulated_step_time_s": last.simulated_s,
                "charts/corrected_step_time_s": last.predicted_s,
                "charts/measurements": len(self.search.curve),
                "losses/correction_noise_std": self.search.model.noise_std,
            }
            if self.search.rate_fit is not None:  # each rate refitted, over the cluster file's
                scalars |= {f"rates/{name}": w for name, w in self.search.rate_fit.weights().items()}
            add_scalars(writer, {k: v for k, v in scalars.items() if np.isfinite(v)}, it)
            # checkpoint (when due)
            session.iteration_done(self.tensors)
        self._side_by_side()

    def _side_by_side(self) -> None:
        """The fastest measured, the correction's pick and the simulator's best, measured again side by side (the
        winner is the run's best); ``correction.json``."""
        session, n = self.session, self.search.options.rematch
        if n:
            k = self.search.options.finalists
            fastest = "the fastest placement measured" if k == 1 else f"the {k} fastest placements measured"
            session.progress.phase(
                f"re-measuring {fastest}, the correction's pick and the simulator's best side by side, {n} times each:"
                " the one judged fastest by its reads and the correction together is the run's best"
            )
        self.search.rematch()
        result = self.search.result()
        if result.chosen != "best":  # the side-by-side's winner is not the fastest measured: it is the run's best
            which = {
                "simulator": "the simulator's best",
                "model": "the correction's pick (the measured placement it predicts fastest)",
            }.get(result.chosen, f"the {result.chosen} fastest measured")
            session.progress.phase(
                f"side by side, {which} is judged fastest (median {result.step_time_s * 1e3:.3f} ms): it is the run's"
                " best placement"
            )
        if result.rematch:  # the winner at its median, even the fastest measured: its fastest read was biased low
            session.adopt(result.op_devices, result.step_time_s, CORRECTED_SEARCH, {"corrected search": result.rematch})
        doc = result.to_dict()
        doc["simulator_op_devices"] = result.simulator_op_devices.tolist()
        checkpoint.write_json(os.path.join(session.logdir, CORRECTION_NAME), doc)
        if result.speedup() is not None:
            session.progress.phase(
                f"side by side: the best measured {np.median(result.rematch['best']) * 1e3:.3f} ms, the simulator's "
                f"best {np.median(result.rematch['simulator']) * 1e3:.3f} ms (medians; the best measured is "
                f"{result.speedup():.3f}x as fast)"
            )
