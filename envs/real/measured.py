"""The Ray measurement harness: score placements by running real training steps.

:class:`MeasuredEnv` has the scorer protocol of :class:`envs.SimEnv`
(``evaluate(placements) -> list[Result]``). Each Ray actor owns one machine's
devices (``num_gpus`` = the CUDA devices the device map uses); ``evaluate``
spreads a batch over the actors, each of which builds the placed module
(:func:`envs.real.placing.place_module`, the pass behind :func:`placer.apply`), runs
``warmup_steps`` then ``timed_steps`` training steps (forward, loss, backward,
Adam step, CUDA synchronised) and reports the median step time and the peak
memory per logical device (:mod:`envs.real.worker` says how it is measured).

Failures are results, not crashes: out of memory (torch's or Python's
``MemoryError``) -> ``"oom"``; any other exception -> ``"error"`` with its
message; a measurement running past ``measure_timeout_s`` -> ``"timeout"``, and
its actor is killed and replaced; an actor that dies has its placement retried on
a fresh one (at most ``max_retries`` times). A worker that does not start within
``start_timeout_s``, or does not build the model within ``build_timeout_s``, is a :class:`PlacerError`
naming the stage (every worker builds the same model, so nothing else could be
measured). Every result is appended to ``run_dir/measurements.jsonl`` (flushed
and fsynced) as it arrives (:mod:`envs.real.measure_log`), so a resumed run
measures nothing twice. A worker whose node leaves the Ray cluster is not
replaced: its placement is measured again on another worker (not counted as a
retry), and the run goes on with the workers left.

The user's code travels with the job: a ``module:callable`` SOURCE's module (its
file, or its whole package) is shipped through Ray's runtime environment
(:mod:`envs.real.shipping`) and the workers import that copy, so no node needs
the driver's files (Ray initialised by the caller: its job; nothing is shipped).
Joining a cluster (``ray_address``) with token authentication: the driver sends
this machine's token when it has one and the cluster asks for one (:mod:`envs.real.ray_access`);
a cluster that refuses it is one line, at once, not after Ray's 20 s of retries.

The local Ray this env starts (no ``ray_address`` and Ray not yet initialised)
listens on the loopback interface only, uses Ray's token authentication
(``RAY_AUTH_MODE=token``, Ray >= 2.52; an explicit ``RAY_AUTH_MODE`` in the
environment is respected), keeps its session files under ``run_dir/ray`` (or, when
that path is too long for Ray's Unix sockets or there is no ``run_dir``, in a
private temporary directory removed by :meth:`MeasuredEnv.close`), and prints
Ray's own messages ("A worker died ...") on stderr, so stdout carries only the
caller's output.

Besides the Ray package :mod:`envs.real.ray` (multi-process jobs), this is the only module that imports
``ray``; ``import envs`` loads it only on first use of ``envs.MeasuredEnv``. The actors' side is
:mod:`envs.real.worker`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import ray._private.worker as ray_worker  # noqa: PLC2701 (ray has no public equivalent)
from ray._private import ray_constants  # noqa: PLC2701 (ray has no public equivalent)
from ray.exceptions import RayActorError, RayTaskError, RuntimeEnvSetupError

from envs.real.allocator import steady_runtime_env
from envs.real.measure_log import (  # noqa: F401
    LOG_NAME,
    RecordedMeasurements,
    append_log_line,
    append_record,
    placement_key,
    read_log,
)
from envs.real.placing import resolve_devices
from envs.real.ray_access import (
    native_stderr_silenced,
    ray_temp_dir,
    refused_message,
    sends_token,
    unasked_token_message,
)
from envs.real.shipping import SHIP_LIMIT_BYTES, Shipment, ship_plan
from envs.real.timing import check_timeout
from envs.real.worker import Builder, Worker, build_model, one_line, placement_hash  # noqa: F401  (the actors' side)
from envs.result import Result
from graphs import OpGraph, PlacerError
from graphs.hash_seed import hash_seed_env, hash_seed_hint
from graphs.torch_capture import export_program, graph_from_program

try:  # token authentication: Ray >= 2.52
    from ray._raylet import AuthenticationTokenLoader, Config, GcsClient
    from ray.exceptions import AuthenticationError
except ImportError:  # pragma: no cover - an older Ray has no tokens to check
    AuthenticationTokenLoader = Config = GcsClient = None
    AuthenticationError = ()


# ---------------------------------------------------------------------- env
#: Ray keeps a node's IP 127.0.0.1 (so its servers listen on loopback only) only
#: while "Ray clusters" are off; it reads this variable into
#: ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` when imported.
_RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def actor_runtime_env() -> dict[str, Any]:
    """The ``runtime_env`` of an actor that measures (this env's workers, a job's ranks): its process starts with
    glibc's thread cache off (:func:`~envs.real.allocator.steady_runtime_env`) and the driver's hash seed, or
    placer's where the driver has none (:mod:`graphs.hash_seed`: a model that iterates a set exports its ops in
    one order in every actor), as an actor on another node does not inherit the driver's environment."""
    return {"env_vars": {**steady_runtime_env()["env_vars"], **hash_seed_env()}}


def node_id() -> str:
    """The id of the Ray node this process runs on (a worker calls it, :class:`envs.real.worker.Worker`)."""
    return ray.get_runtime_context().get_node_id()


def join_cluster(address: str, runtime_env: dict | None = None) -> None:
    """``ray.init(address)``, sending this machine's token when it has one and the cluster asks for one
    (:func:`envs.real.ray_access.sends_token`); a cluster that refuses it, or does not answer, is a
    :class:`PlacerError` naming the address and what to do."""
    asks = _asks_for_token(address)
    if not asks and unasked_token_message():
        raise PlacerError(f"--ray-address {address}: {unasked_token_message()}")
    # read only for a cluster that asks: Ray's loader keeps the token it reads, and a driver holding one refuses
    # the calls of workers that have none
    has_token = asks and AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    if sends_token(os.environ, has_token, asks):
        os.environ["RAY_AUTH_MODE"] = "token"  # as Ray's own ray.init() does for a local cluster
        Config.initialize("")
    _check_token(address)
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env=runtime_env,
        )
    except ConnectionError as e:
        raise PlacerError(
            f"--ray-address {address}: {one_line(e)} (is the head node running, and is its port open?)"
        ) from None


def _asks_for_token(address: str) -> bool:
    """Whether the cluster refuses a call that carries no token (made with token authentication off for it)."""
    if GcsClient is None:
        return False
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    Config.initialize("")
    try:
        with native_stderr_silenced():  # Ray's C++ client logs each refused call there
            GcsClient(address=address).internal_kv_get(b"placer", None, timeout=30)
    except AuthenticationError:
        return True
    except Exception as e:  # noqa: BLE001  (not answering: said at once; anything else, ray.init says)
        if "Timed out" in str(e):
            raise PlacerError(f"--ray-address {address}: no Ray cluster answers there ({one_line(e)})") from None
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
        Config.initialize("")
    return False


def _check_token(address: str) -> None:
    """One call to the cluster's GCS: a refused token raises at once (``ray.init`` retries for 20 s)."""
    if GcsClient is None:
        return
    try:
        with native_stderr_silenced():  # Ray's C++ client logs each refused call there
            GcsClient(address=address).internal_kv_get(b"placer", None, timeout=30)
    except AuthenticationError:
        raise PlacerError(f"--ray-address {address}: {refused_message()}") from None
    except Exception as e:  # noqa: BLE001  (not answering: ray.init says so, after its own retries)
        if "Timed out" in str(e):
            raise PlacerError(f"--ray-address {address}: no Ray cluster answers there ({one_line(e)})") from None


class MeasuredEnv(RecordedMeasurements):
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
        start_timeout_s: wall seconds an actor may take to start.
        build_timeout_s: wall seconds a started actor may take to build the model
            (default: ``start_timeout_s``).
        run_dir: directory of ``measurements.jsonl`` (the resumable log) and of the
            local Ray's session files (``ray/``); none: no log.
        device_map: logical -> torch device (see :func:`envs.real.placing.resolve_devices`).
        max_retries: re-measurements of a placement whose actor died.
        graph: the graph placements refer to (default: captured from ``source``).
        cpus_per_worker: Ray CPUs (and torch threads) per actor (default: a whole
            node's CPUs shared by the actors on it, so CPU ops run as in a real job).
        ship_limit_bytes: the most a shipped ``module:callable`` module may hold.

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
        build_timeout_s: float | None = None,
        run_dir: str | os.PathLike | None = None,
        device_map: Mapping[str, str] | str | None = None,
        max_retries: int = 2,
        graph: OpGraph | None = None,
        cpus_per_worker: int | None = None,
        lr: float = 1e-3,
        ship_limit_bytes: int = SHIP_LIMIT_BYTES,
    ) -> None:
        if timed_steps < 1 or warmup_steps < 0:
            raise PlacerError(
                f"measured env: need timed_steps >= 1 and warmup_steps >= 0, got {timed_steps}, {warmup_steps}"
            )
        self.source, self.cluster, self.device_map = source, cluster, device_map
        self.source_dir = os.getcwd()  # where a module:callable SOURCE resolves, here and in the workers
        self.warmup_steps, self.timed_steps, self.measure_timeout_s = (
            warmup_steps,
            timed_steps,
            check_timeout(measure_timeout_s),
        )
        self.start_timeout_s = check_timeout(start_timeout_s, "start_timeout_s")
        self.build_timeout_s = (
            self.start_timeout_s if build_timeout_s is None else check_timeout(build_timeout_s, "build_timeout_s")
        )
        self.max_retries, self.cpus_per_worker, self.lr = max_retries, cpus_per_worker, lr
        self.ship_limit_bytes = ship_limit_bytes
        self.shipment: Shipment | None = None  # what _ensure_ray shipped with the job
        if graph is None:
            model, inputs = build_model(source, search_dir=self.source_dir)
            graph = graph_from_program(export_program(model, inputs), name=source if isinstance(source, str) else "")
        self.graph = graph
        cuda = [d for d in resolve_devices(cluster.device_names, device_map).values() if d.type == "cuda"]
        self.gpus_per_worker = max((d.index or 0) + 1 for d in cuda) if cuda else 0
        self._ray_address, self._workers_wanted = ray_address, workers
        self._actors: list[Any] = []  # by slot; None: retired (its node left the cluster)
        # the Ray node id of each slot's actor once it has started (of the one it replaces, until then)
        self._nodes: list[str | None] = []
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
        """Start or join Ray (shipping the user's module with the job), unless Ray is already initialised."""
        if not ray.is_initialized():
            self.shipment = ship_plan(self.source, self.source_dir, self.ship_limit_bytes)
            runtime_env = self.shipment.runtime_env() if self.shipment else None
            self._route_ray_messages_to_stderr()
            try:
                if self._ray_address is None:
                    self._start_local_ray(runtime_env)
                else:
                    join_cluster(self._ray_address, runtime_env)
            except RuntimeEnvSetupError as e:
                self._restore_ray_messages()
                raise PlacerError(
                    f"{self.source}: Ray could not ship {self.shipment.describe()} ({one_line(e)})"
                ) from None
            except BaseException:
                self._restore_ray_messages()
                raise
            self._started_ray = True
            atexit.register(self.close)
        return ray

    def _ray_temp_dir(self) -> str:
        """The local Ray's session directory (:func:`envs.real.ray_access.ray_temp_dir`); a private one is removed by
        close()."""
        path, private = ray_temp_dir(self.run_dir)
        if private:
            self._ray_tmp = path
        return path

    def _start_local_ray(self, runtime_env: dict | None = None) -> None:
        """Start a local Ray listening on loopback only, with its session files in :meth:`_ray_temp_dir`, whose
        workers run at this process's priority: Ray's default lowers theirs (niceness 15), so that anything at the
        normal priority on the machine (Ray's own daemons, the driver's search, another program) took a core from a
        measurement at once, and a training step would be measured as no training job runs. (A cluster joined by
        address keeps its own setting.)

        Token authentication: a new local Ray (>= 2.59) enables it unless
        ``RAY_AUTH_MODE`` says otherwise (the token is ``RAY_AUTH_TOKEN``,
        ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, generated if missing).
        """
        saved_env, saved_flag = os.environ.get(_RAY_CLUSTER_ENV), ray_constants.ENABLE_RAY_CLUSTER
        os.environ[_RAY_CLUSTER_ENV] = "0"  # for Ray's own processes
        ray_constants.ENABLE_RAY_CLUSTER = False  # for this one (read at import)
        try:
            ray.init(
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                runtime_env=runtime_env,
                _temp_dir=self._ray_temp_dir(),
                _node_ip_address="127.0.0.1",
                _system_config={"worker_niceness": 0},  # workers not niced (Ray's default is 15)
            )
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
            raise PlacerError(
                f"measured env: the local Ray cluster runs on {ip}, not loopback (this Ray version ignores "
                f"{_RAY_CLUSTER_ENV}=0); start Ray yourself and pass --ray-address"
            )

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
        shipped = self.shipment.module if self.shipment else None
        actor = cls.options(scheduling_strategy="SPREAD", runtime_env=actor_runtime_env()).remote(
            self.source, self.device_map, self.cpus_per_worker, self.lr, self.source_dir, shipped, node_id
        )
        if i is None:
            i = len(self._actors)
            self._actors.append(actor)
            self._nodes.append(None)
        else:
            if self._actors[i] is not None:
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
            self.cpus_per_worker = (
                max(1, int(min(n["Resources"].get("CPU", 1) for n in nodes) // per_node)) if nodes else 1
            )
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
        """Raise :class:`PlacerError` (killing the actor) if an actor is late to start or to build the model.

        An actor late to start while other workers are ready (no room for it) is retired instead, and so
        is, at once, one that replaces an actor whose node has left: the run goes on with the others.
        """
        now = time.monotonic()
        for ref, (i, stage, deadline) in list(self._starting.items()):
            if stage == "start" and self._ready_slots() and self._node_lost(i):  # a replacement for a lost node's
                self._retire(i, "a worker's node left the Ray cluster")
                continue
            if deadline > now:
                continue
            del self._starting[ref]
            if stage == "start" and self._ready_slots() - {i}:
                self._retire(
                    i, f"a worker could not start within {self.start_timeout_s:g}s (no room on the Ray cluster?)"
                )
                continue
            ray.kill(self._actors[i], no_restart=True)
            if stage == "start":
                gpus = f" and {self.gpus_per_worker} GPUs" if self.gpus_per_worker else ""
                what = (
                    f"start a worker (does the Ray cluster have {self.cpus_per_worker} CPUs{gpus} free "
                    f"for each of {len(self._actors)} workers?)"
                )
            else:
                what = (
                    f"build the model from {self.source if isinstance(self.source, str) else 'its builder'} in a worker"
                )
            limit = self.start_timeout_s if stage == "start" else self.build_timeout_s
            raise PlacerError(f"measured env: could not {what} within {limit:g}s")

    def _started(self, ref: Any) -> int:
        """The slot whose actor is now idle (built), or -1 (still building, re-spawned after dying, or retired)."""
        i, stage, _ = self._starting.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError as e:
            if self._node_lost(i):
                self._retire(i, "a worker's node left the Ray cluster")
                return -1
            self._spawn_failures += 1
            if self._spawn_failures > 3 * max(1, len(self._actors)):
                raise PlacerError(
                    f"measured env: workers keep dying while starting or building the model ({one_line(e)})"
                ) from None
            self._spawn(i)
            return -1
        except RayTaskError as e:
            why = f"{one_line(e.cause or e)}{self._ship_hint()}"
            raise PlacerError(f"measured env: a worker could not build the model ({why})") from None
        if stage == "start":
            self._nodes[i] = value
            build = self._actors[i].prepare.remote(freeze_gc=True)  # the actor's process is its own
            self._starting[build] = (i, "build", time.monotonic() + self.build_timeout_s)
            return -1
        if value != self.graph.content_hash:
            raise PlacerError(
                f"measured env: a worker captured graph {value}, not {self.graph.content_hash} (different "
                f"torch version?){hash_seed_hint()}"
            )
        return i

    def _ship_hint(self) -> str:
        """What a failed build in a worker should say about the shipped module (a sibling module left behind)."""
        if self.shipment is None:
            return ""
        return (
            f"; placer shipped the {self.shipment.describe()}: a module of yours that it imports must be inside "
            f"that package or installed on every node"
        )

    def _ready_slots(self) -> set[int]:
        """Slots whose actor is built (idle or measuring)."""
        starting = {i for i, _, _ in self._starting.values()}
        return {i for i, a in enumerate(self._actors) if a is not None and i not in starting}

    def _node_lost(self, i: int) -> bool:
        """True when slot ``i``'s actor ran on a node that is no longer alive in the Ray cluster."""
        node = self._nodes[i]
        return node is not None and node not in {n["NodeID"] for n in ray.nodes() if n.get("Alive")}

    def _retire(self, i: int, why: str) -> None:
        """Stop using slot ``i`` (its actor is killed, not replaced); the run goes on with the other workers."""
        if self._actors[i] is not None:
            ray.kill(self._actors[i], no_restart=True)
        self._actors[i] = None
        for ref, (j, _, _) in list(self._starting.items()):
            if j == i:
                del self._starting[ref]
        live = sum(a is not None for a in self._actors)
        print(f"placer: note: measured env: {why}; measuring with {live} worker(s)", file=sys.stderr)

    def close(self) -> None:
        """Kill the actors (and the local Ray this env started, removing its private temp dir)."""
        atexit.unregister(self.close)
        if ray.is_initialized():
            for a in self._actors:
                if a is not None:
                    ray.kill(a, no_restart=True)
        self._actors, self._nodes, self._starting = [], [], {}
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
        out = []
        for k, p in enumerate(placements):
            key, assignment, self._orders[key] = placement_key(
                p, self.graph, self.cluster.device_names, f"placement {k}"
            )
            out.append((key, assignment))
        return out

    def evaluate(self, placements: Sequence[Any], *, again: bool = False) -> list[Result]:
        """Measure each placement (logged ones are read back, not re-measured; ``again``: every one is measured
        anew, and these results are returned and logged as re-measurements, the cache keeping the first)."""
        keyed = self.keys(placements)
        self._begin(again)
        todo = {h: a for h, a in keyed if again or h not in self._cache}
        pending = deque(todo)
        attempts: dict[str, int] = {}
        if pending:
            self._ensure_actors(len(pending))
        idle = deque(sorted(self._ready_slots()))
        running: dict[Any, tuple[int, str, float]] = {}  # measure() ref -> (slot, key, deadline)
        while pending or running:
            while pending and idle:
                i, key = idle.popleft(), pending.popleft()
                ref = self._actors[i].measure.remote(
                    todo[key], self.graph.content_hash, self.warmup_steps, self.timed_steps, self._orders.get(key)
                )
                running[ref] = (i, key, time.monotonic() + self.measure_timeout_s)
            if pending and not running and not self._starting:  # every worker is gone: start one where there is room
                self._spawn()
            ready, _ = ray.wait(
                list(running) + list(self._starting), num_returns=1, timeout=self._seconds_left(running)
            )
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
                except RayActorError as e:
                    self._measurement_lost(i, key, e, pending, attempts)
            self._check_start_deadlines()
            self._check_measure_deadlines(running)
        return self._results([h for h, _ in keyed])

    def _measurement_lost(self, i: int, key: str, e: RayActorError, pending: deque, attempts: dict[str, int]) -> None:
        """Slot ``i``'s actor died measuring ``key``: measure it again on a fresh actor, at most ``max_retries``
        times, or, when the actor's node left the cluster, on the workers left (not counted as a retry)."""
        if self._node_lost(i):
            self._retire(i, "a worker's node left the Ray cluster")
            pending.appendleft(key)
            return
        attempts[key] = attempts.get(key, 0) + 1
        self._spawn(i)
        if attempts[key] > self.max_retries:
            self._record(
                key,
                Result(float("inf"), "error", f"worker died {attempts[key]} times: {one_line(e)}", source="measured"),
            )
        else:
            pending.appendleft(key)

    def _check_measure_deadlines(self, running: dict[Any, tuple[int, str, float]]) -> None:
        """A measurement past ``measure_timeout_s`` is a ``"timeout"`` result; its hung actor is replaced."""
        now = time.monotonic()
        for ref, (i, key, deadline) in list(running.items()):
            if deadline <= now:
                del running[ref]
                self._spawn(i)  # kills the hung actor
                self._record(
                    key,
                    Result(
                        float("inf"),
                        "timeout",
                        f"measurement ran past {self.measure_timeout_s:g}s; worker replaced",
                        source="measured",
                    ),
                )


__all__ = [
    "MeasuredEnv",
    "Worker",
    "append_log_line",
    "build_model",
    "join_cluster",
    "node_id",
    "placement_hash",
    "read_log",
    "LOG_NAME",
]
