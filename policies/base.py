"""What a placement policy is to the trainer: the :class:`Policy` protocol and log-probability terms.

A policy's ``sample(k)`` returns K placements with their joint log-probability.
A policy whose action has parts (the hierarchical policy: a grouping, then the
devices of its groups) may also say how that log-probability splits into
:class:`LogProbTerm` s, and which samples share each term's actions. The
learning algorithm (:mod:`placer.rl_algos`) credits each action with the summed
advantage of the samples that share it. For an action of its own per sample
that is the sample's advantage; for one action shared by all K samples it is
the batch's advantage sum, which a leave-one-out baseline makes exactly zero:
such an action never learns, and the term makes that visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch


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
    """A placement policy (an ``nn.Module``) as :func:`placer.train.train` uses it.

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
