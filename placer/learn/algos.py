"""The learning algorithm of :mod:`placer.learn.loop`: reward -> reward baseline -> advantage -> loss per log-prob term.

Every step of a policy-gradient iteration is one function here, in order:

1. :func:`reward`: step times (and failures) -> rewards, ``-sqrt(cost / t_ref)``;
2. :func:`advantages`: rewards -> advantages against a reward baseline (leave-one-out or
   the paper's EMA), optionally normalised, failed samples optionally masked;
3. an :class:`Algorithm` (``ALGOS``: :class:`Reinforce`, :class:`PPO`) turns
   advantages into a loss over the sample's log-probability terms
   (:class:`policies.base.LogProbTerm`): each action is credited with the summed
   advantage of the samples that share it (:func:`credit`), and updates the policy.

Schedules that depend only on the iteration (so a resumed run continues
exactly): :func:`learning_rate` and :func:`logit_noise`. :func:`imitate` is the
warm start (behaviour cloning of a heuristic's placement).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol, Sequence

import numpy as np
import torch

from policies.base import LogProbTerm, Policy, PolicySampleLike

if TYPE_CHECKING:
    from placer.learn.config import AlgoOptions


# ------------------------------------------------------------------ 1. reward
def reward(step_time_s: np.ndarray, failed: np.ndarray, t_ref: float, fail_factor: float = 10.0) -> np.ndarray:
    """``-sqrt(cost / t_ref)`` per placement; a failed (OOM) or non-finite one costs ``fail_factor * t_ref``.

    ``t_ref`` is the best single-device step time of the graph (the reward scale:
    a placement no better than one device gets about -1).

    >>> reward(np.array([1.0, 4.0, 2.0]), np.array([False, False, True]), t_ref=1.0, fail_factor=9.0)
    array([-1., -2., -3.])
    """
    step_time_s = np.asarray(step_time_s, dtype=float)
    failed = np.asarray(failed, dtype=bool) | ~np.isfinite(step_time_s)
    cost = np.where(failed, fail_factor * t_ref, step_time_s)
    return -np.sqrt(cost / t_ref)


# ------------------------------------------------------------------ 2. reward baseline and advantage
class Advantages(NamedTuple):
    advantages: np.ndarray  # [K]; 0 for samples left out of the loss
    baseline: float  # the EMA reward baseline after this batch
    in_loss: np.ndarray  # [K] bool: the samples that count


def advantages(
    rewards: np.ndarray, failed: np.ndarray, ema: float | None, opts: AlgoOptions, iteration: int = 0
) -> Advantages:
    """Advantages of K rewards and the updated EMA reward baseline (``ema`` None: the first batch's mean).

    ``opts.baseline == "loo"``: each sample's reward baseline is the mean of the other K-1
    rewards (advantages sum to zero); ``"ema"``: the moving average ``ema``
    (decay ``opts.baseline_decay``). With ``opts.normalize_advantage`` they are
    divided by the batch's reward std. From iteration ``opts.fail_mask_after``
    on, failed samples get advantage 0 and do not enter the reward baseline.
    """
    rewards = np.asarray(rewards, dtype=float)
    in_loss = np.ones(len(rewards), dtype=bool)
    if opts.fail_mask_after is not None and iteration >= opts.fail_mask_after:
        in_loss = ~np.asarray(failed, dtype=bool)
    adv = np.zeros(len(rewards))
    r = rewards[in_loss]
    if not len(r):
        return Advantages(adv, ema if ema is not None else float(rewards.mean()), in_loss)
    if ema is None:
        ema = float(r.mean())
    if opts.baseline == "loo" and len(r) > 1:
        a = r - (r.sum() - r) / (len(r) - 1)
    else:
        a = r - ema
    if opts.normalize_advantage:
        a = a / (r.std() + 1e-3 * abs(ema) + 1e-8)
    adv[in_loss] = a
    ema = opts.baseline_decay * ema + (1 - opts.baseline_decay) * float(r.mean())
    return Advantages(adv, ema, in_loss)


# ------------------------------------------------------------------ 3. loss per log-prob term
def terms_of(sample: PolicySampleLike) -> Sequence[LogProbTerm]:
    """The sample's log-probability terms (its joint ``log_prob`` as one per-sample term if it has none)."""
    terms = getattr(sample, "terms", None)
    return tuple(terms) if terms else (LogProbTerm(sample.log_prob),)


def credit(term: LogProbTerm, adv: torch.Tensor) -> torch.Tensor:
    """Advantage of each of the term's actions: the sum over the samples that share it.

    This is the exact policy gradient of a factored action: sample k's joint
    log-probability contains ``log p(a_owner[k])``, so ``sum_k adv_k * grad log p(a_owner[k])``
    groups into ``sum_a (sum_{k: owner[k] = a} adv_k) * grad log p(a)``. An action
    shared by all K samples gets ``adv.sum()``: zero under leave-one-out.
    """
    if term.owner is None:
        return adv
    out = torch.zeros(term.log_prob.shape[0], dtype=adv.dtype, device=adv.device)
    return out.index_add_(0, term.owner.to(adv.device), adv)


def policy_gradient_loss(terms: Sequence[LogProbTerm], adv: torch.Tensor) -> torch.Tensor:
    """``-(1/K) sum_terms sum_actions credit * log_prob``: REINFORCE's loss (before the per-item scale)."""
    k = adv.shape[0]
    return -sum((credit(t, adv) * t.log_prob).sum() for t in terms) / k


def term_credits(sample: PolicySampleLike, adv: torch.Tensor) -> dict[str, float]:
    """Term name -> mean |credit| per sample (logged: a term whose credit is 0 does not learn)."""
    return {t.name: float(credit(t, adv).abs().sum()) / max(1, adv.shape[0]) for t in terms_of(sample)}


class Algorithm(Protocol):
    """A policy-gradient algorithm: how to sample and how to update from advantages."""

    name: ClassVar[str]

    @staticmethod
    def sample(policy: Policy, k: int, gen: torch.Generator) -> PolicySampleLike: ...

    @staticmethod
    def update(
        policy: Policy, optimizer: torch.optim.Optimizer, sample: PolicySampleLike, adv: torch.Tensor, opts: AlgoOptions
    ) -> tuple[float, float]:
        """One update; returns (policy loss, mean entropy)."""
        ...


def _step(policy: Policy, optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float) -> None:
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    optimizer.step()


class Reinforce:
    """REINFORCE: sample with gradients; loss = -credit * log p per term (per item) - entropy bonus."""

    name: ClassVar[str] = "reinforce"

    @staticmethod
    def sample(policy: Policy, k: int, gen: torch.Generator) -> PolicySampleLike:
        return policy.sample(k, generator=gen)

    @staticmethod
    def update(
        policy: Policy, optimizer: torch.optim.Optimizer, sample: PolicySampleLike, adv: torch.Tensor, opts: AlgoOptions
    ) -> tuple[float, float]:
        num_items = getattr(policy, "num_items", 1)
        loss_pg = policy_gradient_loss(terms_of(sample), adv) / num_items  # per item: lr independent of graph size
        entropy = sample.entropy.mean()
        _step(policy, optimizer, loss_pg - opts.entropy_coef * entropy, opts.grad_clip)
        return float(loss_pg.detach()), float(entropy.detach())


class PPO:
    """PPO: sample without gradients, then ``ppo_epochs`` clipped-surrogate updates.

    The ratio is that of the sample's joint log-probability (one per-sample term);
    at ratio 1 its gradient is REINFORCE's, shared actions included.
    """

    name: ClassVar[str] = "ppo"

    @staticmethod
    def sample(policy: Policy, k: int, gen: torch.Generator) -> PolicySampleLike:
        with torch.no_grad():
            return policy.sample(k, generator=gen)

    @staticmethod
    def update(
        policy: Policy, optimizer: torch.optim.Optimizer, sample: PolicySampleLike, adv: torch.Tensor, opts: AlgoOptions
    ) -> tuple[float, float]:
        old = sample.log_prob.detach()
        loss_pg = entropy = torch.zeros(())
        for _ in range(opts.ppo_epochs):
            logp, ent = policy.log_prob(sample.actions)
            ratio = torch.exp(logp - old)
            loss_pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - opts.ppo_clip, 1 + opts.ppo_clip) * adv).mean()
            entropy = ent.mean()
            _step(policy, optimizer, loss_pg - opts.entropy_coef * entropy, opts.grad_clip)
        return float(loss_pg.detach()), float(entropy.detach())


ALGOS: dict[str, type[Algorithm]] = {Reinforce.name: Reinforce, PPO.name: PPO}


# ------------------------------------------------------------------ schedules (functions of the iteration)
def learning_rate(opts: AlgoOptions, iteration: int) -> float:
    """``lr`` times ``lr_decay`` for every ``lr_decay_every`` iterations past ``lr_decay_after``.

    >>> from placer.learn.config import AlgoOptions
    >>> o = AlgoOptions(lr=0.1, lr_decay=0.5, lr_decay_every=50, lr_decay_after=400)
    >>> [learning_rate(o, i) for i in (0, 449, 450, 500)]
    [0.1, 0.1, 0.05, 0.025]
    """
    if opts.lr_decay == 1.0 or iteration < opts.lr_decay_after:
        return opts.lr
    return opts.lr * opts.lr_decay ** ((iteration - opts.lr_decay_after) // opts.lr_decay_every)


def logit_noise(opts: AlgoOptions, iteration: int) -> float:
    """Std of the sampling noise on the logits: full for ``logit_noise_steps``, then fading to 0 over half as many.

    >>> from placer.learn.config import AlgoOptions
    >>> o = AlgoOptions(logit_noise=1.0, logit_noise_steps=500)
    >>> [logit_noise(o, i) for i in (0, 499, 500, 625, 750, 10**6)]
    [1.0, 1.0, 1.0, 0.5, 0.0, 0.0]
    """
    steps = opts.logit_noise_steps
    if opts.logit_noise <= 0 or iteration >= 1.5 * steps:
        return 0.0
    if iteration <= steps:
        return opts.logit_noise
    return opts.logit_noise * (1.5 * steps - iteration) / (0.5 * steps)


def set_logit_noise(policy: Policy, std: float) -> None:
    """Set the sampling noise of every module of ``policy`` that has a ``logit_noise`` attribute."""
    for m in policy.modules():
        if hasattr(m, "logit_noise"):
            m.logit_noise = float(std)


# ------------------------------------------------------------------ warm start
def imitate(policy: Policy, target: np.ndarray, opts: AlgoOptions, *, deadline: float | None = None) -> int:
    """Fit the policy to a target placement; returns the number of steps taken.

    Stops early at ``deadline`` (a ``time.perf_counter()`` value), so a warm start
    never eats a whole time budget on a large graph.
    """
    opt = torch.optim.Adam(policy.parameters(), lr=opts.warm_start_lr)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, opts.warm_start_steps + 1):
        if deadline is not None and time.perf_counter() >= deadline:
            return step - 1
        if getattr(policy, "sequential", False) and step % 2 == 0:
            # a decoder that sees its earlier decisions also learns the target from where its own samples go (DAgger)
            loss = policy.imitation_loss(target, along=policy.sample(2, generator=gen).op_devices)
        else:
            loss = policy.imitation_loss(target)
        _step(policy, opt, loss, opts.grad_clip)
        if step % 10 == 0 and float(loss.detach()) < opts.warm_start_nll:
            # done once the greedy decoding is the target (as far as the items can express it)
            expand, contract = getattr(policy, "expand", None), getattr(policy, "contract", None)
            want = expand(contract(target)) if expand is not None else np.asarray(target)
            if np.array_equal(policy.greedy(), want):
                return step
    return opts.warm_start_steps
