"""The options of ``placer train``: one typed config in three parts, and presets.

:class:`TrainConfig` is composed of three option dataclasses, each read by one
part of the program:

- :class:`RunOptions`: what to place and where the run lives (SOURCE, cluster,
  scorer, logdir, Ray, device, stopping rule, logging cadence);
- :class:`AlgoOptions`: the learning algorithm (reward, reward baseline, advantage,
  optimizer and its schedule, exploration, PPO, imitation warm start), read by
  :mod:`placer.learn.algos`;
- :class:`PolicyOptions`: the network (policy name, items, LSTM sizes, logit
  squashing), read when the policy is built.

TrainConfig inherits the three, so every option is a flat attribute
(``config.lr``), the checkpoint's ``config`` is a flat JSON object, and
``config.algo_options`` / ``config.policy_options`` / ``config.run_options`` give
the parts. The ``placer train`` command line is generated from these fields
(:func:`placer.cli.train.add_command`): every field is an option, its help is
the field's docstring. This module imports neither torch nor numpy, so
``placer --help`` stays fast.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from graphs.errors import PlacerError
from placer.option_checks import MAX_SEED, check_float, check_int, check_output_dir

EnvName = Literal["sim", "measured"]
ExecutorName = Literal["eager", "dataflow"]
ScoreOrderName = Literal["auto", "node", "planned"]
AlgoName = Literal["reinforce", "ppo", "moves", "corrected"]
ProposalName = Literal["critic", "uniform"]
#: --critic's names (anything else is a critic file).
CRITIC_NAMES = ("auto", "pretrained", "fresh")
RewardBaselineName = Literal["loo", "ema"]
WarmStartName = Literal["best", "none"]
PresetName = Literal["tuned", "paper"]
BackendName = Literal["gloo", "nccl"]
HomesName = Literal["auto", "on", "off"]
RecomputeName = Literal["auto", "on", "off"]
HostStepName = Literal["auto", "backward", "after"]


@dataclass
class RunOptions:
    """What to place, with which scorer, where the run lives and when it stops."""

    source: str = ""
    """SOURCE the graph came from (graph file, zoo name, module:callable), for the record and --env measured."""
    cluster: str = "k80x4"
    """cluster preset name or JSON file."""
    profile: str | None = None
    """optional `placer profile` file applied to the cluster (calibrates per-op times and link speeds); with --ranks,
    its per-op times only (the cluster of `placer profile --ranks` keeps its rates and links): the profile of
    `placer profile SOURCE` on this machine gives the ops the roofline misses, such as dense layers on small batches."""
    env: EnvName = "sim"
    """scorer: "sim" (envs.SimEnv, the simulator) or "measured" (envs.MeasuredEnv: real training steps in Ray actors;
    needs a zoo name or module:callable)."""
    executor: ExecutorName = "eager"
    """simulator executor model (--env sim and the heuristics): "eager" (PyTorch) or "dataflow" (TensorFlow)."""
    score_order: ScoreOrderName = "auto"
    """issue order the samples (and the heuristics, their searches too, and the equal-budget search) are scored
    in: "planned" (each placement in its envs.SimEnv.schedule_order, the order the best placement's file carries;
    ~2 ms more per sample on nmt-2), or "node". "auto": planned under --env sim with the eager executor and one
    microbatch, node otherwise, and node where the run checkpoints layers (--checkpointing: a planned order
    interleaves a layer's ops with other ops, and a layer issued so cannot be checkpointed). The learner then
    optimises the plan it ships: on nmt-2 / k80x4, 120 s, the file's plan was 199.1 ms scored planned against 212.2
    ms scored in node order (BENCHMARKS.md)."""
    microbatches: int = 1
    """M: the plan runs M microbatches per step, gradients accumulated (a pipelined plan, envs.microbatch);
    --env sim, or across processes (--ranks)."""
    inflight: int | None = None
    """W: the most microbatches in flight, 1..M (default: all M, fill-drain; fewer: one-forward-one-backward,
    activations of at most W microbatches held)."""
    choose_shape: bool = False
    """--ranks: choose M and W before the run (they override --microbatches and --inflight): each shape of
    envs.sim.ranks.PIPELINE_SHAPES is scored by the pipeline splits on the simulator of ranks, and the run takes the
    shape of the fastest (placer.learn.shapes; the choice is in the run directory's shapes.json). The move search
    keeps the run's shape, so without it a run cannot find a plan of another shape."""
    ranks: bool = False
    """score every placement as it runs across processes, one rank per device it uses (the runtime `placer run` runs
    across processes: each maximal run of ops on one device a pipeline stage, torch's schedule, activations and
    gradients sent between ranks): under --env sim on the simulator of ranks (envs.sim.ranks.RankSim), under --env
    measured as one Ray job of one process per device per placement (envs.real.ray.jobs.RanksEnv). For a cluster file
    of `placer profile SOURCE --ranks N`. Node order; the lower bound is that of ranks
    (envs.sim.ranks.ranks_lower_bound: the one-process bound does not hold here)."""
    schedule: str | None = None
    """--ranks: torch's pipeline schedule of every plan (gpipe, 1f1b, looped_bfs, interleaved_1f1b, interleaved_zb,
    planned; None: the one that fits each plan, as `placer run` picks it). Not zbv or dualpipev: the learner's
    placements cannot say a V's two stages on one rank."""
    looped: bool = False
    """--ranks: let the simulator score plans of more than one stage per rank (looped schedules, or a
    planned order). Off unless --schedule names looped_bfs, interleaved_1f1b, interleaved_zb or planned: measured on
    two CPU ranks, the simulator of ranks put such plans 16 % and 63 % fast, where it puts one stage per rank within a
    few percent, and a learned looped plan ran 0.79x the splits (BENCHMARKS.md, "A learned looped plan")."""
    backend: BackendName = "gloo"
    """--ranks with --env measured: the process group, "gloo" (CPU tensors, one CPU per rank) or "nccl" (one GPU per
    rank)."""
    iterations: int | None = None
    """stop after this many iterations (None: only the time budget)."""
    time_budget_s: float | None = None
    """stop after this many seconds of training, warm start included (None: only iterations;
    the command line's default is 300 when neither is given)."""
    seed: int = 0
    """seed of the learner: the move search's draws and critic, or the policy's initialisation and sampling (a CPU
    run is reproducible)."""
    logdir: str | None = None
    """run directory (default runs/<graph>-<cluster>-<time>): TensorBoard, checkpoint, best_placement.json."""
    resume: bool = False
    """continue from logdir's checkpoint with the same best, optimizer and RNG states (the checkpoint's model and
    training options win over those given now, which are reported on stderr)."""
    device: str = "cpu"
    """torch device of the policy (--algo reinforce|ppo): "cpu", "cuda", "cuda:N" or "auto"."""
    device_map: str | None = None
    """logical -> torch devices for --env measured and --profile, e.g. "gpu:0=cuda:1,*=cpu"."""
    workers: int | None = None
    """--env measured: Ray workers (default: one per machine in the Ray cluster)."""
    ray_address: str | None = None
    """--env measured: join this Ray cluster (HEAD_IP:PORT) instead of starting a local one; the driver sends this
    machine's Ray token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) and ships SOURCE's module."""
    measure_timeout_s: float = 600.0
    """--env measured: seconds one placement's measurement (its training steps) may take."""
    measure_heuristics: int = 3
    """--env measured: measure the heuristics with this many fastest simulated placements on the same workers, and
    compare the learned placement with the best of those measured (0: none; the comparison is then with a
    simulated time, and says so)."""
    rematch: int = 3
    """--env measured: at the end, measure the best placement and the best measured heuristic's this many times more
    each, side by side, and compare their medians (the best of many noisy measurements is biased low; 0: off); the
    one with the lower median is the run's best (--algo corrected: its own side-by-side with the simulator's best
    and its runner-up comes first)."""
    heuristics: tuple[str, ...] | None = None
    """heuristics to compare with and warm-start from (None: all registered; on the command line a comma list)."""
    eval_every: int = 10
    """score the policy's greedy decoding every this many iterations (--algo reinforce|ppo)."""
    checkpoint_every: int = 20
    """write a checkpoint every this many iterations (and on Ctrl-C and at the end)."""
    progress: bool = True
    """report progress on stderr: a line per phase, then a bar (on a terminal) or a line every few seconds."""
    equal_budget_search: bool = True
    """after training, run module_search with as many simulated placements as the run used (outside the budget, for at
    most as long as the run took) and report it beside the learner's best (--env sim); a placement of it faster than
    the learner's is kept as equal_budget_placement.json."""
    ablation: bool = True
    """--algo moves with the critic's proposals, --env sim: after training, run the same move search with its moves
    drawn uniformly and the levels in turn (its ablation: nothing learned), from the same start, given as many
    placements as the learner's search simulated (outside the budget, for at most as long as it took), and report
    what the learning added over it."""


@dataclass
class AlgoOptions:
    """The learning algorithm: reward -> reward baseline -> advantage -> loss, and its optimizer.

    Tuned defaults (``preset="tuned"``) versus the paper's (``preset="paper"``,
    see :data:`PRESETS`): the defaults were measured on nmt-2 / nmt-4 /
    inception-v3 on a 2-core CPU with a warm start. A warm-started policy needs
    a small learning rate (5e-4; 2e-3 drifts away from its incumbent within a
    few steps) and a zero-mean reward baseline (leave-one-out: an EMA lagging above a
    falling batch mean makes every advantage negative and pushes the incumbent's
    probability down); normalising advantages by the batch's reward std makes
    the step size independent of the reward scale. The paper trains from scratch
    for hours on GPUs, where lr 0.1 with a decay schedule and logit noise are
    affordable.
    """

    algo: AlgoName = "reinforce"
    """"moves" (the default preset's): local search from the best heuristic whose moves a learned critic ranks before
    they are simulated (placer.learn.move_search; no policy network, so the policy options and the imitation warm
    start do not apply; with a time budget and the simulator, its first 20% of the time goes to module_search, and
    the moves start from the better placement); or the paper's policy network trained by "reinforce" (policy
    gradient + entropy bonus) or "ppo" (clipped surrogate); or, with real measurements (--env measured), "corrected":
    the move search on the simulator corrected by the measurements taken (each device's speed and the links' refitted
    to them, then a model of the error they leave), measuring what the corrected simulator finds most promising
    (placer.learn.measured_search)."""
    proposals: ProposalName = "critic"
    """--algo moves|corrected: "critic" ranks the moves by the learned critic and draws each round's level by the
    levels' hit rates; "uniform" draws the moves uniformly and takes the levels in turn (the ablation: nothing
    learned)."""
    critic: str = "auto"
    """--algo moves|corrected: the critic the move search starts from: "pretrained" (shipped with placer, trained on
    the moves the search simulated on 51 graphs in one process, so it ranks from the first round, and fine-tuned on
    this run's moves), "fresh" (untrained: it learns from this run's moves only), a critic file (python -m
    bench.critic_pretrain), or "auto" (the default): pretrained for --algo moves under the simulator in one process,
    where it was trained and measured (level with a fresh one on held-out graphs, ahead on the zoo it was trained on,
    BENCHMARKS.md, "The pretrained critic as the default"), fresh elsewhere (--ranks, --env measured, --algo
    corrected: not measured with it)."""
    fine_tune_critic: bool = True
    """--algo moves|corrected: train the critic on this run's moves as it goes (--no-fine-tune-critic: it ranks as it
    started)."""
    homes: HomesName = "auto"
    """--algo moves under --env sim: home moves too (placer.learn.home_moves): a layer sent to a GPU with its
    parameters, gradient and Adam state homed on the host, copied in ahead of use (envs.sim.homes), counted in the
    same budget; the best placement's file carries the homes (param_homes) and placer.apply runs them. "auto": on
    when the model's training state does not fit the GPUs (the host joins the search then), "on", or "off"."""
    checkpointing: RecomputeName = "auto"
    """--env sim, one process, one microbatch: activation checkpointing of the layers of the model's repeated lists
    of modules (an encoder's and a decoder's). With --algo moves, chosen by moves (placer.learn.checkpoint_moves):
    each move may turn one layer on or off, counted in the same budget; with a policy, every placement the run scores
    checkpoints each layer it keeps whole (placer.learn.checkpoint_choice). At the end the best placement's file turns
    off, one at a time, the layers whose second forward does not pay; placer.apply runs the rest. "auto": on when the
    run searches parameter homes (the model's training state does not fit the GPUs), "on", or "off"."""
    host_step: HostStepName = "auto"
    """with home moves (--homes): when the homed parameters are stepped, in every placement the run scores and in the
    best placement's file: "backward", during the backward, in batches as their gradients come home, while the GPU
    goes on (train with placer.apply.step_in_backward; placer run does); "after", by the optimizer's step after it,
    as FSDP2 and ZeRO-Offload step them; "auto", "backward" in the search, and the best placement's file keeps
    whichever of the two simulates faster for it."""
    samples: int = 8
    """K: placements the policy samples and the run scores per iteration (--algo reinforce|ppo)."""
    lr: float = 5e-4
    """Adam learning rate of the RL updates; measured: 2e-3 already drifts a warm-started policy away
    from its incumbent within a few steps; from scratch (warm_start="none") 1e-2 learns faster."""
    lr_decay: float = 1.0
    """multiply the learning rate by this every lr_decay_every iterations after lr_decay_after (1: constant;
    paper: 0.95)."""
    lr_decay_every: int = 50
    """iterations between learning-rate decays (paper: 50)."""
    lr_decay_after: int = 0
    """iteration from which the learning rate decays (paper: 400)."""
    grad_clip: float = 1.0
    """gradient-norm clip (paper: 1.0)."""
    entropy_coef: float = 0.001
    """weight of the mean per-item entropy bonus."""
    baseline: RewardBaselineName = "loo"
    """the reward baseline: "loo", each sample's is the mean reward of the other K-1 samples (zero-mean advantages);
    "ema": the paper's moving average of the batch-mean reward."""
    baseline_decay: float = 0.9
    """EMA decay of the reward baseline (paper: 0.9); the EMA is tracked and logged either way."""
    normalize_advantage: bool = True
    """divide advantages by the batch's reward std (keeps the step size independent of the reward scale)."""
    fail_factor: float = 10.0
    """a failed (OOM) placement counts as fail_factor x the best single-device step time (the paper's 100 s
    failing runtime was about 10x its models' step times)."""
    fail_mask_after: int | None = None
    """from this iteration on, failed placements are left out of the loss and the reward baseline (paper: 1000;
    None: never)."""
    logit_noise: float = 0.0
    """std of Gaussian noise added to the logits while sampling (exploration; 0: none)."""
    logit_noise_steps: int = 0
    """full logit noise for this many iterations, then fading linearly to 0 over half as many more."""
    ppo_epochs: int = 4
    """PPO: gradient epochs per batch."""
    ppo_clip: float = 0.2
    """PPO: ratio clip."""
    warm_start: WarmStartName = "best"
    """"best": start from the best heuristic's placement (the move search's start; a policy first imitates it, then
    RL); "none": from scratch."""
    warm_start_steps: int = 150
    """at most this many imitation steps."""
    warm_start_lr: float = 0.02
    """Adam learning rate of the imitation steps."""
    warm_start_nll: float = 0.01
    """stop imitating once greedy decoding matches and the mean NLL per item is below this (lower: samples
    stay closer to the incumbent; measured on inception-v3: 0.05 -> no gain in 300 s, 0.01 -> -0.4%)."""


@dataclass
class PolicyOptions:
    """The policy network (see :mod:`policies`)."""

    policy: str = "seq2seq"
    """policy name in policies.POLICIES: seq2seq (the ICML 2017 policy), hierarchical (ICLR 2018 grouper-placer) or gnn
    (a graph network that serves any graph and cluster; see `placer pretrain` and --init)."""
    max_groups: int | None = None
    """items the policy places (co-location groups); None: min(256, 20 x devices) as in HDP's code; 0: every op."""
    hidden: int = 64
    """LSTM units per direction (paper: 256; 64 is several times faster on a CPU)."""
    layers: int = 1
    """encoder LSTM layers (paper: 2)."""
    temperature: float = 10.0
    """logits are divided by this before C*tanh (HDP: 10)."""
    tanh_c: float = 5.0
    """C of C*tanh(logits) (HDP: 5)."""
    init: str | None = None
    """a pretrained policy file (`placer pretrain`, .pt + .json sidecar) to fine-tune (gnn only; implies
    --policy gnn). The warm start still imitates the best heuristic first (--warm-start none skips it), and
    `placer train` then defaults --entropy to 0.01 (not 0.001) and --warm-start-lr to 0.003 (not 0.02), as a
    pretrained policy is sharp (BENCHMARKS.md, fine-tuning)."""


@dataclass
class TrainConfig(PolicyOptions, AlgoOptions, RunOptions):
    """Everything a training run depends on (see ``placer train --help``).

    Build it with :meth:`from_preset` to start from a preset's values.
    """

    preset: PresetName = "tuned"
    """"tuned": the defaults with --algo moves (tuned for short CPU runs); "paper": REINFORCE with the papers' settings
    (Adam lr 0.1 x0.95 every 50 steps after 400, EMA reward baseline 0.9, logit noise for the first 500-750 steps, 2x256
    LSTMs, failed placements masked from the loss after step 1000). Options given with it win."""

    @classmethod
    def from_preset(cls, preset: str = "tuned", **options: Any) -> "TrainConfig":
        """The config of ``preset`` (see :data:`PRESETS`) with ``options`` on top.

        Fine-tuning (``init`` given) changes three defaults that ``options`` does not
        set: ``policy`` "gnn", ``entropy_coef`` :data:`INIT_ENTROPY` and
        ``warm_start_lr`` :data:`INIT_WARM_START_LR`. A ``policy`` or ``init`` given
        makes ``algo`` "reinforce" unless it is given too (the "tuned" preset's
        "moves" trains no policy).
        """
        if preset not in PRESETS:
            raise PlacerError(f"--preset {preset!r}: unknown (known: {', '.join(PRESETS)})")
        options = dict(options)
        if "policy" in options or options.get("init") is not None:  # a policy network to train: policy gradient
            options.setdefault("algo", "reinforce")
        if options.get("init") is not None:  # a pretrained policy still imitates the best heuristic first
            options.setdefault("policy", "gnn")  # unless warm_start="none" (BENCHMARKS.md, fine-tuning)
            options.setdefault("entropy_coef", INIT_ENTROPY)
            options.setdefault("warm_start_lr", INIT_WARM_START_LR)
        return cls(**{**PRESETS[preset], **options, "preset": preset})

    @property
    def run_options(self) -> RunOptions:
        return _part(RunOptions, self)

    @property
    def algo_options(self) -> AlgoOptions:
        return _part(AlgoOptions, self)

    @property
    def policy_options(self) -> PolicyOptions:
        return _part(PolicyOptions, self)

    def resolved(self, env: Any = None) -> "TrainConfig":
        """This config with ``score_order`` "auto" decided (see the field), for a run scored by ``env`` when given."""
        if self.score_order != "auto":
            return self
        from envs.sim import SimEnv  # numpy and torch: TrainConfig itself stays light for placer --help

        planned = (
            self.env == "sim"
            and not self.ranks
            and self.executor == "eager"
            and self.microbatches == 1
            and (env is None or isinstance(env, SimEnv))
        )
        return dataclasses.replace(self, score_order="planned" if planned else "node")

    def _validate_ranks(self) -> None:
        """The options of plans across processes (``--ranks``), each a one-line :class:`PlacerError`."""
        from graphs.plan import check_schedule_name

        if not self.ranks:
            if self.choose_shape:
                raise PlacerError("--choose-shape: only for plans across processes (add --ranks)")
            for name, value, default in (
                ("schedule", self.schedule, None),
                ("backend", self.backend, "gloo"),
                ("looped", self.looped, False),
            ):
                if value != default:
                    given = option_name(name) if value is True else f"{option_name(name)} {value}"
                    raise PlacerError(f"{given}: only for plans across processes (add --ranks)")
            return
        if self.score_order == "planned":
            raise PlacerError("--score-order planned: not across processes (--ranks scores each plan in node order)")
        if self.executor != "eager":
            raise PlacerError(f"--executor {self.executor}: --ranks simulates torch's pipeline runtime (eager) only")
        if self.workers is not None:
            raise PlacerError(
                f"--workers {self.workers}: across processes every placement is one job of one process per device"
            )
        if self.backend != "gloo" and self.env != "measured":
            raise PlacerError(f"--backend {self.backend}: only measured runs (--env measured) start processes")
        check_schedule_name(self.schedule, "--schedule")
        from envs.real.distributed.schedules import is_v

        if is_v(self.schedule):
            raise PlacerError(
                f"--schedule {self.schedule}: its V puts two consecutive stages on one rank, which a placement the "
                "learner proposes (a device per op) cannot say; find one with placer place SOURCE --method "
                f"stage_search --ranks --option schedule={self.schedule}"
            )

    @property
    def critic_used(self) -> str | None:
        """The critic the move search starts from: :attr:`critic`, with "auto" resolved ("pretrained" for --algo moves
        under the simulator in one process, "fresh" elsewhere); None where no critic ranks the moves (uniform
        proposals, a policy network)."""
        if self.algo not in ("moves", "corrected") or self.proposals != "critic":
            return None
        if self.critic != "auto":
            return self.critic
        return "pretrained" if self.algo == "moves" and self.env == "sim" and not self.ranks else "fresh"

    @property
    def one_stage_per_rank(self) -> bool:
        """--ranks: whether the simulator scores only plans of one stage per rank (:attr:`looped` off and no
        --schedule that runs more)."""
        return not self.looped and self.schedule in (None, "gpipe", "1f1b")

    def validate(self) -> None:
        """Raise :class:`PlacerError` (one line, naming the option) for a bad setting."""
        from policies import POLICIES  # torch: TrainConfig itself stays light for placer --help

        if self.policy not in POLICIES:
            raise PlacerError(f"--policy {self.policy!r}: unknown (known: {', '.join(POLICIES)})")
        for f in dataclasses.fields(self):  # the Literal-typed choices
            choices = literal_choices(f)
            if choices and getattr(self, f.name) not in choices:
                raise PlacerError(
                    f"{option_name(f.name)} {getattr(self, f.name)!r}: unknown (known: {', '.join(choices)})"
                )
        if self.iterations is None and self.time_budget_s is None:
            raise PlacerError("train: give --iterations or --time-budget")
        for name, (option, bounds) in INT_FIELDS.items():
            value = getattr(self, name)
            if value is not None or name not in OPTIONAL:
                check_int(value, option, **bounds)
        for name, (option, bounds) in FLOAT_FIELDS.items():
            value = getattr(self, name)
            if value is not None or name not in OPTIONAL:
                check_float(value, option, **bounds)
        for f in dataclasses.fields(self):
            if base_type(f) is bool and not isinstance(getattr(self, f.name), bool):
                raise PlacerError(f"{f.name} {getattr(self, f.name)!r}: must be true or false")
        if self.heuristics is not None and not (
            isinstance(self.heuristics, tuple) and all(isinstance(h, str) for h in self.heuristics)
        ):
            raise PlacerError(f"--heuristics {self.heuristics!r}: must be a tuple of heuristic names")
        if self.score_order == "planned" and self.env != "sim":
            raise PlacerError("--score-order planned: only with --env sim (a measured run runs node order)")
        if self.microbatches != 1 and self.env != "sim" and not self.ranks:
            raise PlacerError(
                f"--microbatches {self.microbatches}: only --env sim, or --ranks, scores microbatched plans"
            )
        self._validate_ranks()
        if self.homes == "on":
            for bad, why in (
                (self.algo != "moves", f"--algo {self.algo} searches op placements only (home moves: --algo moves)"),
                (self.env != "sim", "--env measured measures plans whose parameters live with their ops"),
                (self.ranks, "--ranks: a plan with parameter homes runs in one process"),
            ):
                if bad:
                    raise PlacerError(f"--homes on: {why}")
        if self.checkpointing == "on":
            for bad, why in (
                (self.env != "sim", "--env measured measures plans that keep every activation"),
                (self.ranks, "--ranks: a plan with checkpointed blocks runs in one process"),
                (self.microbatches != 1, f"--microbatches {self.microbatches}: blocks run with one microbatch"),
                (self.executor != "eager", "--executor dataflow: blocks are simulated under the eager executor"),
            ):
                if bad:
                    raise PlacerError(f"--checkpointing on: {why}")
        if self.inflight is not None and self.inflight > self.microbatches:
            raise PlacerError(f"--inflight {self.inflight}: must be at most --microbatches ({self.microbatches})")
        if self.critic not in CRITIC_NAMES:
            from policies.policy_file import load_critic

            load_critic(self.critic)  # a bad file is a one-line error now, not after the heuristics
        if self.init is not None and self.policy != "gnn":
            raise PlacerError(f"--init: a pretrained policy is a gnn policy; --policy is {self.policy!r}")
        if self.resume and not self.logdir:
            raise PlacerError("--resume: needs --logdir (the run directory to continue)")
        if self.logdir is not None:
            check_output_dir(self.logdir, "--logdir")


def _part(cls: type, config: TrainConfig) -> Any:
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


#: entropy_coef when fine-tuning (``init``) and not given: a pretrained gnn policy, warm-started, is sharp, and
#: at the default 0.001 its entropy fell to 0.006 nats per item within 700 iterations, leaving it stuck on its first
#: improvement (BENCHMARKS.md, "Fine-tuning ... model 2").
INIT_ENTROPY = 0.01
#: warm_start_lr when fine-tuning (``init``) and not given: `placer pretrain`'s imitation rate. The default
#: 0.02 (for a fresh seq2seq) threw the no-cnn policy off inception-v3/k80x4 (2,591.8 ms after 150 or 500
#: steps, against 374.5 ms at 0.003; BENCHMARKS.md, fine-tuning).
INIT_WARM_START_LR = 0.003

# The presets: name -> the fields it sets (everything else keeps its default).
PRESETS: dict[str, dict[str, Any]] = {
    # the move search, after module_search's share of the budget: at equal budget (10k placements) it is 0.94-0.98x
    # the best heuristic on nmt-4 and inception-v3, level with module_search on nmt-2 (1.000-1.002, 8 seeds) and equal
    # on gpt2 and resnet50; its critic beats uniform proposals on moe-400 (8 of 8 seeds), not on nmt-2 (BENCHMARKS.md,
    # "Eight seeds, and a share of the budget for module_search"). A policy (--policy, --init) or --algo
    # reinforce|ppo trains a policy network instead
    "tuned": {"algo": "moves"},
    "paper": dict(
        algo="reinforce",
        lr=0.1,
        lr_decay=0.95,
        lr_decay_every=50,
        lr_decay_after=400,
        grad_clip=1.0,
        baseline="ema",
        baseline_decay=0.9,
        normalize_advantage=False,
        logit_noise=1.0,
        logit_noise_steps=500,  # full noise to step 500, fading to 0 at step 750
        hidden=256,
        layers=2,
        fail_factor=10.0,
        fail_mask_after=1000,  # 100 s failing runtime ~ 10x the papers' step times
        warm_start="none",
    ),
}

# Options whose name on the command line is not --<field-name-with-dashes>.
OPTION_NAMES = {
    "time_budget_s": "--time-budget",
    "measure_timeout_s": "--measure-timeout",
    "entropy_coef": "--entropy",
    "progress": "--no-progress",
    "source": "SOURCE",
}


def option_name(field_name: str) -> str:
    """The command-line option that sets TrainConfig field ``field_name`` (named in error messages)."""
    return OPTION_NAMES.get(field_name, "--" + field_name.replace("_", "-"))


# The numeric fields of TrainConfig: field -> bounds for placer.option_checks.check_int / check_float (errors name the
# field's option). Every numeric field is listed (a test checks).
_INT_BOUNDS: dict[str, dict[str, int]] = {
    "samples": dict(least=1, most=4096),
    "microbatches": dict(least=1, most=1024),  # envs.microbatch.MAX_MICROBATCHES
    "inflight": dict(least=1, most=1024),  # and at most microbatches (validate)
    "iterations": dict(least=1),
    "seed": dict(least=0, most=MAX_SEED),
    "max_groups": dict(least=0),  # 0 places every op
    "hidden": dict(least=1, most=4096),
    "layers": dict(least=1, most=16),
    "warm_start_steps": dict(least=0),
    "ppo_epochs": dict(least=1, most=1000),
    "eval_every": dict(least=1),
    "checkpoint_every": dict(least=1),
    "workers": dict(least=1),
    "measure_heuristics": dict(least=0, most=64),
    "rematch": dict(least=0, most=100),
    "lr_decay_every": dict(least=1),
    "lr_decay_after": dict(least=0),
    "fail_mask_after": dict(least=0),
    "logit_noise_steps": dict(least=0),
}
_FLOAT_BOUNDS: dict[str, dict[str, float]] = {
    "time_budget_s": dict(above=0),
    "temperature": dict(above=0),
    "tanh_c": dict(above=0),
    "lr": dict(above=0, most=1),
    "lr_decay": dict(above=0, most=1),
    "grad_clip": dict(above=0),
    "entropy_coef": dict(least=0),
    "baseline_decay": dict(least=0, below=1),
    "fail_factor": dict(least=1),
    "logit_noise": dict(least=0),
    "warm_start_lr": dict(above=0, most=1),
    "warm_start_nll": dict(least=0),
    "ppo_clip": dict(above=0, below=1),
    "measure_timeout_s": dict(above=0),
}
INT_FIELDS = {name: (option_name(name), b) for name, b in _INT_BOUNDS.items()}
FLOAT_FIELDS = {name: (option_name(name), b) for name, b in _FLOAT_BOUNDS.items()}
OPTIONAL = {"iterations", "time_budget_s", "max_groups", "workers", "fail_mask_after", "inflight"}  # None: not set

# On --resume these options are taken from the command line; every other one from the checkpoint.
RESUME_KEEPS = (
    "iterations",
    "time_budget_s",
    "resume",
    "logdir",
    "progress",
    "device",
    "device_map",
    "workers",
    "ray_address",
    "source",
    "cluster",
    "measure_timeout_s",
    "measure_heuristics",
    "rematch",
)


# ----------------------------------------------------------------- field introspection (for the CLI)
@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def base_type(f: dataclasses.Field) -> Any:
    """The field's type without ``| None``."""
    tp = _hints()[f.name]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp


def literal_choices(f: dataclasses.Field) -> tuple[str, ...]:
    """The allowed values of a ``Literal``-typed field (empty for other fields)."""
    tp = base_type(f)
    return tuple(typing.get_args(tp)) if typing.get_origin(tp) is Literal else ()


def is_optional(f: dataclasses.Field) -> bool:
    return type(None) in typing.get_args(_hints()[f.name])


@functools.cache
def field_docs() -> dict[str, str]:
    """Field name -> its docstring (the string literal under it), for every option dataclass here."""
    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    docs: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for a, b in zip(body, body[1:]):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[a.target.id] = " ".join(b.value.value.split())
    return docs
