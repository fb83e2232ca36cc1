"""Deprecated alias of bench.conformance_corpus (kept until the parallel branches merge).

``placer.learn.corpus`` is the pretraining corpus of graphs; this one is the conformance corpus of architectures.
"""

from bench.conformance_corpus import (
    FAMILIES,
    NEEDS_TRANSFORMERS,
    Built,
    LossOf,
    available,
    build,
    load_transformers,
)

__all__ = ["FAMILIES", "NEEDS_TRANSFORMERS", "Built", "LossOf", "available", "build", "load_transformers"]
