"""A training run's directory: its name, its lock, its best placement file, and what a resumed run checks.

``best_placement.json`` is rewritten whenever the best improves and never replaced
by a slower placement of the same problem, whoever writes it (:func:`save_best`),
except by a measured run's side-by-side at the end, whose medians judge better
than the single fastest measurement did (:meth:`placer.learn.session.Session.adopt`);
a run killed after its last checkpoint keeps the best it wrote there
(:func:`adopt_newer_best`).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from graphs import OpGraph, PlacerError
from graphs.hash_seed import hash_seed_hint
from graphs.plan import Placement, checkpoint_blocks, faster_host_step
from placer.learn import checkpoint
from placer.learn.checkpoint_choice import kept_blocks, prune_blocks
from placer.learn.config import TrainConfig
from placer.learn.state import CORRECTED_SEARCH, MODULE_SHARE, MOVE_SEARCH, RunState, is_int

if TYPE_CHECKING:
    from envs.cluster import Cluster
    from placer.learn.run_scorers import CachedScorer


def safe_name(text: str, fallback: str, limit: int = 64) -> str:
    """``text`` as one short, portable path component: letters, digits, ``.``, ``_``, ``-``; at most ``limit`` chars.

    >>> safe_name("nmt/2 (big)\\x00", "graph"), safe_name("..", "graph"), len(safe_name("x" * 5000, "graph"))
    ('nmt_2_big', 'graph', 64)
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:limit].rstrip("._-")
    return name or fallback


def default_logdir(config: TrainConfig, graph: OpGraph) -> str:
    """``runs/<graph>-<cluster>-<time>``, built only from safe characters whatever the graph's name."""
    stem = safe_name(graph.name or os.path.splitext(os.path.basename(config.source))[0], "graph")
    cname = safe_name(os.path.splitext(os.path.basename(config.cluster))[0], "cluster")
    return os.path.join("runs", f"{stem}-{cname}-{time.strftime('%Y%m%d-%H%M%S')}")


LOCK_NAME = "train.lock"


BEST_NAME = "best_placement.json"
#: The equal-budget search's placement (``placer train``), written beside the best when it is faster.
EQUAL_BUDGET_NAME = "equal_budget_placement.json"


@contextlib.contextmanager
def run_lock(logdir: str) -> Iterator[None]:
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
            raise PlacerError(
                f"--logdir {logdir}: another training run is using this directory "
                "(wait for it to end, or choose another --logdir)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def check_fresh(logdir: str) -> None:
    """PlacerError unless ``logdir`` holds no earlier run: training again into one (without --resume) mixed two runs."""
    try:
        names = os.listdir(logdir)
    except OSError:
        return
    earlier = [
        n for n in names if n in (checkpoint.CHECKPOINT_PT, "summary.json") or n.startswith("events.out.tfevents")
    ]
    if earlier:
        raise PlacerError(
            f"--logdir {logdir}: holds an earlier training run ({sorted(earlier)[0]}); add --resume to "
            "continue it, or give another --logdir"
        )


def check_free(logdir: str, resume: bool = False) -> None:
    """PlacerError if another run is using ``logdir`` now, or (``resume`` False) it holds an earlier one.

    What :func:`run_lock` and :func:`check_fresh` say once the run has started, said before it starts (before a
    slow capture of its model); the run checks again under its lock.
    """
    if not os.path.isdir(logdir):
        return
    with run_lock(logdir):
        if not resume:
            check_fresh(logdir)


def same_problem(a: Placement, b: Placement) -> bool:
    """Whether the step times recorded in two placements' meta are comparable (same graph, devices, scorer)."""
    keys = ("env", "profile")
    return (
        a.graph_hash == b.graph_hash
        and a.devices == b.devices
        and a.cluster == b.cluster
        and all(a.meta.get(k) == b.meta.get(k) for k in keys)
        and a.meta.get("score_order", "node") == b.meta.get("score_order", "node")  # older files: node order
        and bool(a.meta.get("ranks", False)) == bool(b.meta.get("ranks", False))  # across processes or in one
        and a.schedule == b.schedule
    )


def recorded_step_time(p: Placement) -> float | None:
    step_time_s = p.meta.get("step_time_s")
    ok = isinstance(step_time_s, (int, float)) and not isinstance(step_time_s, bool) and math.isfinite(step_time_s)
    return float(step_time_s) if ok else None


def save_best(path: str, placement: Placement) -> bool:
    """Write ``placement`` to ``path`` unless the file already holds one at least as fast.

    The step time is read from the file's ``meta.step_time_s``; a file that is
    unreadable, made for another graph/cluster/scorer, or without a recorded
    time is replaced. Returns whether it wrote.
    """
    new_t = recorded_step_time(placement)
    if os.path.exists(path):
        try:
            old = Placement.load(path)
        except PlacerError:
            old = None
        if old is not None and same_problem(old, placement):
            old_t = recorded_step_time(old)
            if old_t is not None and (new_t is None or old_t <= new_t):
                return False
    placement.save(path)
    return True


def save_pruned(path: str, placement: Placement) -> None:
    """Write the run's best with its checkpointed layers pruned over the file of the same placement (which
    :func:`save_best` keeps: the same recorded time), not over another one."""
    try:
        old = Placement.load(path)
    except PlacerError:
        return
    if old.assignment == placement.assignment and old.param_homes == placement.param_homes:
        placement.save(path)


def run_placement(
    graph: OpGraph,
    devices: list[str],
    cluster: Cluster,
    config: TrainConfig,
    op_devices: Any,
    method: str,
    meta: dict[str, Any],
    planner: Any = None,
    codes: Any = None,
    blocks: list[str] | None = None,
    prune_evals: int = 0,
) -> Placement:
    """A placement of the run as a file: ``meta`` plus the run's settings, under ``--env sim`` with the issue
    order ``planner`` (a SimEnv; None for a measured run) chooses for it (``issue_order``, and its eager time
    ``issue_order_step_time_s``).

    ``blocks``: the layers the run checkpoints where a placement keeps them whole (``--checkpointing``): the file
    checkpoints those it can in its order (``checkpoint``), and with ``prune_evals`` turns off those whose second
    forward does not pay (:func:`placer.learn.checkpoint_choice.prune_blocks`; ``meta["checkpoint_pruned"]``).

    ``codes``: the run's home codes (``--homes``; :class:`placer.learn.home_moves.HomeCodes`): ``op_devices`` are
    codes, and the file carries the parameter homes they name. The order is chosen on the ops' devices (as memory,
    the homes are left out of that choice); its eager time is the time with the homes, stepped as ``--host-step``
    says: "auto" keeps whichever of stepping them during the backward and after it simulates faster
    (``meta["host_step_s"]``: both eager times).
    """
    homes = None
    if codes is not None:
        if codes.has_blocks:  # checkpoint moves: the layers the codes turn on are the run's choice
            blocks = codes.names(np.asarray(op_devices))
        op_devices, homes = codes.decode(np.asarray(op_devices))
        homes = homes if codes.has_homes else None
    meta = {
        **meta,
        "seed": config.seed,
        "env": config.env,
        "profile": config.profile,
        "executor": config.executor,
        "score_order": config.score_order,
    }
    if config.ranks:  # scored across processes: what `placer run --nproc-per-node` runs
        meta["ranks"] = True
    order, kept = None, []
    homed = homes is not None and bool((homes >= 0).any())
    host_step = "after" if not homed or config.host_step == "auto" else config.host_step  # auto: chosen below
    if planner is not None:
        order, how, step_s = planner.plan_order(np.asarray(op_devices))
        kept = kept_blocks(planner, graph, blocks or [], np.asarray(op_devices), order)
        in_node_order = kept_blocks(planner, graph, blocks or [], np.asarray(op_devices), None)
        if len(in_node_order) > len(kept):  # the planned order interleaves a layer the run checkpointed: node order
            order, how, kept = None, "node", in_node_order
        if kept and prune_evals > 0:
            eager = planner.with_executor("eager")
            pruned, _, _, used = prune_blocks(eager, graph, np.asarray(op_devices), homes, kept, prune_evals, order)
            meta["checkpoint_pruned"] = {"from": len(kept), "to": len(pruned), "evals": used}
            kept = pruned
        if homed or blocks:  # its time with what the file carries
            ck = checkpoint_blocks(graph, kept)[None] if kept else None
            eager, rows = planner.with_executor("eager"), np.asarray(op_devices)[None]

            def timed(way: str) -> float:
                return float(
                    eager.batch(rows, order, homes=homes[None] if homed else None, checkpoint=ck, host_step=way)[0][0]
                )

            if homed and config.host_step == "auto":
                host_step, meta["host_step_s"] = faster_host_step(timed)
                step_s = meta["host_step_s"][host_step]
            else:
                step_s = timed(host_step)
        meta.update(issue_order=how, issue_order_step_time_s=step_s)
    placement = Placement.from_indices(
        graph,
        devices,
        op_devices,
        homes=homes,
        cluster=getattr(cluster, "name", config.cluster),
        method=method,
        meta=meta,
        order=order,
        microbatches=config.microbatches,
        inflight=config.inflight,
        schedule=config.schedule,
        host_step=host_step,
    )
    placement.checkpoint = kept
    return placement


#: ``found_by`` of a run's best -> the method its file names, its true finder (``heuristic:<name>`` names itself).
FINDER_METHODS = {
    "sample": "rl:{policy}",
    "greedy": "rl:{policy}",
    MOVE_SEARCH: "moves:{proposals}",
    MODULE_SHARE: "moves:module_search",
    CORRECTED_SEARCH: "corrected",
}


def finder_method(found_by: str, config: TrainConfig) -> str:
    """The method a file of the run's best names: the finder ``found_by`` records.

    >>> c = TrainConfig(algo="moves")
    >>> finder_method("heuristic:heft", c), finder_method("move search", c), finder_method("greedy", c)
    ('heuristic:heft', 'moves:critic', 'rl:seq2seq')
    """
    if found_by.startswith("heuristic:"):
        return found_by
    unknown = "moves:{proposals}" if config.algo == "moves" else "rl:{policy}"  # e.g. "" (an older run's file)
    return FINDER_METHODS.get(found_by, unknown).format(policy=config.policy, proposals=config.proposals)


def run_best_placement(
    graph: OpGraph,
    devices: list[str],
    cluster: Cluster,
    config: TrainConfig,
    run: RunState,
    planner: Any = None,
    codes: Any = None,
    blocks: list[str] | None = None,
    prune_evals: int = 0,
) -> Placement:
    """The run's best as a placement file: under ``--env sim`` with the issue order chosen for it (``blocks``,
    ``prune_evals``: :func:`run_placement`).

    Its method is its true finder (:func:`finder_method`): ``rl:<policy>`` for a
    policy's sample or greedy decoding, ``moves:critic`` (``moves:uniform``) for
    the move search's moves and ``moves:module_search`` for its module_search
    share, ``heuristic:<name>`` when nothing the learner found beat that heuristic.
    ``planner`` (a SimEnv; None for a measured run) chooses the order.
    ``step_time_s`` stays the time the run scored (node order, ``config.executor``),
    so bests compare alike; with an order, ``issue_order_step_time_s`` is the eager
    time of the order the file carries, which is what ``placer.apply`` runs. A
    measured run keeps the node order it was measured with.
    """
    meta = {
        "step_time_s": run.best_step_time_s,
        "found_by": run.best_found_by,
        "iteration": run.best_iteration,
        "warm_start": run.warm_start,
        "algo": config.algo,
    }
    method = finder_method(run.best_found_by, config)
    return run_placement(
        graph, devices, cluster, config, run.best_indices, method, meta, planner, codes, blocks, prune_evals
    )


def check_compatible(saved: dict, config: TrainConfig, graph: OpGraph, devices: list[str], logdir: str = "") -> None:
    """PlacerError unless the checkpoint state ``saved`` was made for this graph, cluster and model settings."""
    where = os.path.join(logdir, checkpoint.CHECKPOINT_PT)
    if not (isinstance(saved, dict) and isinstance(saved.get("config"), dict) and isinstance(saved.get("run"), dict)):
        raise PlacerError(f"--resume: {where} is not a placer training checkpoint")
    if saved.get("graph_hash") != graph.content_hash:
        raise PlacerError(
            f"--resume: {where} is for graph {saved.get('graph_hash')}, not this graph ({graph.content_hash})"
            f"{hash_seed_hint()}"
        )
    if saved.get("devices") != devices:
        raise PlacerError(f"--resume: {where} is for devices {saved.get('devices')}, not {devices}")
    for key in ("policy", "samples", "max_groups", "hidden", "layers", "algo", "ranks"):
        if saved["config"].get(key, False if key == "ranks" else None) != getattr(config, key):  # older: one process
            raise PlacerError(
                f"--resume: the checkpoint used {key}={saved['config'].get(key)!r}, this run {getattr(config, key)!r}"
            )
    target = saved["run"].get("warm_start_indices")
    if target is not None and not (isinstance(target, list) and len(target) == graph.num_ops):
        raise PlacerError(
            f"--resume: {where} has a warm-start placement for {len(target) if isinstance(target, list) else '?'} "
            f"ops, not {graph.num_ops}"
        )


def adopt_newer_best(
    run: RunState,
    logdir: str,
    graph: OpGraph,
    devices: list[str],
    score: CachedScorer,
    config: TrainConfig | None = None,
    codes: Any = None,
    blocks: list[str] | None = None,
) -> None:
    """A best found after the last checkpoint (then SIGKILL) survives in best_placement.json.

    ``codes``: the run's home codes (``--homes``): the file's homes are read back into codes; without them, a file
    with homes apart is not this run's. ``blocks``: the layers the run checkpoints (``--checkpointing``); without
    them, a file with checkpointed layers is not this run's."""
    path = os.path.join(logdir, BEST_NAME)
    if not os.path.exists(path):
        return
    try:
        saved_best = Placement.load(path)
        op_devices = saved_best.indices(graph, devices)
        homes = saved_best.home_indices(graph, devices)
    except PlacerError:
        return
    if saved_best.checkpoint and not blocks:
        return  # a plan with checkpointed layers: this run's scorer keeps every activation
    if codes is not None and codes.has_blocks:  # checkpoint moves: the file's layers read back into the codes' bits
        op_devices = codes.encode(op_devices, homes, saved_best.checkpoint)
        if op_devices is None:
            return
    elif (homes >= 0).any():
        if codes is None:
            return
        op_devices = codes.encode(op_devices, homes)
        if op_devices is None:
            return
    if config is not None and (
        any(saved_best.meta.get(k, getattr(config, k)) != getattr(config, k) for k in ("env", "profile", "score_order"))
        or bool(saved_best.meta.get("ranks", False)) != config.ranks  # across processes or in one
    ):
        return  # scored by another scorer: its time says nothing here
    step_time_s, failed = score(op_devices[None])
    if not failed[0] and step_time_s[0] < run.best_step_time_s:
        meta = saved_best.meta
        run.best_step_time_s, run.best_indices = float(step_time_s[0]), op_devices.tolist()
        run.best_found_by = meta.get("found_by") if isinstance(meta.get("found_by"), str) else ""
        run.best_iteration = meta.get("iteration") if is_int(meta.get("iteration")) else -1
