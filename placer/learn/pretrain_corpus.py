"""The pretraining corpus: the zoo, synthetic families and torch.nn library layers, tagged by family.

Each item is tagged with its families so whole families can be held out (``exclude``):

* ``zoo``: the six zoo models (tags: ``lstm`` for rnnlm/nmt-*, ``cnn`` for
  inception-v3/resnet50, ``transformer`` for gpt2);
* ``synthetic``: the structured families of :mod:`graphs.synthetic`
  (chain, branches, unet, moe, attention, recurrent) at several sizes
  (``synthetic_sizes``); unet and branches are tagged ``cnn``, moe and attention
  ``transformer``, recurrent (stacked recurrent layers sharing their weights over
  time steps: the LSTM's grid, without its name) ``recurrent``, so that
  ``exclude={"lstm"}`` keeps it and ``{"lstm", "recurrent"}`` holds out both;
* ``library``: graphs of torch.nn layers every torch install has
  (TransformerEncoderLayer stack ``transformer``, LSTM ``lstm``, a Conv2d stack ``cnn``),
  captured once on the meta device and cached;
* or a directory of graph files (``.json``/``.json.gz``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from graphs import OpGraph, PlacerError, io, zoo
from graphs.synthetic import FAMILIES
from graphs.torch_capture import capture

ZOO_TAGS = {
    "rnnlm": {"lstm"},
    "nmt-2": {"lstm"},
    "nmt-4": {"lstm"},
    "inception-v3": {"cnn"},
    "resnet50": {"cnn"},
    "gpt2": {"transformer"},
}


FAMILY_TAGS = {
    "chain": set(),
    "branches": {"cnn"},
    "unet": {"cnn"},
    "moe": {"transformer"},
    "attention": {"transformer"},
    "recurrent": {"recurrent"},
}


LIBRARY = {"transformer-layers": {"transformer"}, "lstm-layers": {"lstm"}, "conv-stack": {"cnn"}}


SOURCES = ("zoo", "synthetic", "library")


@dataclass
class CorpusItem:
    name: str
    source: str  # zoo | synthetic | library | dir
    tags: set[str]
    load: Callable[[], OpGraph]


def _library_module(name: str) -> tuple[Any, tuple]:
    class Loss(nn.Module):
        def __init__(self, body: nn.Module, out: int) -> None:
            super().__init__()
            self.body, self.head = body, nn.Linear(out, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            y = y[0] if isinstance(y, tuple) else y
            return self.head(y.flatten(1) if y.dim() > 3 else y).float().square().mean()

    if name == "transformer-layers":
        layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
        return Loss(nn.TransformerEncoder(layer, 12, enable_nested_tensor=False), 1024), (
            torch.empty(16, 512, 1024, device="meta"),
        )
    if name == "lstm-layers":
        return Loss(nn.LSTM(1024, 1024, num_layers=4, batch_first=True), 1024), (
            torch.empty(64, 40, 1024, device="meta"),
        )
    if name == "conv-stack":
        layers: list[nn.Module] = []
        ch = 3
        for out in (64, 64, 128, 128, 256, 256, 512, 512):
            layers += [nn.Conv2d(ch, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            ch = out
        return Loss(nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1)), 512), (
            torch.empty(32, 3, 128, 128, device="meta"),
        )
    raise PlacerError(f"unknown library graph {name!r}")


def library_graph(name: str) -> OpGraph:
    """The captured graph of library layers ``name`` (cached under the zoo cache directory)."""
    path = zoo.cache_dir() / "library" / f"{name}-torch{torch.__version__.replace('+', '_')}.json.gz"
    if path.exists():
        try:
            return io.load(path)
        except PlacerError:
            pass
    model, inputs = _library_module(name)
    with torch.device("meta"):
        model = model.to("meta")
    g = capture(model, inputs, name=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    io.save(g, path)
    return g


def build_corpus(
    corpus: str, *, exclude: set[str] = frozenset(), synthetic_sizes: tuple[int, ...] = (300, 1500, 5000), seed: int = 0
) -> list[CorpusItem]:
    """Corpus items for ``corpus`` (a directory, or a comma list of zoo/synthetic/library and zoo names).

    ``exclude``: tags (lstm, cnn, transformer, recurrent) or item names to leave out.
    """
    items: list[CorpusItem] = []
    if os.path.isdir(corpus):
        files = sorted(f for f in os.listdir(corpus) if f.endswith((".json", ".json.gz")))
        if not files:
            raise PlacerError(f"--corpus {corpus}: no graph files (.json, .json.gz) in the directory")
        for f in files:
            path = os.path.join(corpus, f)
            items.append(CorpusItem(f, "dir", set(), lambda p=path: io.load(p)))
    else:
        for part in [p.strip() for p in corpus.split(",") if p.strip()]:
            if part == "zoo":
                items += [CorpusItem(n, "zoo", ZOO_TAGS.get(n, set()), lambda n=n: zoo.graph(n)) for n in zoo.names()]
            elif part in zoo.names():
                items.append(CorpusItem(part, "zoo", ZOO_TAGS.get(part, set()), lambda n=part: zoo.graph(n)))
            elif part == "synthetic":
                for k, (fam, fn) in enumerate(FAMILIES.items()):
                    for j, size in enumerate(synthetic_sizes):
                        s = seed * 1000 + 10 * k + j
                        items.append(
                            CorpusItem(
                                f"{fam}-{size}-s{s}",
                                "synthetic",
                                FAMILY_TAGS[fam],
                                lambda fn=fn, size=size, s=s: fn(size, seed=s),
                            )
                        )
            elif part == "library":
                items += [CorpusItem(n, "library", tags, lambda n=n: library_graph(n)) for n, tags in LIBRARY.items()]
            else:
                raise PlacerError(
                    f"--corpus {corpus!r}: {part!r} is not a directory, zoo, synthetic, library or a zoo name"
                )
    families = set().union(*ZOO_TAGS.values(), *FAMILY_TAGS.values(), *LIBRARY.values())
    unknown = sorted(set(exclude) - families - {it.name for it in items})
    if unknown:
        raise PlacerError(
            f"--exclude {','.join(unknown)}: not a family ({', '.join(sorted(families))}) nor an item of "
            f"--corpus {corpus}"
        )
    kept = [it for it in items if not (it.tags & set(exclude)) and it.name not in exclude]
    if not kept:
        raise PlacerError(f"--corpus {corpus}: nothing left after --exclude {','.join(sorted(exclude))}")
    return kept
