"""Start a job's processes with torch's own launcher, and turn what goes wrong into one line.

:func:`launch` is ``torchrun`` as a function: ``torch.distributed.launcher``'s
elastic agent starts ``nproc_per_node`` processes on this machine, each running
``entrypoint(*args)`` with torch's environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Several machines (or several
launchers on one) meet at a rendezvous: node 0 serves it at ``rdzv_endpoint`` and
the others join it there (torch's static rendezvous, what ``torchrun --node-rank
--master-addr --master-port`` uses). No process restarts: a job either runs as planned
or fails.

Every wait is bounded: joining the rendezvous by ``rdzv_timeout_s``; inside the job,
each collective and send by the process group's timeout (the entry point's). When a
process fails or dies, the agent stops the others and :func:`launch` raises a
:class:`PlacerError` naming the rank and the cause (the exception's first line, or
the exit code or signal); a rendezvous nobody serves is one line too. The processes'
own output goes to log files (``log_dir``, a temporary directory by default, kept when
the job fails), so the launcher's caller keeps its stdout; the agent's log lines, and
what its native code prints (the store's connection retries), are silenced.

The processes are forked from a *fork server* (``multiprocessing``'s ``forkserver``)
that imported the entry point's module once, and torch's export tracer and pipeline
stages (:data:`FORKSERVER_PRELOAD`): a job's process then starts in about 0.1 s instead
of importing torch and placer anew (2-3 s on a CPU core), and exports its model without
importing the tracer (2 s more), which the measured loop would pay on every placement
it measures. Each process still starts clean:
the fork server has run nothing, and the process takes the caller's environment, CPU
affinity, working directory and ``sys.path`` as they are at the launch, as a spawned
one does. ``start_method="spawn"`` starts a fresh interpreter per process instead
(what needs ``exec``: glibc reads ``GLIBC_TUNABLES`` only there). Either way a job's
processes run with glibc's thread cache off (:func:`envs.real.allocator.children_start_steady`),
which a fork server started by an earlier launch has as well.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from envs.real.allocator import children_start_steady
from envs.real.ray_access import native_stderr_silenced
from graphs import PlacerError

_PLACER_ERROR = re.compile(r"^(graphs\.errors\.)?PlacerError: ")
#: torch's launcher logs here (rendezvous, worker states) at INFO and WARNING.
_TORCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (bound to port 0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def parse_endpoint(text: str, option: str = "--rdzv-endpoint") -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``.

    >>> parse_endpoint("node0.cluster:29500")
    ('node0.cluster', 29500)
    """
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PlacerError(f"{option} {text!r}: expected HOST:PORT (e.g. localhost:29500)")
    return host, int(port)


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (once per process) with its warnings off.

    When the agent stops the job's processes after one failed, the tracker finds the
    semaphores they held and warns about "leaked semaphore objects" as this process
    exits: lines about the launcher's housekeeping, after the one line that says what
    failed. The tracker takes its warning filters from this process's ``-W`` options.
    """
    from multiprocessing import resource_tracker

    saved = list(sys.warnoptions)
    sys.warnoptions.append("ignore::UserWarning")
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions[:] = saved


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    _quiet_resource_tracker()
    levels = {name: logging.getLogger(name).level for name in _TORCH_LOGGERS}
    for name in _TORCH_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


#: What torch's launcher sets in each process's environment (``LocalElasticAgent``): kept over the caller's.
_RANK_ENVIRON = frozenset(
    "RANK LOCAL_RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE ROLE_WORLD_SIZE "
    "MASTER_ADDR MASTER_PORT TORCH_NCCL_ASYNC_ERROR_HANDLING".split()
)


def _is_rank_environ(key: str) -> bool:
    return key in _RANK_ENVIRON or key.startswith("TORCHELASTIC_")


def _callers_environment(environ: dict[str, str], cpus: list[int] | None) -> None:
    """This process's environment made the caller's at the launch (``environ``), torch's per-rank entries kept; its
    CPU affinity the caller's (``cpus``). A forked process has the fork server's, from whenever that started."""
    for key in [k for k in os.environ if k not in environ and not _is_rank_environ(k)]:
        del os.environ[key]
    os.environ.update({k: v for k, v in environ.items() if not _is_rank_environ(k)})
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


#: What a process raises when another process of the job went away first: the job's failure is that other one's.
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|remote worker crash|Broken pipe", re.I)
#: How long a process whose peer went away waits before it fails in turn: the launcher polls every 0.1 s, and stops
#: the job at the first failure it sees, which is then the peer's (its cause), not this one's (its consequence).
PEER_GONE_GRACE_S = 2.0


def _run_then_exit_quickly(
    environ: dict[str, str], cpus: list[int] | None, entrypoint: Callable[..., Any], *args: Any
) -> Any:
    """``entrypoint(*args)`` in a job's process (in the caller's environment and affinity), which exits when it
    returns. A failure because a peer went away waits :data:`PEER_GONE_GRACE_S` first. The process's objects are
    frozen at the end, so the interpreter's last garbage collection does not walk torch's millions of them (1-4 s per
    process, measured on 2 CPU cores, before the agent sees the job end)."""
    _callers_environment(environ, cpus)
    try:
        return entrypoint(*args)
    except Exception as e:
        if _PEER_GONE.search(str(e)):  # another process went first: let the launcher see that one
            time.sleep(PEER_GONE_GRACE_S)
        raise
    finally:
        gc.freeze()


#: What the fork server imports besides the entry point's module: what a job's process imports on its first
#: ``torch.export`` (the tracer, and with it dynamo: 0.9-2.1 s of a CPU core here, in every process, where placer's
#: rank processes all export their model) and to run its stages (torch's pipelining). A module this torch lacks is
#: passed over (the fork server skips what it cannot import).
FORKSERVER_PRELOAD = ("torch.export._trace", "torch.distributed.pipelining")


def _start_method(requested: str | None, entrypoint: Callable[..., Any]) -> str:
    """``requested``, or ``forkserver`` where this platform has it (``spawn`` elsewhere); the fork server, when it
    starts, imports ``entrypoint``'s module (and with it torch) and :data:`FORKSERVER_PRELOAD` once for every process
    forked from it."""
    method = requested or ("forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
    if method == "forkserver" and entrypoint.__module__ != "__main__":
        # read when the server (re)starts
        multiprocessing.set_forkserver_preload([entrypoint.__module__, *FORKSERVER_PRELOAD])
    return method


def _said(failure: Any) -> str:
    """What a failed process of the job said of its failure (its exception's text), or "" where it said nothing."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    return "" if text.startswith("To enable traceback") else text


def failure_line(rank: int, failure: Any) -> str:
    """One line for a failed process of the job (a ``ProcessFailure`` of torch's launcher)."""
    text = _said(failure)
    if failure.exitcode is not None and failure.exitcode < 0:
        return f"rank {rank} died (signal {failure.signal_name()})"
    if not text:
        return f"rank {rank} died (exit code {failure.exitcode})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = _PLACER_ERROR.sub("", lines[0])
    if first.endswith(":") and len(lines) > 1:  # "RuntimeError:", and what it says on the lines after
        first = f"{first} {lines[1]}"
    return f"rank {rank} failed: {first[:400]}"


_MAIN_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")


def unguarded_script() -> str | None:
    """The caller's script, where it is one and nothing in it reads ``if __name__ == "__main__":``; else None.

    Each process of a job imports the caller's ``__main__`` script before it runs anything (multiprocessing's
    fork server and spawn both do, so that what the script defines can be sent to it). A script that starts the
    job at its top level starts it again in every process, which dies there before any of placer's code runs,
    with nothing in its log: the job's error says so."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not str(path).endswith(".py"):
        return None
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    return None if _MAIN_GUARD.search(text) else str(path)


def failure_hint(failure: Any) -> str:
    """What to add to :func:`failure_line` where a process ended before it said anything: the likely cause."""
    script = unguarded_script() if not _said(failure) and failure.exitcode == 1 else None
    if script is None:
        return ""
    return (
        f"; {script} starts the job at its top level: each process of the job imports it first, so put what it "
        'runs under `if __name__ == "__main__":`'
    )


def launch(
    entrypoint: Callable[..., Any],
    args: tuple = (),
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_timeout_s: float = 300.0,
    log_dir: str | None = None,
    run_id: str | None = None,
    start_method: str | None = None,
    thread_cache_off: bool = True,
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc_per_node`` processes here, part of a job on ``nnodes`` nodes.

    Returns what each process of this node returned, by global rank. ``rdzv_endpoint``
    (``HOST:PORT``): where node 0 serves the rendezvous (needed with ``nnodes > 1``;
    default: a free port here). ``entrypoint`` must be a module-level function: the
    processes are forked from a fork server or spawned (``start_method``: the module's
    doc), never forked from the caller. ``thread_cache_off``: the processes start with glibc's thread cache off
    (:func:`envs.real.allocator.children_start_steady`; ``False``: as the caller's environment says, for a
    comparison of the two, which needs ``start_method="spawn"``, or a fork server started so).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    if nnodes > 1 and not rdzv_endpoint:
        raise PlacerError(f"--nnodes {nnodes}: needs --rdzv-endpoint HOST:PORT (where node 0 serves the rendezvous)")
    if not 0 <= node_rank < nnodes:
        raise PlacerError(f"--node-rank {node_rank}: must be in [0, {nnodes})")
    host, port = parse_endpoint(rdzv_endpoint) if rdzv_endpoint else ("127.0.0.1", free_port())
    own_logs = log_dir is None
    logs = tempfile.mkdtemp(prefix="placer-ranks-") if own_logs else log_dir
    # torch >= 2.12 waits this long for workers to stop after a failure (its default is 30 s); 2.11 has no such field
    quick_stop = {"shutdown_timeout": 5} if "shutdown_timeout" in LaunchConfig.__dataclass_fields__ else {}
    attempt = 0
    while True:
        try:
            return _launch(
                LaunchConfig(
                    min_nodes=nnodes,
                    max_nodes=nnodes,
                    nproc_per_node=nproc_per_node,
                    run_id=run_id or f"placer-{port}",  # the same on every node: the store's keys begin with it
                    rdzv_backend="static",
                    rdzv_endpoint=f"{host}:{port}",
                    rdzv_configs={"rank": node_rank, "timeout": max(1, int(rdzv_timeout_s))},
                    max_restarts=0,
                    monitor_interval=0.1,
                    start_method=_start_method(start_method, entrypoint),
                    logs_specs=DefaultLogsSpecs(log_dir=logs, redirects=Std.ALL, tee=Std.NONE),
                    **quick_stop,
                ),
                entrypoint,
                args,
                logs,
                own_logs,
                thread_cache_off,
                rdzv_timeout_s,
            )
        except _PortTaken:  # another process took the port we chose before the store listened on it: a fresh one
            if rdzv_endpoint or attempt == PORT_RETRIES:
                raise PlacerError(f"--rdzv-endpoint {host}:{port}: the port is in use (EADDRINUSE)") from None
            attempt += 1
            port = free_port()


#: Times a job launched here on a port it chose is launched again on a fresh one when another process took it first.
PORT_RETRIES = 3


class _PortTaken(Exception):
    """The rendezvous store could not listen on its port: another process has it (``EADDRINUSE``)."""


def port_in_use(message: str) -> bool:
    """Whether an error ``message`` says a port could not be listened on because another process has it.

    >>> port_in_use("DistNetworkError: ... code: -98, name: EADDRINUSE, message: address already in use")
    True
    >>> port_in_use("RuntimeError: shapes differ")
    False
    """
    text = message.lower()
    return "eaddrinuse" in text or "address already in use" in text


def _launch(
    config: Any,
    entrypoint: Any,
    args: tuple,
    logs: str,
    own_logs: bool,
    thread_cache_off: bool,
    rdzv_timeout_s: float,
) -> dict[int, Any]:
    """One launch of :func:`launch` under ``config`` (``logs``: the processes' log folder, removed after a success
    where ``own_logs``). Raises :class:`_PortTaken` where the rendezvous store found its port taken."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    host, port = parse_endpoint(config.rdzv_endpoint)
    failed = True
    try:
        # the agent's native code (the store's connection retries) writes to fd 2: its outcome is an exception
        # glibc's thread cache off in every process of the job (envs.real.allocator: a fork server started now
        # has it, and what it forks keeps it)
        steady_start = children_start_steady() if thread_cache_off else contextlib.nullcontext()
        with _quiet_launcher(), native_stderr_silenced(), steady_start:
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            out = elastic_launch(config, _run_then_exit_quickly)(dict(os.environ), cpus, entrypoint, *args)
        failed = False
        return out
    except ChildFailedError as e:
        rank, failure = min(e.failures.items())
        kept = f" (logs: {logs})" if own_logs else ""
        raise PlacerError(f"{failure_line(rank, failure)}{kept}{failure_hint(failure)}") from None
    except SignalException as e:  # the agent turns Ctrl-C and kill into this
        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise PlacerError(f"the job was stopped by {signal.Signals(e.sigval).name}") from None
    except Exception as e:  # the rendezvous: nobody serves the endpoint, or it timed out, or its port is taken
        name = type(e).__name__
        if port_in_use(str(e)):
            raise _PortTaken(str(e)) from None
        if name.startswith(("Rendezvous", "DistStore", "DistNetwork")) or isinstance(e, TimeoutError):
            raise PlacerError(
                f"--rdzv-endpoint {host}:{port}: no rendezvous within {rdzv_timeout_s:g}s ({name}); is node 0 "
                "running, and is the port open?"
            ) from None
        raise
    finally:
        if own_logs and not failed:
            shutil.rmtree(logs, ignore_errors=True)


__all__ = [
    "PEER_GONE_GRACE_S",
    "failure_hint",
    "failure_line",
    "free_port",
    "launch",
    "parse_endpoint",
    "port_in_use",
    "unguarded_script",
]
