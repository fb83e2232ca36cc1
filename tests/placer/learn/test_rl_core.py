"""The RL core (issue 12): reward, baselines, advantages, credit per log-prob term, schedules, presets,
the scorer's evaluate branch, the failing path, cleanup on error, TensorBoard, and the generated CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import NamedTuple

import numpy as np
import pytest
import torch

import envs
from envs.result import Result
from graphs import PlacerError
from placer.cli import build_parser, main
from placer.learn import algos as rl_algos
from placer.learn.algos import advantages, credit, learning_rate, logit_noise, policy_gradient_loss, reward
from placer.learn.config import PRESETS, AlgoOptions, TrainConfig, literal_choices, option_name
from placer.learn.run_scorers import CachedScorer
from placer.learn.runners import train
from placer.learn.state import RunState
from policies.base import LogProbTerm
from tests.placer.learn.test_move_runner import documented_in_readme
from tests.placer.learn.tiny_runs import train_argv, train_config, two_chains


def _config(tmp_path, **kw) -> TrainConfig:
    return train_config(tmp_path, **{"warm_start": "none", **kw})


# ------------------------------------------------------------------ reward, baselines, advantages
def test_reward_of_failed_and_non_finite_placements_is_the_failing_signal():
    t = np.array([2.0, 8.0, np.inf, np.nan, 1.0])
    failed = np.array([False, False, False, False, True])
    r = reward(t, failed, t_ref=2.0, fail_factor=10.0)
    assert r.tolist() == [-1.0, -2.0, -math.sqrt(10), -math.sqrt(10), -math.sqrt(10)]


def test_leave_one_out_baseline():
    r = np.array([-1.0, -2.0, -3.0, -6.0])
    a = advantages(r, np.zeros(4, bool), None, AlgoOptions(baseline="loo", normalize_advantage=False))
    # each sample against the mean of the other three
    assert a.advantages.tolist() == pytest.approx([-1 + 11 / 3, -2 + 10 / 3, -3 + 9 / 3, -6 + 2])
    assert a.advantages.sum() == pytest.approx(0.0)
    assert a.baseline == pytest.approx(0.9 * -3.0 + 0.1 * -3.0)  # the EMA is tracked either way (first: the mean)


def test_ema_baseline_lags_the_batch_mean():
    opts = AlgoOptions(baseline="ema", baseline_decay=0.9, normalize_advantage=False)
    r = np.array([-1.0, -2.0, -3.0])
    first = advantages(r, np.zeros(3, bool), None, opts)
    assert first.advantages.tolist() == pytest.approx([1.0, 0.0, -1.0]) and first.baseline == pytest.approx(-2.0)
    second = advantages(r - 1.0, np.zeros(3, bool), first.baseline, opts)
    assert second.advantages.tolist() == pytest.approx([0.0, -1.0, -2.0])  # against -2, not the batch mean -3
    assert second.baseline == pytest.approx(0.9 * -2.0 + 0.1 * -3.0)


def test_normalize_advantage_on_and_off():
    r = np.array([-1.0, -1.5, -4.0])
    off = advantages(r, np.zeros(3, bool), -2.0, AlgoOptions(baseline="ema", normalize_advantage=False))
    on = advantages(r, np.zeros(3, bool), -2.0, AlgoOptions(baseline="ema", normalize_advantage=True))
    assert off.advantages.tolist() == pytest.approx([1.0, 0.5, -2.0])
    assert on.advantages.tolist() == pytest.approx((off.advantages / (r.std() + 1e-3 * 2.0 + 1e-8)).tolist())


def test_failed_samples_are_masked_from_the_loss_after_fail_mask_after():
    opts = AlgoOptions(baseline="ema", normalize_advantage=False, fail_mask_after=1000)
    r = np.array([-1.0, -2.0, -math.sqrt(10)])
    failed = np.array([False, False, True])
    before = advantages(r, failed, -2.0, opts, iteration=999)
    after = advantages(r, failed, -2.0, opts, iteration=1000)
    assert before.in_loss.all() and before.advantages[2] < 0
    assert after.in_loss.tolist() == [True, True, False] and after.advantages.tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert after.baseline == pytest.approx(0.9 * -2.0 + 0.1 * -1.5)  # the failed sample is not in the EMA either
    none_ok = advantages(r, np.ones(3, bool), -2.0, opts, iteration=1000)
    assert not none_ok.advantages.any() and none_ok.baseline == -2.0


# ------------------------------------------------------------------ credit per log-prob term
def _theta_grads(owner, adv):
    """Gradient of REINFORCE's loss w.r.t. a shared action's logits and per-sample actions' logits."""
    k = len(adv)
    shared_logits = torch.zeros(3, requires_grad=True)
    own_logits = torch.zeros(k, 2, requires_grad=True)
    g = torch.tensor([1] * (1 if owner == "shared" else k))  # the grouping action(s) taken
    logp_g = torch.log_softmax(shared_logits, 0)[g]  # [1] shared, or [K] one per sample
    logp_d = torch.log_softmax(own_logits, 1)[torch.arange(k), torch.tensor([0, 1] * (k // 2))]
    terms = [
        LogProbTerm(logp_g, torch.zeros(k, dtype=torch.long) if owner == "shared" else None, "grouping"),
        LogProbTerm(logp_d, None, "placement"),
    ]
    policy_gradient_loss(terms, torch.as_tensor(adv, dtype=torch.float32)).backward()
    return shared_logits.grad, own_logits.grad, terms


def test_an_action_shared_by_every_sample_gets_the_summed_advantage():
    """Which samples share an action is explicit: a shared action is credited with the sum of their advantages."""
    r = np.array([-1.0, -2.0, -1.5, -3.0])
    loo = torch.as_tensor(
        advantages(r, np.zeros(4, bool), None, AlgoOptions(baseline="loo")).advantages, dtype=torch.float32
    )
    ema = torch.as_tensor(
        advantages(r, np.zeros(4, bool), -1.0, AlgoOptions(baseline="ema")).advantages, dtype=torch.float32
    )
    shared = LogProbTerm(torch.zeros(1), torch.zeros(4, dtype=torch.long))
    assert credit(shared, loo).item() == pytest.approx(0.0, abs=1e-6)  # leave-one-out: a shared action never learns
    assert credit(shared, ema).item() == pytest.approx(float(ema.sum()))
    assert credit(LogProbTerm(torch.zeros(4)), loo).tolist() == loo.tolist()  # one action per sample: its own
    g_shared, g_own, _ = _theta_grads("shared", loo)
    assert torch.all(g_shared.abs() < 1e-7) and g_own.abs().sum() > 0
    g_per_sample, _, _ = _theta_grads("per-sample", loo)
    assert g_per_sample.abs().sum() == 0  # all four took the same grouping action 1: still the sum, here 0
    # two samples share grouping 0, two share grouping 1: each grouping gets its pair's summed advantage
    pair = LogProbTerm(torch.zeros(2), torch.tensor([0, 0, 1, 1]))
    assert credit(pair, loo).tolist() == pytest.approx([float(loo[:2].sum()), float(loo[2:].sum())])
    assert abs(float(loo[:2].sum())) > 0.1


def test_credit_per_term_is_the_gradient_of_the_joint_log_prob():
    """Splitting a sample's log-probability into shared and own terms changes nothing but what can be seen."""
    torch.manual_seed(0)
    shared_logits = torch.randn(3, requires_grad=True)
    own_logits = torch.randn(4, 2, requires_grad=True)
    owner = torch.tensor([0, 2, 2, 1])  # sample -> its grouping
    adv = torch.tensor([0.5, -1.0, 2.0, -0.3])
    d = torch.tensor([0, 1, 1, 0])

    def terms():
        logp_g = torch.log_softmax(shared_logits, 0)  # the three groupings' log-probs
        logp_d = torch.log_softmax(own_logits, 1)[torch.arange(4), d]
        return logp_g, logp_d

    logp_g, logp_d = terms()
    policy_gradient_loss([LogProbTerm(logp_g, owner, "grouping"), LogProbTerm(logp_d)], adv).backward()
    split = shared_logits.grad.clone(), own_logits.grad.clone()
    shared_logits.grad = own_logits.grad = None
    logp_g, logp_d = terms()
    (-(adv * (logp_g[owner] + logp_d)).mean()).backward()  # REINFORCE on the joint log-probability
    assert torch.allclose(split[0], shared_logits.grad) and torch.allclose(split[1], own_logits.grad)


class _Sample(NamedTuple):
    actions: dict
    log_prob: torch.Tensor
    entropy: torch.Tensor
    op_devices: np.ndarray
    terms: tuple = ()


def test_reinforce_update_uses_the_samples_terms_and_logs_their_credit():
    w = torch.nn.Parameter(torch.zeros(3))
    policy = torch.nn.Module()
    policy.w = w
    policy.num_items = 1
    logp = torch.log_softmax(w, 0)
    shared = LogProbTerm(logp[:1], torch.zeros(4, dtype=torch.long), "grouping")
    sample = _Sample({}, logp[0].expand(4), torch.zeros(4), np.zeros((4, 2), np.int32), (shared,))
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0])  # zero-sum
    opt = torch.optim.SGD([w], lr=1.0)
    rl_algos.Reinforce.update(policy, opt, sample, adv, AlgoOptions(entropy_coef=0.0))
    assert torch.all(w == 0)  # the shared action's credit was 0: no step
    assert rl_algos.term_credits(sample, adv) == {"grouping": 0.0}


# ------------------------------------------------------------------ schedules and the paper preset
def test_paper_preset_values():
    paper = TrainConfig.from_preset("paper", iterations=1)
    assert (paper.lr, paper.lr_decay, paper.lr_decay_every, paper.lr_decay_after, paper.grad_clip) == (
        0.1,
        0.95,
        50,
        400,
        1.0,
    )
    assert (paper.baseline, paper.baseline_decay) == ("ema", 0.9)
    assert (paper.hidden, paper.layers) == (256, 2)
    assert paper.fail_mask_after == 1000 and paper.fail_factor == 10.0 and paper.preset == "paper"
    assert [learning_rate(paper, i) for i in (0, 400, 449, 450, 500)] == pytest.approx([0.1, 0.1, 0.1, 0.095, 0.09025])
    noise = [logit_noise(paper, i) for i in (0, 499, 500, 600, 749, 750, 5000)]
    assert noise[0] == noise[1] == noise[2] > 0 and noise[2] > noise[3] > noise[4] > 0 and noise[5] == noise[6] == 0
    paper.validate()
    tuned = TrainConfig.from_preset("tuned")
    # the tuned preset is the dataclass's defaults with the move search as the learner; a policy trains by REINFORCE
    assert (
        tuned == TrainConfig(algo="moves") and learning_rate(tuned, 10**6) == tuned.lr and logit_noise(tuned, 0) == 0.0
    )
    assert paper.algo == "reinforce" and TrainConfig.from_preset("tuned", policy="seq2seq").algo == "reinforce"
    assert TrainConfig.from_preset("tuned", policy="gnn", algo="moves").algo == "moves"
    assert TrainConfig.from_preset("paper", lr=0.05).lr == 0.05  # options given with a preset win
    with pytest.raises(PlacerError, match="--preset 'x'"):
        TrainConfig.from_preset("x")
    assert set(PRESETS) == set(literal_choices(next(f for f in dataclasses.fields(TrainConfig) if f.name == "preset")))


def test_fine_tuning_defaults_hold_for_the_python_api_too():
    from placer.learn.config import INIT_ENTROPY, INIT_WARM_START_LR

    tuned = TrainConfig.from_preset("tuned")
    ft = TrainConfig.from_preset("tuned", init="p.pt")
    assert (ft.policy, ft.entropy_coef, ft.warm_start_lr) == ("gnn", INIT_ENTROPY, INIT_WARM_START_LR)
    assert (INIT_ENTROPY, INIT_WARM_START_LR) != (tuned.entropy_coef, tuned.warm_start_lr)
    given = TrainConfig.from_preset("tuned", init="p.pt", entropy_coef=0.002, warm_start_lr=0.05)
    assert (given.entropy_coef, given.warm_start_lr) == (0.002, 0.05)  # what the caller sets wins


def test_cli_preset_paper_with_an_override(tmp_path, monkeypatch):
    import placer.learn.runners as runners
    from graphs import save

    seen = {}

    def fake_train(config, **_):
        seen["config"] = config
        raise _Stop()

    monkeypatch.setattr(runners, "train", fake_train)
    save(two_chains(), str(tmp_path / "g.json"))
    with pytest.raises(_Stop):
        main(
            [
                "train",
                str(tmp_path / "g.json"),
                "--cluster",
                "k80x2",
                "--preset",
                "paper",
                "--hidden",
                "32",
                "--iterations",
                "1",
                "--logdir",
                str(tmp_path / "run"),
            ]
        )
    config = seen["config"]
    assert config.preset == "paper" and config.hidden == 32 and config.lr == 0.1 and config.layers == 2


class _Stop(Exception):
    pass


def test_logit_noise_changes_samples_not_their_scored_log_prob():
    from policies import POLICIES

    torch.manual_seed(0)
    p = POLICIES["seq2seq"](two_chains(), 3, max_groups=0, hidden=8)
    plain = p.sample(16, generator=torch.Generator().manual_seed(1))
    rl_algos.set_logit_noise(p, 5.0)
    noisy = p.sample(16, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(plain.actions["devices"], noisy.actions["devices"])
    logp, _ = p.log_prob(noisy.actions)  # re-scored without noise: the sample's log-prob is the policy's
    assert torch.allclose(logp, noisy.log_prob)
    rl_algos.set_logit_noise(p, 0.0)
    again = p.sample(16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain.actions["devices"], again.actions["devices"])  # no noise: the same random stream


# ------------------------------------------------------------------ the scorer: evaluate branch, failing path
class EvaluateOnly:
    """A scorer with only ``evaluate``: a placement with every op on one device is out of memory (time inf)."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.closed = False

    def evaluate(self, placements):
        self.calls.append(len(placements))
        out = []
        for row in placements:
            row = np.asarray(row)
            if len(set(row.tolist())) == 1:
                out.append(Result(float("inf"), "oom", "does not fit"))
            else:
                out.append(Result(1.0 + 0.01 * float(row.sum())))
        return out

    def close(self) -> None:
        self.closed = True


def test_cached_scorer_evaluate_branch():
    env = EvaluateOnly()
    score = CachedScorer(env)
    t, failed = score(np.array([[1, 2, 1], [0, 0, 0], [1, 2, 1]]))
    assert env.calls == [2]  # identical rows scored once, through evaluate
    assert t[0] == t[2] == pytest.approx(1.04) and failed.tolist() == [False, True, False] and t[1] == np.inf
    score(np.array([[0, 0, 0]]))
    assert env.calls == [2]


def test_training_against_a_scorer_where_no_single_device_fits(tmp_path):
    """Every single-device placement OOMs without a time: the reward scale falls back to the simulator's
    (was inf, making every reward NaN); failed samples get the failing signal."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    g = two_chains()
    env = EvaluateOnly()
    r = train(_config(tmp_path, iterations=3, lr=0.01), graph=g, cluster=envs.resolve_cluster("k80x2"), env=env)
    assert r.iterations == 3 and np.isfinite(r.reference_step_time_s)
    assert np.isfinite(r.best_step_time_s) and r.best_step_time_s >= 1.0
    assert not env.closed  # the caller's scorer is the caller's to close
    ea = EventAccumulator(r.logdir)
    ea.Reload()
    rewards = [e.value for e in ea.Scalars("charts/reward")]
    assert len(rewards) == 3 and all(np.isfinite(rewards))
    params = torch.load(os.path.join(r.logdir, "checkpoint.pt"), weights_only=True)["policy"]
    assert all(torch.isfinite(v).all() for v in params.values())


def test_tensorboard_events_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r = train(_config(tmp_path, iterations=4, eval_every=2), graph=two_chains(), cluster=envs.resolve_cluster("k80x2"))
    ea = EventAccumulator(r.logdir)
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    for tag in (
        "charts/reward",
        "charts/best_step_time_s",
        "charts/baseline",
        "charts/failed_fraction",
        "charts/learning_rate",
        "losses/policy_loss",
        "losses/entropy",
        "losses/credit/placement",
        "charts/greedy_step_time_s",
        "charts/device_share/gpu:0",
    ):
        assert tag in tags, tag
    assert [e.step for e in ea.Scalars("charts/reward")] == [0, 1, 2, 3]
    assert [e.step for e in ea.Scalars("charts/greedy_step_time_s")] == [0, 2]
    assert "hyperparameters/text_summary" in ea.Tags()["tensors"]
    best = [e.value for e in ea.Scalars("charts/best_step_time_s")]
    assert best == sorted(best, reverse=True) and best[-1] == pytest.approx(r.best_step_time_s)
    documented_in_readme(tags, envs.resolve_cluster("k80x2").device_names)


# ------------------------------------------------------------------ cleanup on error
def test_env_and_writer_are_closed_when_the_loop_raises(tmp_path, monkeypatch):
    import torch.utils.tensorboard as tb

    import placer.learn.runners as runners

    writers = []

    class Writer(tb.SummaryWriter):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.closed = False
            writers.append(self)

        def close(self):
            self.closed = True
            super().close()

    class Crash(rl_algos.Reinforce):
        @staticmethod
        def update(*a, **k):
            raise RuntimeError("boom")

    env = EvaluateOnly()
    monkeypatch.setattr(tb, "SummaryWriter", Writer)
    monkeypatch.setitem(runners.ENVS, "sim", lambda *a: env)
    monkeypatch.setitem(rl_algos.ALGOS, "reinforce", Crash)
    with pytest.raises(RuntimeError, match="boom"):
        train(_config(tmp_path, iterations=5), graph=two_chains(), cluster=envs.resolve_cluster("k80x2"))
    assert env.closed and len(writers) == 1 and writers[0].closed


# ------------------------------------------------------------------ RunState
def test_run_state_round_trips_through_json_and_rejects_bad_values():
    s = RunState(iteration=3, baseline=-1.5, best_indices=[0, 1], warm_start="x", time_to_best_s=2.0)
    doc = json.loads(json.dumps(s.to_dict()))
    assert RunState.from_dict(doc) == s and RunState.from_dict({**doc, "future_key": 1}) == s
    for key, bad in (
        ("iteration", "3"),
        ("iteration", 1.5),
        ("best_indices", [0, "1"]),
        ("warm_start", 3),
        ("baseline", True),
    ):
        with pytest.raises(PlacerError, match=f"run.{key}"):
            RunState.from_dict({**doc, key: bad})


def test_resume_rejects_a_checkpoint_with_a_bad_run_state(tmp_path, capsys):
    from graphs import save

    path = str(tmp_path / "g.json")
    save(two_chains(), path)
    argv = train_argv(path, tmp_path / "run", "--no-progress", "--warm-start", "none")
    assert main(argv + ["--iterations", "1"]) == 0
    from placer.learn import checkpoint

    tensors, state = checkpoint.load(str(tmp_path / "run"))
    state["run"]["iteration"] = "lots"
    checkpoint.save(str(tmp_path / "run"), tensors, state)
    capsys.readouterr()
    rc = main(argv + ["--iterations", "2", "--resume"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "run.iteration" in err


# ------------------------------------------------------------------ the generated command line
def _train_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["train"]


def _other_value(f: dataclasses.Field, default):
    choices = literal_choices(f)
    if choices:
        return next(c for c in choices if c != default)
    if f.name == "heuristics":
        return ("m_topo", "single")
    if f.name == "policy":
        return "hierarchical"
    if isinstance(default, bool):
        return not default
    if isinstance(default, float):
        return default + 0.25
    if isinstance(default, int):
        return default + 3
    return "value-x"  # str or None-defaulted str/int/float fields: type-specific below


def test_every_train_config_field_is_reachable_from_the_cli():
    """Each field is an option (SOURCE for source) with help text, and a value given there reaches the config."""
    from placer.learn.config import base_type

    parser = _train_parser()
    by_dest = {a.dest: a for a in parser._actions}
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        assert f.name in by_dest, f"TrainConfig.{f.name} has no option"
        assert by_dest[f.name].help, f"{option_name(f.name)} has no help"
        if f.name == "source":
            continue
        default = getattr(defaults, f.name)
        tp = base_type(f)
        value = (
            _other_value(f, default)
            if default is not None or f.name == "heuristics"
            else {int: 7, float: 2.5}.get(tp, "value-x")
        )
        if tp is bool:
            argv = [
                option_name(f.name) if not (default and f.name != "progress") else "--no-" + f.name.replace("_", "-")
            ]
        elif f.name == "heuristics":
            argv = [option_name(f.name), ",".join(value)]
        else:
            argv = [f"{option_name(f.name)}={value}"]
        base = ["train", "g.json"] + (["--cluster", "k80x2"] if f.name != "cluster" else [])
        args = build_parser().parse_args(base + argv)
        assert getattr(args, f.name) == value, f.name
        assert not any(
            getattr(args, other.name, None) is not None
            for other in dataclasses.fields(TrainConfig)
            if other.name not in (f.name, "source", "cluster")
        ), f"{f.name}: defaults must not be set"


def test_train_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        if f.name != "source":
            assert option_name(f.name) in out, f.name
    for legacy in (
        "--time-budget",
        "--warm-start",
        "--executor",
        "--measure-timeout",
        "--entropy",
        "--no-progress",
        "--json",
        "--preset",
    ):
        assert legacy in out


def test_algorithm_registries_match_the_literal_choices():
    from placer.learn.run_scorers import ENVS

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    # every runner (the move search, the measured loop, the policy-gradient loop) has a choice, and the
    # policy-gradient loop runs every algorithm of rl_algos
    from placer.learn.loop import PolicyGradient
    from placer.learn.runners import RUNNERS

    assert set(RUNNERS) == set(literal_choices(fields["algo"]))
    assert {a for a, runner in RUNNERS.items() if runner is PolicyGradient} == set(rl_algos.ALGOS)
    assert set(ENVS) == set(literal_choices(fields["env"]))
    from envs.sim.schedule import EXECUTORS

    assert set(EXECUTORS) == set(literal_choices(fields["executor"]))
