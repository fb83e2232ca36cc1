"""envs.real.distributed.launch: which failed process names a job's failure, and what a job's process starts with.

The processes are forked from a fork server (started once per calling process) unless
``start_method="spawn"``; either way each takes the caller's environment and CPU
affinity as they are at the launch, torch's per-rank entries on top.
"""

from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import pytest

from envs.real.allocator import thread_cache_off
from envs.real.distributed.launch import FORKSERVER_PRELOAD, failure_line, launch
from graphs import PlacerError


def dies_on_rank_1() -> None:
    """A job's process: rank 1 ends as a crash would, while rank 0 waits on a receive from it."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os._exit(7)
    dist.recv(torch.zeros(1), src=1)


@pytest.mark.slow
def test_the_job_s_failure_is_the_rank_that_went_first_not_the_one_it_left_behind():
    # rank 0 fails too (gloo: "Connection closed by peer"), but waits before it does: the launcher sees rank 1 first
    with pytest.raises(PlacerError, match=r"^rank 1 died \(exit code 7\)"):
        launch(dies_on_rank_1, nproc_per_node=2)


def report(tag: str) -> dict:
    """A job's process: what it started with."""
    return {
        "tag": tag,
        "rank": os.environ["RANK"],
        "mine": os.environ.get("PLACER_TEST_LAUNCH"),
        "gone": "PLACER_TEST_GONE" in os.environ,
        "cpus": sorted(os.sched_getaffinity(0)),
        "parent": os.getppid(),
        "thread_cache_off": thread_cache_off(),  # glibc's, as the process started (envs.real.allocator)
        "preloaded": [m for m in FORKSERVER_PRELOAD if m in sys.modules],  # imported before the entry point ran
    }


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_each_job_s_processes_start_with_the_caller_s_environment_and_cores_as_they_are_at_the_launch(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv("PLACER_TEST_LAUNCH", "first")
    monkeypatch.setenv("PLACER_TEST_GONE", "1")
    first = launch(report, ("a",), nproc_per_node=2)
    rows = [(r["rank"], r["mine"], r["gone"]) for _, r in sorted(first.items())]
    assert rows == [("0", "first", True), ("1", "first", True)]
    # forked from the fork server, not from this process: the second job's processes are forked from the same one
    assert first[0]["parent"] != os.getpid() and first[0]["parent"] == first[1]["parent"]
    # the fork server imported torch.export's tracer: a process that exports does not import it again (2 s)
    assert first[0]["preloaded"] == list(FORKSERVER_PRELOAD) == ["torch.export._trace", "torch.distributed.pipelining"]
    monkeypatch.setenv("PLACER_TEST_LAUNCH", "second")
    monkeypatch.delenv("PLACER_TEST_GONE")
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cores[:1])
        second = launch(report, ("b",), nproc_per_node=2)
    finally:
        os.sched_setaffinity(0, saved)
    assert [(r["mine"], r["gone"], r["cpus"]) for _, r in sorted(second.items())] == [("second", False, cores[:1])] * 2
    assert second[0]["parent"] == first[0]["parent"]
    # spawned: a fresh interpreter per process, started by this one's launcher
    spawned = launch(report, ("c",), nproc_per_node=2, start_method="spawn")
    rows = [(r["mine"], r["parent"], r["cpus"]) for _, r in sorted(spawned.items())]
    assert rows == [("second", os.getpid(), cores)] * 2
    # forked or spawned, every process runs with glibc's thread cache off; this one's is as it was
    assert all(r["thread_cache_off"] for job in (first, second, spawned) for r in job.values())
    cached = launch(report, ("d",), nproc_per_node=2, start_method="spawn", thread_cache_off=False)
    assert [r["thread_cache_off"] for r in cached.values()] == [False, False]  # as this environment says
    assert "GLIBC_TUNABLES" not in os.environ  # as it was


UNGUARDED = """
import os
import re
from envs.real.distributed.launch import launch
print(launch(os.getpid, nproc_per_node=1))
"""


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_that_starts_a_job_at_its_top_level_is_told_to_guard_it(tmp_path, guarded):
    # each process of the job imports the caller's script first, as multiprocessing's do: unguarded, the script
    # starts the job again there, and that process dies before any of placer's code runs, with nothing in its log
    import subprocess
    import sys
    from pathlib import Path

    body = UNGUARDED if not guarded else UNGUARDED.replace("print(", 'if __name__ == "__main__":\n    print(')
    script = tmp_path / "myjob.py"
    script.write_text(body)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    if guarded:
        assert done.returncode == 0, done.stderr[-2000:]
        assert "{0: " in done.stdout
        return
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"graphs\.errors\.PlacerError: rank 0 died \(exit code 1\) \(logs: \S+\); \S*myjob\.py starts the job at its "
        r'top level: each process of the job imports it first, so put what it runs under `if __name__ == "__main__":`',
        last,
    ), last


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_a_job_whose_rendezvous_port_was_taken_first_is_launched_again_on_a_fresh_one(monkeypatch):
    """Another process may take the port launch chose (bound to port 0 and released) before the rendezvous store
    listens on it: the job is launched again on a fresh port, and a port the caller named is an error saying so."""
    import socket

    import envs.real.distributed.launch as launcher

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fresh = launcher.free_port
        ports = iter([port])
        monkeypatch.setattr(launcher, "free_port", lambda host="127.0.0.1": next(ports, None) or fresh(host))
        out = launch(report, ("a",), nproc_per_node=1)
        assert out[0]["tag"] == "a"
        with pytest.raises(PlacerError, match=f"127.0.0.1:{port}: the port is in use"):
            launch(report, ("b",), nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout_s=5)


@pytest.mark.parametrize(
    "message, line",
    [
        ("PlacerError: plan for another graph\nmore", "rank 0 failed: plan for another graph"),
        # torch's pipeline stage: the type on a line of its own, what failed on the next
        (
            "RuntimeError: \n            [Stage 1] failed to run forward:\n  args: (...)",
            "rank 0 failed: RuntimeError: [Stage 1] failed to run forward:",
        ),
        ({"message": "\n\nValueError: bad\n"}, "rank 0 failed: ValueError: bad"),
        ("", "rank 0 died (exit code 1)"),
    ],
)
def test_a_failed_rank_s_line_is_the_first_line_that_says_something(message, line):
    assert failure_line(0, SimpleNamespace(message=message, exitcode=1)) == line
