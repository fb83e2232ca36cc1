"""Train a placement policy with REINFORCE (or PPO) against a scorer.

One readable loop, in the spirit of CleanRL: build env and policy, (optionally)
warm-start by imitation, then repeat: sample K placements -> score them in one
batch -> rewards and advantages -> update -> log -> checkpoint. The options are
:class:`placer.train_config.TrainConfig`; the algorithm (reward, baselines,
advantages, the loss per log-probability term, schedules) is
:mod:`placer.rl_algos`; the loop's state is a :class:`RunState`, saved in every
checkpoint.

Reward and failing signal. The paper's reward is ``-sqrt(runtime)`` with a failing
runtime of 100 s for placements that do not run, i.e. about 10x its models' step
times. Absolute seconds do not transfer between a 2 ms and a 2 s model, so here
every step time is divided by ``t_ref``, the best single-device step time
(ignoring memory) of the graph on this cluster: the reward is
``-sqrt(step_time_s / t_ref)`` (about -1 for a no-better-than-one-device
placement) and a failed (OOM) placement counts as ``fail_factor * t_ref``
(:func:`placer.rl_algos.reward`).

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

Baseline. The paper's EMA baseline (decay 0.9) is available (``baseline="ema"``)
and always logged, but the default is leave-one-out: each of the K samples is
compared with the mean reward of the other K-1, so advantages have zero mean in
every batch (an EMA lagging above a falling batch mean makes them all negative
and pushes the mode's probability down). Advantages are divided by the batch's
reward std. After a warm start the RL learning rate must be small (5e-4):
measured on nmt-2, 2e-3 raises the entropy from 0.09 to 0.13 within five steps
and 1e-2 to 0.9 within a hundred, and the samples get worse with it. The
papers' settings are one switch away (``TrainConfig.from_preset("paper")``,
``placer train --preset paper``; see :data:`placer.train_config.PRESETS`).
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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from graphs import OpGraph, PlacerError
from graphs.grouping import default_num_groups
from placer import checkpoint
from placer._callable import make_module_callable
from placer.checks import check_output_dir
from placer.methods import best_heuristic
from graphs.plan import Placement, single_device_rows
from placer.rl_algos import ALGOS, advantages, imitate, learning_rate, logit_noise, reward, set_logit_noise, term_credits
from placer.train_config import (  # noqa: F401 - TrainConfig and its checks are part of placer.train's surface
    _FLOAT_FIELDS, _INT_FIELDS, PRESETS, AlgoOptions, PolicyOptions, RunOptions, TrainConfig,
)
from policies.base import Policy

if TYPE_CHECKING:
    from envs.cluster import Cluster
    from envs.result import Result


@dataclass
class RunState:
    """The training loop's state: everything besides tensors that a resumed run continues from.

    Saved as JSON in every checkpoint (``checkpoint.json``'s ``run``); plain
    numbers, strings and lists only, so checkpoints load with ``weights_only=True``.
    """

    iteration: int = 0
    elapsed_s: float = 0.0
    baseline: float | None = None  # the EMA baseline (None before the first batch)
    best_step_time_s: float = float("inf")
    best_indices: list[int] | None = None  # device index per op of the best placement
    best_found_by: str = ""  # "sample" or "greedy"
    best_iteration: int = -1
    time_to_best_s: float = float("nan")
    time_to_beat_heuristic_s: float | None = None
    warm_start: str = "none"  # how the policy was warm-started, for the record
    warm_start_indices: list[int] | None = None  # the imitated placement (the policy's items are cut by it)
    warm_start_step_time_s: float | None = None
    setup_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str = "checkpoint") -> "RunState":
        """The state of a checkpoint's ``run`` object (unknown keys ignored); PlacerError if a value has the wrong type."""
        state = cls()
        for f in dataclasses.fields(cls):
            if f.name in doc:
                base, _, optional = str(f.type).partition(" | ")
                value = doc[f.name]
                if not ((value is None and optional == "None") or _JSON_CHECKS[base](value)):
                    raise PlacerError(f"--resume: {where} has run.{f.name} = {value!r}, not a {f.type}")
                setattr(state, f.name, value)
        return state


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_JSON_CHECKS = {"int": _is_int, "float": lambda v: _is_int(v) or isinstance(v, float), "str": lambda v: isinstance(v, str),
                "list[int]": lambda v: isinstance(v, list) and all(_is_int(i) for i in v)}


@runtime_checkable
class Scorer(Protocol):
    """What scores placements (``envs.SimEnv``, ``envs.MeasuredEnv``, a test's fake).

    ``evaluate`` scores op-device index arrays one result each; a scorer may also
    have ``step_times(idx [K, num_ops]) -> (step_time_s [K], failed [K])`` (a fast
    batch path, used when present) and ``close()`` (called when a run that built
    it ends).
    """

    def evaluate(self, placements: Sequence[Any]) -> list[Result]: ...


@runtime_checkable
class BatchScorer(Scorer, Protocol):
    def step_times(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...



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
    score_order: str = "node"  # the issue order every time here (samples, heuristics) was scored in

    @property
    def best_heuristic(self) -> tuple[str, float] | None:
        """``(name, step time)`` of the fastest heuristic of the run (:func:`placer.methods.best_heuristic`)."""
        return best_heuristic(self.heuristics)

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
            "score_order": self.score_order,
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

    Uses the scorer's fast ``step_times`` when it has one (:class:`BatchScorer`),
    else ``evaluate``. The cache key is a digest of the index array's bytes;
    identical rows of a batch are scored once.
    """

    def __init__(self, env: Scorer, order: str | None = None) -> None:
        self.env = env
        self.order = order  # passed to env.step_times ("planned": SimEnv's planned order per row)
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
                t, failed = self.env.step_times(rows) if self.order is None else self.env.step_times(rows, order=self.order)
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


def _make_env(config: TrainConfig, graph: OpGraph, cluster: Cluster, logdir: str) -> Scorer:
    """The scorer named by ``config.env`` (registry ENVS; checked by TrainConfig.validate)."""
    return ENVS[config.env](config, graph, cluster, logdir)


def _sim_env(config: TrainConfig, graph: OpGraph, cluster: Cluster, logdir: str) -> Scorer:
    import envs

    return envs.SimEnv(graph, cluster, executor=config.executor, microbatches=config.microbatches, inflight=config.inflight)


def _measured_env(config: TrainConfig, graph: OpGraph, cluster: Cluster, logdir: str) -> Scorer:
    """Real training steps on Ray actors; needs a runnable SOURCE (zoo name or module:callable)."""
    from graphs import zoo
    from placer.sources import looks_like_callable

    if not (config.source in zoo.names() or looks_like_callable(config.source)):
        raise PlacerError(
            f"--env measured: SOURCE {config.source!r} is not runnable (need a zoo name or module:callable, not a graph file)"
        )
    from envs.real.measured import MeasuredEnv

    return MeasuredEnv(config.source, cluster, graph=graph, run_dir=logdir, device_map=config.device_map,
                       workers=config.workers, ray_address=config.ray_address, measure_timeout_s=config.measure_timeout_s)


ENVS: dict[str, Callable[[TrainConfig, OpGraph, Cluster, str], Scorer]] = {"sim": _sim_env, "measured": _measured_env}


def _heuristics(graph: OpGraph, cluster: Cluster, config: TrainConfig) -> dict[str, tuple[float, np.ndarray | None]]:
    """name -> (simulated step time, op devices) of the heuristic baselines, via ``placer.compare``.

    Methods that cannot run get ``inf``.
    """
    from placer.compare import compare, default_methods

    # by default every heuristic but ilp: a solver run of a minute whose plan rests on its own issue order
    methods = list(config.heuristics) if config.heuristics is not None else default_methods(exclude=("ilp",))
    if methods == []:
        return {}
    report = compare(graph, cluster, methods=methods, seed=config.seed, executor=config.executor,
                     microbatches=config.microbatches, inflight=config.inflight)
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
            and all(a.meta.get(k) == b.meta.get(k) for k in keys)
            and a.meta.get("score_order", "node") == b.meta.get("score_order", "node"))  # older files: node order


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
def train(config: TrainConfig, *, graph: OpGraph | None = None, cluster: Cluster | None = None,
          env: Scorer | None = None) -> TrainResult:
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
            from envs.real.profiler import with_profile

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


def _train(config: TrainConfig, graph: OpGraph, cluster: Cluster, env: Scorer, logdir: str, device: torch.device,
           saved: tuple[dict[str, Any], dict[str, Any]] | None) -> TrainResult:
    """The training run proper, in a locked ``logdir``; ``saved``: the checkpoint to resume (checked)."""
    from torch.utils.tensorboard import SummaryWriter

    run = _Run(config, graph, cluster, env, logdir, device, saved)
    writer = SummaryWriter(logdir)
    bar = None
    interrupted = False
    try:
        run.start(writer)
        bar = _progress_bar(config, run)
        while not run.done():
            if run.state.iteration % config.eval_every == 0:  # greedy first: the warm start's mode is scored at 0
                run.evaluate_greedy(writer)
            run.iterate(writer)
            if bar is not None:
                bar.set_postfix(it=run.state.iteration, best=f"{run.state.best_step_time_s * 1e3:.2f}ms", refresh=False)
                bar.update(1 if config.iterations is not None else int(run.elapsed()) - bar.n)
            if run.state.iteration % config.checkpoint_every == 0:
                run.save_checkpoint()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    run.save_checkpoint()
    return run.result(interrupted)


class _Run:
    """One training run: the objects it works with and its :class:`RunState` (what the checkpoint keeps)."""

    def __init__(self, config: TrainConfig, graph: OpGraph, cluster: Cluster, env: Scorer, logdir: str,
                 device: torch.device, saved: tuple[dict[str, Any], dict[str, Any]] | None) -> None:
        import envs
        from policies import POLICIES, policy_file

        self.config, self.graph, self.cluster, self.logdir, self.device = config, graph, cluster, logdir, device
        self.algo = ALGOS[config.algo]
        self.score = CachedScorer(env, "planned" if config.score_order == "planned" else None)
        self.devices = list(cluster.device_names)
        # ---- reference times: the reward scale, heuristics and the lower bound
        setup_start = time.perf_counter()
        self.t_ref = _reference_time(self.score, graph, cluster, config.executor)
        found = _heuristics(graph, cluster, config)
        if self.score.order is not None:
            # scored in the run's own order, so the warm start, the rival's start and "beat the best
            # heuristic" compare like with like (compare's rows are node order)
            found = {name: (self._scored(idx) if idx is not None and np.isfinite(t) else t, idx)
                     for name, (t, idx) in found.items()}
        self.heuristics = {name: t for name, (t, _) in found.items()}
        # the simulator of this problem (executor, microbatches): the lower bound, and under --env sim the
        # planner of the best placement's issue order; the scorer itself when it is one
        sim = env if isinstance(env, envs.SimEnv) else envs.SimEnv(graph, cluster, executor=config.executor,
                                                                  microbatches=config.microbatches, inflight=config.inflight)
        self.lower_bound_s: float | None = float(sim.lower_bound())
        self.best_h = min(self.heuristics.items(), key=lambda kv: kv[1]) if self.heuristics else ("none", float("inf"))
        self.state = RunState(setup_s=time.perf_counter() - setup_start)
        # ---- seed, policy, optimizer
        torch.manual_seed(config.seed)
        self.max_groups = config.max_groups if config.max_groups is not None else default_num_groups(len(self.devices))
        self.warm = config.warm_start == "best" and np.isfinite(self.best_h[1]) and saved is None
        target = found[self.best_h[0]][1] if self.warm else None
        if saved is not None:  # the items must be those the checkpoint was trained on
            self.state = RunState.from_dict(saved[1]["run"])
            target = np.asarray(self.state.warm_start_indices, dtype=np.int32) if self.state.warm_start_indices else None
        self.target = target
        p = config.policy_options
        self.policy: Policy = POLICIES[config.policy](
            graph, len(self.devices), max_groups=self.max_groups, hidden=p.hidden, layers=p.layers,
            temperature=p.temperature, tanh_c=p.tanh_c, refine=target, cluster=cluster,
            **({"net": policy_file.load(p.init).net} if p.init is not None else {}),  # --init: pretrained weights
        ).to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.gen = torch.Generator(device=device).manual_seed(config.seed)
        if saved is not None:
            self._load(saved[0])
            _adopt_newer_best(self.state, logdir, graph, self.devices, self.score, config)
        self.fail_cost = config.fail_factor * self.t_ref
        # the simulator that picks the best placement's issue order (built once; --env sim only)
        self.planner = sim if config.env == "sim" else None
        self.t0 = time.perf_counter() - self.state.elapsed_s

    def _scored(self, idx: np.ndarray) -> float:
        t, failed = self.score(np.asarray(idx, dtype=np.int32)[None])
        return float("inf") if failed[0] else float(t[0])

    def _load(self, tensors: dict[str, Any]) -> None:
        try:
            self.policy.load_state_dict(tensors["policy"])
            self.optimizer.load_state_dict(tensors["optimizer"])
            self.gen.set_state(tensors["generator"].cpu())
        except (KeyError, RuntimeError, ValueError) as e:
            raise PlacerError(f"--resume: {os.path.join(self.logdir, checkpoint.CHECKPOINT_PT)} does not fit this run "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def done(self) -> bool:
        c = self.config
        return (c.iterations is not None and self.state.iteration >= c.iterations) or (
            c.time_budget_s is not None and self.elapsed() >= c.time_budget_s)

    def start(self, writer: Any) -> None:
        """Log the hyperparameters; warm-start by imitation (against the time budget); first checkpoint."""
        c, s = self.config, self.state
        if not c.resume:
            writer.add_text("hyperparameters", _hparams_table(c, {
                "graph": self.graph.name, "num_ops": self.graph.num_ops,
                "items": getattr(self.policy, "num_items", self.max_groups), "devices": ",".join(self.devices),
                "reference_step_time_s": self.t_ref, "device": str(self.device),
                "best_heuristic": f"{self.best_h[0]} {self.best_h[1]}", "setup_s": s.setup_s}))
        if self.warm:
            # imitation may use at most half the time budget, so RL always gets its turn
            deadline = self.t0 + 0.5 * c.time_budget_s if c.time_budget_s is not None else None
            steps = imitate(self.policy, self.target, c.algo_options, deadline=deadline)
            s.warm_start, s.warm_start_indices = f"imitation of {self.best_h[0]} ({steps} steps)", self.target.tolist()
        if not c.resume:
            # resumable from here on: a run killed before its first periodic checkpoint keeps its policy and items,
            # and the best it wrote to best_placement.json since is adopted on --resume (_adopt_newer_best)
            self.save_checkpoint()
        if self.warm:
            g_idx = self.policy.greedy()[None]
            g_t, g_failed = self.score(g_idx)
            s.warm_start_step_time_s = float(g_t[0]) if not g_failed[0] else None
            self.consider(g_idx, g_t, g_failed, "greedy")  # a run whose budget ends here still has a placement

    def evaluate_greedy(self, writer: Any) -> None:
        g_idx = self.policy.greedy()[None]
        g_t, g_failed = self.score(g_idx)
        self.consider(g_idx, g_t, g_failed, "greedy")
        writer.add_scalar("charts/greedy_step_time_s", g_t[0] if not g_failed[0] else self.fail_cost, self.state.iteration)

    def iterate(self, writer: Any) -> None:
        """One iteration: sample K placements, score them in one batch, reward -> advantage -> update, log."""
        c, s, it = self.config, self.state, self.state.iteration
        set_logit_noise(self.policy, logit_noise(c, it))
        sample = self.algo.sample(self.policy, c.samples, self.gen)
        t, failed = self.score(sample.op_devices)
        self.consider(sample.op_devices, t, failed, "sample")
        r = reward(t, failed, self.t_ref, c.fail_factor)
        adv = advantages(r, failed, s.baseline, c, it)
        adv_t = torch.as_tensor(adv.advantages, dtype=torch.float32, device=self.device)
        lr = learning_rate(c, it)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        policy_loss, entropy = self.algo.update(self.policy, self.optimizer, sample, adv_t, c)
        s.baseline, s.iteration = adv.baseline, it + 1
        ok_t = t[~failed]
        scalars = {
            "charts/best_step_time_s": s.best_step_time_s, "charts/reward": float(r.mean()),
            "charts/step_time_s": float(ok_t.mean()) if len(ok_t) else self.fail_cost,
            "charts/failed_fraction": float(failed.mean()), "charts/baseline": s.baseline,
            "charts/elapsed_s": self.elapsed(), "charts/learning_rate": lr, "charts/logit_noise": logit_noise(c, it),
            "losses/policy_loss": policy_loss, "losses/entropy": entropy,
            **{f"losses/credit/{name}": v for name, v in term_credits(sample, adv_t).items()},
        }
        share = np.bincount(sample.op_devices.ravel(), minlength=len(self.devices)) / sample.op_devices.size
        scalars.update({f"charts/device_share/{dev}": float(share[d]) for d, dev in enumerate(self.devices)})
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, it)

    def consider(self, idx: np.ndarray, t: np.ndarray, failed: np.ndarray, found_by: str) -> None:
        """Keep the best successful placement; rewrite best_placement.json when it improves."""
        ok = np.flatnonzero(~failed & np.isfinite(t))
        if not len(ok):
            return
        j = ok[np.argmin(t[ok])]
        s = self.state
        if t[j] < s.best_step_time_s:
            s.best_step_time_s, s.best_indices, s.best_found_by = float(t[j]), idx[j].tolist(), found_by
            s.best_iteration, s.time_to_best_s = s.iteration, self.elapsed()
            if s.time_to_beat_heuristic_s is None and t[j] <= self.best_h[1]:
                s.time_to_beat_heuristic_s = self.elapsed()
            _save_best(os.path.join(self.logdir, BEST_NAME), self.best_placement())

    def best_placement(self) -> Placement:
        return _best_placement(self.graph, self.devices, self.cluster, self.config, self.state, self.planner)

    def save_checkpoint(self) -> None:
        self.state.elapsed_s = self.elapsed()
        tensors = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                   "generator": self.gen.get_state()}
        checkpoint.save(self.logdir, tensors, {"config": dataclasses.asdict(self.config),
                                               "graph_hash": self.graph.content_hash, "devices": self.devices,
                                               "run": self.state.to_dict()})

    def result(self, interrupted: bool) -> TrainResult:
        s = self.state
        best = self.best_placement() if s.best_indices is not None else None
        result = TrainResult(
            best_step_time_s=s.best_step_time_s, best_placement=best, iterations=s.iteration, elapsed_s=s.elapsed_s,
            time_to_best_s=s.time_to_best_s, logdir=self.logdir, heuristics=self.heuristics,
            score_order=self.config.score_order,
            lower_bound_s=self.lower_bound_s, reference_step_time_s=self.t_ref,
            time_to_beat_heuristic_s=s.time_to_beat_heuristic_s, interrupted=interrupted, setup_s=s.setup_s,
            num_items=getattr(self.policy, "num_items", 0), warm_start=s.warm_start,
            warm_start_step_time_s=s.warm_start_step_time_s,
        )
        if best is not None:
            _save_best(os.path.join(self.logdir, BEST_NAME), best)
        checkpoint.write_json(os.path.join(self.logdir, "summary.json"), result.to_dict())
        return result


def _reference_time(score: CachedScorer, graph: OpGraph, cluster: Cluster, executor: str) -> float:
    """The reward scale: the best single-device step time (memory ignored).

    A scorer that gives a failed placement no time (a real device's OOM: ``inf``)
    may leave every single-device placement without one (a model that fits on no
    single device); the simulator's time of those placements, memory ignored, is
    the scale then (an infinite scale made every reward NaN).
    """
    import envs

    single = single_device_rows(len(cluster.device_names), graph.num_ops)
    t, _ = score(single)
    t = t[np.isfinite(t) & (t > 0)]
    if not len(t):
        t, _ = envs.SimEnv(graph, cluster, executor=executor).step_times(single)
    return float(np.min(t))


def _progress_bar(config: TrainConfig, run: _Run) -> Any:
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    by_iterations = config.iterations is not None
    return tqdm(total=config.iterations if by_iterations else int(config.time_budget_s),
                initial=run.state.iteration if by_iterations else int(run.elapsed()),
                unit="it" if by_iterations else "s", dynamic_ncols=True)


# ------------------------------------------------------------------ small helpers
def _best_placement(graph: OpGraph, devices: list[str], cluster: Cluster, config: TrainConfig, run: RunState,
                    planner: Any = None) -> Placement:
    """The run's best as a placement file: under ``--env sim`` with the issue order chosen for it.

    ``planner`` (a SimEnv; None for a measured run) chooses the order.
    ``step_time_s`` stays the time the run scored (node order, ``config.executor``),
    so bests compare alike; with an order, ``issue_order_step_time_s`` is the eager
    time of the order the file carries, which is what ``placer.apply`` runs. A
    measured run keeps the node order it was measured with.
    """
    meta = {"step_time_s": run.best_step_time_s, "found_by": run.best_found_by,
            "iteration": run.best_iteration, "warm_start": run.warm_start, "algo": config.algo,
            "seed": config.seed, "env": config.env, "profile": config.profile, "executor": config.executor,
            "score_order": config.score_order}
    order = None
    if planner is not None:
        order, how, step_s = planner.plan_order(np.asarray(run.best_indices))
        meta.update(issue_order=how, issue_order_step_time_s=step_s)
    return Placement.from_indices(
        graph, devices, run.best_indices, cluster=getattr(cluster, "name", config.cluster),
        method=f"rl:{config.policy}", meta=meta, order=order, microbatches=config.microbatches,
        inflight=config.inflight,
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


def _adopt_newer_best(run: RunState, logdir: str, graph: OpGraph, devices: list[str], score: CachedScorer,
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
    if config is not None and any(saved_best.meta.get(k, getattr(config, k)) != getattr(config, k) for k in ("env", "profile", "score_order")):
        return  # scored by another scorer: its time says nothing here
    t, failed = score(idx[None])
    if not failed[0] and t[0] < run.best_step_time_s:
        meta = saved_best.meta
        run.best_step_time_s, run.best_indices = float(t[0]), idx.tolist()
        run.best_found_by = meta.get("found_by") if isinstance(meta.get("found_by"), str) else ""
        run.best_iteration = meta.get("iteration") if _is_int(meta.get("iteration")) else -1


make_module_callable(__name__, train)  # `placer.train(config)` calls train()
