"""The Ray measurement harness: score placements by running real training steps.

:class:`MeasuredEnv` has the scorer protocol of :class:`envs.SimEnv`
(``evaluate(placements) -> list[Result]``). Each Ray actor owns one machine's
devices (``num_gpus`` = the CUDA devices the device map uses); ``evaluate``
spreads a batch over the actors, each of which builds the placed module
(:func:`envs.real.placing.place_module`, the pass behind :func:`placer.apply`), runs
``warmup_steps`` then ``timed_steps`` training steps (forward, loss, backward,
Adam step, CUDA synchronised) and reports the median step time.

Failures are results, not crashes: out of memory (torch's or Python's
``MemoryError``) -> ``"oom"``; any other exception -> ``"error"`` with its
message; a measurement running past ``measure_timeout_s`` -> ``"timeout"``, and
its actor is killed and replaced; an actor that dies has its placement retried on
a fresh one (at most ``max_retries`` times). A worker that does not start, or does
not build the model, within ``start_timeout_s`` (each) is a :class:`PlacerError`
naming the stage (every worker builds the same model, so nothing else could be
measured). Every result is appended to ``run_dir/measurements.jsonl`` (flushed
and fsynced) as it arrives, keyed by graph hash and placement hash, so a resumed
run measures nothing twice.

The local Ray this env starts (no ``ray_address`` and Ray not yet initialised)
listens on the loopback interface only, uses Ray's token authentication
(``RAY_AUTH_MODE=token``, Ray >= 2.52; an explicit ``RAY_AUTH_MODE`` in the
environment is respected), keeps its session files under ``run_dir/ray`` (or, when
that path is too long for Ray's Unix sockets or there is no ``run_dir``, in a
private temporary directory removed by :meth:`MeasuredEnv.close`), and prints
Ray's own messages ("A worker died ...") on stderr, so stdout carries only the
caller's output.

Peak memory per logical device: ``torch.cuda.max_memory_allocated`` for CUDA
devices; for the CPU, how far the process's peak resident set (``VmHWM``, reset
through ``/proc/self/clear_refs`` on Linux) rose above its resident set at the
start of the measurement (0 where ``/proc`` is unavailable). Logical devices
mapped to the same torch device report that device's peak.

This is the only module that imports ``ray``; ``import envs`` loads it only on first use of
``envs.MeasuredEnv``. The actors' side is :mod:`envs.real.worker`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray
import ray._private.worker as ray_worker
from ray._private import ray_constants
from ray.exceptions import RayActorError, RayTaskError

from envs.real.placing import resolve_devices
from envs.real.timing import check_timeout
from envs.real.worker import Builder, Worker, build_model, one_line, placement_hash  # noqa: F401  (the actors' side)
from envs.result import Result
from graphs import OpGraph, PlacerError
from graphs.plan import as_indices, check_order
from graphs.torch_capture import export_program, graph_from_program

LOG_NAME = "measurements.jsonl"










# ---------------------------------------------------------------------- env
#: Longest path of an AF_UNIX socket (``sun_path`` holds 108 bytes with the NUL).
_UNIX_PATH_MAX = 107
#: What Ray appends to its temp dir for its longest socket path (a 7-digit pid).
_RAY_SOCKET_SUFFIX = len("/session_2000-01-01_00-00-00_000000_1234567/sockets/plasma_store")
#: Ray keeps a node's IP 127.0.0.1 (so its servers listen on loopback only) only
#: while "Ray clusters" are off; it reads this variable into
#: ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` when imported.
_RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class MeasuredEnv:
    """Scores placements by real training steps on Ray actors.

    Args:
        source: a zoo name, ``module:callable`` or a picklable callable returning
            ``(model, example_inputs)``; built with ``torch.manual_seed(0)``.
        cluster: the :class:`envs.Cluster` whose logical devices placements use.
        workers: number of actors (default: one per alive Ray node).
        ray_address: join this Ray cluster (default: start a local Ray with this
            machine's resources, on loopback with token authentication, unless Ray
            is already initialised).
        warmup_steps, timed_steps: training steps per placement, discarded / timed.
        measure_timeout_s: wall seconds one placement's measurement may take once
            its actor is ready (placing the module, warm-up and timed steps).
        start_timeout_s: wall seconds an actor may take to start, and then to
            build the model (each).
        run_dir: directory of ``measurements.jsonl`` (the resumable log) and of the
            local Ray's session files (``ray/``); none: no log.
        device_map: logical -> torch device (see :func:`envs.real.placing.resolve_devices`).
        max_retries: re-measurements of a placement whose actor died.
        graph: the graph placements refer to (default: captured from ``source``).
        cpus_per_worker: Ray CPUs (and torch threads) per actor (default: a whole
            node's CPUs shared by the actors on it, so CPU ops run as in a real job).

    The actors run :attr:`worker_cls` (:class:`Worker`; a subclass may override
    its ``_steps``, e.g. to inject faults in tests).
    """

    worker_cls: type = Worker

    def __init__(
        self,
        source: str | Builder,
        cluster: Any,
        *,
        workers: int | None = None,
        ray_address: str | None = None,
        warmup_steps: int = 2,
        timed_steps: int = 5,
        measure_timeout_s: float = 600.0,
        start_timeout_s: float = 600.0,
        run_dir: str | os.PathLike | None = None,
        device_map: Mapping[str, str] | str | None = None,
        max_retries: int = 2,
        graph: OpGraph | None = None,
        cpus_per_worker: int | None = None,
        lr: float = 1e-3,
    ) -> None:
        if timed_steps < 1 or warmup_steps < 0:
            raise PlacerError(f"measured env: need timed_steps >= 1 and warmup_steps >= 0, got {timed_steps}, {warmup_steps}")
        self.source, self.cluster, self.device_map = source, cluster, device_map
        self.source_dir = os.getcwd()  # where a module:callable SOURCE resolves, here and in the workers
        self.warmup_steps, self.timed_steps, self.measure_timeout_s = warmup_steps, timed_steps, check_timeout(measure_timeout_s)
        self.start_timeout_s = check_timeout(start_timeout_s, "start_timeout_s")
        self.max_retries, self.cpus_per_worker, self.lr = max_retries, cpus_per_worker, lr
        if graph is None:
            model, inputs = build_model(source, search_dir=self.source_dir)
            graph = graph_from_program(export_program(model, inputs), name=source if isinstance(source, str) else "")
        self.graph = graph
        cuda = [d for d in resolve_devices(cluster.device_names, device_map).values() if d.type == "cuda"]
        self.gpus_per_worker = max((d.index or 0) + 1 for d in cuda) if cuda else 0
        self._ray_address, self._workers_wanted = ray_address, workers
        self._actors: list[Any] = []
        # ready()/prepare() ref -> (actor slot, stage "start" or "build", deadline), until the actor is idle
        self._starting: dict[Any, tuple[int, str, float]] = {}
        self._spawn_failures = 0
        self._started_ray = False
        self._ray_tmp: str | None = None  # a private temp dir of the local Ray, removed by close()
        self._print_to_stdstream: Any = None  # Ray's, while ours routes its messages to stderr
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.log_path = os.path.join(self.run_dir, LOG_NAME) if self.run_dir is not None else None
        self._cache: dict[str, Result] = {}
        self._orders: dict[str, list[str] | None] = {}  # placement hash -> op names in issue order (None: node order)
        if self.log_path:
            os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
            self._cache = read_log(self.log_path, self.graph.content_hash)

    # ------------------------------------------------------------- actors
    def _ensure_ray(self) -> Any:
        if not ray.is_initialized():
            self._route_ray_messages_to_stderr()
            try:
                if self._ray_address is None:
                    self._start_local_ray()
                else:
                    ray.init(address=self._ray_address, include_dashboard=False, log_to_driver=False, configure_logging=False)
            except BaseException:
                self._restore_ray_messages()
                raise
            self._started_ray = True
            atexit.register(self.close)
        return ray

    def _ray_temp_dir(self) -> str:
        """``run_dir/ray`` if Ray's socket paths under it fit AF_UNIX's limit, else a private temp dir."""
        if self.run_dir is not None:
            path = os.path.join(os.path.abspath(self.run_dir), "ray")
            if len(os.fsencode(path)) + _RAY_SOCKET_SUFFIX <= _UNIX_PATH_MAX:
                os.makedirs(path, exist_ok=True)
                return path
        base = tempfile.gettempdir()
        if len(os.fsencode(base)) + len("/placer-ray-XXXXXXXX") + _RAY_SOCKET_SUFFIX > _UNIX_PATH_MAX:
            base = "/tmp"
        self._ray_tmp = tempfile.mkdtemp(prefix="placer-ray-", dir=base)  # mode 0700
        return self._ray_tmp

    def _start_local_ray(self) -> None:
        """Start a local Ray listening on loopback only, with its session files in :meth:`_ray_temp_dir`.

        Token authentication: a new local Ray (>= 2.59) enables it unless
        ``RAY_AUTH_MODE`` says otherwise (the token is ``RAY_AUTH_TOKEN``,
        ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, generated if missing).
        """
        saved_env, saved_flag = os.environ.get(_RAY_CLUSTER_ENV), ray_constants.ENABLE_RAY_CLUSTER
        os.environ[_RAY_CLUSTER_ENV] = "0"  # for Ray's own processes
        ray_constants.ENABLE_RAY_CLUSTER = False  # for this one (read at import)
        try:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
                     _temp_dir=self._ray_temp_dir(), _node_ip_address="127.0.0.1")
        except BaseException:
            self._remove_ray_tmp()
            raise
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag
            if saved_env is None:
                os.environ.pop(_RAY_CLUSTER_ENV, None)
            else:
                os.environ[_RAY_CLUSTER_ENV] = saved_env
        ip = ray.util.get_node_ip_address()
        if ip not in ("127.0.0.1", "::1"):
            ray.shutdown()
            self._remove_ray_tmp()
            raise PlacerError(f"measured env: the local Ray cluster runs on {ip}, not loopback (this Ray version ignores "
                              f"{_RAY_CLUSTER_ENV}=0); start Ray yourself and pass --ray-address")

    def _route_ray_messages_to_stderr(self) -> None:
        """Print Ray's driver messages ("A worker died ...") on stderr, not stdout.

        Ray's error listener thread prints what raylets publish through
        ``ray._private.worker.print_to_stdstream`` on stdout; stdout belongs to the
        caller (``placer train --json``).
        """
        original = getattr(ray_worker, "print_to_stdstream", None)
        if original is None or self._print_to_stdstream is not None:
            return

        def to_stderr(data: dict, *args: Any, **kwargs: Any) -> Any:
            return original({**data, "is_err": True}, *args, **kwargs)

        self._print_to_stdstream = original
        ray_worker.print_to_stdstream = to_stderr

    def _restore_ray_messages(self) -> None:
        if self._print_to_stdstream is not None:
            ray_worker.print_to_stdstream = self._print_to_stdstream
            self._print_to_stdstream = None

    def _remove_ray_tmp(self) -> None:
        if self._ray_tmp is not None:
            shutil.rmtree(self._ray_tmp, ignore_errors=True)
            self._ray_tmp = None

    def _spawn(self, i: int | None = None) -> None:
        """Start an actor (in slot ``i``, replacing a dead or hung one); it becomes idle once built."""
        ray = self._ensure_ray()
        cls = ray.remote(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker, max_restarts=0)(self.worker_cls)
        actor = cls.options(scheduling_strategy="SPREAD").remote(self.source, self.device_map, self.cpus_per_worker, self.lr, self.source_dir)
        if i is None:
            i = len(self._actors)
            self._actors.append(actor)
        else:
            ray.kill(self._actors[i], no_restart=True)
            self._actors[i] = actor
        self._starting[actor.ready.remote()] = (i, "start", time.monotonic() + self.start_timeout_s)

    def _ensure_actors(self, wanted: int) -> None:
        ray = self._ensure_ray()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if self._workers_wanted is None:
            self._workers_wanted = max(1, len(nodes))
        if self.cpus_per_worker is None:
            per_node = max(1, self._workers_wanted // max(1, len(nodes)))
            self.cpus_per_worker = max(1, int(min(n["Resources"].get("CPU", 1) for n in nodes) // per_node)) if nodes else 1
        while len(self._actors) < min(self._workers_wanted, max(wanted, 1)):
            self._spawn()

    def start(self) -> None:
        """Start every worker and wait until each has built the model (else ``evaluate`` does it lazily)."""
        self._ensure_actors(self._workers_wanted or 1 << 30)
        while self._starting:
            ready, _ = ray.wait(list(self._starting), num_returns=1, timeout=self._seconds_left())
            for ref in ready:
                self._started(ref)
            self._check_start_deadlines()

    def _seconds_left(self, running: Mapping[Any, tuple[int, str, float]] | None = None) -> float | None:
        """Seconds until the next deadline of a starting actor or a running measurement (None: none)."""
        deadlines = [d for *_, d in self._starting.values()] + [d for *_, d in (running or {}).values()]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _check_start_deadlines(self) -> None:
        """Raise :class:`PlacerError` (killing the actor) if an actor is late to start or to build the model."""
        now = time.monotonic()
        for ref, (i, stage, deadline) in list(self._starting.items()):
            if deadline > now:
                continue
            del self._starting[ref]
            ray.kill(self._actors[i], no_restart=True)
            if stage == "start":
                gpus = f" and {self.gpus_per_worker} GPUs" if self.gpus_per_worker else ""
                what = (f"start a worker (does the Ray cluster have {self.cpus_per_worker} CPUs{gpus} free "
                        f"for each of {len(self._actors)} workers?)")
            else:
                what = f"build the model from {self.source if isinstance(self.source, str) else 'its builder'} in a worker"
            raise PlacerError(f"measured env: could not {what} within {self.start_timeout_s:g}s")

    def _started(self, ref: Any) -> int:
        """The slot whose actor is now idle (built), or -1 (still building, or re-spawned after dying)."""
        i, stage, _ = self._starting.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError as e:
            self._spawn_failures += 1
            if self._spawn_failures > 3 * max(1, len(self._actors)):
                raise PlacerError(f"measured env: workers keep dying while starting or building the model ({one_line(e)})") from None
            self._spawn(i)
            return -1
        except RayTaskError as e:
            raise PlacerError(f"measured env: a worker could not build the model ({one_line(e.cause or e)})") from None
        if stage == "start":
            self._starting[self._actors[i].prepare.remote()] = (i, "build", time.monotonic() + self.start_timeout_s)
            return -1
        if value != self.graph.content_hash:
            raise PlacerError(f"measured env: a worker captured graph {value}, not {self.graph.content_hash} (different torch version?)")
        return i

    def close(self) -> None:
        """Kill the actors (and the local Ray this env started, removing its private temp dir)."""
        atexit.unregister(self.close)
        if ray.is_initialized():
            for a in self._actors:
                ray.kill(a, no_restart=True)
        self._actors, self._starting = [], {}
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
        self._restore_ray_messages()
        self._remove_ray_tmp()

    def __enter__(self) -> "MeasuredEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------- scoring
    def keys(self, placements: Sequence[Any]) -> list[tuple[str, dict[str, str]]]:
        """(placement hash, op name -> device) of each placement, checked against the graph."""
        names = self.cluster.device_names
        out = []
        for k, p in enumerate(placements):
            idx = as_indices(p, self.graph, names, source=f"placement {k}")
            devs = [names[i] for i in idx.tolist()]
            order = getattr(p, "order", None)
            if order is not None:
                order = [self.graph.names[i] for i in check_order(order, self.graph, source=f"placement {k}: order").tolist()]
            key = placement_hash(devs, order)
            self._orders[key] = order
            out.append((key, dict(zip(self.graph.names, devs))))
        return out

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        """Measure each placement (logged ones are read back, not re-measured)."""
        keyed = self.keys(placements)
        todo = {h: a for h, a in keyed if h not in self._cache}
        pending = deque(todo)
        attempts: dict[str, int] = {}
        if pending:
            self._ensure_actors(len(pending))
        building = {i for i, _, _ in self._starting.values()}
        idle = deque(i for i in range(len(self._actors)) if i not in building)
        running: dict[Any, tuple[int, str, float]] = {}  # measure() ref -> (slot, key, deadline)
        while pending or running:
            while pending and idle:
                i, key = idle.popleft(), pending.popleft()
                ref = self._actors[i].measure.remote(todo[key], self.graph.content_hash, self.warmup_steps, self.timed_steps,
                                                       self._orders.get(key))
                running[ref] = (i, key, time.monotonic() + self.measure_timeout_s)
            ready, _ = ray.wait(list(running) + list(self._starting), num_returns=1, timeout=self._seconds_left(running))
            for ref in ready:
                if ref in self._starting:
                    i = self._started(ref)
                    if i >= 0:
                        idle.append(i)
                    continue
                i, key, _ = running.pop(ref)
                try:
                    self._record(key, Result.from_dict(ray.get(ref)))
                    idle.append(i)
                except RayActorError as e:  # the actor died: replace it, retry the placement (bounded)
                    attempts[key] = attempts.get(key, 0) + 1
                    self._spawn(i)
                    if attempts[key] > self.max_retries:
                        self._record(key, Result(float("inf"), "error", f"worker died {attempts[key]} times: {one_line(e)}", source="measured"))
                    else:
                        pending.appendleft(key)
            self._check_start_deadlines()
            now = time.monotonic()
            for ref, (i, key, deadline) in list(running.items()):
                if deadline <= now:
                    del running[ref]
                    self._spawn(i)  # kills the hung actor
                    self._record(key, Result(float("inf"), "timeout", f"measurement ran past {self.measure_timeout_s:g}s; worker replaced", source="measured"))
        return [self._cache[h] for h, _ in keyed]

    def _record(self, key: str, result: Result) -> None:
        self._cache[key] = result
        if self.log_path:
            line = json.dumps({"graph_hash": self.graph.content_hash, "placement_hash": key, "time_unix": time.time(), "result": result.to_dict()})
            append_log_line(self.log_path, line)

    def step_times(self, op_devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Batched ``[K, num_ops]`` device indices -> (step_time_s[K], oom[K]), like ``SimEnv.step_times``."""
        results = self.evaluate(list(np.asarray(op_devices)))
        return np.array([r.step_time_s for r in results]), np.array([r.status == "oom" for r in results])


def append_log_line(path: str, line: str) -> None:
    """Append one record to the log (flushed and fsynced), first ending a torn last line of a killed run,
    so that the new record never joins it."""
    with open(path, "ab+") as f:  # writes go to the end whatever the read position
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_log(path: str, graph_hash: str) -> dict[str, Result]:
    """Placement hash -> Result of every logged measurement of ``graph_hash``.

    Unreadable lines (a torn line of a killed run) are skipped and counted in one warning on stderr.
    """
    out: dict[str, Result] = {}
    if not os.path.exists(path):
        return out
    skipped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec.get("graph_hash") == graph_hash:
                    out[rec["placement_hash"]] = Result.from_dict(rec["result"])
            except (ValueError, KeyError, TypeError, AttributeError):
                skipped += 1  # the run was killed mid-write, or the line is not a record
    if skipped:
        print(f"placer: warning: {path}: skipped {skipped} unreadable line(s)", file=sys.stderr)
    return out


__all__ = ["MeasuredEnv", "Worker", "append_log_line", "build_model", "placement_hash", "read_log", "LOG_NAME"]
