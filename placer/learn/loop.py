"""``placer train --algo reinforce|ppo``: train a placement policy by policy gradient against the run's scorer.

One readable loop, in the spirit of CleanRL (:meth:`PolicyGradient.run`): seed
and build the policy, (optionally) warm-start it by imitation, then repeat:
sample K placements -> score them in one batch -> rewards and advantages ->
update -> log -> checkpoint. The options are :class:`placer.learn.config.TrainConfig`;
the algorithm (reward, reward baselines, advantages, the loss per
log-probability term, schedules) is :mod:`placer.learn.algos`; what every
learner shares (the scorer, the heuristics, the best placement, checkpoints) is
the run's :class:`~placer.learn.session.Session`.

Reward and failing signal. The paper's reward is ``-sqrt(runtime)`` with a failing
runtime of 100 s for placements that do not run, i.e. about 10x its models' step
times. Absolute seconds do not transfer between a 2 ms and a 2 s model, so here
every step time is divided by ``t_ref``, the best single-device step time
(ignoring memory) of the graph on this cluster: the reward is
``-sqrt(step_time_s / t_ref)`` (about -1 for a no-better-than-one-device
placement) and a failed (OOM) placement counts as ``fail_factor * t_ref``
(:func:`placer.learn.algos.reward`).

Warm start (``warm_start="best"``, the default; honest labelling). Before RL, the
policy is trained for a few steps to imitate the best heuristic placement (by
simulated step time), contracted to the policy's groups by majority vote. RL then
starts from a policy whose greedy decoding is (close to) that heuristic. The best
placement reported is always one the policy sampled or greedily decoded; its
``meta`` says which, at which iteration, and which heuristic it was warm-started
from. ``warm_start="none"`` trains from scratch. So that the incumbent can be
imitated exactly, the seq2seq policy's items are the coarsened co-location
groups further cut wherever the incumbent changes device along the topological
order (``graphs.grouping.refine_grouping``): more items (e.g. 100 -> 333 on
nmt-2 with annealing's placement), but majority-voting an incumbent onto the
plain coarse groups lost 10-18% of its quality on nmt-2.

Reward baseline. The paper's EMA reward baseline (decay 0.9) is available (``baseline="ema"``)
and always logged, but the default is leave-one-out: each of the K samples is
compared with the mean reward of the other K-1, so advantages have zero mean in
every batch (an EMA lagging above a falling batch mean makes them all negative
and pushes the mode's probability down). Advantages are divided by the batch's
reward std. After a warm start the RL learning rate must be small (5e-4):
measured on nmt-2, 2e-3 raises the entropy from 0.09 to 0.13 within five steps
and 1e-2 to 0.9 within a hundred, and the samples get worse with it. The
papers' settings are one switch away (``TrainConfig.from_preset("paper")``,
``placer train --preset paper``; see :data:`placer.learn.config.PRESETS`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from graphs import PlacerError
from graphs.grouping import default_num_groups
from placer.learn import checkpoint
from placer.learn.algos import (
    ALGOS,
    advantages,
    imitate,
    learning_rate,
    logit_noise,
    reward,
    set_logit_noise,
    term_credits,
)
from placer.learn.progress import ms
from placer.learn.session import Session, add_scalars, device_share
from policies import POLICIES, policy_file
from policies.base import Policy


def resolve_device(name: str) -> torch.device:
    """The torch device of the policy: ``--device`` (``auto``: CUDA where there is one)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch_device = torch.device(name)
    except RuntimeError:
        raise PlacerError(f"--device {name!r}: not a torch device (cpu, cuda, cuda:N, auto)") from None
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise PlacerError(f"--device {name!r}: CUDA is not available on this machine")
    return torch_device


class PolicyGradient:
    """``--algo reinforce|ppo``: a policy network trained by policy gradient; :meth:`run` is the loop.

    ``saved``: the checkpoint's tensors to continue from (the policy, its optimizer, the sampling RNG), or None.
    """

    phase = "RL"

    def __init__(self, session: Session, saved: dict[str, Any] | None) -> None:
        c, s, h = session.config, session.state, session.heuristics
        self.session, self.algo = session, ALGOS[c.algo]
        # ---- seed, items, policy, optimizer
        torch.manual_seed(c.seed)
        max_groups = c.max_groups if c.max_groups is not None else default_num_groups(len(session.devices))
        self.warm = c.warm_start == "best" and np.isfinite(h.best_step_time_s) and saved is None
        self.target = h.best_op_devices if self.warm else None  # the policy's items are cut along it
        if saved is not None:  # the items must be those the checkpoint was trained on
            self.target = np.asarray(s.warm_start_indices, dtype=np.int32) if s.warm_start_indices else None
        p = c.policy_options
        self.policy: Policy = POLICIES[c.policy](
            session.graph,
            len(session.devices),
            max_groups=max_groups,
            hidden=p.hidden,
            layers=p.layers,
            temperature=p.temperature,
            tanh_c=p.tanh_c,
            refine=self.target,
            cluster=session.cluster,
            **({"net": policy_file.load(p.init).net} if p.init is not None else {}),  # --init: pretrained weights
        ).to(session.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=c.lr)
        self.gen = torch.Generator(device=session.device).manual_seed(c.seed)
        if saved is not None:
            self._load(saved)
        self.fail_cost = c.fail_factor * session.t_ref

    @property
    def num_items(self) -> int:
        return self.policy.num_items

    def tensors(self) -> dict[str, Any]:
        """What the checkpoint keeps of the learner: the policy, its optimizer, the sampling RNG."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.gen.get_state(),
        }

    def run(self, writer: Any) -> None:
        """Warm start, then until the budget is spent: sample -> score -> advantage -> update -> log -> checkpoint."""
        session, c, s = self.session, self.session.config, self.session.state
        if self.warm:
            self._warm_start()
        if not c.resume:
            # resumable from here on: a run killed before its first periodic checkpoint keeps its policy and items,
            # and the best it wrote to best_placement.json since is adopted on --resume (adopt_newer_best)
            session.save_checkpoint(self.tensors())
        if self.warm:
            # a run whose budget ends here still has the warm-started policy's placement
            step_time_s, failed = session.score(self.policy.greedy()[None], "greedy")
            s.warm_start_step_time_s = float(step_time_s[0]) if not failed[0] else None
            session.progress.phase(
                f"warm start: {s.warm_start}{', cut short by the time budget' if s.warm_start_cut_short else ''}"
                f"; the policy's greedy placement: {ms(s.warm_start_step_time_s)}"
            )
        session.start_progress(self.phase, f"{c.samples} sampled placements ({self.num_items} items each)")
        while not session.done():
            it = s.iteration
            if it % c.eval_every == 0:  # greedy first: the warm start's mode is scored at 0
                step_time_s, failed = session.score(self.policy.greedy()[None], "greedy")
                writer.add_scalar("charts/greedy_step_time_s", step_time_s[0] if not failed[0] else self.fail_cost, it)
            # sample K placements
            set_logit_noise(self.policy, logit_noise(c, it))
            sample = self.algo.sample(self.policy, c.samples, self.gen)
            # score them in one batch
            step_time_s, failed = session.score(sample.op_devices, "sample")
            # reward -> advantage
            rewards = reward(step_time_s, failed, session.t_ref, c.fail_factor)
            adv = advantages(rewards, failed, s.baseline, c, it)
            adv_t = torch.as_tensor(adv.advantages, dtype=torch.float32, device=session.device)
            # update
            lr = learning_rate(c, it)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            policy_loss, entropy = self.algo.update(self.policy, self.optimizer, sample, adv_t, c)
            s.baseline = adv.baseline
            # log
            ok = step_time_s[~failed]
            scalars = {
                "charts/best_step_time_s": s.best_step_time_s,
                "charts/reward": float(rewards.mean()),
                "charts/step_time_s": float(ok.mean()) if len(ok) else self.fail_cost,
                "charts/failed_fraction": float(failed.mean()),
                "charts/baseline": s.baseline,
                "charts/elapsed_s": session.elapsed(),
                "charts/learning_rate": lr,
                "charts/logit_noise": logit_noise(c, it),
                "losses/policy_loss": policy_loss,
                "losses/entropy": entropy,
                **{f"losses/credit/{name}": v for name, v in term_credits(sample, adv_t).items()},
                **device_share(sample.op_devices, session.devices),
            }
            add_scalars(writer, scalars, it)
            # checkpoint (when due)
            session.iteration_done(self.tensors)

    def _warm_start(self) -> None:
        """Imitate the best heuristic's placement, within half the time budget (so RL always gets its turn)."""
        session, c, s = self.session, self.session.config, self.session.state
        name, most = session.heuristics.best_name, c.algo_options.warm_start_steps
        deadline = session.t0 + 0.5 * c.time_budget_s if c.time_budget_s is not None else None
        limit = f", {max(deadline - time.perf_counter(), 0.0):.3g} s at most" if deadline is not None else ""
        session.progress.phase(f"warm start: imitating {name}'s placement, up to {most} steps{limit}")
        steps = imitate(self.policy, self.target, c.algo_options, deadline=deadline)
        s.warm_start, s.warm_start_indices = f"imitation of {name} ({steps} steps)", self.target.tolist()
        # imitate stops at the deadline (cut short) or once the greedy decoding is the target (done)
        s.warm_start_cut_short = steps < most and deadline is not None and time.perf_counter() >= deadline

    def _load(self, tensors: dict[str, Any]) -> None:
        try:
            self.policy.load_state_dict(tensors["policy"])
            self.optimizer.load_state_dict(tensors["optimizer"])
            self.gen.set_state(tensors["generator"].cpu())
        except (KeyError, RuntimeError, ValueError) as e:
            raise PlacerError(
                f"--resume: {os.path.join(self.session.logdir, checkpoint.CHECKPOINT_PT)} does not fit this run "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from None


def __getattr__(name: str) -> Any:
    """``placer.learn.loop.train``: deprecated, the run is :func:`placer.learn.runners.train` (``placer.train``).

    Kept for one release, for callers of the name from before the runners were apart; imported when asked for,
    as the runners import this module.
    """
    if name == "train":
        from placer.learn.runners import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
