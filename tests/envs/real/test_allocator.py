"""glibc's malloc kept steady while steps are timed (envs.real.allocator): a step takes no pages again, and every
measurement of placer's runs so."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from envs.real import allocator, timing


def fault_script(setup: str, body: str, warmup: int, steps: int) -> str:
    """A fresh interpreter's script: ``setup``, then ``step()`` (``body``) ``warmup`` times, then the median page
    faults of ``steps`` more and the heap's bytes at the end (``steady`` as its argument: after
    ``steady_malloc()``)."""
    return "\n".join(
        [
            "import resource, sys, torch",
            "from envs.real.allocator import heap_bytes, steady_malloc",
            "if sys.argv[1] == 'steady':",
            "    assert steady_malloc()",
            setup,
            "def step():",
            *(f"    {line}" for line in body.splitlines()),
            f"for _ in range({warmup}):",
            "    step()",
            "per_step = []",
            f"for _ in range({steps}):",
            "    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt",
            "    step()",
            "    per_step.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)",
            f"print(sorted(per_step)[{steps // 2}], heap_bytes())",
        ]
    )


#: A loop of 48 MB tensors (over glibc's own mmap threshold: mapped and unmapped each time by default): the median
#: page faults of 9 steps after four of warm-up (the heap may still grow once).
FAULTS = fault_script("a = torch.ones(12 << 20)", "b = a * 2\nc = b + 1\ndel b, c", warmup=4, steps=9)
#: One 1.25 GiB tensor made and freed each step (a large embedding's dense gradient on the host; over the bound
#: placer had set, blocks up to 1 GiB from the heap): the median page faults of 3 steps after 6 of warm-up (torch
#: asks for aligned blocks, and the heap grows two or three times before a freed block fits the next one).
LARGE = fault_script("", "b = torch.empty(5 << 28, dtype=torch.uint8).fill_(1)\ndel b", warmup=6, steps=3)


def faults_and_heap(setting: str, script: str = FAULTS, environ: dict[str, str] | None = None) -> tuple[float, int]:
    """A fresh process's median page faults per step and its heap's bytes at the end (``environ``: its
    environment, this one's by default)."""
    out = subprocess.run(
        [sys.executable, "-c", script, setting], capture_output=True, text=True, timeout=120, env=environ
    )
    assert out.returncode == 0, out.stderr[-2000:]
    faults, heap = out.stdout.split()
    return float(faults), int(heap)


def faults_per_step(setting: str, script: str = FAULTS) -> float:
    return faults_and_heap(setting, script)[0]


@pytest.mark.slow  # real steps of a model, timed (~6 s)
@pytest.mark.skipif(not allocator.trim_malloc(), reason="glibc only")
def test_a_step_takes_no_pages_again_once_malloc_is_steady():
    default, steady = faults_per_step("default"), faults_per_step("steady")
    assert default > 10_000  # two 48 MB tensors mapped anew each step: ~24,000 pages
    assert steady < 100, (default, steady)


@pytest.mark.slow
@pytest.mark.skipif(not allocator.trim_malloc(), reason="glibc only")
def test_a_tensor_over_a_gigabyte_is_not_mapped_anew_each_step_nor_the_heap_grown_by_it_again():
    """A process started as placer starts the processes it measures in (glibc's thread cache off): the heap holds
    the 1.25 GiB block at most twice (and its 64 MiB pad), and a step takes no pages. With the cache on, the heap
    grew by the block up to 8 times, and now and then was still growing at the 9th step, faulting all 327,680
    pages (envs.real.allocator's module doc). Under the old bounded settings every step faulted them all."""
    block, pages = 5 << 28, (5 << 28) // 4096
    environ = {**os.environ, "GLIBC_TUNABLES": allocator.STEADY_MALLOC_ENV["GLIBC_TUNABLES"]}
    faults, heap = faults_and_heap("steady", LARGE, environ)
    assert faults < pages // 100 and heap <= 2 * block + (256 << 20), (faults, heap >> 20)


@pytest.mark.slow  # two fresh interpreters (~1.5 s)
@pytest.mark.skipif(not allocator.trim_malloc(), reason="glibc only")
def test_what_a_process_starts_with_is_what_glibc_reads(monkeypatch):
    """A process started inside children_start_steady has glibc's thread cache off, as glibc itself shows it (a
    small block freed goes to a fast bin), and its other tunables kept; this process's environment is as it was."""
    probe = "import os; from envs.real import allocator as a; print(a.thread_cache_off(), os.environ['GLIBC_TUNABLES'])"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0")
    with allocator.children_start_steady():
        inside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    after = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.check=0"
    assert inside.stdout.split() == ["True", "glibc.malloc.check=0:" + allocator.NO_TCACHE]
    assert after.stdout.split() == ["False", "glibc.malloc.check=0"]
    assert allocator.steady_runtime_env()["env_vars"]["GLIBC_TUNABLES"] == "glibc.malloc.check=0:" + allocator.NO_TCACHE


@pytest.mark.slow  # four fresh interpreters (~2 s)
@pytest.mark.skipif(not allocator.trim_malloc(), reason="glibc only")
def test_a_process_starts_itself_again_with_the_thread_cache_off_once(monkeypatch):
    """start_again_with_thread_cache_off replaces a process whose cache is on by the same command with it off, its
    other tunables kept; and tries once: a process started with the setting that still shows the cache on (glibc
    did not take it; here the probe is made to say so) goes on."""
    script = (
        "import os, sys; from envs.real import allocator as a; {patch}"
        "print(a.thread_cache_off(), os.environ.get('GLIBC_TUNABLES'), flush=True); "
        "a.start_again_with_thread_cache_off([sys.executable, *sys.orig_argv[1:]]); print('went on')"
    )
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0")
    run = dict(capture_output=True, text=True, check=True, timeout=60)  # a loop of restarts: a timeout, not a hang
    plain = subprocess.run([sys.executable, "-c", script.format(patch="")], **run)
    tunables = "glibc.malloc.check=0:" + allocator.NO_TCACHE
    assert plain.stdout.split("\n") == ["False glibc.malloc.check=0", f"True {tunables}", "went on", ""]
    stuck = script.format(patch="a.thread_cache_off = lambda: False; ")
    once = subprocess.run([sys.executable, "-c", stuck], **run)
    assert once.stdout.split("\n") == ["False glibc.malloc.check=0", f"False {tunables}", "went on", ""]


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_every_measurement_runs_with_malloc_steady_unless_told_not_to(monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "steady_malloc", lambda: calls.append("steady") or True)
    monkeypatch.setattr(timing, "trim_malloc", lambda: calls.append("trim") or True)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args = (model, (torch.ones(2, 4),), opt, {"cpu:0": torch.device("cpu")})
    m = timing.measure_steps(*args, warmup_steps=0, timed_steps=1, protocol=timing.Protocol())
    assert calls == ["steady", "trim"] and m["protocol"]["steady_malloc"] is True
    calls.clear()
    timing.measure_steps(*args, warmup_steps=0, timed_steps=1, protocol=timing.Protocol(steady_malloc=False))
    assert calls == []


def test_the_environment_variables_say_what_the_call_sets():
    env, size = allocator.STEADY_MALLOC_ENV, allocator.as_size
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) == size(allocator.STEADY_MALLOC[allocator.M_MMAP_THRESHOLD]) == 2**64 - 1
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) == size(allocator.STEADY_MALLOC[allocator.M_TRIM_THRESHOLD]) == 2**64 - 1
    assert int(env["MALLOC_TOP_PAD_"]) == size(allocator.STEADY_MALLOC[allocator.M_TOP_PAD]) == 64 << 20


def test_the_readme_starts_a_users_job_with_the_same_settings():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    line = " ".join(f"{k}={v}" for k, v in allocator.STEADY_MALLOC_ENV.items()) + " torchrun"
    assert line in readme
