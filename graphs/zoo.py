"""The model zoo: real PyTorch models with example inputs, captured on demand.

=============  ===================================================================  =====  ======
name           model and sizes                                                      ops    ops
                                                                                           (core)
=============  ===================================================================  =====  ======
rnnlm          2-layer LSTM LM; vocab 50,000, embedding/hidden 2048, 40 steps,      1,409  1,627
               batch 64; 272M params, 868 GFLOPs forward
nmt-2          attentional encoder-decoder LSTM, 2+2 layers; vocab 40,000 (source   2,383  2,734
               and target), hidden 1024, 30 source and 30 target steps, batch 64;
               160M params, 299 GFLOPs
nmt-4          as nmt-2 with 4+4 layers; 193M params, 428 GFLOPs                    4,425  5,016
inception-v3   full Inception-v3 with auxiliary head; 299x299, batch 32; 27M          420    745
               params, 367 GFLOPs
gpt2           GPT-2 small: 12 layers, width 768, 12 heads, vocab 50,257 (tied),      273    904
               1024 tokens, batch 8; 124M params, 2.3 TFLOPs
resnet50       ResNet-50; 224x224, batch 32; 26M params, 263 GFLOPs                   229    405
=============  ===================================================================  =====  ======

``ops`` counts the ops of the default capture, ``ops (core)`` those after
decomposition to core ATen (``decompose=True``). The LSTM models are written
with one cell per time step and layer (:mod:`graphs.models.lstm`), so their
graphs unroll over time as the paper's did. Every model's ``forward`` takes one
training batch and returns the loss.

:func:`graph` caches each capture as JSON under ``$PLACER_CACHE_DIR`` (default
``~/.cache/placer``), keyed by name, capture-code version, torch version and a
hash of the capture and model source, so only the first call pays for
``torch.export``. Captures run on the meta device: no weights are allocated.

>>> names()
['rnnlm', 'nmt-2', 'nmt-4', 'inception-v3', 'gpt2', 'resnet50']
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from graphs import io
from graphs.errors import PlacerError
from graphs.ir import OpGraph


@dataclass(frozen=True)
class ZooModel:
    """How to build one zoo model and a training batch for it."""

    description: str
    module: str  # graphs.models.<module>
    factory: str  # class name in that module
    kwargs: dict[str, Any]
    inputs: Callable[[Any], tuple]  # device -> example inputs
    sizes: dict[str, int] = field(default_factory=dict)


def _tokens(batch: int, steps: int, vocab: int, count: int) -> Callable[[Any], tuple]:
    def make(device: Any) -> tuple:
        import torch  # torch: only to build a model

        gen = torch.Generator().manual_seed(0)
        out = tuple(torch.randint(0, vocab, (batch, steps), generator=gen) for _ in range(count))
        return tuple(t.to(device) for t in out)

    return make


def _images(batch: int, side: int, classes: int) -> Callable[[Any], tuple]:
    def make(device: Any) -> tuple:
        import torch  # torch: only to build a model

        gen = torch.Generator().manual_seed(0)
        if str(device) == "meta":
            images = torch.empty(batch, 3, side, side, device="meta")
        else:
            images = torch.randn(batch, 3, side, side, generator=gen).to(device)
        return images, torch.randint(0, classes, (batch,), generator=gen).to(device)

    return make


def _nmt(layers: int) -> ZooModel:
    """The attentional encoder-decoder LSTM NMT of the paper, ``layers`` layers deep."""
    return ZooModel(
        f"attentional encoder-decoder LSTM NMT, {layers} layers (vocab 40k, hidden 1024, 30 steps, batch 64)",
        "nmt",
        "NMT",
        dict(num_layers=layers, src_vocab=40_000, tgt_vocab=40_000, hidden_size=1024),
        _tokens(64, 30, 40_000, 3),
        dict(batch_size=64, seq_len=30, hidden_size=1024, vocab_size=40_000, layers=layers),
    )


_ZOO: dict[str, ZooModel] = {
    "rnnlm": ZooModel(
        "2-layer LSTM language model (vocab 50k, hidden 2048, 40 steps, batch 64)",
        "rnnlm",
        "RNNLM",
        dict(vocab_size=50_000, hidden_size=2048, num_layers=2),
        _tokens(64, 40, 50_000, 2),
        dict(batch_size=64, seq_len=40, hidden_size=2048, vocab_size=50_000),
    ),
    "nmt-2": _nmt(2),
    "nmt-4": _nmt(4),
    "inception-v3": ZooModel(
        "Inception-v3 with auxiliary classifier (299x299, batch 32)",
        "inception",
        "InceptionV3",
        dict(num_classes=1000),
        _images(32, 299, 1000),
        dict(batch_size=32, image_size=299),
    ),
    "gpt2": ZooModel(
        "GPT-2 small (12 layers, width 768, 12 heads, 1024 tokens, batch 8)",
        "gpt2",
        "GPT2",
        dict(vocab_size=50_257, context=1024, width=768, layers=12, heads=12),
        _tokens(8, 1024, 50_257, 2),
        dict(batch_size=8, seq_len=1024, hidden_size=768, vocab_size=50_257),
    ),
    "resnet50": ZooModel(
        "ResNet-50 (224x224, batch 32)",
        "resnet",
        "ResNet50",
        dict(num_classes=1000),
        _images(32, 224, 1000),
        dict(batch_size=32, image_size=224),
    ),
}


def names() -> list[str]:
    """The zoo's model names, in the order ``placer graphs`` lists them."""
    return list(_ZOO)


def _entry(name: str) -> ZooModel:
    if name not in _ZOO:
        raise PlacerError(f"{name}: not a zoo model (choose from {', '.join(_ZOO)})")
    return _ZOO[name]


def build(name: str, *, device: Any = "cpu") -> tuple[Any, tuple]:
    """``(model, example_inputs)`` of zoo model ``name`` in training mode.

    ``device="meta"`` builds it without allocating weights (what capture uses).
    """
    import torch  # torch: only to build a model

    entry = _entry(name)
    cls = getattr(importlib.import_module(f"graphs.models.{entry.module}"), entry.factory)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(**entry.kwargs)
    return model.train(), entry.inputs(device)


# ------------------------------------------------------------------ cache
def cache_dir() -> Path:
    """``$PLACER_CACHE_DIR`` or ``~/.cache/placer``."""
    return Path(os.environ.get("PLACER_CACHE_DIR") or Path.home() / ".cache" / "placer")


@lru_cache(maxsize=1)
def _source_hash() -> str:
    here = Path(__file__).parent
    files = [here / "zoo.py", here / "torch_capture.py", here / "flops.py", *sorted((here / "models").glob("*.py"))]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:10]


def cache_path(name: str, *, decompose: bool = False) -> Path:
    """Where :func:`graph` keeps the capture of ``name``."""
    import torch  # torch: its version keys the cache

    from graphs.torch_capture import CAPTURE_VERSION  # torch: capture's version keys the cache

    _entry(name)
    kind = "-core" if decompose else ""
    key = f"c{CAPTURE_VERSION}-torch{torch.__version__.replace('+', '_')}-{_source_hash()}"
    return cache_dir() / "zoo" / f"{name}{kind}-{key}.json.gz"


def graph(name: str, *, decompose: bool = False, refresh: bool = False) -> OpGraph:
    """The captured :class:`OpGraph` of zoo model ``name``, from the disk cache when there.

    Args:
        decompose: capture in core ATen (see :func:`graphs.torch_capture.export_program`).
        refresh: capture again even if cached.
    """
    from filelock import FileLock

    path = cache_path(name, decompose=decompose)
    if not refresh and (cached := _cached(path)) is not None:
        return cached
    path.parent.mkdir(parents=True, exist_ok=True)
    # one capture at a time per entry, across processes (test workers, Ray workers, two runs): whoever waited reads
    # what the first captured instead of capturing it again; the OS drops the lock of a process that dies
    with FileLock(f"{path}.lock"):
        if not refresh and (cached := _cached(path)) is not None:
            return cached
        g = capture(name, decompose=decompose)
        io.save(g, path)  # atomic: a reader without the lock sees the whole file or none
    return g


def _cached(path: Path) -> OpGraph | None:
    if path.exists():
        try:
            return io.load(path)
        except PlacerError:
            pass  # a damaged cache entry: capture again and overwrite it
    return None


def capture(name: str, *, decompose: bool = False) -> OpGraph:
    """Capture zoo model ``name`` now (on the meta device), bypassing the cache."""
    from graphs.torch_capture import capture as _capture  # torch: loaded only to capture

    model, inputs = build(name, device="meta")
    g = _capture(model, inputs, decompose=decompose, name=name)
    g.meta["zoo"] = {"model": name, **_ZOO[name].sizes}
    g.invalidate()
    return g


def num_params(name: str) -> int:
    """Trainable parameter count of ``name`` (tied weights once), without allocating them."""
    model, _ = build(name, device="meta")
    return sum(p.numel() for p in model.parameters())


def info(*, decompose: bool = False, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per zoo model: name, description, ops, edges, params, param_bytes, flops.

    Captures what is not cached yet; ``progress`` is called with a line before each
    capture (for ``placer graphs`` to show on stderr).
    """
    rows = []
    for name in names():
        if progress is not None and not cache_path(name, decompose=decompose).exists():
            progress(f"capturing {name} (first time; cached in {cache_dir()})")
        g = graph(name, decompose=decompose)
        rows.append(
            dict(
                name=name,
                description=_ZOO[name].description,
                ops=g.num_ops,
                edges=g.num_edges,
                params=num_params(name),
                param_bytes=g.total_param_bytes,
                flops=g.total_flops,
                hash=g.content_hash,
            )
        )
    return rows
