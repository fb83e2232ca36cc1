"""What a placement policy is to the trainer: the :class:`Policy` protocol, its samples, its items.

A policy decides *items*: the ops of a graph, or the groups of a grouping (the
coarsened co-location groups of :func:`item_grouping`, a module grouping, or the
hierarchical policy's learned groups); ``expand`` maps item devices to op
devices, ``contract`` op devices to item devices (:class:`ItemPolicy`).

A policy's ``sample(k)`` returns K placements with their joint log-probability.
A policy whose action has parts (the hierarchical policy: a grouping, then the
devices of its groups) may also say how that log-probability splits into
:class:`LogProbTerm` s, and which samples share each term's actions. The
learning algorithm (:mod:`placer.learn.algos`) credits each action with the summed
advantage of the samples that share it. For an action of its own per sample
that is the sample's advantage; for one action shared by all K samples it is
the batch's advantage sum, which a leave-one-out reward baseline makes exactly zero:
such an action never learns, and the term makes that visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from graphs import OpGraph
from graphs.grouping import Grouping, coarsen, refine_grouping


@dataclass(frozen=True)
class LogProbTerm:
    """One part of K samples' joint log-probability.

    ``log_prob [A]`` holds the log-probability of A actions; ``owner [K]`` (int64)
    maps sample k to the action it used (several samples may share one). ``None``
    means one action per sample (A == K, sample k used action k).
    """

    log_prob: torch.Tensor
    owner: torch.Tensor | None = None
    name: str = "placement"


class PolicySample(NamedTuple):
    """What a policy's ``sample`` returns.

    ``actions`` is everything ``log_prob`` needs to re-score the same samples;
    ``op_devices`` is the device index of every op, ``[K, num_ops]`` int32.
    """

    actions: dict[str, torch.Tensor]
    log_prob: torch.Tensor
    entropy: torch.Tensor
    op_devices: np.ndarray


@runtime_checkable
class PolicySampleLike(Protocol):
    """What ``Policy.sample`` returns (:class:`policies.PolicySample`)."""

    @property
    def actions(self) -> dict[str, torch.Tensor]: ...  # what log_prob needs to re-score the samples
    @property
    def log_prob(self) -> torch.Tensor: ...  # [K] joint, differentiable
    @property
    def entropy(self) -> torch.Tensor: ...  # [K] mean per item
    @property
    def op_devices(self) -> np.ndarray: ...  # [K, num_ops] int32


@runtime_checkable
class Policy(Protocol):
    """A placement policy (an ``nn.Module``) as :func:`placer.learn.loop.train` uses it.

    Built as ``cls(graph, num_devices, max_groups=, hidden=, layers=, temperature=, tanh_c=, refine=)``.
    A sample may carry ``terms`` (a sequence of :class:`LogProbTerm` summing to its
    ``log_prob``); without them its ``log_prob`` is one term, an action per sample.
    Sampling modules with a ``logit_noise`` attribute (a float) add Gaussian noise of
    that std to their logits while sampling (not while scoring).
    """

    num_items: int

    def sample(self, k: int, *, generator: torch.Generator | None = None) -> PolicySampleLike: ...
    def log_prob(self, actions: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]: ...
    def greedy(self) -> np.ndarray: ...
    def imitation_loss(self, op_devices: np.ndarray) -> torch.Tensor: ...
    def parameters(self, recurse: bool = True) -> Any: ...
    def modules(self) -> Any: ...
    def state_dict(self, *args: Any, **kwargs: Any) -> Any: ...
    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any: ...


def item_grouping(graph: OpGraph, max_groups: int, refine: np.ndarray | None = None) -> Grouping | None:
    """The items of a policy: co-location groups coarsened to at most ``max_groups``; None (one item per op) for 0.

    With ``refine`` (a device per op), each group is further cut wherever that
    placement changes device along the topological order, so the placement is
    exactly representable by the items (:func:`graphs.grouping.refine_grouping`).
    """
    if max_groups <= 0 or graph.num_ops <= 1:
        return None
    grouping = coarsen(graph, max_groups)
    return refine_grouping(graph, grouping, refine) if refine is not None else grouping


class ItemPolicy(nn.Module):
    """A policy whose items are the ops of its graph or the groups of a fixed :class:`graphs.grouping.Grouping`.

    Subclasses set ``grouping`` (None: every op is an item), ``num_ops``,
    ``num_items`` and ``num_devices``.
    """

    grouping: Grouping | None = None
    num_ops: int
    num_items: int
    num_devices: int

    def expand(self, item_devices: np.ndarray) -> np.ndarray:
        """Item devices ``[..., num_items]`` -> op devices ``[..., num_ops]`` (int32)."""
        if self.grouping is None:
            return np.asarray(item_devices, dtype=np.int32)
        return np.asarray(self.grouping.expand(np.asarray(item_devices)), dtype=np.int32)

    def contract(self, op_devices: np.ndarray) -> np.ndarray:
        """Op devices ``[..., num_ops]`` -> item devices, by majority vote inside each item (int64)."""
        if self.grouping is None:
            return np.asarray(op_devices, dtype=np.int64)
        return self.grouping.vote(op_devices, self.num_devices)
