"""A placement environment as a scorer: placer's own learners scored through the Gymnasium interface.

:class:`EnvScorer` has the scorer protocol (:mod:`envs.scorer`), and scores every
placement vector by one episode of a :class:`~placer.gym.views.PlaceAllEnv` whose
items are the ops (``groups=0``): ``reset()``, then ``step(op_devices)``. Given to
``placer.train(config, env=EnvScorer(env))``, placer's REINFORCE is scored through
the same environment an outside agent uses; on the simulator it reproduces
``placer train --algo reinforce`` with the same seed and iterations exactly
(``tests/placer/gym/test_agents_agree.py``), as long as the environment scores in
the run's issue order (``order="planned"`` for ``--score-order planned``, the
default of a simulated run; ``"node"`` for ``--score-order node``).

>>> from graphs.synthetic import random_dag
>>> from placer.gym.views import PlaceAllEnv
>>> scorer = EnvScorer(PlaceAllEnv(random_dag(5), "k80x2", groups=0))
>>> step_time_s, failed = scorer.step_times(np.ones((2, 5), dtype=np.int32))
>>> bool(step_time_s[0] == step_time_s[1] > 0), failed.tolist()
(True, [False, False])
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from envs.result import STATUSES, Result
from graphs import PlacerError
from graphs.plan import as_indices
from placer.gym.views import PlaceAllEnv


class EnvScorer:
    """Scores placement vectors by episodes of a place-all environment whose items are the ops (see the module doc)."""

    source = "gym"

    def __init__(self, env: Any) -> None:
        inner = getattr(env, "unwrapped", env)
        if not isinstance(inner, PlaceAllEnv) or inner.problem.grouping is not None:
            raise PlacerError(
                "EnvScorer: needs a placer/PlaceAll-v0 environment whose items are the ops (groups=0), "
                f"got {type(inner).__name__}"
            )
        self.env, self.problem = env, inner.problem
        self.order = None if inner.problem.order == "node" else inner.problem.order

    def step_times(self, op_devices: np.ndarray, order: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(step_time_s, failed)`` of a ``[K, num_ops]`` batch: one episode per row."""
        if order is not None and not (isinstance(order, str) and order == self.order):
            raise PlacerError(
                f"EnvScorer: order {order!r}: the environment scores in {self.problem.order!r} order "
                "(make it with order='planned' for a run scored in planned order)"
            )
        infos = [self._episode(row) for row in np.asarray(op_devices)]
        return np.array([i["step_time_s"] for i in infos], dtype=float), np.array([i["failed"] for i in infos])

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        """One :class:`envs.Result` per placement (a placement vector, a name -> device mapping or a Placement)."""
        graph, names = self.problem.graph, self.problem.cluster.device_names
        results = []
        for placement in placements:
            info = self._episode(as_indices(placement, graph, names))
            ok = not info["failed"]
            results.append(
                Result(
                    step_time_s=info["step_time_s"] if ok else float("inf"),
                    status="ok" if ok else (info["status"] if info["status"] in STATUSES else "error"),
                    message=info["message"],
                    peak_bytes=info.get("peak_bytes", {}),
                    source=self.source,
                    extra={"sim_step_time_s": info["step_time_s"]},
                )
            )
        return results

    def _episode(self, op_devices: np.ndarray) -> dict[str, Any]:
        self.env.reset()
        _, _, _, _, info = self.env.step(np.asarray(op_devices, dtype=np.int64))
        return info

    def close(self) -> None:
        self.env.close()
