"""The scorer protocol: one shape for everything that scores placements.

The simulator (:class:`envs.SimEnv` and its :meth:`~envs.SimEnv.in_order` view),
the measured envs (Ray and in-process), the training run's cache and a
benchmark's counting wrapper are all scorers. A scorer has:

* ``evaluate(placements) -> list[Result]``: one :class:`envs.Result` per
  placement (a placement vector, a name -> device mapping or a
  :class:`graphs.Placement`);
* ``step_times(op_devices, order=None) -> (step_time_s, failed)``: the batch
  path. ``op_devices`` is a ``[K, num_ops]`` array of placement vectors (a
  device index per op); it returns two ``[K]`` arrays, the step time in seconds
  of each placement and whether it failed (out of memory, an error, a timeout).
  ``order`` is the issue order: ``None`` (the scorer's own: node order, or the
  one it was made with), ``"planned"`` (each placement in the order the
  simulator plans for it), one order shared by the batch, or ``[K, num_ops]``
  orders. A scorer that cannot run in the order asked raises
  :class:`graphs.PlacerError`.

Where a scorer can, it also has:

* ``overflow(op_devices, order=None) -> (step_time_s, failed, over)``: as
  ``step_times``, with ``over``, per placement, the largest peak / capacity
  over the devices that run out of memory (0 where it fits): how far an
  out-of-memory placement is from fitting (the simulator's);
* ``measure_again(op_devices) -> (step_time_s, failed)``: measure anew,
  bypassing every cache (measured envs: a re-measurement);
* ``close()``: release what it holds (workers, processes).

Every ``step_times`` in the tree has exactly this signature.

>>> import envs
>>> from graphs.synthetic import random_dag
>>> sim = envs.SimEnv(random_dag(10, seed=0), envs.resolve_cluster("k80x2"))
>>> isinstance(sim, Scorer), can_overflow(sim), can_measure_again(sim)
(True, True, False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from envs.result import Result


@runtime_checkable
class Scorer(Protocol):
    """What scores placements: ``evaluate`` one by one, ``step_times`` in a batch (see the module doc)."""

    def evaluate(self, placements: Sequence[Any]) -> list[Result]: ...

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]: ...


def can_overflow(scorer: Any) -> bool:
    """Whether ``scorer`` says how far an out-of-memory placement is over capacity (``overflow``)."""
    return callable(getattr(scorer, "overflow", None))


def can_measure_again(scorer: Any) -> bool:
    """Whether ``scorer`` can measure a placement anew, past its caches (``measure_again``)."""
    return callable(getattr(scorer, "measure_again", None))


def measure_again(scorer: Any, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``op_devices`` measured anew: ``scorer.measure_again`` where it has one, else its ``step_times`` (a scorer
    without caches: each call measures).

    >>> import envs
    >>> from graphs.synthetic import random_dag
    >>> sim, on_one = envs.SimEnv(random_dag(10, seed=0), envs.resolve_cluster("k80x2")), np.zeros((1, 10), np.int32)
    >>> bool(measure_again(sim, on_one)[0][0] == sim.step_times(on_one)[0][0])
    True
    """
    again = scorer.measure_again if can_measure_again(scorer) else scorer.step_times
    return again(op_devices)
