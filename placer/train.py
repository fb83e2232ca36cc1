"""Train a placement policy with REINFORCE (or PPO) against a scorer.

One readable loop, in the spirit of CleanRL: build env and policy, (optionally)
warm-start by imitation, then repeat: sample K placements -> score them in one
batch -> rewards and advantages -> update -> log -> checkpoint.

Reward and failing signal. The paper's reward is ``-sqrt(runtime)`` with a failing
runtime of 100 s for placements that do not run, i.e. about 10x its models' step
times. Absolute seconds do not transfer between a 2 ms and a 2 s model, so here
every step time is divided by ``t_ref``, the best single-device step time
(ignoring memory) of the graph on this cluster: the reward is
``-sqrt(step_time_s / t_ref)`` (about -1 for a no-better-than-one-device
placement) and a failed (OOM) placement counts as ``fail_factor * t_ref``.

Warm start (``warm_start="best"``, the default; honest labelling). Before RL, the
policy is trained for a few steps to imitate the best heuristic placement (by
simulated step time), contracted to the policy's groups by majority vote. RL then
starts from a policy whose greedy decoding is (close to) that heuristic. The best
placement reported is always one the policy sampled or greedily decoded; its
``meta`` says which, at which iteration, and which heuristic it was warm-started
from. ``warm_start="none"`` trains from scratch. So that the incumbent can be
imitated exactly, the seq2seq policy's items are the coarsened co-location
groups further cut wherever the incumbent changes device along the topological
order (``policies.seq2seq.refine_grouping``): more items (e.g. 100 -> 333 on
nmt-2 with annealing's placement), but majority-voting an incumbent onto the
plain coarse groups lost 10-18% of its quality on nmt-2.

Baseline. The paper's EMA baseline (decay 0.9) is available (``baseline="ema"``)
and always logged, but the default is leave-one-out: each of the K samples is
compared with the mean reward of the other K-1, so advantages have zero mean in
every batch (an EMA lagging above a falling batch mean makes them all negative
and pushes the mode's probability down). Advantages are divided by the batch's
reward std. After a warm start the RL learning rate must be small (5e-4):
measured on nmt-2, 2e-3 raises the entropy from 0.09 to 0.13 within five steps
and 1e-2 to 0.9 within a hundred, and the samples get worse with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from graphs import OpGraph, PlacerError
from placer import checkpoint
from placer.checks import MAX_SEED, check_float, check_int, check_output_dir
from placer.placement import Placement
from placer._callable import make_module_callable
from placer.rl_algos import ALGOS, imitate


@dataclass
class TrainConfig:
    """Everything a training run depends on (one typed config; see ``placer train --help``)."""

    source: str = ""
    """SOURCE the graph came from (graph file, zoo name, module:callable), for the record and --env measured."""
    cluster: str = "k80x4"
    """cluster preset name or JSON file."""
    profile: str | None = None
    """optional profile file applied to the cluster (Cluster.with_profile)."""
    env: str = "sim"
    """scorer: "sim" (envs.SimEnv) or "measured" (envs.MeasuredEnv, real devices)."""
    executor: str = "eager"
    """simulator executor model (--env sim and the heuristics): "eager" (PyTorch) or "dataflow" (TensorFlow)."""
    policy: str = "seq2seq"
    """policy name in policies.POLICIES."""
    algo: str = "reinforce"
    """"reinforce" (EMA baseline + entropy bonus) or "ppo" (clipped surrogate)."""
    samples: int = 8
    """K: placements sampled and scored per iteration."""
    iterations: int | None = None
    """stop after this many iterations (None: only the time budget)."""
    time_budget_s: float | None = None
    """stop after this many seconds of training, warm start included (None: only iterations)."""
    seed: int = 0
    """seed of the policy initialisation and sampling (a CPU run is reproducible)."""
    logdir: str | None = None
    """run directory (default runs/<graph>-<cluster>-<time>): TensorBoard, checkpoint, best_placement.json."""
    resume: bool = False
    """continue from logdir's checkpoint with the same best, optimizer and RNG states."""
    max_groups: int | None = None
    """items the policy places (co-location groups); None: min(256, 20 x devices) as in HDP's code."""
    hidden: int = 64
    """LSTM units per direction (paper: 256; 64 is several times faster on a CPU)."""
    layers: int = 1
    """encoder LSTM layers (paper: 2)."""
    temperature: float = 10.0
    """logits are divided by this before C*tanh (HDP: 10)."""
    tanh_c: float = 5.0
    """C of C*tanh(logits) (HDP: 5)."""
    lr: float = 5e-4
    """Adam learning rate of the RL updates; measured: 2e-3 already drifts a warm-started policy away
    from its incumbent within a few steps; from scratch (warm_start="none") 1e-2 learns faster."""
    grad_clip: float = 1.0
    """gradient-norm clip (paper: 1.0)."""
    entropy_coef: float = 0.001
    """weight of the mean per-item entropy bonus."""
    baseline: str = "loo"
    """"loo": each sample's baseline is the mean reward of the other K-1 samples; "ema": the paper's moving average."""
    baseline_decay: float = 0.9
    """EMA decay of the reward baseline (paper: 0.9); the EMA is tracked and logged either way."""
    normalize_advantage: bool = True
    """divide advantages by the batch's reward std (keeps the step size independent of the reward scale)."""
    fail_factor: float = 10.0
    """a failed (OOM) placement counts as fail_factor x the best single-device step time."""
    warm_start: str = "best"
    """"best": imitate the best heuristic placement before RL; "none": start from scratch."""
    warm_start_steps: int = 150
    """at most this many imitation steps."""
    warm_start_lr: float = 0.02
    """Adam learning rate of the imitation steps."""
    warm_start_nll: float = 0.01
    """stop imitating once greedy decoding matches and the mean NLL per item is below this (lower: samples
    stay closer to the incumbent; measured on inception-v3: 0.05 -> no gain in 300 s, 0.01 -> -0.4%)."""
    ppo_epochs: int = 4
    """PPO: gradient epochs per batch."""
    ppo_clip: float = 0.2
    """PPO: ratio clip."""
    eval_every: int = 10
    """score the greedy decoding every this many iterations."""
    checkpoint_every: int = 20
    """write a checkpoint every this many iterations (and on Ctrl-C and at the end)."""
    device: str = "cpu"
    """torch device of the policy: "cpu", "cuda", "cuda:N" or "auto"."""
    device_map: str | None = None
    """logical -> torch devices for --env measured and --profile, e.g. "gpu:0=cuda:1,*=cpu"."""
    workers: int | None = None
    """--env measured: Ray workers (default: one per machine in the Ray cluster)."""
    ray_address: str | None = None
    """--env measured: join this Ray cluster instead of starting a local one."""
    measure_timeout_s: float = 600.0
    """--env measured: seconds one placement's measurement (its training steps) may take."""
    heuristics: tuple[str, ...] | None = None
    """baselines to compare with and warm-start from (None: all registered)."""
    progress: bool = True
    """show a tqdm progress bar."""

    def validate(self) -> None:
        """Raise :class:`PlacerError` (one line, naming the option) for a bad setting."""
        from policies import POLICIES

        if self.policy not in POLICIES:
            raise PlacerError(f"--policy {self.policy!r}: unknown (known: {', '.join(POLICIES)})")
        if self.algo not in ALGOS:
            raise PlacerError(f"--algo {self.algo!r}: unknown (known: {', '.join(ALGOS)})")
        if self.env not in ENVS:
            raise PlacerError(f"--env {self.env!r}: unknown (known: {', '.join(ENVS)})")
        from envs.schedule import EXECUTORS

        if self.executor not in EXECUTORS:
            raise PlacerError(f"--executor {self.executor!r}: unknown (known: {', '.join(EXECUTORS)})")
        if self.iterations is None and self.time_budget_s is None:
            raise PlacerError("train: give --iterations or --time-budget")
        for name, (option, bounds) in _INT_FIELDS.items():
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                check_int(value, option, **bounds)
        for name, (option, bounds) in _FLOAT_FIELDS.items():
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                check_float(value, option, **bounds)
        for name in ("resume", "normalize_advantage", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise PlacerError(f"{name} {getattr(self, name)!r}: must be true or false")
        if self.resume and not self.logdir:
            raise PlacerError("--resume: needs --logdir (the run directory to continue)")
        if self.logdir is not None:
            check_output_dir(self.logdir, "--logdir")
        if self.baseline not in ("loo", "ema"):
            raise PlacerError(f"baseline {self.baseline!r}: must be 'loo' or 'ema'")
        if self.warm_start not in ("best", "none"):
            raise PlacerError(f"--warm-start {self.warm_start!r}: must be best or none")


# The numeric fields of TrainConfig: field -> (option named in errors, bounds for
# placer.checks.check_int / check_float). Every numeric field is listed (a test checks).
_INT_FIELDS: dict[str, tuple[str, dict[str, int]]] = {
    "samples": ("--samples", dict(least=1, most=4096)),
    "iterations": ("--iterations", dict(least=1)),
    "seed": ("--seed", dict(least=0, most=MAX_SEED)),
    "max_groups": ("--max-groups", dict(least=0)),  # 0 places every op
    "hidden": ("--hidden", dict(least=1, most=4096)),
    "layers": ("layers", dict(least=1, most=16)),
    "warm_start_steps": ("warm_start_steps", dict(least=0)),
    "ppo_epochs": ("ppo_epochs", dict(least=1, most=1000)),
    "eval_every": ("eval_every", dict(least=1)),
    "checkpoint_every": ("checkpoint_every", dict(least=1)),
    "workers": ("--workers", dict(least=1)),
}
_FLOAT_FIELDS: dict[str, tuple[str, dict[str, float]]] = {
    "time_budget_s": ("--time-budget", dict(above=0)),
    "temperature": ("temperature", dict(above=0)),
    "tanh_c": ("tanh_c", dict(above=0)),
    "lr": ("--lr", dict(above=0, most=1)),
    "grad_clip": ("grad_clip", dict(above=0)),
    "entropy_coef": ("--entropy", dict(least=0)),
    "baseline_decay": ("baseline_decay", dict(least=0, below=1)),
    "fail_factor": ("fail_factor", dict(least=1)),
    "warm_start_lr": ("warm_start_lr", dict(above=0, most=1)),
    "warm_start_nll": ("warm_start_nll", dict(least=0)),
    "ppo_clip": ("ppo_clip", dict(above=0, below=1)),
    "measure_timeout_s": ("--measure-timeout", dict(above=0)),
}
_OPTIONAL = {"iterations", "time_budget_s", "max_groups", "workers"}  # None: not set


@dataclass
class TrainResult:
    """What a run produced."""

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

    @property
    def best_heuristic(self) -> tuple[str, float] | None:
        ok = {k: v for k, v in self.heuristics.items() if np.isfinite(v)}
        return min(ok.items(), key=lambda kv: kv[1]) if ok else None

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
            "expert_step_time_s": fin(self.heuristics.get("expert")),
            "heuristics": {k: fin(v) for k, v in self.heuristics.items()},
            "lower_bound_s": fin(self.lower_bound_s),
            "reference_step_time_s": fin(self.reference_step_time_s),
            "logdir": self.logdir,
            "interrupted": self.interrupted,
            "setup_s": self.setup_s,
            "num_items": self.num_items,
            "warm_start": self.warm_start,
            "warm_start_step_time_s": fin(self.warm_start_step_time_s),
            "best_placement": os.path.join(self.logdir, "best_placement.json") if self.best_placement else None,
            # the issue order the placement file carries and its simulated (eager) step time
            "issue_order": meta.get("issue_order"),
            "issue_order_step_time_s": fin(meta.get("issue_order_step_time_s")),
        }


class CachedScorer:
    """Scores op-device arrays ``[K, num_ops]`` once each: ``(step_time_s, failed)``.

    Uses the env's fast ``step_times`` when it has one, else ``evaluate``. The cache
    key is a digest of the index array's bytes; identical rows of a batch are
    scored once.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.cache: dict[bytes, tuple[float, bool]] = {}
        self.evaluated = 0

    @staticmethod
    def key(row: np.ndarray) -> bytes:
        return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.int32).tobytes(), digest_size=16).digest()

    def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(idx, dtype=np.int32)
        keys = [self.key(r) for r in idx]
        todo = {k: i for i, k in reversed(list(enumerate(keys))) if k not in self.cache}
        if todo:
            rows = idx[list(todo.values())]
            if hasattr(self.env, "step_times"):
                t, failed = self.env.step_times(rows)
            else:
                results = self.env.evaluate(list(rows))
                t = np.array([r.step_time_s for r in results], dtype=float)
                failed = np.array([not r.ok for r in results])
            for k, ti, fi in zip(todo, np.asarray(t, dtype=float), np.asarray(failed, dtype=bool)):
                self.cache[k] = (float(ti), bool(fi))
            self.evaluated += len(todo)
        out = [self.cache[k] for k in keys]
        return np.array([o[0] for o in out]), np.array([o[1] for o in out])


# ------------------------------------------------------------------ setup helpers
def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise PlacerError(f"--device {name!r}: not a torch device (cpu, cuda, cuda:N, auto)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PlacerError(f"--device {name!r}: CUDA is not available on this machine")
    return dev


def _make_env(config: TrainConfig, graph: OpGraph, cluster: Any, logdir: str) -> Any:
    """The scorer named by ``config.env`` (registry ENVS; checked by TrainConfig.validate)."""
    return ENVS[config.env](config, graph, cluster, logdir)


def _sim_env(config: TrainConfig, graph: OpGraph, cluster: Any, logdir: str) -> Any:
    import envs

    return envs.SimEnv(graph, cluster, executor=config.executor)


def _measured_env(config: TrainConfig, graph: OpGraph, cluster: Any, logdir: str) -> Any:
    """Real training steps on Ray actors; needs a runnable SOURCE (zoo name or module:callable)."""
    from graphs import zoo
    from placer.sources import looks_like_callable

    if not (config.source in zoo.names() or looks_like_callable(config.source)):
        raise PlacerError(
            f"--env measured: SOURCE {config.source!r} is not runnable (need a zoo name or module:callable, not a graph file)"
        )
    try:
        from envs.measured import MeasuredEnv
    except ImportError as e:
        raise PlacerError(f"--env measured: the measurement harness is not available ({e})") from None
    return MeasuredEnv(config.source, cluster, graph=graph, run_dir=logdir, device_map=config.device_map,
                       workers=config.workers, ray_address=config.ray_address, measure_timeout_s=config.measure_timeout_s)


ENVS: dict[str, Any] = {"sim": _sim_env, "measured": _measured_env}


def _heuristics(graph: OpGraph, cluster: Any, config: TrainConfig) -> dict[str, tuple[float, np.ndarray | None]]:
    """name -> (simulated step time, op devices) of the heuristic baselines, via ``placer.compare``.

    Methods that cannot run get ``inf``; if the compare module is missing, the
    result is empty (the single-device placements are always scored separately).
    """
    try:
        from placer.compare import compare, default_methods
    except ImportError:
        return {}
    # by default every heuristic but ilp: a solver run of a minute whose plan rests on its own issue order
    methods = list(config.heuristics) if config.heuristics is not None else default_methods(exclude=("ilp",))
    if methods == []:
        return {}
    report = compare(graph, cluster, methods=methods, seed=config.seed, executor=config.executor)
    out: dict[str, tuple[float, np.ndarray | None]] = {}
    for row in report.rows:
        if row.kind != "baseline":
            continue
        ok = row.status == "ok" and row.step_time_s is not None and row.placement is not None
        idx = row.placement.indices(graph, cluster.device_names) if row.placement is not None else None
        out[row.method] = (float(row.step_time_s) if ok else float("inf"), idx)
    return out


def _safe_name(text: str, fallback: str, limit: int = 64) -> str:
    """``text`` as one short, portable path component: letters, digits, ``.``, ``_``, ``-``; at most ``limit`` chars.

    >>> _safe_name("nmt/2 (big)\\x00", "graph"), _safe_name("..", "graph"), len(_safe_name("x" * 5000, "graph"))
    ('nmt_2_big', 'graph', 64)
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:limit].rstrip("._-")
    return name or fallback


def _default_logdir(config: TrainConfig, graph: OpGraph) -> str:
    """``runs/<graph>-<cluster>-<time>``, built only from safe characters whatever the graph's name."""
    stem = _safe_name(graph.name or os.path.splitext(os.path.basename(config.source))[0], "graph")
    cname = _safe_name(os.path.splitext(os.path.basename(config.cluster))[0], "cluster")
    return os.path.join("runs", f"{stem}-{cname}-{time.strftime('%Y%m%d-%H%M%S')}")


LOCK_NAME = "train.lock"
BEST_NAME = "best_placement.json"


@contextlib.contextmanager
def _run_lock(logdir: str) -> Iterator[None]:
    """Hold an exclusive lock on the run directory (``flock`` on ``logdir/train.lock``) for the run.

    A second run on the same directory gets a PlacerError at once instead of
    interleaving checkpoints and best placements with the first. The lock goes
    with the process (a killed run leaves no stale lock); the file stays.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    path = os.path.join(logdir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        raise PlacerError(f"--logdir {logdir}: cannot open the lock file {LOCK_NAME} ({e.strerror or e})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise PlacerError(f"--logdir {logdir}: another training run is using this directory "
                              "(wait for it to end, or choose another --logdir)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def _same_problem(a: Placement, b: Placement) -> bool:
    """Whether the step times recorded in two placements' meta are comparable (same graph, devices, scorer)."""
    keys = ("env", "profile")
    return (a.graph_hash == b.graph_hash and a.devices == b.devices and a.cluster == b.cluster
            and all(a.meta.get(k) == b.meta.get(k) for k in keys))


def _recorded_step_time(p: Placement) -> float | None:
    t = p.meta.get("step_time_s")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) else None


def _save_best(path: str, placement: Placement) -> bool:
    """Write ``placement`` to ``path`` unless the file already holds one at least as fast.

    The step time is read from the file's ``meta.step_time_s``; a file that is
    unreadable, made for another graph/cluster/scorer, or without a recorded
    time is replaced. Returns whether it wrote.
    """
    new_t = _recorded_step_time(placement)
    if os.path.exists(path):
        try:
            old = Placement.load(path)
        except PlacerError:
            old = None
        if old is not None and _same_problem(old, placement):
            old_t = _recorded_step_time(old)
            if old_t is not None and (new_t is None or old_t <= new_t):
                return False
    placement.save(path)
    return True


def _hparams_table(config: TrainConfig, extra: dict[str, Any]) -> str:
    rows = {**dataclasses.asdict(config), **extra}
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in rows.items())


# --------------------------------------------------------------------- the loop
def train(config: TrainConfig, *, graph: OpGraph | None = None, cluster: Any = None, env: Any = None) -> TrainResult:
    """Train a placement policy; see :class:`TrainConfig`. Returns the best placement found.

    ``graph``, ``cluster`` and ``env`` may be given directly (tests, notebooks);
    otherwise they are resolved from ``config.source`` / ``config.cluster`` / ``config.env``.
    """
    import envs

    # ---- validate and resolve
    config.validate()
    device = _resolve_device(config.device)
    if graph is None:
        from placer.sources import resolve_graph

        graph = resolve_graph(config.source)
    if cluster is None:
        cluster = envs.resolve_cluster(config.cluster)
        if config.profile:
            from envs.profiler import with_profile

            graph, cluster = with_profile(graph, cluster, config.profile, device_map=config.device_map)
    if graph.num_ops == 0:
        raise PlacerError(f"{config.source or graph.name or 'graph'}: the graph has no ops, so there is nothing to place")
    logdir = config.logdir or _default_logdir(config, graph)
    check_output_dir(logdir, "--logdir")
    os.makedirs(logdir, exist_ok=True)
    with _run_lock(logdir):
        saved = None
        if config.resume:  # before anything is built on it: a checkpoint of another graph is a user error
            if not checkpoint.exists(logdir):
                raise PlacerError(f"--resume: {logdir} has no {checkpoint.CHECKPOINT_PT}")
            saved = checkpoint.load(logdir, map_location=device)
            _check_compatible(saved[1], config, graph, list(cluster.device_names), logdir)
        owns_env = env is None
        env = env if env is not None else _make_env(config, graph, cluster, logdir)
        try:
            return _train(config, graph, cluster, env, logdir, device, saved)
        finally:
            if owns_env and hasattr(env, "close"):
                env.close()


def _train(config: TrainConfig, graph: OpGraph, cluster: Any, env: Any, logdir: str, device: torch.device,
           saved: tuple[dict[str, Any], dict[str, Any]] | None) -> TrainResult:
    """The training run proper, in a locked ``logdir``; ``saved``: the checkpoint to resume (checked)."""
    import envs
    from policies import POLICIES

    score = CachedScorer(env)
    devices = list(cluster.device_names)
    num_devices = len(devices)

    # ---- reference times: the reward scale, heuristics and the lower bound
    setup_start = time.perf_counter()
    single_t, _ = score(np.repeat(np.arange(num_devices, dtype=np.int32)[:, None], graph.num_ops, axis=1))
    t_ref = float(np.min(single_t))  # best single-device time, memory ignored: the reward scale
    found = _heuristics(graph, cluster, config)
    heuristics = {name: t for name, (t, _) in found.items()}
    try:
        lower_bound_s = float(envs.lower_bound(graph, cluster))
    except Exception:  # a scorer without a bound (custom env) still trains
        lower_bound_s = None
    best_h = min(heuristics.items(), key=lambda kv: kv[1]) if heuristics else ("none", float("inf"))
    setup_s = time.perf_counter() - setup_start

    # ---- seed, policy, optimizer
    torch.manual_seed(config.seed)
    max_groups = config.max_groups if config.max_groups is not None else min(256, 20 * num_devices)
    warm = config.warm_start == "best" and np.isfinite(best_h[1])
    target = found[best_h[0]][1] if warm else None
    if saved is not None:  # the items must be those the checkpoint was trained on
        target = saved[1]["run"].get("warm_start_indices")
        target = np.asarray(target, dtype=np.int32) if target is not None else None
    policy = POLICIES[config.policy](
        graph, num_devices, max_groups=max_groups, hidden=config.hidden, layers=config.layers,
        temperature=config.temperature, tanh_c=config.tanh_c, refine=target,
    ).to(device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    gen = torch.Generator(device=device).manual_seed(config.seed)

    run = dict(iteration=0, elapsed_s=0.0, baseline=None, best_step_time_s=float("inf"), best_indices=None,
               best_found_by="", best_iteration=-1, time_to_best_s=float("nan"), time_to_beat_heuristic_s=None,
               warm_start="none", warm_start_indices=None, setup_s=setup_s)
    if saved is not None:
        tensors, state = saved
        try:
            policy.load_state_dict(tensors["policy"])
            optimizer.load_state_dict(tensors["optimizer"])
            gen.set_state(tensors["generator"].cpu())
        except (KeyError, RuntimeError, ValueError) as e:
            raise PlacerError(f"--resume: {os.path.join(logdir, checkpoint.CHECKPOINT_PT)} does not fit this run "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        run.update(state["run"])
        _adopt_newer_best(run, logdir, graph, devices, score, config)

    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(logdir)
    if not config.resume:
        writer.add_text("hyperparameters", _hparams_table(config, {
            "graph": graph.name, "num_ops": graph.num_ops, "items": getattr(policy, "num_items", max_groups),
            "devices": ",".join(devices), "reference_step_time_s": t_ref, "device": str(device),
            "best_heuristic": f"{best_h[0]} {best_h[1]}", "setup_s": setup_s}))

    t0 = time.perf_counter() - run["elapsed_s"]
    elapsed = lambda: time.perf_counter() - t0  # noqa: E731
    fail_cost = config.fail_factor * t_ref
    # the simulator that picks the best placement's issue order (built once; --env sim only)
    planner = (env if isinstance(env, envs.SimEnv) else envs.SimEnv(graph, cluster, executor=config.executor)) \
        if config.env == "sim" else None

    def consider(idx: np.ndarray, t: np.ndarray, failed: np.ndarray, found_by: str) -> None:
        """Keep the best successful placement; rewrite best_placement.json when it improves."""
        ok = np.flatnonzero(~failed & np.isfinite(t))
        if not len(ok):
            return
        j = ok[np.argmin(t[ok])]
        if t[j] < run["best_step_time_s"]:
            run.update(best_step_time_s=float(t[j]), best_indices=idx[j].tolist(), best_found_by=found_by,
                       best_iteration=run["iteration"], time_to_best_s=elapsed())
            if run["time_to_beat_heuristic_s"] is None and t[j] <= best_h[1]:
                run["time_to_beat_heuristic_s"] = elapsed()
            _save_best(os.path.join(logdir, BEST_NAME), _best_placement(graph, devices, cluster, config, run, planner))

    def save_checkpoint() -> None:
        run["elapsed_s"] = elapsed()
        tensors = {"policy": policy.state_dict(), "optimizer": optimizer.state_dict(), "generator": gen.get_state()}
        checkpoint.save(logdir, tensors, {"config": dataclasses.asdict(config), "graph_hash": graph.content_hash,
                                          "devices": devices, "run": run})

    # ---- warm start: imitate the best heuristic (counts against the time budget)
    if not config.resume and warm:
        # imitation may use at most half the time budget, so RL always gets its turn
        deadline = t0 + 0.5 * config.time_budget_s if config.time_budget_s is not None else None
        steps = imitate(policy, target, config, deadline=deadline)
        run.update(warm_start=f"imitation of {best_h[0]} ({steps} steps)", warm_start_indices=target.tolist())
    if not config.resume:
        # resumable from here on: a run killed before its first periodic checkpoint keeps its policy and items,
        # and the best it wrote to best_placement.json since is adopted on --resume (_adopt_newer_best)
        save_checkpoint()
    if not config.resume and warm:
        g_idx = policy.greedy()[None]
        g_t, g_failed = score(g_idx)
        run["warm_start_step_time_s"] = float(g_t[0]) if not g_failed[0] else None
        consider(g_idx, g_t, g_failed, "greedy")  # a run whose budget ends here still has a placement

    bar = None
    if config.progress:
        from tqdm.auto import tqdm

        total = config.iterations if config.iterations is not None else int(config.time_budget_s)
        bar = tqdm(total=total, initial=run["iteration"] if config.iterations is not None else int(elapsed()),
                   unit="it" if config.iterations is not None else "s", dynamic_ncols=True)
    interrupted = False
    try:
        while True:
            it = run["iteration"]
            if (config.iterations is not None and it >= config.iterations) or (
                config.time_budget_s is not None and elapsed() >= config.time_budget_s):
                break
            # greedy decoding first (cheap), so the warm-started policy's mode is scored at iteration 0
            if it % config.eval_every == 0:
                g_idx = policy.greedy()[None]
                g_t, g_failed = score(g_idx)
                consider(g_idx, g_t, g_failed, "greedy")
                writer.add_scalar("charts/greedy_step_time_s", g_t[0] if not g_failed[0] else fail_cost, it)
            # sample K placements, score them in one batch
            sample = ALGOS[config.algo].sample(policy, config.samples, gen)
            t, failed = score(sample.op_devices)
            consider(sample.op_devices, t, failed, "sample")
            cost = np.where(failed | ~np.isfinite(t), fail_cost, t)
            reward = -np.sqrt(cost / t_ref)
            if run["baseline"] is None:
                run["baseline"] = float(reward.mean())
            if config.baseline == "loo" and len(reward) > 1:
                adv = reward - (reward.sum() - reward) / (len(reward) - 1)
            else:
                adv = reward - run["baseline"]
            if config.normalize_advantage:
                adv = adv / (reward.std() + 1e-3 * abs(run["baseline"]) + 1e-8)
            adv_t = torch.as_tensor(adv, dtype=torch.float32, device=device)
            policy_loss, entropy = ALGOS[config.algo].update(policy, optimizer, sample, adv_t, config)
            run["baseline"] = config.baseline_decay * run["baseline"] + (1 - config.baseline_decay) * float(reward.mean())
            run["iteration"] = it + 1
            # log
            ok_t = t[~failed]
            writer.add_scalar("charts/best_step_time_s", run["best_step_time_s"], it)
            writer.add_scalar("charts/reward", float(reward.mean()), it)
            writer.add_scalar("charts/step_time_s", float(ok_t.mean()) if len(ok_t) else fail_cost, it)
            writer.add_scalar("charts/failed_fraction", float(failed.mean()), it)
            writer.add_scalar("charts/baseline", run["baseline"], it)
            writer.add_scalar("charts/elapsed_s", elapsed(), it)
            writer.add_scalar("losses/policy_loss", policy_loss, it)
            writer.add_scalar("losses/entropy", entropy, it)
            share = np.bincount(sample.op_devices.ravel(), minlength=num_devices) / sample.op_devices.size
            for d, dev in enumerate(devices):
                writer.add_scalar(f"charts/device_share/{dev}", float(share[d]), it)
            if bar is not None:
                bar.set_postfix(it=run["iteration"], best=f"{run['best_step_time_s'] * 1e3:.2f}ms",
                                cur=f"{(float(ok_t.min()) * 1e3 if len(ok_t) else float('inf')):.2f}ms", refresh=False)
                bar.update(1 if config.iterations is not None else int(elapsed()) - bar.n)
            if run["iteration"] % config.checkpoint_every == 0:
                save_checkpoint()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    save_checkpoint()
    writer.flush()
    writer.close()
    best = _best_placement(graph, devices, cluster, config, run, planner) if run["best_indices"] is not None else None
    result = TrainResult(
        best_step_time_s=run["best_step_time_s"], best_placement=best, iterations=run["iteration"],
        elapsed_s=run["elapsed_s"], time_to_best_s=run["time_to_best_s"], logdir=logdir, heuristics=heuristics,
        lower_bound_s=lower_bound_s, reference_step_time_s=t_ref,
        time_to_beat_heuristic_s=run["time_to_beat_heuristic_s"], interrupted=interrupted,
        setup_s=run["setup_s"], num_items=getattr(policy, "num_items", 0), warm_start=run["warm_start"],
        warm_start_step_time_s=run.get("warm_start_step_time_s"),
    )
    if best is not None:
        _save_best(os.path.join(logdir, BEST_NAME), best)
    checkpoint.write_json(os.path.join(logdir, "summary.json"), result.to_dict())
    return result


# ------------------------------------------------------------------ small helpers
def _best_placement(graph: OpGraph, devices: list[str], cluster: Any, config: TrainConfig, run: dict,
                    planner: Any = None) -> Placement:
    """The run's best as a placement file: under ``--env sim`` with the issue order chosen for it.

    ``planner`` (a SimEnv; None for a measured run) chooses the order.
    ``step_time_s`` stays the time the run scored (node order, ``config.executor``),
    so bests compare alike; with an order, ``issue_order_step_time_s`` is the eager
    time of the order the file carries, which is what ``placer.apply`` runs. A
    measured run keeps the node order it was measured with.
    """
    meta = {"step_time_s": run["best_step_time_s"], "found_by": run["best_found_by"],
            "iteration": run["best_iteration"], "warm_start": run["warm_start"], "algo": config.algo,
            "seed": config.seed, "env": config.env, "profile": config.profile, "executor": config.executor}
    order = None
    if planner is not None:
        order, how, step_s = planner.plan_order(np.asarray(run["best_indices"]))
        meta.update(issue_order=how, issue_order_step_time_s=step_s)
    return Placement.from_indices(
        graph, devices, run["best_indices"], cluster=getattr(cluster, "name", config.cluster),
        method=f"rl:{config.policy}", meta=meta, order=order,
    )


def _check_compatible(saved: dict, config: TrainConfig, graph: OpGraph, devices: list[str], logdir: str = "") -> None:
    """PlacerError unless the checkpoint state ``saved`` was made for this graph, cluster and model settings."""
    where = os.path.join(logdir, checkpoint.CHECKPOINT_PT)
    if not (isinstance(saved, dict) and isinstance(saved.get("config"), dict) and isinstance(saved.get("run"), dict)):
        raise PlacerError(f"--resume: {where} is not a placer training checkpoint")
    if saved.get("graph_hash") != graph.content_hash:
        raise PlacerError(f"--resume: {where} is for graph {saved.get('graph_hash')}, not this graph ({graph.content_hash})")
    if saved.get("devices") != devices:
        raise PlacerError(f"--resume: {where} is for devices {saved.get('devices')}, not {devices}")
    for key in ("policy", "samples", "max_groups", "hidden", "layers", "algo"):
        if saved["config"].get(key) != getattr(config, key):
            raise PlacerError(f"--resume: the checkpoint used {key}={saved['config'].get(key)!r}, this run {getattr(config, key)!r}")
    target = saved["run"].get("warm_start_indices")
    if target is not None and not (isinstance(target, list) and len(target) == graph.num_ops):
        raise PlacerError(f"--resume: {where} has a warm-start placement for {len(target) if isinstance(target, list) else '?'} "
                          f"ops, not {graph.num_ops}")


def _adopt_newer_best(run: dict, logdir: str, graph: OpGraph, devices: list[str], score: CachedScorer,
                      config: TrainConfig | None = None) -> None:
    """A best found after the last checkpoint (then SIGKILL) survives in best_placement.json."""
    path = os.path.join(logdir, BEST_NAME)
    if not os.path.exists(path):
        return
    try:
        saved_best = Placement.load(path)
        idx = saved_best.indices(graph, devices)
    except PlacerError:
        return
    if config is not None and any(saved_best.meta.get(k, getattr(config, k)) != getattr(config, k) for k in ("env", "profile")):
        return  # scored by another scorer: its time says nothing here
    t, failed = score(idx[None])
    if not failed[0] and t[0] < run["best_step_time_s"]:
        meta = saved_best.meta
        run.update(best_step_time_s=float(t[0]), best_indices=idx.tolist(), best_found_by=meta.get("found_by", ""),
                   best_iteration=meta.get("iteration", -1))


make_module_callable(__name__, train)  # `placer.train(config)` calls train()
