"""What the learner's tests train on: a two-chain graph, and the config or argv of a small ``placer train`` run."""

from __future__ import annotations

from typing import Any

from graphs import OpGraph
from placer.learn.config import TrainConfig


def two_chains(length: int = 4) -> OpGraph:
    """Two independent chains of heavy ops with tiny tensors: the optimum puts one per GPU."""
    names = [f"{c}{i}" for c in "ab" for i in range(length)]
    edges = [(f"{c}{i}", f"{c}{i + 1}", 1024) for c in "ab" for i in range(length - 1)]
    return OpGraph.from_edges(names, edges, flops=[2e11] * len(names), name="two-chains")


def train_config(tmp_path, **fields) -> TrainConfig:
    """A small run's config, logging to ``tmp_path/run``: no grouping, 8 samples, 8 hidden units, no heuristics, no
    progress bar; ``fields`` override any of them."""
    base = dict(max_groups=0, samples=8, logdir=str(tmp_path / "run"), progress=False, heuristics=(), hidden=8)
    return TrainConfig(**{**base, **fields})


def train_argv(path: str, logdir, *extra: str) -> list[str]:
    """``placer train PATH`` on k80x2 with a small policy (8 hidden units, no grouping) logging to ``logdir``."""
    return ["train", path, "--cluster", "k80x2", "--max-groups", "0", "--hidden", "8", "--logdir", str(logdir), *extra]


def spy_on_move_searches(monkeypatch: Any) -> list:
    """Every :class:`placer.learn.move_search.MoveSearch` made from now on (the test's ``monkeypatch`` undoes it), in
    the order made: a run's learner, then its ablation."""
    import placer.learn.move_search as move_search

    made = []
    real_init = move_search.MoveSearch.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(move_search.MoveSearch, "__init__", spy)
    return made
