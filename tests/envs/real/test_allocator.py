"""glibc's malloc kept steady while steps are timed (envs.real.allocator): a step takes no pages again, and every
measurement of placer's runs so."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from envs.real import allocator, timing

#: A loop of 48 MB tensors (over glibc's own mmap threshold: mapped and unmapped each time by default): the median
#: page faults of 9 steps after four of warm-up (the heap may still grow once), in a fresh interpreter (``steady``:
#: after ``steady_malloc()``).
FAULTS = textwrap.dedent(
    """
    import resource, sys, torch
    from envs.real.allocator import steady_malloc
    if sys.argv[1] == "steady":
        assert steady_malloc()
    a = torch.ones(12 << 20)
    def step():
        b = a * 2
        c = b + 1
        del b, c
    for _ in range(4):
        step()
    per_step = []
    for _ in range(9):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        per_step.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(sorted(per_step)[4])
    """
)


def faults_per_step(setting: str) -> float:
    out = subprocess.run([sys.executable, "-c", FAULTS, setting], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip())


@pytest.mark.skipif(not allocator.trim_malloc(), reason="glibc only")
def test_a_step_takes_no_pages_again_once_malloc_is_steady():
    default, steady = faults_per_step("default"), faults_per_step("steady")
    assert default > 10_000  # two 48 MB tensors mapped anew each step: ~24,000 pages
    assert steady < 100, (default, steady)


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
    env = allocator.STEADY_MALLOC_ENV
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) == allocator.STEADY_MALLOC[allocator.M_MMAP_THRESHOLD] == 1 << 30
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) == allocator.STEADY_MALLOC[allocator.M_TRIM_THRESHOLD]
    assert int(env["MALLOC_TOP_PAD_"]) == allocator.STEADY_MALLOC[allocator.M_TOP_PAD]


def test_the_readme_starts_a_users_job_with_the_same_settings():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    line = " ".join(f"{k}={v}" for k, v in allocator.STEADY_MALLOC_ENV.items()) + " torchrun"
    assert line in readme
