"""Deprecated alias of placer.learn.pretrain_corpus (kept until the parallel branches merge).

The pretraining corpus lives in :mod:`placer.learn.pretrain_corpus` (its old name
clashed with ``bench/corpus.py``, the benchmark's models).
"""

from placer.learn.pretrain_corpus import (
    FAMILY_TAGS,
    LIBRARY,
    SOURCES,
    ZOO_TAGS,
    CorpusItem,
    build_corpus,
    library_graph,
)

__all__ = ["FAMILY_TAGS", "LIBRARY", "SOURCES", "ZOO_TAGS", "CorpusItem", "build_corpus", "library_graph"]
