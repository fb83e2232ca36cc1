"""Placement problems by name: the zoo, the conformance corpus, the synthetic families; the train/held-out split.

An item is named ``<dataset>/<item>``:

* ``zoo/<model>``: a zoo model's captured graph (:mod:`graphs.zoo`), e.g. ``zoo/nmt-2``;
* ``corpus/<entry>``: an architecture of the conformance corpus (:mod:`graphs.models.corpus`), built
  from its config and captured (the Hugging Face entries need ``transformers``), e.g. ``corpus/llama``;
* ``synthetic/<family>-<ops>-s<seed>``: a graph of a synthetic family (:data:`graphs.synthetic.FAMILIES`)
  with about ``ops`` ops, e.g. ``synthetic/moe-300-s0`` (any size and seed; :func:`items` lists 300 and
  1,500 ops, seeds 0-2).

:func:`graph` also takes any SOURCE placer takes (a zoo name, a graph file, a ``module:callable``).

The split is by family (:data:`HELD_OUT_FAMILIES`): the held-out families were used to tune nothing. The
simulator was tuned on rnnlm, nmt-2 and resnet50 (``bench/fidelity/models.py``), the learner's defaults on
nmt-2, nmt-4 and inception-v3, the move search on moe-400, unet-400 and gpt2, and the ``recurrent`` family's
widths after looking at its results (BENCHMARKS.md), so all of the zoo, ``moe``, ``unet`` and
``recurrent`` are train items. Held out: the synthetic ``attention`` and ``branches`` families and the
corpus's ``llama`` and ``bert``, the Hugging Face models the simulator's fidelity is already quoted on as
held out. (The shipped pretrained policy saw ``attention`` and ``branches`` graphs in its training, not in
any tuning.) :data:`TRAIN` and :data:`HELD_OUT` list the items.

>>> split_of("synthetic/attention-300-s1"), split_of("zoo/nmt-2"), split_of("mymodels:build")
('held_out', 'train', None)
>>> graph("synthetic/chain-40-s0").num_ops
40
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from graphs import OpGraph, PlacerError, sources, zoo
from graphs.synthetic import FAMILIES as SYNTHETIC_FAMILIES

#: The families of each dataset that no tuning saw (see the module doc).
HELD_OUT_FAMILIES: dict[str, tuple[str, ...]] = {
    "zoo": (),
    "corpus": ("llama", "bert"),
    "synthetic": ("attention", "branches"),
}
#: The sizes and seeds :func:`items` lists for the synthetic families.
SYNTHETIC_SIZES, SYNTHETIC_SEEDS = (300, 1500), (0, 1, 2)
_SYNTHETIC_ITEM = re.compile(r"^(?P<family>[a-z_]+)-(?P<ops>\d+)-s(?P<seed>\d+)$")


@dataclass(frozen=True)
class Dataset:
    """A named set of placement problems: its item names (without the ``<dataset>/`` prefix) and how to load one."""

    name: str
    description: str
    names: Callable[[], list[str]]
    family: Callable[[str], str]
    load: Callable[[str], OpGraph]


def _zoo_family(item: str) -> str:
    if item not in zoo.names():
        raise PlacerError(f"zoo/{item}: not a zoo model (choose from {', '.join(zoo.names())})")
    return item


def _corpus_names() -> list[str]:
    from graphs.models import corpus  # torch: only to build the corpus's models

    return list(corpus.FAMILIES)


def _corpus_family(item: str) -> str:
    if item not in _corpus_names():
        raise PlacerError(f"corpus/{item}: not a corpus entry (choose from {', '.join(_corpus_names())})")
    return item


@lru_cache(maxsize=None)
def _corpus_graph(item: str) -> OpGraph:
    """The captured graph of corpus entry ``item`` (captured once per process: a few seconds each)."""
    from graphs.models import corpus  # torch (and transformers for its Hugging Face entries)
    from graphs.torch_capture import capture

    _corpus_family(item)
    try:
        model, inputs = corpus.build(item)
    except ImportError as e:
        raise PlacerError(f"corpus/{item}: needs transformers (pip install transformers): {e}") from None
    return capture(model, inputs, name=f"corpus/{item}")


def _synthetic_parts(item: str) -> tuple[str, int, int]:
    m = _SYNTHETIC_ITEM.match(item)
    if not m or m["family"] not in SYNTHETIC_FAMILIES:
        raise PlacerError(
            f"synthetic/{item}: not a synthetic item (<family>-<ops>-s<seed>, family one of "
            f"{', '.join(SYNTHETIC_FAMILIES)}; e.g. synthetic/moe-300-s0)"
        )
    if int(m["ops"]) < 2:
        raise PlacerError(f"synthetic/{item}: needs at least 2 ops")
    return m["family"], int(m["ops"]), int(m["seed"])


def _synthetic_graph(item: str) -> OpGraph:
    family, ops, seed = _synthetic_parts(item)
    return SYNTHETIC_FAMILIES[family](ops, seed=seed)


DATASETS: dict[str, Dataset] = {
    "zoo": Dataset(
        "zoo", "the model zoo (graphs.zoo): the paper's models and today's", zoo.names, _zoo_family, zoo.graph
    ),
    "corpus": Dataset(
        "corpus",
        "the conformance corpus (graphs.models.corpus): architectures people train today, tiny, built from configs",
        _corpus_names,
        _corpus_family,
        _corpus_graph,
    ),
    "synthetic": Dataset(
        "synthetic",
        "structured synthetic families (graphs.synthetic): chains, branches, U-nets, MoE, attention, recurrent",
        lambda: [
            f"{family}-{ops}-s{seed}"
            for family in SYNTHETIC_FAMILIES
            for ops in SYNTHETIC_SIZES
            for seed in SYNTHETIC_SEEDS
        ],
        lambda item: _synthetic_parts(item)[0],
        _synthetic_graph,
    ),
}


def _split_name(name: str) -> tuple[Dataset, str] | None:
    """``(dataset, item)`` of a dataset item's name, None for anything else (a SOURCE); an unknown dataset raises."""
    if os.path.exists(name) or sources.looks_like_callable(name) or "/" not in name:
        return None
    prefix, _, item = name.partition("/")
    if prefix not in DATASETS:
        if name.endswith((".json", ".gz", ".pt2")):
            return None  # a graph file that is not there: graph() says so
        raise PlacerError(f"{name}: unknown dataset {prefix!r} (known: {', '.join(DATASETS)})")
    return DATASETS[prefix], item


def items(dataset: str, split: str = "all") -> list[str]:
    """The item names of ``dataset`` (``zoo``, ``corpus``, ``synthetic``) in ``split`` (``all``, ``train``,
    ``held_out``).

    >>> items("zoo", "held_out"), items("corpus", "held_out")
    ([], ['corpus/llama', 'corpus/bert'])
    """
    if dataset not in DATASETS:
        raise PlacerError(f"dataset {dataset!r}: unknown (known: {', '.join(DATASETS)})")
    if split not in ("all", "train", "held_out"):
        raise PlacerError(f"split {split!r}: unknown (known: all, train, held_out)")
    d = DATASETS[dataset]
    names = [f"{dataset}/{item}" for item in d.names()]
    return names if split == "all" else [n for n in names if split_of(n) == split]


def split_of(name: str) -> str | None:
    """``"held_out"`` or ``"train"`` for a dataset item (by its family), None for any other SOURCE."""
    parts = _split_name(name)
    if parts is None:
        return None
    dataset, item = parts
    return "held_out" if dataset.family(item) in HELD_OUT_FAMILIES[dataset.name] else "train"


def graph(name: str) -> OpGraph:
    """The graph of a dataset item (``zoo/nmt-2``, ``corpus/llama``, ``synthetic/moe-300-s0``) or of any SOURCE
    (a zoo name, a graph file, a ``module:callable``); an unknown name is a one-line :class:`PlacerError`."""
    parts = _split_name(name)
    if parts is None:
        return sources.resolve_graph(name)
    dataset, item = parts
    dataset.family(item)  # an unknown item is named before anything is built
    return dataset.load(item)


def _all_items() -> list[str]:
    return [name for dataset in DATASETS for name in items(dataset)]


#: Every listed item the held-out families do not own (importable: ``from placer.gym.datasets import TRAIN``).
TRAIN: tuple[str, ...] = tuple(n for n in _all_items() if split_of(n) == "train")
#: Every listed item of the held-out families.
HELD_OUT: tuple[str, ...] = tuple(n for n in _all_items() if split_of(n) == "held_out")
