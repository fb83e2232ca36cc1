"""The conformance check of one corpus model, shared by ``test_conformance.py`` and ``test_conformance_causal.py``.

The corpus is split over the two files so that the two xdist workers (``--dist loadfile``: a file runs on one
worker) share its minutes.
"""

from __future__ import annotations

import pytest

from bench import conformance
from graphs.models import corpus

#: The families that run in the fast tier; the rest are marked slow (CI runs both).
FAST = ("nn_encoder",)  # the others (15-30 s each) run in the slow tier: the fast tier is the inner loop
#: The decoder-only language models (``transformers``' causal LMs): test_conformance_causal.py checks them.
CAUSAL = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "gpt2", "gpt_neox", "opt", "mixtral", "qwen2_moe")


def entries(names) -> list:
    """``pytest.param`` of each family in ``names``, marked slow unless in :data:`FAST`."""
    return [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in names]


def check_every_plan(name: str) -> None:
    """Every plan of :data:`bench.conformance.PLANS` on corpus model ``name`` keeps float64's loss and gradients."""
    if name in corpus.NEEDS_TRANSFORMERS:
        pytest.importorskip("transformers")
    rows = conformance.check_model(name)
    assert [r.plan for r in rows] == list(conformance.PLANS)
    bad = [
        f"{r.plan}: {r.message or f'{r.worst} at {r.allowed_ratio:.1f}x the allowed error'}" for r in rows if not r.ok
    ]
    assert not bad, f"{name}: " + "; ".join(bad)
    for r in rows:
        assert r.loss_error < 1e-4 and r.grad_error < 1e-3
