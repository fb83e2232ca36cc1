"""The Gymnasium environments: three views of one placement problem (:class:`~placer.gym.problem.Problem`).

* :class:`PlaceAllEnv` (``placer/PlaceAll-v0``), the paper's: one action places every item (a
  MultiDiscrete of a device per item); the episode is that one step.
* :class:`PlaceSequentialEnv` (``placer/PlaceSequential-v0``), the seq2seq decoding: one item per step,
  in topological order (a Discrete device); the placement is scored after the last item.
* :class:`MoveItemEnv` (``placer/MoveItem-v0``), Placeto's: from an incumbent (``start``), each step moves
  one item to a device (MultiDiscrete ``[item, device]``) and scores the new placement; ``max_moves`` steps.

Reward: :meth:`Problem.reward` of the scored placement (placer's REINFORCE reward: ``-sqrt(step_time_s /
t_ref)``, a failed placement ``-sqrt(fail_factor)``); 0 on the sequential view's unscored steps; on the move
view, the change of that reward since the previous placement, so an episode's return is the last
placement's reward minus the start's. ``info`` of a scored step: ``step_time_s`` (the scorer's: the
simulator's ignores memory), ``failed``, ``status``, ``message``, ``peak_bytes`` (device -> bytes, with
``peak_memory``), ``op_devices`` (the placement vector, a device per op), ``item_devices`` and ``t_ref_s``.

Each takes the problem's keywords (``graph``, ``cluster``, ``scorer``, ``groups``, ``order``,
``fail_factor``, ``peak_memory``, ``scorer_options``) and the observation's (``max_items``, ``max_edges``,
``flatten``: :mod:`placer.gym.observation`). An action outside the action space, or a step outside an
episode, is a one-line :class:`graphs.PlacerError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from graphs import PlacerError
from graphs.plan import single_device_rows
from placer.gym.observation import Observer
from placer.gym.problem import Outcome, Problem

ObsInfo = tuple[Any, dict[str, Any]]
Transition = tuple[Any, float, bool, bool, dict[str, Any]]


class PlacementEnv(gym.Env):
    """What the views share: the problem, the observation, scoring a placement, the action check."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    view: ClassVar[str] = ""

    def __init__(
        self,
        graph: Any = None,
        cluster: Any = None,
        scorer: Any = "sim",
        *,
        max_items: int | None = None,
        max_edges: int | None = None,
        flatten: bool = False,
        **problem_options: Any,
    ) -> None:
        self.problem = Problem(graph, cluster, scorer, **problem_options)
        self.observer = Observer(self.problem, max_items=max_items, max_edges=max_edges, flatten=flatten)
        self.observation_space = self.observer.space
        self.num_items, self.num_devices = self.problem.num_items, self.problem.num_devices
        self.in_episode = False

    def score(self, item_devices: np.ndarray) -> tuple[float, dict[str, Any]]:
        """``(reward, info)`` of placing the items on ``item_devices``."""
        op_devices = self.problem.expand(item_devices)
        outcome = self.problem.score(op_devices)
        return self.problem.reward(outcome), self.scored_info(outcome, op_devices, item_devices)

    def scored_info(self, outcome: Outcome, op_devices: np.ndarray, item_devices: np.ndarray) -> dict[str, Any]:
        info: dict[str, Any] = {
            "step_time_s": outcome.step_time_s,
            "failed": outcome.failed,
            "status": outcome.status,
            "message": outcome.message,
            "op_devices": op_devices,
            "item_devices": np.asarray(item_devices, dtype=np.int64).copy(),
            "t_ref_s": self.problem.t_ref,
        }
        if outcome.peak_bytes is not None:
            info["peak_bytes"] = outcome.peak_bytes
        return info

    def checked(self, action: Any) -> np.ndarray:
        """``action`` as an int64 array, if it is in the action space and an episode runs; else a PlacerError."""
        if not self.in_episode:
            raise PlacerError(f"{self.view}: step() outside an episode: call reset() first (and after it ends)")
        a = np.asarray(action)
        if a.dtype.kind not in "iu" or not self.action_space.contains(a if a.ndim else a.item()):
            shown = np.array2string(a.ravel()[:8], separator=",") + ("..." if a.size > 8 else "")
            raise PlacerError(
                f"{self.view}: action {shown} (shape {a.shape}) is not in the action space: "
                f"{described(self.action_space)}"
            )
        return a.astype(np.int64)

    def to_placement(self, op_devices: np.ndarray) -> Any:
        """A :class:`graphs.Placement` of a placement vector (``info["op_devices"]``), to save or apply."""
        return self.problem.placement(op_devices, method=f"gym:{self.view}")

    def close(self) -> None:
        self.problem.close()


def described(space: spaces.Space) -> str:
    """An action space in one line (a MultiDiscrete's repr spans lines).

    >>> described(spaces.MultiDiscrete([4, 3])), described(spaces.Discrete(3))
    ('2 integers, in [0, 4) x [0, 3)', 'an integer in [0, 3)')
    """
    if isinstance(space, spaces.Discrete):
        return f"an integer in [{space.start}, {space.start + space.n})"
    nvec = np.asarray(space.nvec)
    if len(set(nvec.tolist())) == 1:
        return f"{len(nvec)} integers, each in [0, {nvec[0]})"
    return f"{len(nvec)} integers, in " + " x ".join(f"[0, {n})" for n in nvec.tolist())


class PlaceAllEnv(PlacementEnv):
    """The paper's view: one action, a device per item, places everything; the episode is one step."""

    view = "PlaceAll"

    def __init__(self, graph: Any = None, cluster: Any = None, scorer: Any = "sim", **options: Any) -> None:
        super().__init__(graph, cluster, scorer, **options)
        self.action_space = spaces.MultiDiscrete(np.full(self.observer.max_items, self.num_devices, dtype=np.int64))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ObsInfo:
        super().reset(seed=seed)
        self.in_episode = True
        return self.observer.observe(None, None), {}

    def step(self, action: Any) -> Transition:
        item_devices = self.checked(action)[: self.num_items]  # the padding's entries place nothing
        self.in_episode = False
        reward, info = self.score(item_devices)
        return self.observer.observe(item_devices, None), reward, True, False, info


class PlaceSequentialEnv(PlacementEnv):
    """The seq2seq decoding: one item per step, in topological order; scored after the last one."""

    view = "PlaceSequential"

    def __init__(self, graph: Any = None, cluster: Any = None, scorer: Any = "sim", **options: Any) -> None:
        super().__init__(graph, cluster, scorer, **options)
        self.action_space = spaces.Discrete(self.num_devices)
        self.item_devices = np.full(self.num_items, self.num_devices, dtype=np.int64)
        self.cursor = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ObsInfo:
        super().reset(seed=seed)
        self.item_devices[:] = self.num_devices
        self.cursor, self.in_episode = 0, True
        return self.observer.observe(self.item_devices, 0), {"item_devices": self.item_devices.copy()}

    def step(self, action: Any) -> Transition:
        device = int(self.checked(action))
        self.item_devices[self.cursor] = device
        self.cursor += 1
        if self.cursor < self.num_items:
            obs = self.observer.observe(self.item_devices, self.cursor)
            return obs, 0.0, False, False, {"item_devices": self.item_devices.copy()}
        self.in_episode = False
        reward, info = self.score(self.item_devices)
        return self.observer.observe(self.item_devices, None), reward, True, False, info


class MoveItemEnv(PlacementEnv):
    """Placeto's view: from an incumbent, each step moves one item to a device and scores the placement.

    Args:
        start: the incumbent each episode starts from: ``"single"`` (default: every item on the fastest single
            device, memory ignored), ``"random"`` (a device per item drawn with the episode's seed), a heuristic's
            name (:func:`placer.methods.names`; its placement, voted onto the items) or a placement vector.
        max_moves: steps per episode (default: the number of items); the episode is then truncated.
    """

    view = "MoveItem"

    def __init__(
        self,
        graph: Any = None,
        cluster: Any = None,
        scorer: Any = "sim",
        *,
        start: Any = "single",
        max_moves: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(graph, cluster, scorer, **options)
        self.action_space = spaces.MultiDiscrete(np.array([self.observer.max_items, self.num_devices], dtype=np.int64))
        self.max_moves = self.num_items if max_moves is None else max_moves
        if isinstance(self.max_moves, bool) or not isinstance(self.max_moves, (int, np.integer)) or self.max_moves < 1:
            raise PlacerError(f"{self.view}: max_moves={max_moves!r}: give a whole number >= 1")
        self.start = start
        self.fixed_start = None if isinstance(start, str) and start == "random" else self._start_items(start)
        self.item_devices = np.zeros(self.num_items, dtype=np.int64)
        self.moves, self.last_reward = 0, 0.0

    def _start_items(self, start: Any) -> np.ndarray:
        """The device per item of a fixed start (``"single"``, a heuristic's name or a placement vector)."""
        p = self.problem
        if isinstance(start, str) and start == "single":
            step_time_s, _ = p.step_times(single_device_rows(p.num_devices, p.graph.num_ops))
            return np.full(self.num_items, int(np.argmin(step_time_s)), dtype=np.int64)
        if isinstance(start, str):
            from placer.methods import registry  # the heuristics load on first use

            if start not in registry.names():
                raise PlacerError(
                    f"{self.view}: start={start!r}: not single, random nor a heuristic ({', '.join(registry.names())})"
                )
            start = registry.place(start, p.graph, p.cluster).indices(p.graph, p.cluster.device_names)
        op_devices = np.asarray(start)
        if op_devices.shape != (p.graph.num_ops,) or op_devices.dtype.kind not in "iu":
            raise PlacerError(f"{self.view}: start: give a device index per op ({p.graph.num_ops} ints)")
        if op_devices.min() < 0 or op_devices.max() >= p.num_devices:
            raise PlacerError(f"{self.view}: start: device index out of range [0, {p.num_devices})")
        return p.contract(op_devices)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ObsInfo:
        super().reset(seed=seed)
        if self.fixed_start is not None:
            self.item_devices[:] = self.fixed_start
        else:
            self.item_devices[:] = self.np_random.integers(0, self.num_devices, size=self.num_items)
        self.moves, self.in_episode = 0, True
        self.last_reward, info = self.score(self.item_devices)
        return self.observer.observe(self.item_devices, None), info

    def step(self, action: Any) -> Transition:
        item, device = (int(x) for x in self.checked(action))
        if item < self.num_items:  # an item of the padding moves nothing
            self.item_devices[item] = device
        self.moves += 1
        reward, info = self.score(self.item_devices)
        gain, self.last_reward = reward - self.last_reward, reward
        truncated = self.moves >= self.max_moves
        self.in_episode = not truncated
        return self.observer.observe(self.item_devices, None), gain, False, truncated, info


#: Gymnasium id -> the environment class it makes (registered by :mod:`placer.gym`).
ENV_IDS: dict[str, type[PlacementEnv]] = {
    "placer/PlaceAll-v0": PlaceAllEnv,
    "placer/PlaceSequential-v0": PlaceSequentialEnv,
    "placer/MoveItem-v0": MoveItemEnv,
}
