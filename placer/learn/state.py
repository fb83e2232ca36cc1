"""What a training run records: :class:`RunState` (the loop's state, saved in every checkpoint) and
:class:`TrainResult`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphs import PlacerError
from graphs.plan import Placement
from placer.methods import best_heuristic

#: ``found_by`` of a placement the move search found, and of one its module_search share found (the search's start).
MOVE_SEARCH = "move search"
MODULE_SHARE = "module_search, the move search's start"
#: ``found_by`` of a placement the measured loop found (``--algo corrected``: the simulator corrected by measurements).
CORRECTED_SEARCH = "corrected search"


@dataclass
class RunState:
    """The training loop's state: everything besides tensors that a resumed run continues from.

    Saved as JSON in every checkpoint (``checkpoint.json``'s ``run``); plain
    numbers, strings and lists only, so checkpoints load with ``weights_only=True``.
    """

    iteration: int = 0
    elapsed_s: float = 0.0
    baseline: float | None = None  # the EMA reward baseline (None before the first batch)
    best_step_time_s: float = float("inf")
    best_indices: list[int] | None = None  # device index per op of the best placement
    best_found_by: str = ""  # "sample", "greedy", "heuristic:<name>" (the incumbent no sample beat), or the move
    # search's: MOVE_SEARCH, MODULE_SHARE
    best_iteration: int = -1
    time_to_best_s: float = float("nan")
    time_to_beat_heuristic_s: float | None = None
    warm_start: str = "none"  # how the policy was warm-started, for the record
    warm_start_indices: list[int] | None = None  # the imitated placement (the policy's items are cut by it)
    warm_start_step_time_s: float | None = None
    warm_start_cut_short: bool = (
        False  # the time budget stopped the imitation before its greedy decoding was the target
    )
    policy_step_time_s: float = float("inf")  # the best placement the learner found (the incumbent aside)
    setup_s: float = 0.0
    # placements the run simulated up to this checkpoint, every session of it (resumed ones too), and of them the
    # heuristics': the equal-budget search is given the whole run's
    simulated: int = 0
    heuristics_simulated: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON values: ``dataclasses.asdict``'s result, its lists copied, in a hundredth of its time (it
        copies each of a large graph's op indices one call at a time: 5 ms a checkpoint at 2,383 ops)."""
        return {f.name: _copied(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str = "checkpoint") -> "RunState":
        """The state of a checkpoint's ``run`` object (unknown keys ignored); PlacerError if a value has the wrong
        type."""
        state = cls()
        for f in dataclasses.fields(cls):
            if f.name in doc:
                base, _, optional = str(f.type).partition(" | ")
                value = doc[f.name]
                if not ((value is None and optional == "None") or _JSON_CHECKS[base](value)):
                    raise PlacerError(f"--resume: {where} has run.{f.name} = {value!r}, not a {f.type}")
                setattr(state, f.name, value)
        if "policy_step_time_s" not in doc and state.best_found_by in ("sample", "greedy"):  # an older checkpoint
            state.policy_step_time_s = state.best_step_time_s
        return state


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_JSON_CHECKS = {
    "bool": lambda v: isinstance(v, bool),
    "int": is_int,
    "float": lambda v: is_int(v) or isinstance(v, float),
    "str": lambda v: isinstance(v, str),
    "list[int]": lambda v: isinstance(v, list) and all(is_int(i) for i in v),
}


@dataclass
class TrainResult:
    """What a run produced.

    ``heuristics``, ``expert_step_time_s`` and ``lower_bound_s`` are simulated, whatever
    the run's scorer; a measured run (``env == "measured"``) also has
    ``measured_heuristics``, and its best heuristic is the best of those (its JSON's
    ``best_heuristic_source`` says which kind of time it is).
    """

    best_step_time_s: float
    best_placement: Placement | None
    iterations: int
    elapsed_s: float
    time_to_best_s: float
    logdir: str
    heuristics: dict[str, float] = field(default_factory=dict)
    lower_bound_s: float | None = None
    reference_step_time_s: float = float("nan")
    time_to_beat_heuristic_s: float | None = None
    interrupted: bool = False
    setup_s: float = 0.0
    num_items: int = 0
    warm_start: str = "none"
    warm_start_step_time_s: float | None = None
    score_order: str = "node"  # the issue order every time here (samples, heuristics) was scored in
    # module_search given as many simulated placements as the run used: {method, simulated, step_time_s, wall_s}
    equal_budget_search: dict[str, Any] | None = None
    ablation: dict[str, Any] | None = None
    # --env measured: the best placement and the best heuristic's re-measured side by side
    # {heuristic, rounds, learned_s, heuristic_s} (medians; None where every re-measurement failed)
    rematch: dict[str, Any] | None = None
    warm_start_cut_short: bool = False
    policy_step_time_s: float = float("inf")  # the learner's own best (best_step_time_s may be a heuristic's)
    found_by: str = ""  # of the best placement: "sample", "greedy", "heuristic:<name>" or the move search's
    measured_heuristics: dict[str, float] = field(default_factory=dict)  # --env measured: on the run's workers
    env: str = "sim"  # the scorer of the samples: "sim" or "measured"
    homes_searched: bool = False  # the learner searched parameter homes too (--homes; placer.learn.home_moves)
    checkpointing_searched: bool = False  # its placements checkpointed layers (--checkpointing; checkpoint_choice)
    # --algo moves|corrected: the critic the move search started from ("pretrained", "fresh" or a critic file; --critic
    # auto resolved), None with uniform proposals or a policy network
    critic: str | None = None

    @property
    def best_heuristic(self) -> tuple[str, float] | None:
        """``(name, step time)`` of the fastest heuristic of the run (:func:`placer.methods.best_heuristic`):
        of the measured ones in a measured run that measured some, else of the simulated ones."""
        return best_heuristic(self.measured_heuristics if self.measured_heuristics else self.heuristics)

    @property
    def best_heuristic_source(self) -> str:
        """How the best heuristic's time was obtained: "measured" or "simulated"."""
        return "measured" if self.measured_heuristics else "simulated"

    def to_dict(self) -> dict[str, Any]:
        bh = self.best_heuristic
        fin = lambda x: x if x is not None and np.isfinite(x) else None  # noqa: E731
        meta = self.best_placement.meta if self.best_placement is not None else {}
        return {
            # "no_placement": no sampled placement ran (all out of memory or failed), so the times are null
            "status": "ok" if self.best_placement is not None else "no_placement",
            "best_step_time_s": fin(self.best_step_time_s),
            "iterations": self.iterations,
            "elapsed_s": self.elapsed_s,
            "time_to_best_s": fin(self.time_to_best_s),
            "time_to_beat_heuristic_s": self.time_to_beat_heuristic_s,
            "best_heuristic": bh[0] if bh else None,
            "best_heuristic_step_time_s": fin(bh[1]) if bh else None,
            "best_heuristic_source": self.best_heuristic_source,
            "env": self.env,
            "measured_heuristics": {k: fin(v) for k, v in self.measured_heuristics.items()},
            "expert_step_time_s": fin(self.heuristics.get("expert")),
            "heuristics": {k: fin(v) for k, v in self.heuristics.items()},
            "score_order": self.score_order,
            "lower_bound_s": fin(self.lower_bound_s),
            "reference_step_time_s": fin(self.reference_step_time_s),
            "logdir": self.logdir,
            "interrupted": self.interrupted,
            "setup_s": self.setup_s,
            "num_items": self.num_items,
            "warm_start": self.warm_start,
            "warm_start_step_time_s": fin(self.warm_start_step_time_s),
            # the time budget stopped the imitation early: RL started from a policy that is not yet the heuristic
            "warm_start_cut_short": self.warm_start_cut_short,
            # who found the best placement ("sample", "greedy", the move search's, or "heuristic:<name>": no placement
            # the learner found was faster, so best_placement.json holds that heuristic's), and the learner's own best
            "found_by": self.found_by,
            "policy_step_time_s": fin(self.policy_step_time_s),
            "best_placement": os.path.join(self.logdir, "best_placement.json") if self.best_placement else None,
            # the issue order the placement file carries and its simulated (eager) step time
            "issue_order": meta.get("issue_order"),
            "issue_order_step_time_s": fin(meta.get("issue_order_step_time_s")),
            "equal_budget_search": self.equal_budget_search,
            "ablation": self.ablation,
            "rematch": self.rematch,
            "homes_searched": self.homes_searched,
            "checkpointing_searched": self.checkpointing_searched,
            "critic": self.critic,
        }
