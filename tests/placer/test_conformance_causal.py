"""The conformance corpus's causal language models on the CPU: every kind of plan, float64's loss and gradients.

The same check as ``test_conformance.py`` (see its docstring), on the decoder-only families; a file of its own so
that the two xdist workers share the corpus.
"""

from __future__ import annotations

import pytest

from graphs.models import corpus
from tests.placer.conformance_case import CAUSAL, check_every_plan, entries


def test_every_causal_family_is_in_the_corpus():
    assert set(CAUSAL) <= set(corpus.FAMILIES)


@pytest.mark.parametrize("name", entries(CAUSAL))
def test_every_plan_keeps_the_float64_loss_and_gradients(name):
    check_every_plan(name)
