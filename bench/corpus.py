"""Deprecated alias of graphs.models.corpus (kept until the parallel branches merge).

The conformance corpus's builders live in the product, :mod:`graphs.models.corpus`, where
:mod:`placer.gym.datasets` serves them as placement problems (``corpus/<entry>``); the
conformance benchmark and its tests import them from here until the lead merges this move
with the renaming of ``bench/``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # importing this module kept the Hugging Face hub offline: it still does

from graphs.models.corpus import (  # noqa: E402
    BATCH,
    FAMILIES,
    NEEDS_TRANSFORMERS,
    SEQ,
    VOCAB,
    Built,
    LossOf,
    available,
    build,
    build_bart,
    build_bert,
    build_cnn_bn,
    build_distilbert,
    build_nn_decoder,
    build_nn_encoder,
    build_nn_transformer,
    build_recommender,
    build_rnn,
    build_roberta,
    build_t5,
    build_vit,
    load_transformers,
)

__all__ = [
    "BATCH",
    "FAMILIES",
    "NEEDS_TRANSFORMERS",
    "SEQ",
    "VOCAB",
    "Built",
    "LossOf",
    "available",
    "build",
    "build_bart",
    "build_bert",
    "build_cnn_bn",
    "build_distilbert",
    "build_nn_decoder",
    "build_nn_encoder",
    "build_nn_transformer",
    "build_recommender",
    "build_rnn",
    "build_roberta",
    "build_t5",
    "build_vit",
    "load_transformers",
]
