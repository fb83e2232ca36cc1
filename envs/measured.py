"""The Ray measurement harness: score placements by running real training steps.

:class:`MeasuredEnv` has the scorer protocol of :class:`envs.SimEnv`
(``evaluate(placements) -> list[Result]``). Each Ray actor owns one machine's
devices (``num_gpus`` = the CUDA devices the device map uses); ``evaluate``
spreads a batch over the actors, each of which builds the placed module
(:func:`envs.runtime.place_module`, the pass behind :func:`placer.apply`), runs
``warmup_steps`` then ``timed_steps`` training steps (forward, loss, backward,
Adam step, CUDA synchronised) and reports the median step time.

Failures are results, not crashes: out of memory -> ``"oom"``; any exception ->
``"error"`` with its message; a measurement running past ``timeout_s`` ->
``"timeout"``, and its actor is killed and replaced; an actor that dies has its
placement retried on a fresh one (at most ``max_retries`` times). Every result is
appended to ``run_dir/measurements.jsonl`` (flushed and fsynced) as it arrives,
keyed by graph hash and placement hash, so a resumed run measures nothing twice.

Peak memory per logical device: ``torch.cuda.max_memory_allocated`` for CUDA
devices; for the CPU, how far the process's peak resident set (``VmHWM``, reset
through ``/proc/self/clear_refs`` on Linux) rose above its resident set at the
start of the measurement (0 where ``/proc`` is unavailable). Logical devices
mapped to the same torch device report that device's peak.

This is the only module that imports ``ray`` (lazily, so ``import envs`` stays light).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from envs.assign import as_indices
from envs.result import Result
from graphs import OpGraph, PlacerError

LOG_NAME = "measurements.jsonl"
Builder = Callable[[], tuple[Any, tuple]]


# ------------------------------------------------------------------ sources
def build_model(source: str | Builder, seed: int = 0) -> tuple[Any, tuple]:
    """``(model, example_inputs)`` from a zoo name, ``module:callable`` or a callable, seeded."""
    import importlib

    import torch

    torch.manual_seed(seed)
    if callable(source):
        out = source()
    else:
        from graphs import zoo

        if source in zoo.names():
            return zoo.build(source)
        mod_name, sep, attr = source.partition(":")
        if not (sep and mod_name and attr):
            raise PlacerError(f"{source}: not a zoo name ({', '.join(zoo.names())}) or module:callable")
        try:
            fn = importlib.import_module(mod_name)
            for part in attr.split("."):
                fn = getattr(fn, part)
        except (ImportError, AttributeError) as e:
            raise PlacerError(f"{source}: cannot import ({type(e).__name__}: {e})") from None
        out = fn()
    if not (isinstance(out, tuple) and len(out) == 2):
        raise PlacerError(f"{source}: must return (model, example_inputs)")
    model, inputs = out
    return model, inputs if isinstance(inputs, tuple) else (tuple(inputs) if isinstance(inputs, list) else (inputs,))


def placement_hash(assignment_list: Sequence[str]) -> str:
    """Hash of the logical device of every op, in graph order (16 hex chars)."""
    return hashlib.sha256(json.dumps(list(assignment_list)).encode()).hexdigest()[:16]


# ------------------------------------------------------------------- worker
def _inject(fault: str | None) -> None:
    """Test-only fault injection (see MeasuredEnv ``faults``)."""
    if not fault:
        return
    import torch

    action, _, arg = fault.partition(":")
    if action == "sleep":
        time.sleep(float(arg or 3600))
    elif action == "raise":
        raise RuntimeError(arg or "injected failure")
    elif action == "oom":
        raise torch.OutOfMemoryError(arg or "injected out of memory")
    elif action == "exit":
        os._exit(1)
    elif action == "exit_once":
        if not os.path.exists(arg):
            with open(arg, "w") as f:
                f.write(str(os.getpid()))
            os._exit(1)


class Worker:
    """One Ray actor: builds the exported program once, measures placements on it."""

    def __init__(self, source: str | Builder, device_map: Mapping[str, str] | str | None, threads: int, lr: float = 1e-3) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.source, self.device_map, self.lr = source, device_map, lr
        self.ep = None
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def prepare(self) -> str:
        """Build and export the model (once); returns its graph hash."""
        import torch

        from graphs.torch_capture import export_program, graph_from_program

        if self.ep is None:
            model, inputs = build_model(self.source)
            self.ep = export_program(model, inputs)
            self.inputs = inputs
            self.graph_hash = graph_from_program(self.ep).content_hash
            self.snapshot = {k: v.detach().clone() for k, v in self.ep.state_dict.items()}
            self.constants = {k: v.detach().clone() for k, v in self.ep.constants.items() if isinstance(v, torch.Tensor)}
        return self.graph_hash

    def _restore(self) -> None:
        import torch

        with torch.no_grad():
            for k, v in self.ep.state_dict.items():
                v.copy_(self.snapshot[k])
            for k, v in self.constants.items():
                self.ep.constants[k].copy_(v)

    def measure(self, assignment: dict[str, str], graph_hash: str, warmup_steps: int, timed_steps: int, fault: str | None = None) -> dict[str, Any]:
        """Measure one placement; returns ``Result.to_dict()`` (never raises for a bad placement)."""
        import torch

        from envs.runtime import measure_steps, place_module, resolve_devices

        extra: dict[str, Any] = {"worker": self.name}
        try:
            if self.prepare() != graph_hash:
                return Result(float("inf"), "error", f"worker built graph {self.graph_hash}, expected {graph_hash}", source="measured", extra=extra).to_dict()
            self._restore()
            devices = resolve_devices(sorted(set(assignment.values())), self.device_map)
            module = place_module(self.ep, assignment, self.device_map)
            opt = torch.optim.Adam(module.parameters(), lr=self.lr)
            _inject(fault)
            m = measure_steps(module, self.inputs, opt, devices, warmup_steps=warmup_steps, timed_steps=timed_steps)
            extra.update(step_times_s=m["step_times_s"], losses=m["losses"])
            return Result(m["step_time_s"], "ok", peak_bytes=m["peak_bytes"], source="measured", extra=extra).to_dict()
        except torch.OutOfMemoryError as e:
            return Result(float("inf"), "oom", f"out of memory: {_one_line(e)}", source="measured", extra=extra).to_dict()
        except Exception as e:  # any failure of the user's model on this placement is a result
            status = "oom" if "can't allocate memory" in str(e) or "out of memory" in str(e).lower() else "error"
            return Result(float("inf"), status, f"{type(e).__name__}: {_one_line(e)}", source="measured", extra=extra).to_dict()
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


# ---------------------------------------------------------------------- env
class MeasuredEnv:
    """Scores placements by real training steps on Ray actors.

    Args:
        source: a zoo name, ``module:callable`` or a picklable callable returning
            ``(model, example_inputs)``; built with ``torch.manual_seed(0)``.
        cluster: the :class:`envs.Cluster` whose logical devices placements use.
        workers: number of actors (default: one per alive Ray node).
        ray_address: join this Ray cluster (default: start a local Ray with this
            machine's resources, unless Ray is already initialised).
        warmup_steps, timed_steps: training steps per placement, discarded / timed.
        timeout_s: wall seconds one placement's measurement may take once its
            actor is ready (placing the module, warm-up and timed steps).
        run_dir: directory of ``measurements.jsonl`` (the resumable log); none: no log.
        device_map: logical -> torch device (see :func:`envs.runtime.resolve_devices`).
        max_retries: re-measurements of a placement whose actor died.
        graph: the graph placements refer to (default: captured from ``source``).
        cpus_per_worker: Ray CPUs (and torch threads) per actor (default: a whole
            node's CPUs shared by the actors on it, so CPU ops run as in a real job).
        faults: TEST ONLY. placement hash -> ``"sleep:S"``, ``"raise[:msg]"``,
            ``"oom"``, ``"exit"`` or ``"exit_once:MARKER_PATH"``, acted on by the
            actor just before the training steps of that placement.
    """

    def __init__(
        self,
        source: str | Builder,
        cluster: Any,
        *,
        workers: int | None = None,
        ray_address: str | None = None,
        warmup_steps: int = 2,
        timed_steps: int = 5,
        timeout_s: float = 600.0,
        run_dir: str | os.PathLike | None = None,
        device_map: Mapping[str, str] | str | None = None,
        max_retries: int = 2,
        graph: OpGraph | None = None,
        cpus_per_worker: int | None = None,
        lr: float = 1e-3,
        faults: Mapping[str, str] | None = None,
    ) -> None:
        from envs.runtime import resolve_devices

        if timed_steps < 1 or warmup_steps < 0:
            raise PlacerError(f"measured env: need timed_steps >= 1 and warmup_steps >= 0, got {timed_steps}, {warmup_steps}")
        self.source, self.cluster, self.device_map = source, cluster, device_map
        self.warmup_steps, self.timed_steps, self.timeout_s = warmup_steps, timed_steps, float(timeout_s)
        self.max_retries, self.cpus_per_worker, self.lr = max_retries, cpus_per_worker, lr
        self.faults = dict(faults or {})
        if graph is None:
            from graphs.torch_capture import export_program, graph_from_program

            model, inputs = build_model(source)
            graph = graph_from_program(export_program(model, inputs), name=source if isinstance(source, str) else "")
        self.graph = graph
        cuda = [d for d in resolve_devices(cluster.device_names, device_map).values() if d.type == "cuda"]
        self.gpus_per_worker = max((d.index or 0) + 1 for d in cuda) if cuda else 0
        self._ray_address, self._workers_wanted = ray_address, workers
        self._actors: list[Any] = []
        self._preparing: dict[Any, int] = {}  # prepare() ref -> actor slot, while it builds
        self._spawn_failures = 0
        self._started_ray = False
        self.log_path = os.path.join(os.fspath(run_dir), LOG_NAME) if run_dir is not None else None
        self._cache: dict[str, Result] = {}
        if self.log_path:
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            self._cache = read_log(self.log_path, self.graph.content_hash)

    # ------------------------------------------------------------- actors
    def _ensure_ray(self) -> Any:
        import ray

        if not ray.is_initialized():
            ray.init(address=self._ray_address, include_dashboard=False, log_to_driver=False, configure_logging=False)
            self._started_ray = True
        return ray

    def _spawn(self, i: int | None = None) -> None:
        """Start an actor (in slot ``i``, replacing a dead or hung one); it becomes idle once built."""
        ray = self._ensure_ray()
        cls = ray.remote(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker, max_restarts=0)(Worker)
        actor = cls.options(scheduling_strategy="SPREAD").remote(self.source, self.device_map, self.cpus_per_worker, self.lr)
        if i is None:
            i = len(self._actors)
            self._actors.append(actor)
        else:
            ray.kill(self._actors[i], no_restart=True)
            self._actors[i] = actor
        self._preparing[actor.prepare.remote()] = i

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
        import ray

        self._ensure_actors(self._workers_wanted or 1 << 30)
        while self._preparing:
            ready, _ = ray.wait(list(self._preparing), num_returns=1)
            self._prepared(ready[0])

    def _prepared(self, ref: Any) -> int:
        """Slot of the actor whose build finished (re-spawned if it died while building)."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        i = self._preparing.pop(ref)
        try:
            graph_hash = ray.get(ref)
        except RayActorError as e:
            self._spawn_failures += 1
            if self._spawn_failures > 3 * max(1, len(self._actors)):
                raise PlacerError(f"measured env: workers keep dying while building the model ({_one_line(e)})") from None
            self._spawn(i)
            return -1
        except RayTaskError as e:
            raise PlacerError(f"measured env: a worker could not build the model ({_one_line(e.cause or e)})") from None
        if graph_hash != self.graph.content_hash:
            raise PlacerError(f"measured env: a worker captured graph {graph_hash}, not {self.graph.content_hash} (different torch version?)")
        return i

    def close(self) -> None:
        """Kill the actors (and the local Ray this env started)."""
        import ray

        for a in self._actors:
            ray.kill(a, no_restart=True)
        self._actors, self._preparing = [], {}
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

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
            out.append((placement_hash(devs), dict(zip(self.graph.names, devs))))
        return out

    def evaluate(self, placements: Sequence[Any]) -> list[Result]:
        """Measure each placement (logged ones are read back, not re-measured)."""
        import ray
        from ray.exceptions import RayActorError

        keyed = self.keys(placements)
        todo = {h: a for h, a in keyed if h not in self._cache}
        pending = deque(todo)
        attempts: dict[str, int] = {}
        if pending:
            self._ensure_actors(len(pending))
        building = set(self._preparing.values())
        idle = deque(i for i in range(len(self._actors)) if i not in building)
        running: dict[Any, tuple[int, str, float]] = {}  # measure() ref -> (slot, key, deadline)
        while pending or running:
            while pending and idle:
                i, key = idle.popleft(), pending.popleft()
                ref = self._actors[i].measure.remote(todo[key], self.graph.content_hash, self.warmup_steps, self.timed_steps, self.faults.get(key))
                running[ref] = (i, key, time.monotonic() + self.timeout_s)
            wait_s = max(0.0, min(d for _, _, d in running.values()) - time.monotonic()) if running else None
            ready, _ = ray.wait(list(running) + list(self._preparing), num_returns=1, timeout=wait_s)
            now = time.monotonic()
            for ref in ready:
                if ref in self._preparing:
                    i = self._prepared(ref)
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
                        self._record(key, Result(float("inf"), "error", f"worker died {attempts[key]} times: {_one_line(e)}", source="measured"))
                    else:
                        pending.appendleft(key)
            for ref, (i, key, deadline) in list(running.items()):
                if deadline <= now:
                    del running[ref]
                    self._spawn(i)  # kills the hung actor
                    self._record(key, Result(float("inf"), "timeout", f"measurement ran past {self.timeout_s:g}s; worker replaced", source="measured"))
        return [self._cache[h] for h, _ in keyed]

    def _record(self, key: str, result: Result) -> None:
        self._cache[key] = result
        if self.log_path:
            line = json.dumps({"graph_hash": self.graph.content_hash, "placement_hash": key, "time_unix": time.time(), "result": result.to_dict()})
            append_log_line(self.log_path, line)

    def step_times(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Batched ``[K, num_ops]`` device indices -> (step_time_s[K], oom[K]), like ``SimEnv.step_times``."""
        results = self.evaluate(list(np.asarray(idx)))
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
