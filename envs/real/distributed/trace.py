"""Each rank's actions in a real step, timed: which stage's forward or backward of which microbatch ran when.

:class:`ActionRecorder` wraps, on this rank's objects only, the methods torch's
pipeline runtime calls for each action (every schedule calls them, the built-in ones
and the custom action lists alike): each ``PipelineStage``'s ``forward_one_chunk``
(``F``), ``backward_one_chunk`` (``B``; ``I`` where a zero-bubble schedule asks for its input part only) and
``backward_weight_one_chunk`` (``W``), and
the optimizer's ``step`` (``O``). Nothing of torch is patched globally, and a wrapper
costs a microsecond per action.

A step begins where every rank has passed the step's barrier
(:class:`~envs.real.distributed.worker.PipelineStep` calls :meth:`ActionRecorder.begin_step`)
and ends when the rank's optimizer step returns. What an action's time holds: its
stage's compute, plus torch's bookkeeping around it (retrieving the received
tensors, caching the outputs for the backward). Waiting for receives, and the sends,
fall between actions: they are the ``other_s`` of :func:`envs.timeline.phases`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from envs.timeline import Event, median_phases, phases

#: The stage methods timed, and the kind of action each is.
STAGE_METHODS = {"forward_one_chunk": "F", "backward_one_chunk": "B", "backward_weight_one_chunk": "W"}


def _microbatch(args: tuple, kwargs: dict) -> int:
    """The microbatch (chunk) index an action method was called with: its first argument."""
    if args:
        return int(args[0])
    for key in ("fwd_chunk_id", "bwd_chunk_id"):
        if key in kwargs:
            return int(kwargs[key])
    return -1


class ActionRecorder:
    """Records this rank's actions step by step (module doc); ``steps[k]``: step k's events, seconds from its
    start; ``step_s[k]``: its length (to the end of the optimizer step)."""

    def __init__(self, rank: int, stages: Sequence[Any], optimizer: Any, clock: Any = time.perf_counter) -> None:
        self.rank, self.clock = rank, clock
        self.steps: list[list[Event]] = []
        self.step_s: list[float] = []
        self._t0: float | None = None
        for stage in stages:
            inner = getattr(stage, "placer_compute", None)  # receives posted early: time the compute, not the wait
            for method, kind in STAGE_METHODS.items():
                if inner is not None and method in inner:
                    inner[method] = self._timed(inner[method], kind, int(stage.stage_index))
                elif hasattr(stage, method):
                    setattr(stage, method, self._timed(getattr(stage, method), kind, int(stage.stage_index)))
        if hasattr(optimizer, "step"):
            optimizer.step = self._timed(optimizer.step, "O", -1, ends_step=True)

    def begin_step(self) -> None:
        """A step starts now (every rank has passed its barrier)."""
        self._t0 = self.clock()
        self.steps.append([])

    def _timed(self, fn: Any, kind: str, stage: int, ends_step: bool = False) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                end = self.clock()
                if self._t0 is not None:
                    m = -1 if kind == "O" else _microbatch(args, kwargs)
                    what = "I" if kind == "B" and kwargs.get("full_backward") is False else kind
                    self.steps[-1].append(Event(self.rank, stage, what, m, start - self._t0, end - self._t0))
                    if ends_step:
                        self.step_s.append(end - self._t0)
                        self._t0 = None

        return timed

    def report(self, last: int) -> dict[str, Any]:
        """The last ``last`` finished steps (the timed ones): ``{"phases": medians, "trace": [[event rows] per
        step]}`` (rows: :meth:`envs.timeline.Event.to_list`)."""
        done = min(len(self.step_s), len(self.steps))
        keep = range(max(0, done - last), done)
        per_step = [phases(self.steps[k], self.step_s[k]) for k in keep]
        return {
            "phases": median_phases(per_step),
            "trace": [[e.to_list() for e in self.steps[k]] for k in keep],
        }


__all__ = ["ActionRecorder", "STAGE_METHODS"]
