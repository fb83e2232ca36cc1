"""A model whose forward iterates a set of names exports one graph in every placer process (graphs.hash_seed)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import graphs
from graphs import PlacerError
from graphs.hash_seed import hash_seed_env, hash_seed_fixed, hash_seed_hint
from graphs.plan import Placement

#: ModernBERT's pattern (``for layer_type in set(config.layer_types)``), with eight names so that two hash seeds all
#: but surely order them differently.
SET_MODULE = """
import torch
from torch import nn

NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


class SetOrder(nn.Module):
    def __init__(self):
        super().__init__()
        for name in NAMES:
            self.register_parameter(name, nn.Parameter(torch.randn(4)))

    def forward(self, x):
        out = x.sum() * 0
        for name in set(NAMES):
            out = out + (x * getattr(self, name)).sin().sum()
        return out


def build():
    torch.manual_seed(0)
    return SetOrder(), (torch.randn(3, 4),)
"""


def _without_seed() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}


def test_a_process_that_drew_its_seed_starts_itself_again_with_seed_0_once_and_a_seed_set_is_kept():
    script = (
        "import os, sys; from placer import console as h; print('started', flush=True); "
        "h.start_again_with_fixed_hash_seed([sys.executable, *sys.orig_argv[1:]]); "
        "print(os.environ.get('PYTHONHASHSEED'), hash('placer'))"
    )
    run = dict(capture_output=True, text=True, check=True, timeout=60)  # a loop of restarts: a timeout, not a hang

    def hashed(seed: str) -> str:
        code = "print(hash('placer'))"
        return subprocess.run(
            [sys.executable, "-c", code], env={**_without_seed(), "PYTHONHASHSEED": seed}, **run
        ).stdout

    drawn = subprocess.run([sys.executable, "-c", script], env=_without_seed(), **run)
    assert drawn.stdout.split("\n") == ["started", "started", f"0 {hashed('0').strip()}", ""]  # one exec, then on
    kept = subprocess.run([sys.executable, "-c", script], env={**_without_seed(), "PYTHONHASHSEED": "5"}, **run)
    assert kept.stdout.split("\n") == ["started", f"5 {hashed('5').strip()}", ""]  # replaced nothing


@pytest.mark.slow  # three fresh interpreters that import torch (~8 s)
def test_the_placer_command_exports_a_set_iterating_model_as_it_does_with_seed_0(tmp_path):
    (tmp_path / "setorder.py").write_text(SET_MODULE)
    run = dict(cwd=tmp_path, capture_output=True, text=True, timeout=300)

    def export(out: str, seed: str | None) -> str:
        env = _without_seed() if seed is None else {**_without_seed(), "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-m", "placer", "export", "setorder:build", "-o", out], env=env, **run)
        assert proc.returncode == 0, proc.stderr
        return graphs.load(tmp_path / out).content_hash

    zero, other = export("zero.json", "0"), export("other.json", "1")
    assert zero != other  # the model's graph does depend on the seed
    assert export("drawn.json", None) == zero  # the command fixed it (199 of 200 seeds order the names apart)


def test_a_plan_refused_for_another_graph_says_what_to_do_where_the_seed_was_drawn(monkeypatch):
    graph = graphs.OpGraph.from_edges(["a", "b"], [("a", "b", 4)])
    plan = Placement.from_indices(graph, ["cpu:0", "gpu:0"], np.array([0, 1]))
    other = graphs.OpGraph.from_edges(["a", "b"], [("a", "b", 8)])
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(PlacerError, match=r"made for graph .*start this process with PYTHONHASHSEED=0"):
        plan.indices(other)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with pytest.raises(PlacerError, match=r"made for graph [0-9a-f]+, not for this graph \(graph [0-9a-f]+\)$"):
        plan.indices(other)


def test_a_process_placer_starts_elsewhere_gets_this_one_s_seed_or_placer_s(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert not hash_seed_fixed() and hash_seed_env() == {"PYTHONHASHSEED": "0"} and hash_seed_hint()
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert hash_seed_fixed() and hash_seed_env() == {"PYTHONHASHSEED": "7"} and hash_seed_hint() == ""
    monkeypatch.setenv("PYTHONHASHSEED", "random")  # Python's word for a drawn seed
    assert not hash_seed_fixed() and hash_seed_env() == {"PYTHONHASHSEED": "0"}


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s): imports Ray
def test_measuring_actors_start_with_the_driver_s_seed_or_placer_s(monkeypatch):
    from envs.real.measured import actor_runtime_env

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    env = actor_runtime_env()["env_vars"]
    assert env["PYTHONHASHSEED"] == "0" and "GLIBC_TUNABLES" in env  # the thread cache's setting kept beside it
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert actor_runtime_env()["env_vars"]["PYTHONHASHSEED"] == "7" and hash_seed_hint() == ""
    monkeypatch.setenv("PYTHONHASHSEED", "random")  # Python's word for a drawn seed
    assert actor_runtime_env()["env_vars"]["PYTHONHASHSEED"] == "0"


def test_python_m_bench_starts_itself_again_with_seed_0_and_importing_bench_does_not():
    """``python -m bench.<module>`` restarts once where no seed is set (its first process got as far as importing
    placer.console, once more after the exec: -X importtime lists it twice), not where one is; a program that
    imports bench is never restarted."""
    run = dict(capture_output=True, text=True, check=True, timeout=60)

    def imports_of_console(env: dict[str, str], *command: str) -> int:
        proc = subprocess.run([sys.executable, "-X", "importtime", *command], env=env, **run)
        return sum(line.split("|")[-1].strip() == "placer.console" for line in proc.stderr.splitlines())

    assert imports_of_console(_without_seed(), "-m", "bench.common") == 2
    assert imports_of_console({**_without_seed(), "PYTHONHASHSEED": "0"}, "-m", "bench.common") == 1
    assert imports_of_console(_without_seed(), "-c", "import bench") == 1
