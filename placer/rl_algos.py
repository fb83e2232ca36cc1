"""Policy-gradient updates for :mod:`placer.train`: REINFORCE, PPO, and the imitation warm start.

Each algorithm is a pair of functions over a policy (see :mod:`policies`):
``sample(policy, k, generator)`` and ``update(policy, optimizer, sample,
advantages, config) -> (policy_loss, entropy)``; ``ALGOS`` maps names to them.
"""

from __future__ import annotations

from typing import Any

import time

import numpy as np
import torch


class Reinforce:
    """REINFORCE: sample with gradients, loss = -adv * log p - entropy bonus."""

    @staticmethod
    def sample(policy: Any, k: int, gen: torch.Generator) -> Any:
        return policy.sample(k, generator=gen)

    @staticmethod
    def update(policy: Any, optimizer: torch.optim.Optimizer, sample: Any, adv: torch.Tensor, config: Any) -> tuple[float, float]:
        num_items = getattr(policy, "num_items", 1)
        loss_pg = -(adv * sample.log_prob).mean() / num_items  # per-item scale: lr independent of graph size
        entropy = sample.entropy.mean()
        loss = loss_pg - config.entropy_coef * entropy
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip)
        optimizer.step()
        return float(loss_pg.detach()), float(entropy.detach())


class PPO:
    """PPO: sample without gradients, then ``ppo_epochs`` clipped-surrogate updates."""

    @staticmethod
    def sample(policy: Any, k: int, gen: torch.Generator) -> Any:
        with torch.no_grad():
            return policy.sample(k, generator=gen)

    @staticmethod
    def update(policy: Any, optimizer: torch.optim.Optimizer, sample: Any, adv: torch.Tensor, config: Any) -> tuple[float, float]:
        old = sample.log_prob.detach()
        loss_pg = entropy = torch.zeros(())
        for _ in range(config.ppo_epochs):
            logp, ent = policy.log_prob(sample.actions)
            ratio = torch.exp(logp - old)
            loss_pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - config.ppo_clip, 1 + config.ppo_clip) * adv).mean()
            entropy = ent.mean()
            optimizer.zero_grad()
            (loss_pg - config.entropy_coef * entropy).backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip)
            optimizer.step()
        return float(loss_pg.detach()), float(entropy.detach())


ALGOS: dict[str, Any] = {"reinforce": Reinforce, "ppo": PPO}


def reward(step_times: np.ndarray, failed: np.ndarray, t_ref: float, fail_factor: float) -> np.ndarray:
    """The training reward of a batch: ``-sqrt(cost / t_ref)`` (see :mod:`placer.train`).

    ``cost`` is the step time, or ``fail_factor * t_ref`` for a placement that failed
    (out of memory) or has no finite time; ``t_ref`` is the best single-device step time.

    >>> reward(np.array([1.0, 4.0, 2.0]), np.array([False, False, True]), 1.0, 9.0).tolist()
    [-1.0, -2.0, -3.0]
    """
    t = np.asarray(step_times, dtype=float)
    cost = np.where(np.asarray(failed, dtype=bool) | ~np.isfinite(t), fail_factor * t_ref, t)
    return -np.sqrt(cost / t_ref)


def imitate(policy: Any, target: np.ndarray, config: Any, *, deadline: float | None = None) -> int:
    """Fit the policy to a target placement; returns the number of steps taken.

    Stops early at ``deadline`` (a ``time.perf_counter()`` value), so a warm start
    never eats a whole time budget on a large graph.
    """
    opt = torch.optim.Adam(policy.parameters(), lr=config.warm_start_lr)
    for step in range(1, config.warm_start_steps + 1):
        if deadline is not None and time.perf_counter() >= deadline:
            return step - 1
        opt.zero_grad()
        loss = policy.imitation_loss(target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip)
        opt.step()
        if step % 10 == 0 and float(loss.detach()) < config.warm_start_nll:
            # done once the greedy decoding is the target (as far as the items can express it)
            expand, contract = getattr(policy, "expand", None), getattr(policy, "contract", None)
            want = expand(contract(target)) if expand is not None else np.asarray(target)
            if np.array_equal(policy.greedy(), want):
                return step
    return config.warm_start_steps
