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
"""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

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


def _run_then_exit_quickly(entrypoint: Callable[..., Any], *args: Any) -> Any:
    """``entrypoint(*args)`` in a job's process, which exits when it returns: its objects are frozen first, so the
    interpreter's last garbage collection does not walk torch's millions of them (1-4 s per process, measured on
    2 CPU cores, before the agent sees the job end)."""
    try:
        return entrypoint(*args)
    finally:
        gc.freeze()


def failure_line(rank: int, failure: Any) -> str:
    """One line for a failed process of the job (a ``ProcessFailure`` of torch's launcher)."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    if failure.exitcode is not None and failure.exitcode < 0:
        return f"rank {rank} died (signal {failure.signal_name()})"
    if not text or text.startswith("To enable traceback"):
        return f"rank {rank} died (exit code {failure.exitcode})"
    first = _PLACER_ERROR.sub("", text.splitlines()[0])
    return f"rank {rank} failed: {first[:400]}"


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
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc_per_node`` processes here, part of a job on ``nnodes`` nodes.

    Returns what each process of this node returned, by global rank. ``rdzv_endpoint``
    (``HOST:PORT``): where node 0 serves the rendezvous (needed with ``nnodes > 1``;
    default: a free port here). ``entrypoint`` must be a module-level function: the
    processes are spawned, not forked.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nnodes > 1 and not rdzv_endpoint:
        raise PlacerError(f"--nnodes {nnodes}: needs --rdzv-endpoint HOST:PORT (where node 0 serves the rendezvous)")
    if not 0 <= node_rank < nnodes:
        raise PlacerError(f"--node-rank {node_rank}: must be in [0, {nnodes})")
    host, port = parse_endpoint(rdzv_endpoint) if rdzv_endpoint else ("127.0.0.1", free_port())
    own_logs = log_dir is None
    logs = tempfile.mkdtemp(prefix="placer-ranks-") if own_logs else log_dir
    # torch >= 2.12 waits this long for workers to stop after a failure (its default is 30 s); 2.11 has no such field
    quick_stop = {"shutdown_timeout": 5} if "shutdown_timeout" in LaunchConfig.__dataclass_fields__ else {}
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        run_id=run_id or f"placer-{port}",  # the same on every node: the store's keys begin with it
        rdzv_backend="static",
        rdzv_endpoint=f"{host}:{port}",
        rdzv_configs={"rank": node_rank, "timeout": max(1, int(rdzv_timeout_s))},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=logs, redirects=Std.ALL, tee=Std.NONE),
        **quick_stop,
    )
    failed = True
    try:
        # the agent's native code (the store's connection retries) writes to fd 2: its outcome is an exception
        with _quiet_launcher(), native_stderr_silenced():
            out = elastic_launch(config, _run_then_exit_quickly)(entrypoint, *args)
        failed = False
        return out
    except ChildFailedError as e:
        rank, failure = min(e.failures.items())
        kept = f" (logs: {logs})" if own_logs else ""
        raise PlacerError(f"{failure_line(rank, failure)}{kept}") from None
    except SignalException as e:  # the agent turns Ctrl-C and kill into this
        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise PlacerError(f"the job was stopped by {signal.Signals(e.sigval).name}") from None
    except Exception as e:  # the rendezvous: nobody serves the endpoint, or it timed out
        name = type(e).__name__
        if name.startswith(("Rendezvous", "DistStore", "DistNetwork")) or isinstance(e, TimeoutError):
            raise PlacerError(
                f"--rdzv-endpoint {host}:{port}: no rendezvous within {rdzv_timeout_s:g}s ({name}); is node 0 "
                "running, and is the port open?"
            ) from None
        raise
    finally:
        if own_logs and not failed:
            shutil.rmtree(logs, ignore_errors=True)


__all__ = ["failure_line", "free_port", "launch", "parse_endpoint"]
