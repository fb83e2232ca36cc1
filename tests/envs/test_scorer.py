"""One scorer protocol (envs.scorer): every ``step_times``, ``overflow`` and ``measure_again`` in the tree has
its one signature, and the scorers are scorers."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import envs
from envs.scorer import Scorer, can_measure_again, can_overflow
from graphs.synthetic import random_dag

ROOT = Path(__file__).resolve().parents[2]
#: method name -> its parameters, in order (defaults: ``order`` is None)
SIGNATURES = {
    "step_times": ["self", "op_devices", "order"],
    "overflow": ["self", "op_devices", "order"],
    "measure_again": ["self", "op_devices"],
}


def signature_violations(sources: dict[str, str]) -> list[str]:
    """``path:line name(params)`` of each method named in SIGNATURES whose parameters are not its protocol's."""
    bad = []
    for path, source in sources.items():
        for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef) or fn.name not in SIGNATURES:
                    continue
                a = fn.args
                names = [p.arg for p in a.posonlyargs + a.args]
                defaults_ok = all(isinstance(d, ast.Constant) and d.value is None for d in a.defaults)
                if names != SIGNATURES[fn.name] or a.vararg or a.kwarg or a.kwonlyargs or not defaults_ok:
                    bad.append(f"{path}:{fn.lineno} {cls.name}.{fn.name}({', '.join(names)})")
    return bad


def tree_sources() -> dict[str, str]:
    folders = ("graphs", "envs", "policies", "placer", "bench", "scripts", "tests")
    return {str(p.relative_to(ROOT)): p.read_text() for f in folders for p in sorted((ROOT / f).rglob("*.py"))}


@pytest.mark.slow  # over 1 s (the fast tier is kept under 90 s)
def test_every_scorer_method_in_the_tree_has_the_protocol_s_signature():
    assert signature_violations(tree_sources()) == []


@pytest.mark.parametrize(
    "planted",
    [
        "class A:\n    def step_times(self, rows, overflow=False): ...\n",
        "class A:\n    def step_times(self, op_devices, order=None, **kw): ...\n",
        "class A:\n    def measure_again(self, op_devices, *, again=True): ...\n",
    ],
)
def test_a_scorer_method_with_another_signature_is_found(planted):
    assert signature_violations({"planted.py": planted})


def test_the_simulator_and_its_order_view_are_scorers_that_say_how_far_over_capacity():
    g = random_dag(12, seed=0)
    sim = envs.SimEnv(g, envs.resolve_cluster("k80x2"))
    for scorer in (sim, sim.in_order("planned")):
        assert isinstance(scorer, Scorer) and can_overflow(scorer) and not can_measure_again(scorer)
        rows = np.zeros((2, g.num_ops), dtype=np.int32)
        rows[1] = 1
        t, failed = scorer.step_times(rows)
        t2, failed2, over = scorer.overflow(rows)
        assert np.array_equal(t, t2) and np.array_equal(failed, failed2) and over.shape == (2,)
